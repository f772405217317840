"""Triton local-attention kernels against the torch formula: forward and backward, odd sizes.

On CPU the kernels run in triton's interpreter (``TRITON_INTERPRET=1``), which is slow:
sizes stay tiny and windows 3 x 3 (one 5 x 5 case).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close
from visionblocks.ops.local_attention import local_attention2d

RUNNABLE = _TRITON_RUNNABLE
pytestmark = pytest.mark.skipif(not RUNNABLE, reason=_NO_TRITON)


def run(q, k, v, grad_out, impl, *args):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = local_attention2d(q, k, v, *args, impl=impl)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out.to(out.dtype)))


def inputs(b, c, h, w, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, c, h, w, generator=gen).to(device, dtype) for _ in range(4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [(1, 1), (5, 7), (9, 11)])
@pytest.mark.parametrize(("dilation", "heads"), [(1, 1), (2, 2)])
def test_kernel_matches_torch_forward_and_backward(dtype, size, dilation, heads, device):
    q, k, v, grad_out = inputs(1, 4, *size, dtype, device, seed=size[0])
    expected = run(q, k, v, grad_out, "torch", 3, dilation, heads)
    actual = run(q, k, v, grad_out, "triton", 3, dilation, heads)
    for name, a, e in zip(("out", "grad_q", "grad_k", "grad_v"), actual, expected, strict=True):
        assert a.dtype == dtype
        assert_close(a, e, scale=2.0, msg=f"{name} differs")


def test_kernel_larger_window_and_heads_float64(device):
    q, k, v, grad_out = inputs(1, 6, 6, 5, torch.float64, device, seed=3)
    expected = run(q, k, v, grad_out, "torch", 5, 2, 3)
    actual = run(q, k, v, grad_out, "triton", 5, 2, 3)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)


def test_kernel_one_input_grad_and_non_contiguous(device):
    q, k, v, _ = inputs(1, 4, 5, 6, torch.float32, device, seed=4)
    views = [x.transpose(2, 3).contiguous().transpose(2, 3) for x in (q, k, v)]
    views[2].requires_grad_(True)
    out = local_attention2d(*views, 3, 1, 2, impl="triton")
    assert_close(out, local_attention2d(q, k, v, 3, 1, 2, impl="torch"))
    (grad_v,) = torch.autograd.grad(out.sum(), views[2])
    v_ref = v.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(local_attention2d(q, k, v_ref, 3, 1, 2).sum(), v_ref)
    assert_close(grad_v, ref)


def test_kernel_empty_batch(device):
    q = torch.randn(0, 4, 3, 3, device=device, requires_grad=True)
    out = local_attention2d(q, q, q, 3, impl="triton")
    assert out.shape == (0, 4, 3, 3)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert grad.shape == q.shape


@pytest.mark.parametrize(
    ("channels", "heads", "dtype"),
    [
        (40, 1, torch.float32),  # D = 40: one block of 64 lanes
        (80, 1, torch.float32),  # D = 80: blocks of 64, logits recomputed per block
        (160, 2, torch.float64),
        (136, 1, torch.bfloat16),
    ],
)
def test_kernel_wide_heads_loop_over_channel_blocks(channels, heads, dtype, device):
    q, k, v, grad_out = inputs(1, channels, 4, 5, dtype, device, seed=channels)
    expected = run(q, k, v, grad_out, "torch", 3, 1, heads)
    actual = run(q, k, v, grad_out, "triton", 3, 1, heads)
    for name, a, e in zip(("out", "grad_q", "grad_k", "grad_v"), actual, expected, strict=True):
        assert_close(a, e, scale=2.0, msg=f"{name} differs")
