"""Every layer of `visionblocks.nn` under ``torch.export`` (strict and non-strict), eval mode,
dynamic batch and image size, compared with eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.testing import assert_close

from visionblocks.nn import (
    ChannelShuffle,
    ConvNormAct,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    Involution2d,
    LayerNorm2d,
    LocalAttention2d,
    LocalFilter2d,
    fuse_modules,
)


def _fused() -> nn.Module:
    model = nn.Sequential(
        ConvNormAct(4, 8, stride=2), DepthwiseSeparableConv2d(8, 8, act="relu6"),
        ChannelShuffle(4), DepthwiseConv2d(8, multiplier=2), ConvNormAct(16, 8, 1, act=None),
    )  # fmt: skip
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return fuse_modules(model.eval())


LAYERS = {
    "conv_norm_act": lambda: ConvNormAct(4, 8, stride=2, act="hardswish"),
    "conv_norm_act_gn": lambda: ConvNormAct(4, 8, kernel_size=2, norm="gn", act="gelu"),
    "conv_norm_act_ln2d": lambda: ConvNormAct(4, 8, norm="ln2d", act="silu"),
    "depthwise": lambda: DepthwiseConv2d(4, 5, multiplier=2),
    "depthwise_separable": lambda: DepthwiseSeparableConv2d(4, 8, dilation=2),
    "channel_shuffle": lambda: ChannelShuffle(2),
    "layer_norm_2d": lambda: LayerNorm2d(4),
    "fused": _fused,
    "involution": lambda: Involution2d(4, kernel_size=3, stride=2, groups=2),
    "local_filter": lambda: LocalFilter2d(4, kernel_size=3, groups=2),
    "local_filter_dilated": lambda: LocalFilter2d(4, kernel_size=5, dilation=2, groups=1),
    "local_attention": lambda: LocalAttention2d(4, kernel_size=3, num_heads=2),
}

DYNAMIC = {
    0: Dim("batch", min=1, max=8),
    2: 8 * Dim("h", min=2, max=32),
    3: 8 * Dim("w", min=2, max=32),
}


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_exports(name, strict):
    torch.manual_seed(0)
    layer = LAYERS[name]().eval()
    program = torch.export.export(
        layer, (torch.randn(2, 4, 16, 24),), dynamic_shapes=(DYNAMIC,), strict=strict
    )
    for shape in [(2, 4, 16, 24), (3, 4, 32, 16)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert_close(program.module()(x), layer(x), atol=1e-5, rtol=1e-5)
