"""The deterministic Triton backward of the RoI pooling family against torchvision's backward.

On CPU the kernel runs in triton's interpreter (``TRITON_INTERPRET=1``): sizes stay small,
but maps span several ``8 x 16`` tiles and boxes cross tiles, borders and images.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tv

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from visionblocks.kernels import roi_align as kernel
from visionblocks.kernels._launch import KernelFailure
from visionblocks.ops import ps_roi_align, ps_roi_pool, roi_align, roi_pool

pytestmark = pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)

CASES = {
    "roi_align": (roi_align, tv.roi_align, (3, 0.5, -1, False)),
    "roi_align_aligned_sr2": (roi_align, tv.roi_align, ((2, 3), 0.5, 2, True)),
    "roi_align_sr1": (roi_align, tv.roi_align, (2, 1.0, 1, False)),
    "ps_roi_align": (ps_roi_align, tv.ps_roi_align, (2, 0.5, -1)),
    "ps_roi_align_sr3": (ps_roi_align, tv.ps_roi_align, ((1, 2), 0.7, 3)),
    "roi_pool": (roi_pool, tv.roi_pool, ((3, 2), 0.5)),
    "ps_roi_pool": (ps_roi_pool, tv.ps_roi_pool, (2, 0.6)),
}


def make_rois(n_images=2, size=36.0, dtype=torch.float64, seed=0):
    """Boxes of 0 to 20 pixels, some past the borders, one inverted, one degenerate, one
    larger than the map."""
    gen = torch.Generator().manual_seed(seed)
    k = 8
    xy = torch.rand(k, 2, generator=gen, dtype=torch.float64) * size - 4
    wh = torch.rand(k, 2, generator=gen, dtype=torch.float64) * 20
    wh[0], wh[1] = 0.0, -3.0
    boxes = torch.cat([xy, xy + wh], 1)
    boxes[2] = torch.tensor([-6.0, -5.0, 46.0, 26.0])
    index = (torch.arange(k) * 7 % n_images).to(torch.float64)[:, None]  # not sorted by image
    return torch.cat([index, boxes], 1).to(dtype)


def grads(fn, x, rois, args, grad, impl=None):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, rois, *args) if impl is None else fn(x, rois, *args, impl=impl)
    (g,) = torch.autograd.grad(out, x, grad)
    return out, g


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(name, torch.float64) for name in CASES]
    + [("roi_align", torch.float32), ("roi_pool", torch.float32)],
)
def test_backward_equals_torchvision(name, dtype):
    ours, theirs, args = CASES[name]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 11, 20, generator=gen, dtype=dtype)  # 2 x 2 tiles
    rois = make_rois(dtype=dtype)
    ref_out = theirs(x, rois, *args)
    grad = torch.randn(ref_out.shape, generator=gen, dtype=dtype)
    _, ref = grads(theirs, x, rois, args, grad)
    out, got = grads(ours, x, rois, args, grad, "triton")
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0, equal_nan=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("name", "boxes"),
    [
        ("roi_align", 4),  # the empty, inverted and larger-than-the-map boxes, and one more
        *(
            pytest.param(n, 8, marks=pytest.mark.slow)
            for n in ("roi_align", "ps_roi_align", "ps_roi_pool")
        ),
    ],
)
def test_backward_is_bitwise_reproducible(name, boxes):
    """Two runs give the same bits (the GPU version of this test, below, is the one that
    can fail with atomics)."""
    ours, _, args = CASES[name]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 11, 20, generator=gen)
    rois = make_rois(n_images=1, dtype=torch.float32)[:boxes]
    rois = torch.cat([rois, rois])  # boxes on the same pixels
    grad = torch.randn(ours(x, rois, *args).shape, generator=gen)
    first = grads(ours, x, rois, args, grad, "triton")[1]
    assert torch.equal(grads(ours, x, rois, args, grad, "triton")[1], first)


def test_half_input_empty_boxes_and_other_grad_layouts():
    x = torch.randn(2, 4, 9, 17).half().requires_grad_(True)
    rois = make_rois(dtype=torch.float32)
    roi_align(x, rois, 2, 0.5, impl="triton").float().sum().backward()
    x32 = x.detach().float().requires_grad_(True)
    tv.roi_align(x32, rois, 2, 0.5).sum().backward()
    assert x.grad.dtype == torch.float16
    torch.testing.assert_close(x.grad, x32.grad.half())
    y = torch.randn(1, 4, 5, 6, requires_grad=True)
    empty = roi_align(y, torch.zeros(0, 5), 2, impl="triton")
    (g,) = torch.autograd.grad(empty.sum(), y)
    assert torch.equal(g, torch.zeros_like(y))
    out = roi_align(y, torch.tensor([[0.0, 0.5, 0.5, 4.0, 3.0]]), 3, impl="triton")
    grad_out = torch.randn(1, 4, 3, 3).transpose(2, 3)  # a non-contiguous gradient
    (g,) = torch.autograd.grad(out, y, grad_out)
    (r,) = torch.autograd.grad(
        tv.roi_align(y, torch.tensor([[0.0, 0.5, 0.5, 4.0, 3.0]]), 3), y, grad_out
    )
    torch.testing.assert_close(g, r)


def test_failed_backward_takes_torchvision_gradients_or_raises_when_forced(monkeypatch):
    class Broken:
        fn = kernel._roi_pool_bwd_kernel.fn

        def __getitem__(self, grid):
            def run(**kwargs):
                raise RuntimeError("simulated compile error: invalid PTX")

            return run

    monkeypatch.setattr(kernel, "_roi_pool_bwd_kernel", Broken())
    x = torch.randn(1, 4, 6, 7, requires_grad=True)
    rois = torch.tensor([[0.0, 0.5, 0.5, 4.0, 3.0]])
    with pytest.raises(KernelFailure):
        roi_align(x, rois, 2, impl="triton").sum().backward()
    out = kernel.roi_pool_triton("roi_align", x, rois, 1.0, 2, 2, -1, False, forced=False)
    with pytest.warns(RuntimeWarning, match="'roi_align' failed on cpu"):
        (g,) = torch.autograd.grad(out.sum(), x)
    (r,) = torch.autograd.grad(tv.roi_align(x, rois, 2).sum(), x)
    torch.testing.assert_close(g, r)


def test_plan_covers_every_channel_and_pixel():
    p = kernel.plan("ps_roi_pool", (3, 4 * 49, 30, 50), (7, 7))
    assert p["grid"] == (3 * 4 * 4, 1, 49) and p["N_TILES"] == 16
    p = kernel.plan("roi_align", (1, 33, 8, 16), (7, 7))
    assert p["grid"] == (1, 3, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("name", ["roi_align", "ps_roi_align", "roi_pool", "ps_roi_pool"])
def test_cuda_deterministic_mode_runs_the_triton_backward(name):
    """Under deterministic algorithms torchvision's CUDA backward raises; ours runs, equals
    torchvision's (atomic) gradients to rounding and repeats bitwise."""
    ours, theirs, args = CASES[name]
    x = torch.randn(2, 256, 50, 68, device="cuda")
    rois = make_rois(size=60.0, dtype=torch.float32).repeat(50, 1).cuda()
    grad = torch.randn(theirs(x, rois, *args).shape, device="cuda")
    _, ref = grads(theirs, x, rois, args, grad)
    torch.use_deterministic_algorithms(True)
    try:
        first = grads(ours, x, rois, args, grad)[1]
        again = grads(ours, x, rois, args, grad)[1]
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(first, again)
    torch.testing.assert_close(first, ref, rtol=1e-4, atol=1e-4)
