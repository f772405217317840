"""LocalAttention2d: shapes, gradients, agreement with the functional, registry, errors."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close
from visionblocks.nn import local_attention as module
from visionblocks.nn.local_attention import LocalAttention2d
from visionblocks.ops.local_attention import local_attention2d
from visionblocks.registry import LAYERS


@pytest.mark.parametrize(("size", "dilation"), [((9, 8), 1), ((1, 1), 1), ((5, 13), 2)])
def test_shape_and_functional(size, dilation):
    layer = LocalAttention2d(16, kernel_size=5, num_heads=4, dilation=dilation).double()
    x = torch.randn(2, 16, *size, dtype=torch.float64)
    out = layer(x)
    assert out.shape == x.shape
    q, k, v = layer.qkv(x).chunk(3, 1)
    assert_close(out, layer.proj(local_attention2d(q, k, v, 5, dilation, 4)))


def test_module_calls_the_functional(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3:])
        return local_attention2d(*args, **kwargs)

    monkeypatch.setattr(module, "local_attention2d", spy)
    LocalAttention2d(8, kernel_size=3, num_heads=2, dilation=2)(torch.randn(1, 8, 4, 4))
    assert calls == [(3, 2, 2)]


def test_defaults_and_backward():
    layer = LocalAttention2d(32)
    assert (layer.kernel_size, layer.num_heads, layer.dilation) == (7, 8, 1)
    assert layer.qkv.out_channels == 96 and layer.qkv.bias is not None
    assert LocalAttention2d(32, qkv_bias=False).qkv.bias is None
    x = torch.randn(2, 32, 10, 12, requires_grad=True)
    layer(x).square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_registry_entry():
    layer = LAYERS.build({"type": "local_attention", "channels": 8, "num_heads": 2})
    assert isinstance(layer, LocalAttention2d)
    assert layer.extra_repr() == "channels=8, kernel_size=7, num_heads=2, dilation=1, qkv_bias=True"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": 3}, ValueError, "num_heads must divide channels"),
        ({"kernel_size": 4}, ValueError, "kernel_size must be odd"),
        ({"dilation": 0}, ValueError, r"dilation must be in \[1, "),
        ({"channels": 8.0}, TypeError, "channels must be int"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"channels": 8, "num_heads": 2, **kwargs}
    with pytest.raises(error, match=match):
        LocalAttention2d(**args)


def test_forward_checks_the_input_shape():
    module = LocalAttention2d(32, kernel_size=3, num_heads=4)
    with pytest.raises(ValueError, match=r"got \(1, 16, 9, 9\)"):
        module(torch.randn(1, 16, 9, 9))
