"""``nn.Module`` building blocks: convolution blocks, Conv+BN fusion and unfold-based local layers.

Every block is registered in `visionblocks.registry.LAYERS`.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.nn.conv import (
    ChannelShuffle,
    ConvNormAct,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    channel_shuffle,
)
from visionblocks.nn.fuse import find_conv_bn_pairs, fuse_conv_bn, fuse_modules
from visionblocks.nn.involution import Involution2d, LocalFilter2d
from visionblocks.nn.layers import LayerNorm2d, make_activation, make_norm
from visionblocks.nn.local_attention import LocalAttention2d

__all__ = [
    "ChannelShuffle",
    "ConvNormAct",
    "DepthwiseConv2d",
    "DepthwiseSeparableConv2d",
    "Involution2d",
    "LayerNorm2d",
    "LocalAttention2d",
    "LocalFilter2d",
    "channel_shuffle",
    "find_conv_bn_pairs",
    "fuse_conv_bn",
    "fuse_modules",
    "make_activation",
    "make_norm",
]
__dir__ = public_dir(__name__, __all__)
