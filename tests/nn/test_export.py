"""The convolution blocks (plain and fused) under torch.jit.trace, torch.export and torch.compile."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch import nn

from tests.helpers import assert_close
from visionblocks.nn.conv import (
    ChannelShuffle,
    ConvNormAct,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    channel_shuffle,
)
from visionblocks.nn.fuse import fuse_modules

pytestmark = [
    pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace.*` is deprecated:FutureWarning"),
]


def _randomize(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model


BLOCKS = {
    "conv_norm_act": lambda: ConvNormAct(4, 8, stride=2, act="hardswish"),
    "conv_norm_act_even": lambda: ConvNormAct(4, 8, kernel_size=2, norm="gn", act="gelu"),
    "conv_norm_act_ln2d": lambda: ConvNormAct(4, 8, norm="ln2d", act="silu"),
    "depthwise_conv": lambda: DepthwiseConv2d(4, 5, multiplier=2),
    "depthwise_separable_conv": lambda: DepthwiseSeparableConv2d(4, 8, dilation=2),
    "channel_shuffle": lambda: ChannelShuffle(2),
}


def _block(name: str) -> nn.Module:
    return _randomize(BLOCKS[name]()).eval()


def _stack() -> nn.Module:
    """Every block in one small model."""
    return _randomize(
        nn.Sequential(
            ConvNormAct(4, 8, stride=2),
            DepthwiseSeparableConv2d(8, 8, act="relu6"),
            ChannelShuffle(4),
            DepthwiseConv2d(8, multiplier=2),
            ConvNormAct(16, 8, kernel_size=1, act=None),
        )
    ).eval()


# Our own code must not make the trace input-specific (torch's group_norm does warn).
@pytest.mark.filterwarnings("error::torch.jit.TracerWarning:visionblocks")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning:torch")
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_jit_trace(name):
    block = _block(name)
    x = torch.randn(2, 4, 12, 12)
    with torch.no_grad():
        traced = torch.jit.trace(block, x)
        x2 = torch.randn(3, 4, 12, 12)  # another batch size: nothing batch-specific is baked in
        assert_close(traced(x2), block(x2))


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_torch_export(name):
    block = _block(name)
    x = torch.randn(2, 4, 12, 12)
    program = torch.export.export(block, (x,))
    x2 = torch.randn(2, 4, 12, 12)
    with torch.no_grad():
        assert_close(program.module()(x2), block(x2))


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_fx_symbolic_trace(name):
    block = _block(name)
    graph_module = torch.fx.symbolic_trace(block)
    x = torch.randn(2, 4, 12, 12)
    with torch.no_grad():
        assert_close(graph_module(x), block(x))


def test_fx_keeps_channel_shuffle_as_one_call():
    graph = torch.fx.symbolic_trace(_stack()).graph
    calls = [n.target for n in graph.nodes if n.op == "call_function"]
    assert channel_shuffle in calls


def test_torch_export_dynamic_batch():
    model = _stack()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 4, 16, 16),), dynamic_shapes=({0: batch},))
    x = torch.randn(5, 4, 16, 16)
    with torch.no_grad():
        assert_close(program.module()(x), model(x))


def test_fused_model_traces_and_exports():
    model = _stack().double()
    fused = fuse_modules(model)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    x = torch.randn(2, 4, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        assert_close(torch.jit.trace(fused, x)(x), expected)
        assert_close(torch.export.export(fused, (x,)).module()(x), expected)
        assert_close(torch.fx.symbolic_trace(fused)(x), expected)


@pytest.mark.slow
def test_torch_compile_aot_eager():
    model = _stack()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 4, 16, 16)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
    # Training mode too (BatchNorm updates its statistics inside the graph).
    model.train()
    x.requires_grad_(True)
    compiled(x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def _cxx_compiler() -> str | None:
    names = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    return next((path for n in names if n and (path := shutil.which(n))), None)


@pytest.mark.slow
@pytest.mark.skipif(
    _cxx_compiler() is None and not torch.cuda.is_available(),
    reason="inductor on CPU compiles C++ and no C++ compiler (CXX, g++, c++, clang++) is on PATH",
)
def test_torch_compile_inductor():
    # Kept tiny: a cold inductor compile on CPU takes ~10 s; test_torch_compile_aot_eager covers
    # every block.
    model = _randomize(nn.Sequential(ConvNormAct(4, 8, act="silu"), ChannelShuffle(2))).eval()
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert_close(compiled(x), model(x), scale=10.0)
