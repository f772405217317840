"""Triton local_filter2d kernels against the torch formula: forward and backward, odd sizes."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close
from visionblocks.ops.local import local_filter2d

RUNNABLE = _TRITON_RUNNABLE
pytestmark = pytest.mark.skipif(not RUNNABLE, reason=_NO_TRITON)


def make(b, c, h, w, k, g, s, dtype, device):
    gen = torch.Generator().manual_seed(h * 100 + w * 10 + c + g)
    x = torch.randn(b, c, h, w, generator=gen)
    ker = torch.randn(b, g * k * k, -(-h // s), -(-w // s), generator=gen)
    go = torch.randn(b, c, -(-h // s), -(-w // s), generator=gen)
    return x.to(device, dtype), ker.to(device, dtype), go.to(device, dtype)


def run(x, ker, go, k, d, s, impl):
    x = x.clone().requires_grad_(True)
    ker = ker.clone().requires_grad_(True)
    out = local_filter2d(x, ker, k, d, stride=s, impl=impl)
    return (out, *torch.autograd.grad(out, (x, ker), go))


CASES = [  # (B, C, H, W, k, d, stride, G)
    (2, 4, 1, 1, 3, 1, 1, 1),
    (1, 4, 7, 9, 3, 1, 1, 4),
    (1, 6, 7, 9, 3, 2, 1, 1),
    (1, 3, 13, 17, 5, 1, 1, 1),
    (1, 4, 13, 17, 3, 2, 2, 2),
    (2, 2, 7, 9, 5, 1, 3, 1),
    (1, 20, 5, 6, 3, 1, 1, 1),  # more channels in a group than one channel block
    (1, 6, 5, 5, 3, 1, 1, 2),  # 3 channels per group in a block of 4
    (2, 3, 4, 5, 1, 1, 2, 3),  # 1 x 1 window, depthwise, strided
]
HALF_CASES = [CASES[1], CASES[4]]
PARAMS = [pytest.param(c, torch.float32, id="x".join(map(str, c))) for c in CASES] + [
    pytest.param(c, dt, id="x".join(map(str, c)) + "-" + str(dt)[6:])
    for c in HALF_CASES
    for dt in (torch.float16, torch.bfloat16)
]


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_kernel_matches_torch_forward_and_backward(case, dtype, device):
    b, c, h, w, k, d, s, g = case
    x, ker, go = make(b, c, h, w, k, g, s, dtype, device)
    expected = run(x, ker, go, k, d, s, "torch")
    actual = run(x, ker, go, k, d, s, "triton")
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype == dtype
        assert_close(a, e, dtype=dtype, scale=2.0)


def test_kernel_float64(device):
    x, ker, go = make(2, 4, 6, 5, 3, 2, 2, torch.float64, device)
    for a, e in zip(
        run(x, ker, go, 3, 2, 2, "triton"), run(x, ker, go, 3, 2, 2, "torch"), strict=True
    ):
        assert_close(a, e)


def test_kernel_non_contiguous_and_one_grad(device):
    x, ker, _ = make(1, 4, 6, 7, 3, 2, 1, torch.float32, device)
    x_nc = x.transpose(2, 3).contiguous().transpose(2, 3)
    ker_nc = ker.to(memory_format=torch.channels_last).requires_grad_(True)
    out = local_filter2d(x_nc, ker_nc, 3, impl="triton")
    assert_close(out, local_filter2d(x, ker, 3, impl="torch"))
    (gk,) = torch.autograd.grad(out.sum(), ker_nc)
    assert_close(gk, torch.autograd.grad(local_filter2d(x, ker.requires_grad_(), 3).sum(), ker)[0])


def test_kernel_empty(device):
    x = torch.randn(0, 4, 5, 5, device=device, requires_grad=True)
    ker = torch.randn(0, 18, 5, 5, device=device, requires_grad=True)
    out = local_filter2d(x, ker, 3, impl="triton")
    assert out.shape == (0, 4, 5, 5)
    gx, gk = torch.autograd.grad(out.sum(), (x, ker))
    assert gx.shape == x.shape and gk.shape == ker.shape
