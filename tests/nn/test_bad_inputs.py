"""The blocks reject bad inputs clearly (issue 19): absurd sizes before allocating, and in
``forward`` inputs of the wrong rank, channels or dtype, naming the argument
(the generic type, dtype and device mistakes: tests/conformance/)."""

from __future__ import annotations

import pytest
import torch

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
    make_norm,
)
from visionblocks.nn.layers import group_norm_groups


@pytest.mark.parametrize(
    ("eps", "error", "match"),
    [
        (0.0, ValueError, "eps must be in"),
        (float("inf"), ValueError, "eps must be in"),
    ],
)
def test_layer_norm_2d_eps(eps, error, match):
    with pytest.raises(error, match=match):
        LayerNorm2d(8, eps=eps)


BLOCKS = {
    "conv_norm_act": lambda: ConvNormAct(4, 8),
    "depthwise": lambda: DepthwiseConv2d(4),
    "separable": lambda: DepthwiseSeparableConv2d(4, 8),
    "layer_norm": lambda: LayerNorm2d(4),
    "involution": lambda: Involution2d(4, kernel_size=3, groups=2, reduction=2),
    "local_filter": lambda: LocalFilter2d(4, kernel_size=3),
    "local_attention": lambda: LocalAttention2d(4, kernel_size=3, num_heads=2),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_forward_rejects_bad_inputs(name):
    block = BLOCKS[name]().eval()
    x = torch.randn(2, 4, 8, 8)
    assert block(x).shape[0] == 2
    with pytest.raises(
        ValueError, match=r"x must have shape \(B, 4, H, W\), got \(4, 8, 8\) \(one image"
    ):
        block(x[0])  # a 3-D image
    with pytest.raises(ValueError, match=r"x must have shape \(B, 4, H, W\), got \(2, 3, 8, 8\)"):
        block(x[:, :3])  # the wrong channel count
    if name != "layer_norm":  # LayerNorm2d runs mixed precision itself
        with pytest.raises(
            TypeError, match="x has dtype torch.float64 but the module's parameters"
        ):
            block(x.double())


def test_mixed_dtypes_are_fine_under_autocast():
    block = ConvNormAct(4, 8).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert block(torch.randn(1, 4, 8, 8)).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ConvNormAct(10**9, 8), r"in_channels must be in \[1, 65536\], got 1000000000"),
        (lambda: ConvNormAct(4, 8, kernel_size=10**9), r"kernel_size must be in \[1, 1024\]"),
        (lambda: ConvNormAct(4, 8, padding=10**9), r"padding must be in \[0, 1024\]"),
        (lambda: ConvNormAct(65536, 65536, 3), "weights, more than the 2,147,483,648"),
        (lambda: DepthwiseConv2d(4, multiplier=10**9), r"multiplier must be in \[1, 65536\]"),
        (lambda: LayerNorm2d(10**9), r"num_channels must be in \[1, 65536\]"),
        (lambda: make_norm("bn", 10**9), r"num_channels must be in \[1, 65536\]"),
        (lambda: group_norm_groups(10**9), r"num_channels must be in \[1, 65536\]"),
        (lambda: Involution2d(8, kernel_size=10**9 + 1), r"kernel_size must be in \[1, 63\]"),
        (lambda: LocalAttention2d(8, kernel_size=101), r"kernel_size must be in \[1, 63\]"),
        (lambda: LocalFilter2d(8, dilation=10**9), r"dilation must be in \[1, 1024\]"),
    ],
)
def test_absurd_sizes_fail_before_allocating(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_local_filter_given_kernels_are_checked():
    layer = LocalFilter2d(4, kernel_size=3, groups=2, predict=False)
    x = torch.randn(2, 4, 8, 8)
    assert layer(x, torch.rand(2, 18, 8, 8)).shape == x.shape
    with pytest.raises(ValueError, match=r"kernels must have shape .* = \(2, 18, 8, 8\)"):
        layer(x, torch.rand(2, 9, 8, 8))
    with pytest.raises(ValueError, match="kernels is on meta"):
        layer(x, torch.rand(2, 18, 8, 8, device="meta"))
    with pytest.raises(ValueError, match="no predictor; pass kernels"):
        layer(x)


def test_channel_shuffle_takes_any_dtype_and_device():
    x = torch.arange(8).view(1, 4, 2)
    assert ChannelShuffle(2)(x).tolist() == [[[0, 1], [4, 5], [2, 3], [6, 7]]]
    assert ChannelShuffle(2)(x.to("meta")).shape == x.shape


def test_checked_blocks_still_fuse_and_trace():
    model = torch.nn.Sequential(ConvNormAct(4, 8), DepthwiseConv2d(8), torch.nn.BatchNorm2d(8))
    model.eval()
    fused = fuse_modules(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    x = torch.randn(1, 4, 8, 8)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-5)
    for block in (ConvNormAct(4, 8), DepthwiseSeparableConv2d(4, 8)):
        graph = torch.fx.symbolic_trace(block).graph
        assert not [n for n in graph.nodes if n.op == "get_attr"]  # the checks read no weight
