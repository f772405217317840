"""The Triton kernel of the pairwise rotated IoU against the torch path, its fallback, and its
compilation for real GPU targets (no GPU needed)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.kernel_specs import record_launches
from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from visionblocks._core import dispatch
from visionblocks.kernels._launch import KernelFailure
from visionblocks.ops import nms_rotated, rotated_box_iou

RUNNABLE = _TRITON_RUNNABLE
pytestmark = pytest.mark.skipif(not RUNNABLE, reason=_NO_TRITON)


@pytest.fixture(autouse=True)
def _forget_failures():
    dispatch._failures.clear()
    yield
    dispatch._failures.clear()


def boxes_pair(n: int, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random boxes; with ``n, m >= 10``, pairs ``(i, i)`` for ``i < 10`` are the special
    cases: equal, 180 degrees apart, sides swapped with 90 degrees, nested, zero width, a
    point, touching, nearly coincident, far from the origin, equal."""
    g = torch.Generator().manual_seed(seed)

    def rand(k: int) -> torch.Tensor:
        xy = torch.rand(k, 2, generator=g) * 8
        wh = torch.rand(k, 2, generator=g) * 5 + 0.1
        return torch.cat([xy, wh, torch.rand(k, 1, generator=g) * 720 - 360], 1)

    a, b = rand(n), rand(m)
    if n < 10 or m < 10:
        return a, b
    a[8, :2] += 1e4
    cx, cy, w, h, r = a[:10].clone().unbind(1)
    rad = r * math.pi / 180
    b[0] = a[0]
    b[1] = a[1] + torch.tensor([0.0, 0.0, 0.0, 0.0, 180.0])
    b[2] = torch.stack([cx[2], cy[2], h[2], w[2], r[2] + 90])
    b[3] = torch.stack([cx[3], cy[3], w[3] * 0.4, h[3] * 0.4, r[3] + 17])
    b[4] = torch.stack([cx[4], cy[4], torch.tensor(0.0), h[4], r[4]])
    b[5] = torch.stack([cx[5], cy[5], torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0)])
    b[6] = torch.stack([cx[6] + w[6] * rad[6].cos(), cy[6] - w[6] * rad[6].sin(), w[6], h[6], r[6]])
    b[7] = a[7] + torch.tensor([0.0, 0.0, 0.0, 0.0, 1e-4])
    b[8] = a[8] + torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0])
    b[9] = a[9]
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape",
    # 110 and 851 pairs: a last program that is partly masked (32 pairs a program, 8 in
    # float64), rows that cross programs, and the special pairs of `boxes_pair`; the larger
    # one (more random pairs, slow in the interpreter) in the full run only.
    [(1, 1), (11, 10), pytest.param((37, 23), marks=pytest.mark.slow), (3, 70)],
)
def test_kernel_matches_the_torch_path(dtype, shape, device):
    a, b = boxes_pair(*shape, seed=shape[0])
    a, b = a.to(device, dtype), b.to(device, dtype)
    got = rotated_box_iou(a, b, impl="triton")
    want = rotated_box_iou(a, b, impl="torch")
    assert got.dtype == want.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    atol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    # exactly 1 for equal and equivalent boxes, 0 for degenerate ones, in the kernel too
    if shape[0] >= 10 and shape[1] >= 10:
        assert got[0, 0] == 1 and got[1, 1] == 1 and got[9, 9] == 1
        assert got[4, 4] == 0 and got[5, 5] == 0
        if dtype in (torch.float32, torch.float64):
            assert got[2, 2] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_reduces_angles_exactly(dtype, device):
    """As the torch path: thin boxes (aspect up to 1e6) at angles using every bit, and their
    exact 180- and 360-degree equivalents, give exactly 1 (the canonical angle is reduced
    with no rounding); the other pairs match the torch path."""
    g = torch.Generator().manual_seed(7)
    n = 12
    w = torch.rand(n, 1, generator=g, dtype=torch.float64) * 20 + 1
    h = w * 10 ** -(torch.rand(n, 1, generator=g, dtype=torch.float64) * 6)
    r = 256 + 256 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 10
    a = torch.cat([xy, w, h, r], 1).to(dtype)
    b = a.clone()
    b[:, 4] -= torch.tensor([180.0, 360.0] * (n // 2), dtype=dtype)
    a, b = a.to(device), b.to(device)
    got = rotated_box_iou(a, b, impl="triton")
    assert torch.equal(got.diagonal(), torch.ones(n, dtype=dtype, device=device))
    want = rotated_box_iou(a, b, impl="torch")
    atol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_kernel_empty_and_other_formats(device):
    a, b = boxes_pair(6, 5, seed=1)
    a, b = a.to(device), b.to(device)
    assert rotated_box_iou(a[:0], b, impl="triton").shape == (0, 5)
    assert rotated_box_iou(a, b[:0], impl="triton").shape == (6, 0)
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as TF

    corners = [
        TF.convert_bounding_box_format(
            x.cpu(),
            old_format=tv_tensors.BoundingBoxFormat.CXCYWHR,
            new_format=tv_tensors.BoundingBoxFormat.XYXYXYXY,
        ).to(device)
        for x in (a, b)
    ]
    got = rotated_box_iou(*corners, fmt="xyxyxyxy", impl="triton")
    want = rotated_box_iou(*corners, fmt="xyxyxyxy", impl="torch")
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def test_kernel_forward_takes_the_torch_gradient(device):
    a, b = boxes_pair(9, 7, seed=2)
    weight = torch.rand(9, 7, generator=torch.Generator().manual_seed(0)).to(device)
    grads = []
    for impl in ("triton", "torch"):
        x, y = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        out = rotated_box_iou(x, y, impl=impl)
        grads.append(torch.autograd.grad((out * weight).sum(), (x, y)))
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-6)


def test_kernel_launches_for_pairwise_2d_inputs_only(device):
    a, b = boxes_pair(5, 4, seed=3)
    a, b = a.to(device), b.to(device)
    with record_launches(execute=False) as specs:
        rotated_box_iou(a, b, impl="triton")
    assert {s.kernel.rpartition(":")[2] for s in specs} == {"_rotated_iou_kernel"}
    with record_launches(execute=False) as specs:
        rotated_box_iou(a[:4], b, aligned=True, impl="triton")  # aligned: the torch path
        rotated_box_iou(a[None], b[None], impl="triton")  # batched: the torch path
    assert specs == set()


def test_a_failing_kernel_falls_back_or_raises(monkeypatch, device):
    from visionblocks.kernels import rotated_iou

    class Broken:
        def __init__(self, real):
            self.fn = real.fn

        def __getitem__(self, grid):
            def run(**kwargs):
                raise RuntimeError("simulated compile error: invalid PTX")

            return run

    monkeypatch.setattr(rotated_iou, "_rotated_iou_kernel", Broken(rotated_iou._rotated_iou_kernel))
    a, b = boxes_pair(4, 3, seed=4)
    a, b = a.to(device), b.to(device)
    want = rotated_box_iou(a, b, impl="torch")
    with pytest.raises(KernelFailure, match="simulated compile error"):
        rotated_box_iou(a, b, impl="triton")
    # "auto" never picks triton on CPU; force the fused path as "auto" would on a GPU.
    monkeypatch.setattr("visionblocks.ops._rotated_overlap.use_triton", lambda *a, **k: True)
    with pytest.warns(RuntimeWarning, match=f"'rotated_box_iou' failed on {device.type}"):
        got = rotated_box_iou(a, b, impl="auto")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("n", [24, pytest.param(60, marks=pytest.mark.slow)])
def test_nms_through_the_kernel(n, device):
    a, _ = boxes_pair(n, 10, seed=5)
    scores = torch.rand(n, generator=torch.Generator().manual_seed(5))
    want = nms_rotated(a, scores, 0.2)
    assert 0 < len(want) < n  # some boxes suppressed, some kept
    with kernels_forced():
        got = nms_rotated(a.to(device), scores.to(device), 0.2)
    assert torch.equal(got.cpu(), want)


def kernels_forced():
    from visionblocks import use_impl

    return use_impl("triton")


@pytest.mark.slow
def test_compiles_for_gpu_targets_without_spills():
    """The launched specialisations (every box dtype) compile for sm_75, sm_80 and sm_90 with
    triton's compiler and ptxas, no spills (as tests/kernels/test_compile.py checks for the
    specialisations of benchmarks/kernel_specs.py)."""
    from benchmarks.compile_kernels import compile_all

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on CPU
    with record_launches(execute=False) as specs:
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            boxes = torch.rand(3, 5, dtype=dtype, device=device) * 90  # angles in degrees
            rotated_box_iou(boxes, boxes, impl="triton")
    rows = compile_all([s._asdict() for s in sorted(specs)], jobs=2)
    assert len(rows) == 4 * 3
    bad = [f"{r['target']} {r['spec']['signature'][0]}: {r['error']}" for r in rows if not r["ok"]]
    assert not bad, bad
    assert all(r["spill_stores"] == 0 and r["shared"] <= r["shared_limit"] for r in rows)
