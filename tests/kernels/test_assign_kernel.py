"""Triton kernels of the anchor assignment against the torch path: bitwise, odd sizes, ties.

On CPU they run in triton's interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``);
`test_kernels_compile_for_every_gpu_target` compiles the launched specialisations for real GPU
targets (with the inline-PTX products the interpreter does not run).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from visionblocks.ops import best_box_iou, box_iou, match_anchors
from visionblocks.ops.assign import _reaches_torch

RUNNABLE = _TRITON_RUNNABLE
pytestmark = pytest.mark.skipif(not RUNNABLE, reason=_NO_TRITON)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def boxes(n: int, seed: int, device, dtype=torch.float32, size: float = 30.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = (torch.rand(n, 2, generator=g) * 100).round()  # half-exact corners: grid-like ties
    wh = (torch.rand(n, 2, generator=g) * size).round() + 1
    out = torch.cat([xy, xy + wh], 1)
    out[1::9, 2] = out[1::9, 0]  # zero-width boxes
    return out.to(device, dtype)


def match(anchors, gt, high, low, allow, **options):
    """`match_anchors` with its keyword arguments given by position."""
    return match_anchors(
        anchors, boxes=gt, high_threshold=high, low_threshold=low,
        allow_low_quality_matches=allow, **options,
    )  # fmt: skip


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))


@pytest.mark.parametrize("n", [1, 63, 64, 65, 700])
@pytest.mark.parametrize("m", [1, 31, 32, 33, 90])
def test_best_kernel_equals_torch(n, m, device):
    anchors, gt = boxes(n, n, device), boxes(m, 1000 + m, device)
    got = best_box_iou(anchors, gt, impl="triton")
    assert_same(got, best_box_iou(anchors, gt, impl="torch"))
    iou = box_iou(anchors, gt)
    assert torch.equal(got.anchor_indices, iou.max(1).indices)


@pytest.mark.parametrize("adtype", FLOATS)
@pytest.mark.parametrize("bdtype", [torch.float32, torch.float64, torch.float16])
def test_best_kernel_dtypes(adtype, bdtype, device):
    anchors, gt = boxes(150, 1, device, adtype), boxes(40, 2, device, bdtype)
    got = best_box_iou(anchors, gt, impl="triton")
    assert_same(got, best_box_iou(anchors, gt, impl="torch"))
    assert got.anchor_values.dtype == box_iou(anchors, gt).dtype


def test_more_tiles_than_programs(monkeypatch, device):
    from visionblocks.kernels import assign

    monkeypatch.setattr(assign, "_MAX_PROGRAMS", 3)
    anchors, gt = boxes(700, 3, device), boxes(45, 4, device)
    assert_same(best_box_iou(anchors, gt, impl="triton"), best_box_iou(anchors, gt, impl="torch"))


def test_exact_grid_ious_and_ties(device):
    # IoUs of exactly 0.5, 1/3 and 0, duplicated objects: thresholds and ties must fall
    # exactly where the matrix puts them (no fused multiply-add, an IEEE division).
    centres = torch.arange(16.0) * 4 + 4
    cy, cx = torch.meshgrid(centres, centres, indexing="ij")
    anchors = torch.cat(
        [torch.stack([cx - h, cy - h, cx + h, cy + h], -1).reshape(-1, 4) for h in (4.0, 8.0)]
    ).to(device)
    gt = torch.tensor(
        [[0.0, 0.0, 8.0, 8.0], [0.0, 0.0, 8.0, 8.0], [0.0, 0.0, 16.0, 8.0], [8, 8, 24, 24]],
        device=device,
    )
    iou = box_iou(anchors, gt)
    assert (iou == 0.5).any() and (iou == 1 / 3).any()
    got = best_box_iou(anchors, gt, impl="triton")
    assert_same(got, (*iou.max(1), iou.max(0).values))
    for allow in (False, True):
        for high, low in ((0.5, 0.4), (0.5, 1 / 3)):
            want = match(anchors, gt, high, low, allow, impl="torch")
            assert torch.equal(match(anchors, gt, high, low, allow, impl="triton"), want)


@pytest.mark.parametrize("n", [1, 64, 333])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_reaches_kernel_equals_torch(n, dtype, device):
    from visionblocks.kernels.assign import box_iou_reaches_triton

    anchors, gt = boxes(n, 5, device, dtype), boxes(37, 6, device, dtype)
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    iou = box_iou(anchors, gt)
    for targets in (iou.amax(0), iou[n // 2], torch.full((37,), float("nan"), device=device)):
        want = _reaches_torch(anchors.to(cdt), gt.to(cdt), 1e-7, targets, 10_000)
        got = box_iou_reaches_triton(anchors, gt, 1e-7, targets)
        assert got.dtype == torch.bool and torch.equal(got, want)
    assert box_iou_reaches_triton(anchors, gt, 1e-7, iou.amax(0)).any()


def test_nan_boxes(device):
    anchors, gt = boxes(100, 7, device), boxes(9, 8, device)
    anchors[10, 0] = float("nan")
    gt[3, 1] = float("nan")
    assert_same(best_box_iou(anchors, gt, impl="triton"), best_box_iou(anchors, gt, impl="torch"))
    for allow in (False, True):
        want = match(anchors, gt, 0.5, 0.4, allow, impl="torch")
        assert torch.equal(match(anchors, gt, 0.5, 0.4, allow, impl="triton"), want)


def test_auto_keeps_the_torch_path_and_triton_runs_the_kernels():
    from benchmarks.kernel_specs import record_launches

    anchors, gt = boxes(10, 9, "cpu"), boxes(3, 10, "cpu")
    with record_launches() as specs:
        match(anchors, gt, 0.5, 0.4, True)
    assert not specs  # "auto": the torch path (the kernels are not yet exact on a GPU)
    with record_launches() as specs:
        match(anchors, gt, 0.5, 0.4, True, impl="triton")
    assert {s.kernel.rpartition(":")[2] for s in specs} == {"_best_iou_kernel", "_reaches_kernel"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_large_equals_torch_and_matcher():
    from torchvision.models.detection._utils import Matcher

    anchors, gt = boxes(50_000, 11, "cuda", size=60.0), boxes(300, 12, "cuda", size=60.0)
    assert_same(best_box_iou(anchors, gt), best_box_iou(anchors, gt, impl="torch"))
    iou = box_iou(anchors, gt)
    for allow in (False, True):
        want = Matcher(0.5, 0.4, allow)(iou.T)
        assert torch.equal(match(anchors, gt, 0.5, 0.4, allow), want)


@pytest.mark.slow  # compiles 2 kernels x their dtypes for three GPU targets
def test_kernels_compile_for_every_gpu_target():
    from benchmarks.compile_kernels import TARGETS, compile_all
    from benchmarks.kernel_specs import record_launches

    with record_launches(execute=False) as specs:  # dry run: checked and recorded only
        for adtype in FLOATS:
            for bdtype in (adtype, torch.float32):
                a, b = boxes(70, 1, "cpu", adtype), boxes(5, 2, "cpu", bdtype)
                match(a, b, 0.5, 0.4, True, impl="triton")
    rows = compile_all([s._asdict() for s in specs], jobs=os.cpu_count())
    kernels_seen = {(r["kernel"].rpartition(":")[2], r["target"]) for r in rows}
    assert kernels_seen == {
        (k, t) for k in ("_best_iou_kernel", "_reaches_kernel") for t in TARGETS
    }
    bad = [f"{r['target']} {r['spec']['signature']}: {r['error']}" for r in rows if not r["ok"]]
    assert not bad, "\n".join(bad)
    cdts = {dict(map(tuple, r["spec"]["constexprs"]))["CDT"] for r in rows}
    assert cdts == {"tl.float32", "tl.float64"}


_PTX_OPCODES = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from benchmarks.compile_kernels import _decode
from visionblocks.kernels import assign

out = {}
for spec in json.load(sys.stdin):
    name = spec["kernel"].rpartition(":")[2]
    names = [p for p, _ in spec["signature"]]
    src = ASTSource(
        getattr(assign, name),
        dict(map(tuple, spec["signature"])),
        {(names.index(k),): _decode(v) for k, v in spec["constexprs"]},
    )
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": spec["num_warps"]}).asm["ptx"]
    cdt = dict(map(tuple, spec["constexprs"]))["CDT"]
    ops = re.findall(r"^\s*(?:@!?%p\d+\s+)?((?:fma|mad|div|rcp|mul|add|sub)\.[\w.]+)", ptx, re.M)
    out[f"{name} {cdt}"] = sorted(set(ops))
json.dump(out, sys.stdout)
"""


@pytest.mark.slow  # compiles 2 kernels x 2 compute dtypes for sm_90
def test_the_gpu_code_rounds_every_product_and_quotient_as_torch():
    """No FMA and no approximate division in the PTX (any triton version): ``div.full.f32``
    from ``tl.fdiv(ieee_rounding=True)`` under triton 3.6 made an H200 run differ from
    `box_iou` in the last bit."""
    import json
    import subprocess
    import sys

    from benchmarks.kernel_specs import record_launches

    with record_launches(execute=False) as specs:
        for dtype in (torch.float32, torch.float64):
            match(boxes(70, 1, "cpu", dtype), boxes(5, 2, "cpu", dtype), 0.5, 0.4, True,
                  impl="triton")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _PTX_OPCODES],
        input=json.dumps([s._asdict() for s in specs]),
        capture_output=True, text=True, env=env, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    opcodes = json.loads(run.stdout)
    assert set(opcodes) == {
        f"{k} tl.{d}"
        for k in ("_best_iou_kernel", "_reaches_kernel")
        for d in ("float32", "float64")
    }
    for kernel, ops in opcodes.items():
        floats = [op for op in ops if ".f32" in op or ".f64" in op]
        width = "f64" if "float64" in kernel else "f32"
        assert f"div.rn.{width}" in floats and f"mul.rn.{width}" in floats, (kernel, floats)
        inexact = [op for op in floats if op.startswith(("fma", "mad", "rcp")) or ".full" in op
                   or ".approx" in op or (op.startswith(("div", "mul")) and ".rn" not in op)]  # fmt: skip
        assert not inexact, (kernel, floats)
