"""Triton rotated RoI align kernels against the torch formula: forward, the gather backward,
bitwise determinism, gradcheck.

On CPU the kernels run in triton's interpreter (``TRITON_INTERPRET=1``), which is slow: a
few RoIs on maps of at most a few 8 x 8 tiles.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close, gradcheck
from tests.ops.test_rotated_roi_align import make_rois
from visionblocks.ops.rotated_roi_align import rotated_roi_align

pytestmark = pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)


def run(x, rois, grad_out, impl, *args):
    x = x.detach().clone().requires_grad_(True)
    out = rotated_roi_align(x, rois, *args, impl=impl)
    return out, torch.autograd.grad(out, x, grad_out.to(out.dtype))[0]


def inputs(n, c, height, width, k, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, height, width, generator=gen).to(device, dtype)
    rois = make_rois(k, n, height, width, seed=seed).to(device, torch.float32)
    return x, rois


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_kernel_matches_torch_forward_and_backward(dtype, sampling_ratio, device):
    x, rois = inputs(2, 3, 9, 11, 4, dtype, device, seed=sampling_ratio + 3)
    rois[0, 3:5] = 0  # no samples (adaptive) or all at the centre (fixed)
    grad_out = torch.randn(4, 3, 2, 3, device=device)
    expected = run(x, rois, grad_out, "torch", (2, 3), 1.0, sampling_ratio)
    actual = run(x, rois, grad_out, "triton", (2, 3), 1.0, sampling_ratio)
    for name, a, e in zip(("out", "grad"), actual, expected, strict=True):
        assert a.dtype == dtype
        assert_close(a, e, scale=2.0, msg=f"{name} differs")


@pytest.mark.slow
def test_kernel_float64_blocks_tiles_and_large_rois(device):
    # 33 channels (two channel blocks), 9 x 8 bins (two bin blocks), 9 x 10 pixels (four
    # tiles), a RoI larger than the map and one of many points per bin.
    x = torch.randn(1, 33, 9, 10, dtype=torch.float64, device=device)
    rois = torch.tensor(
        [[0, 8.0, 5.0, 24.0, 20.0, 20.0], [0, 3.0, 7.0, 2.5, 1.5, -130.0]],
        dtype=torch.float64, device=device,
    )  # fmt: skip
    grad_out = torch.randn(2, 33, 9, 8, dtype=torch.float64, device=device)
    for ratio in (-1, 3):
        expected = run(x, rois, grad_out, "torch", (9, 8), 0.5, ratio)
        actual = run(x, rois, grad_out, "triton", (9, 8), 0.5, ratio)
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e)


def test_kernel_gradcheck_float64(device):
    x, rois = inputs(1, 2, 5, 6, 3, torch.float64, device, seed=5)
    for ratio in (-1, 2):
        fn = lambda t, r=ratio: rotated_roi_align(t, rois, 2, 1.0, r, impl="triton")  # noqa: E731
        assert gradcheck(fn, [x], fast_mode=True)


def test_kernel_backward_is_bitwise_deterministic(device):
    x, rois = inputs(2, 2, 9, 7, 3, torch.float32, device, seed=6)
    rois = torch.cat([rois, rois])  # overlapping RoIs: shared pixels
    grad_out = torch.randn(6, 2, 2, 2, device=device)
    first = run(x, rois, grad_out, "triton", 2)
    second = run(x, rois, grad_out, "triton", 2)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_kernel_empty_non_contiguous_and_no_grad(device):
    x, rois = inputs(1, 3, 6, 7, 2, torch.float32, device, seed=7)
    out = rotated_roi_align(x, rois[:0], 2, impl="triton")
    assert out.shape == (0, 3, 2, 2)
    view = x.transpose(2, 3).contiguous().transpose(2, 3)
    assert_close(
        rotated_roi_align(view, rois, 2, impl="triton"), rotated_roi_align(x, rois, 2, impl="torch")
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_kernel_cuda_realistic_sizes():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 256, 50, 68, generator=gen).cuda()
    rois = make_rois(512, 2, 400, 544, seed=1).float().cuda()
    rois[:, 3:5] = rois[:, 3:5].clamp(max=300)
    grad_out = torch.randn(512, 256, 7, 7, generator=gen).cuda()
    for ratio in (0, 2):
        expected = run(x, rois, grad_out, "torch", 7, 0.125, ratio)
        actual = run(x, rois, grad_out, "triton", 7, 0.125, ratio)
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e, scale=4.0)
    torch.use_deterministic_algorithms(True)
    try:
        again = run(x, rois, grad_out, "triton", 7, 0.125, 0)
        assert torch.equal(again[1], run(x, rois, grad_out, "triton", 7, 0.125, 0)[1])
    finally:
        torch.use_deterministic_algorithms(False)
