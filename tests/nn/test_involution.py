"""Involution2d and LocalFilter2d: shapes, the reference computation, registry, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close
from visionblocks.nn.involution import Involution2d, LocalFilter2d
from visionblocks.ops.local import local_filter2d
from visionblocks.registry import LAYERS


def involution_reference(layer: Involution2d, x: torch.Tensor) -> torch.Tensor:
    """The paper's naive version: unfold with stride, multiply by the kernels, sum the taps."""
    k, s, g = layer.kernel_size, layer.stride, layer.groups
    pooled = x if s == 1 else F.avg_pool2d(x, s, s, ceil_mode=True)
    kernels = layer.span(layer.reduce(pooled))
    b, c = x.shape[:2]
    ho, wo = kernels.shape[2:]
    cols = F.unfold(x, k, padding=k // 2, stride=s).view(b, g, c // g, k * k, ho, wo)
    return (cols * kernels.view(b, g, 1, k * k, ho, wo)).sum(3).view(b, c, ho, wo)


@pytest.mark.parametrize(
    ("stride", "size"), [(1, (9, 8)), (2, (9, 8)), (2, (16, 16)), (3, (7, 11))]
)
def test_involution_shape_and_reference(stride, size):
    layer = Involution2d(16, kernel_size=5, stride=stride, groups=4, reduction=4).double().eval()
    x = torch.randn(2, 16, *size, dtype=torch.float64)
    out = layer(x)
    assert out.shape == (2, 16, -(-size[0] // stride), -(-size[1] // stride))
    assert_close(out, involution_reference(layer, x))


def test_involution_defaults_and_backward():
    layer = Involution2d(32)
    assert (layer.kernel_size, layer.stride, layer.groups, layer.reduction) == (7, 1, 16, 4)
    assert layer.span.out_channels == 16 * 49 and layer.reduce[0].out_channels == 8
    x = torch.randn(2, 32, 10, 12, requires_grad=True)
    layer(x).square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in layer.parameters())


def test_local_filter2d_module_matches_functional():
    layer = LocalFilter2d(8, kernel_size=3, dilation=2, groups=2).double()
    x = torch.randn(2, 8, 7, 6, dtype=torch.float64)
    predicted = layer.predictor(x).view(2, 2, 9, 7, 6).softmax(2).view(2, 18, 7, 6)
    assert_close(layer(x), local_filter2d(x, predicted, 3, 2))
    assert_close(
        layer.predict_kernels(x).view(2, 2, 9, 7, 6).sum(2),
        torch.ones(2, 2, 7, 6, dtype=torch.float64),
    )
    given = torch.randn(2, 18, 7, 6, dtype=torch.float64)
    assert_close(layer(x, given), local_filter2d(x, given, 3, 2))


def test_local_filter2d_raw_and_parameter_free():
    raw = LocalFilter2d(4, kernel_size=5, groups=4, normalize="none").double()
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64)
    assert_close(raw(x), local_filter2d(x, raw.predictor(x), 5))
    fixed = LocalFilter2d(4, predict=False)
    assert list(fixed.parameters()) == []
    kernels = torch.randn(1, 9, 6, 6)
    assert_close(fixed(x.float(), kernels), local_filter2d(x.float(), kernels, 3))
    with pytest.raises(ValueError, match="no predictor"):
        fixed(x.float())
    assert "predict=False" in repr(fixed)


def test_registry_entries():
    assert LAYERS.get("involution") is Involution2d
    assert LAYERS.get("local_filter") is LocalFilter2d
    layer = LAYERS.build({"type": "involution", "channels": 8, "groups": 2, "kernel_size": 3})
    assert isinstance(layer, Involution2d) and layer(torch.randn(1, 8, 5, 5)).shape == (1, 8, 5, 5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        Involution2d(16, kernel_size=4)
    with pytest.raises(ValueError, match="groups must divide channels"):
        Involution2d(24, groups=16)
    with pytest.raises(ValueError, match="reduction must be <= channels"):
        Involution2d(16, groups=4, reduction=32)
    with pytest.raises(ValueError, match=r"stride must be in \[1, "):
        Involution2d(16, stride=0)
    with pytest.raises(TypeError, match="channels must be int"):
        Involution2d(16.0)
    with pytest.raises(ValueError, match="groups must divide channels"):
        LocalFilter2d(8, groups=3)


def test_forward_checks_the_input_shape():
    with pytest.raises(ValueError, match=r"x must have shape \(B, 8, H, W\), got \(1, 4, 8, 8\)"):
        LocalFilter2d(8)(torch.randn(1, 4, 8, 8))
