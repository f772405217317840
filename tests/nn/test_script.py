"""Every ``visionblocks.nn`` block under ``torch.jit.script``: alone and in a model, as eager.

The cases cover every name in `LAYERS` (a new layer fails `test_every_layer_has_a_case` until
it gets one) plus `LayerNorm2d`, the norm and activation variants and fused models.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.helpers import assert_close
from visionblocks._core.checkpointing import is_grad_checkpointing
from visionblocks.nn import (
    MLP,
    ChannelShuffle,
    ConvNormAct,
    ConvNormAct3d,
    DeformConv2d,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    DropBlock2d,
    DropBlock3d,
    FrozenBatchNorm2d,
    Involution2d,
    LayerNorm2d,
    LocalAttention2d,
    LocalFilter2d,
    Permute,
    SqueezeExcitation,
    StochasticDepth,
    channel_shuffle,
    fuse_modules,
)
from visionblocks.registry import LAYERS
from visionblocks.training import convert_sync_batchnorm, set_grad_checkpointing

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning"),
]


class _Deformable(nn.Module):
    """`DeformConv2d` with its offsets and mask from a convolution, as models use it."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = nn.Conv2d(4, 27, 3, padding=1)
        self.conv = DeformConv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset, mask = self.offset(x).split([18, 9], dim=1)
        return self.conv(x, offset, mask.sigmoid())


# name -> (factory of a block taking 4 channels, the LAYERS name it covers or None)
CASES: dict[str, tuple[Callable[[], nn.Module], str | None]] = {
    "conv_norm_act": (lambda: ConvNormAct(4, 8, stride=2, act="hardswish"), "conv_norm_act"),
    "conv_norm_act_gn_even": (lambda: ConvNormAct(4, 8, 2, norm="gn", act="gelu"), None),
    "conv_norm_act_ln2d": (lambda: ConvNormAct(4, 8, norm="ln2d", act="silu"), None),
    "conv_norm_act_plain": (lambda: ConvNormAct(4, 8, 1, norm=None, act=None), None),
    "depthwise_conv": (lambda: DepthwiseConv2d(4, 5, stride=2, multiplier=2), "depthwise_conv"),
    "depthwise_separable_conv": (
        lambda: DepthwiseSeparableConv2d(4, 8, dilation=2, act="relu6"),
        "depthwise_separable_conv",
    ),
    "channel_shuffle": (lambda: ChannelShuffle(2), "channel_shuffle"),
    "layer_norm_2d": (lambda: LayerNorm2d(4), None),
    "involution": (lambda: Involution2d(4, 3, stride=2, groups=2, reduction=2), "involution"),
    "local_filter": (lambda: LocalFilter2d(4, 3, dilation=2, groups=2), "local_filter"),
    "local_filter_raw": (lambda: LocalFilter2d(4, 5, normalize="none"), None),
    "local_attention": (lambda: LocalAttention2d(4, 3, num_heads=2), "local_attention"),
    # torchvision.ops' blocks; the random ones with p=0 here (a model in training mode is
    # compared with its scripted twin): their seeded draws are compared in their own tests.
    "squeeze_excitation": (lambda: SqueezeExcitation(4, 2), "squeeze_excitation"),
    "frozen_bn": (lambda: FrozenBatchNorm2d(4), "frozen_bn"),
    "mlp": (lambda: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), MLP(4, [8, 4])), "mlp"),
    "stochastic_depth": (lambda: StochasticDepth(0.0), "stochastic_depth"),
    "drop_block2d": (lambda: DropBlock2d(0.0, 3), "drop_block2d"),
    "drop_block3d": (
        lambda: nn.Sequential(nn.Unflatten(1, (2, 2)), DropBlock3d(0.0, 3), nn.Flatten(1, 2)),
        "drop_block3d",
    ),
    "deform_conv2d": (_Deformable, "deform_conv2d"),
    "conv_norm_act3d": (
        lambda: nn.Sequential(nn.Unflatten(1, (2, 2)), ConvNormAct3d(2, 2), nn.Flatten(1, 2)),
        "conv_norm_act3d",
    ),
    "permute": (lambda: nn.Sequential(Permute([0, 2, 3, 1]), Permute([0, 3, 1, 2])), "permute"),
}


def _randomize(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model


def _block(name: str) -> nn.Module:
    torch.manual_seed(0)
    return _randomize(CASES[name][0]())


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


# Layers TorchScript cannot compile, and why (torch.compile and export cover them).
NOT_SCRIPTABLE = {
    # Its spatial_shapes is a tensor or a sequence of pairs (a union TorchScript cannot type);
    # tests/ops/test_ms_deform_attn.py compiles it with fullgraph=True and exports it to ONNX.
    "ms_deform_attn",
}


def test_every_layer_has_a_case():
    covered = {layer for _, layer in CASES.values()}
    assert set(LAYERS.list()) - NOT_SCRIPTABLE <= covered
    assert not NOT_SCRIPTABLE & covered


@pytest.mark.parametrize("name", sorted(CASES))
def test_block_scripts_and_matches_eager(name):
    block = _block(name).eval()
    scripted = torch.jit.script(block)
    for x in (_x(2, 4, 9, 10), _x(1, 4, 6, 7).to(memory_format=torch.channels_last)):
        with torch.no_grad():
            assert_close(scripted(x), block(x), check_dtype=True)
    assert scripted.state_dict().keys() == block.state_dict().keys()


@pytest.mark.parametrize("name", sorted(CASES))
def test_block_scripts_in_a_sequential_model_in_training_too(name):
    torch.manual_seed(0)
    model = _randomize(nn.Sequential(ConvNormAct(4, 4, act="silu"), CASES[name][0]()))
    twin = copy.deepcopy(model)
    scripted = torch.jit.script(twin).train()
    model.train()
    x = _x(2, 4, 9, 10)
    # Three steps: TorchScript's profiling executor optimises the graph after the first runs.
    for _ in range(3):
        out, ref = scripted(x), model(x)
        assert_close(out, ref)
        out.square().mean().backward()
        ref.square().mean().backward()
    for (key, a), b in zip(twin.named_parameters(), model.parameters()):
        assert_close(a.grad, b.grad, msg=key)
    for key, value in model.state_dict().items():  # running statistics
        assert_close(twin.state_dict()[key].float(), value.float(), msg=key)
    scripted.eval(), model.eval()
    with torch.no_grad():
        for _ in range(3):
            assert_close(scripted(x), model(x))


def test_channel_shuffle_function_scripts():
    scripted = torch.jit.script(channel_shuffle)
    x = _x(2, 6, 3, 5)
    assert torch.equal(scripted(x, 3), channel_shuffle(x, 3))
    last = x.to(memory_format=torch.channels_last)
    out = scripted(last, 2)
    assert torch.equal(out, channel_shuffle(last, 2))
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(scripted(_x(2, 6, 7), 2), channel_shuffle(_x(2, 6, 7), 2))  # 3-D


def test_local_filter_with_given_kernels_and_without_a_predictor():
    layer = LocalFilter2d(4, 3, groups=2, predict=False)
    scripted = torch.jit.script(layer)
    x, kernels = _x(2, 4, 7, 9), torch.rand(2, 18, 7, 9)
    assert_close(scripted(x, kernels), layer(x, kernels))
    with pytest.raises(torch.jit.Error, match="has no predictor; pass kernels"):
        scripted(x)
    predicting = _block("local_filter").eval()
    assert_close(torch.jit.script(predicting)(x, kernels), predicting(x, kernels))


@pytest.mark.parametrize("name", ["involution", "local_filter", "local_attention"])
def test_checkpointed_layers_script_without_checkpointing(name):
    layer = set_grad_checkpointing(_block(name)).train()
    scripted = torch.jit.script(layer)
    assert is_grad_checkpointing(layer)  # the layer itself still checkpoints
    shared = dict(layer.named_parameters())
    assert all(p is shared[k] for k, p in scripted.named_parameters())
    x = _x(2, 4, 9, 10)
    assert_close(scripted(x), layer(x))


def test_fused_model_scripts():
    torch.manual_seed(0)
    model = _randomize(
        nn.Sequential(
            ConvNormAct(4, 8, stride=2),
            DepthwiseSeparableConv2d(8, 8, act="relu6"),
            ChannelShuffle(4),
            DepthwiseConv2d(8, multiplier=2),
            Involution2d(16, 3, groups=4),
            ConvNormAct(16, 8, kernel_size=1, act=None),
        )
    ).eval()
    fused = fuse_modules(model)
    x = _x(2, 4, 16, 16)
    with torch.no_grad():
        assert_close(torch.jit.script(fused)(x), model(x), scale=10.0)


def test_eager_checks_still_run():
    block = ConvNormAct(4, 8)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 4, H, W\)"):
        block(_x(4, 9, 9))
    with pytest.raises(ValueError, match="groups=4 must divide the channels of x"):
        channel_shuffle(_x(1, 6, 2, 2), 4)
    # A scripted block skips them: torch's own errors remain.
    with pytest.raises(RuntimeError):
        torch.jit.script(block)(_x(1, 3, 9, 9))


@pytest.mark.parametrize(
    "make",
    [
        lambda: ConvNormAct(4, 8, norm="syncbn"),
        lambda: nn.Sequential(DepthwiseSeparableConv2d(4, 8, norm="syncbn")),
        lambda: convert_sync_batchnorm(nn.Sequential(ConvNormAct(4, 8))),
    ],
)
def test_sync_batchnorm_blocks_do_not_script_and_say_why(make):
    with pytest.raises(RuntimeError, match=r"SyncBatchNorm norm does not compile with torch\.jit"):
        torch.jit.script(make())
