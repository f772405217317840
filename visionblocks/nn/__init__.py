"""``nn.Module`` building blocks: convolution blocks, Conv+BN fusion, unfold-based local layers
and the blocks of ``torchvision.ops`` (squeeze-excitation, stochastic depth, DropBlock, frozen
BatchNorm, MLP, deformable convolution, permute).

Every block is registered in `visionblocks.registry.LAYERS`.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.nn.conv import (
    ChannelShuffle,
    ConvNormAct,
    ConvNormAct3d,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    Permute,
    channel_shuffle,
)
from visionblocks.nn.deform_conv import DeformConv2d
from visionblocks.nn.drop_block import DropBlock2d, DropBlock3d, drop_block2d, drop_block3d
from visionblocks.nn.frozen_batch_norm import FrozenBatchNorm2d
from visionblocks.nn.fuse import find_conv_bn_pairs, fuse_conv_bn, fuse_modules
from visionblocks.nn.involution import Involution2d, LocalFilter2d
from visionblocks.nn.layers import LayerNorm2d, make_activation, make_norm
from visionblocks.nn.local_attention import LocalAttention2d
from visionblocks.nn.mlp import MLP
from visionblocks.nn.ms_deform_attn import MultiScaleDeformableAttention
from visionblocks.nn.squeeze_excitation import SqueezeExcitation
from visionblocks.nn.stochastic_depth import StochasticDepth, drop_path

__all__ = [
    "MLP",
    "ChannelShuffle",
    "ConvNormAct",
    "ConvNormAct3d",
    "DeformConv2d",
    "DepthwiseConv2d",
    "DepthwiseSeparableConv2d",
    "DropBlock2d",
    "DropBlock3d",
    "FrozenBatchNorm2d",
    "Involution2d",
    "LayerNorm2d",
    "LocalAttention2d",
    "LocalFilter2d",
    "MultiScaleDeformableAttention",
    "Permute",
    "SqueezeExcitation",
    "StochasticDepth",
    "channel_shuffle",
    "drop_block2d",
    "drop_block3d",
    "drop_path",
    "find_conv_bn_pairs",
    "fuse_conv_bn",
    "fuse_modules",
    "make_activation",
    "make_norm",
]
__dir__ = public_dir(__name__, __all__)
