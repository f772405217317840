"""Triton kernels of the anchor assignment's reductions (`visionblocks.ops.assign`).

Called by `visionblocks.ops.assign` (after validation) for CUDA tensors:

- ``best_box_iou_triton(anchors, boxes, eps)``: each anchor's best IoU and object, and each
  object's best IoU, i.e. ``iou.max(dim=1)`` and ``iou.max(dim=0).values`` of
  ``iou = box_iou(anchors, boxes)``;
- ``box_iou_reaches_triton(anchors, boxes, eps, targets)``: whether each anchor's IoU with
  some object ``j`` equals ``targets[j]`` (the second pass of ``allow_low_quality_matches``).

``anchors (N, 4)`` and ``boxes (M, 4)`` are ``"xyxy"`` boxes of any floating dtype, loaded in
their dtype and cast to the compute dtype (float32, float64 if either is float64) before any
math, as `box_iou`'s ``_upcast`` does. The IoU matrix is never stored: a program takes a tile
of ``BLOCK_N`` anchors and walks the objects ``BLOCK_M`` at a time.

Bitwise `box_iou`: every IoU is formed with the operations and roundings of the torch formula
(`visionblocks.ops.boxes._measure`), in the formula's order, products rounded on their own
(``mul.rn`` in inline PTX, never fused into an FMA) and an IEEE division (``div.rn``: triton's
``/`` and even ``tl.fdiv(ieee_rounding=True)`` can compile to an approximate one). Under
``TRITON_INTERPRET=1`` (NumPy, no FMA) they are plain NumPy operations. So thresholds and
ties fall exactly where they fall on the matrix.

Ties and NaN as ``torch.max``: the first best object (``tie_break_left``), and a NaN IoU
wins (as the key ``+inf``; an IoU is never ``+inf``), giving NaN.

Determinism: each anchor's results are written by one program; each program keeps a
running per-object maximum in its own row of a ``(programs, M)`` buffer (at most 1,024
rows, so ``O(M)`` memory), which torch reduces with ``amax`` afterwards. No atomics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from visionblocks._core.namespace import public_dir
from visionblocks.kernels._launch import INTERPRET, jit, launch, prepare, with_fallback

__all__ = ["best_box_iou_triton", "box_iou_reaches_triton"]
__dir__ = public_dir(__name__, __all__)

# Anchors per tile and objects per step, by compute dtype (float64 tiles are smaller: the
# float32 ones spill registers in float64).
_BLOCK_N = {torch.float32: 64, torch.float64: 32}
_BLOCK_M = {torch.float32: 32, torch.float64: 16}
_NUM_WARPS = 4
_MAX_PROGRAMS = 1024  # rows of the per-object partial maxima
_INF = tl.constexpr(float("inf"))

if INTERPRET:  # NumPy rounds every product on its own and divides exactly

    @triton.jit
    def _mul_rn(a, b, CDT: tl.constexpr):
        """``a * b`` rounded to nearest, never fused with a following add."""
        return a * b

    @triton.jit
    def _div_rn(a, b, CDT: tl.constexpr):
        """``a / b`` rounded to nearest (IEEE division)."""
        return a / b

else:

    @triton.jit
    def _rounded(a, b, F32: tl.constexpr, F64: tl.constexpr, CDT: tl.constexpr):
        """``a <op> b`` by the inline PTX instruction ``F32`` or ``F64`` (of ``CDT``)."""
        if CDT == tl.float64:  # noqa: SIM300 (CDT is a parameter)
            return tl.inline_asm_elementwise(
                F64, "=d,d,d", [a, b], dtype=tl.float64, is_pure=True, pack=1
            )
        else:
            return tl.inline_asm_elementwise(
                F32, "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
            )

    @triton.jit
    def _mul_rn(a, b, CDT: tl.constexpr):
        """``a * b`` rounded to nearest, never fused with a following add (``mul.rn``)."""
        return _rounded(a, b, "mul.rn.f32 $0, $1, $2;", "mul.rn.f64 $0, $1, $2;", CDT)

    @triton.jit
    def _div_rn(a, b, CDT: tl.constexpr):
        """``a / b`` rounded to nearest (``div.rn``): triton's float32 ``/`` is the
        approximate ``div.full.f32``, and ``tl.fdiv(ieee_rounding=True)`` gives ``div.rn``
        only from triton 3.8 (3.6 still emits ``div.full.f32``)."""
        return _rounded(a, b, "div.rn.f32 $0, $1, $2;", "div.rn.f64 $0, $1, $2;", CDT)


@triton.jit
def _relu(x):
    """``max(x, 0)`` keeping NaN (torch's ``clamp_min`` / ``relu``)."""
    return tl.where(x < 0, 0.0, x)


@triton.jit
def _load_anchors(a_ptr, rows, rmask, eps, CDT: tl.constexpr):
    """Corners of the anchors at ``rows`` and their areas (``eps`` where exactly zero)."""
    base = rows * 4
    x1 = tl.load(a_ptr + base, mask=rmask, other=0.0).to(CDT)
    y1 = tl.load(a_ptr + base + 1, mask=rmask, other=0.0).to(CDT)
    x2 = tl.load(a_ptr + base + 2, mask=rmask, other=1.0).to(CDT)
    y2 = tl.load(a_ptr + base + 3, mask=rmask, other=1.0).to(CDT)
    area = _mul_rn(_relu(x2 - x1), _relu(y2 - y1), CDT)
    area = tl.where(area == 0, tl.cast(eps, CDT), area)
    return x1, y1, x2, y2, area


@triton.jit
def _iou_tile(ax1, ay1, ax2, ay2, aarea, b_ptr, cols, cmask, CDT: tl.constexpr):
    """IoU ``(BLOCK_N, BLOCK_M)`` of the anchors with the objects at ``cols``: `_measure`'s
    kind 0, operation for operation."""
    base = cols * 4
    bx1 = tl.load(b_ptr + base, mask=cmask, other=0.0).to(CDT)
    by1 = tl.load(b_ptr + base + 1, mask=cmask, other=0.0).to(CDT)
    bx2 = tl.load(b_ptr + base + 2, mask=cmask, other=1.0).to(CDT)
    by2 = tl.load(b_ptr + base + 3, mask=cmask, other=1.0).to(CDT)
    barea = _mul_rn(_relu(bx2 - bx1), _relu(by2 - by1), CDT)
    dx = tl.minimum(ax2[:, None], bx2[None, :], propagate_nan=tl.PropagateNan.ALL) - tl.maximum(
        ax1[:, None], bx1[None, :], propagate_nan=tl.PropagateNan.ALL
    )
    dy = tl.minimum(ay2[:, None], by2[None, :], propagate_nan=tl.PropagateNan.ALL) - tl.maximum(
        ay1[:, None], by1[None, :], propagate_nan=tl.PropagateNan.ALL
    )
    inter = _mul_rn(_relu(dx), _relu(dy), CDT)
    union = (aarea[:, None] + barea[None, :]) - inter
    return _div_rn(inter, union, CDT)


@jit
def _best_iou_kernel(
    a_ptr, b_ptr, best_ptr, index_ptr, part_ptr,
    n: tl.int64, m: tl.int32, tiles: tl.int32, eps: tl.float32,
    CDT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    part_row = part_ptr + pid.to(tl.int64) * m
    for tile in range(pid, tiles, programs):
        rows = tl.cast(tile, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < n
        ax1, ay1, ax2, ay2, aarea = _load_anchors(a_ptr, rows, rmask, eps, CDT)
        best = tl.full([BLOCK_N], -_INF, CDT)
        index = tl.zeros([BLOCK_N], tl.int32)
        for start in range(0, m, BLOCK_M):
            cols = start + tl.arange(0, BLOCK_M)
            cmask = cols < m
            iou = _iou_tile(ax1, ay1, ax2, ay2, aarea, b_ptr, cols, cmask, CDT)
            key = tl.where(iou != iou, _INF, iou)  # NaN wins, as in torch.max
            row_key = tl.where(cmask[None, :], key, -_INF)
            tile_best, tile_index = tl.max(
                row_key, axis=1, return_indices=True, return_indices_tie_break_left=True
            )
            better = tile_best > best  # strict: an earlier object keeps a tie
            index = tl.where(better, tile_index + start, index)
            best = tl.where(better, tile_best, best)
            col_best = tl.max(tl.where(rmask[:, None], key, -_INF), axis=0)
            old = tl.load(part_row + cols, mask=cmask, other=-_INF)
            tl.store(part_row + cols, tl.maximum(old, col_best), mask=cmask)
        # inf - inf: NaN at run time (a NaN global constexpr trips triton's check that
        # globals are unchanged, since NaN != NaN)
        tl.store(best_ptr + rows, tl.where(best == _INF, best - best, best), mask=rmask)
        tl.store(index_ptr + rows, index.to(tl.int64), mask=rmask)


@jit
def _reaches_kernel(
    a_ptr, b_ptr, target_ptr, out_ptr, n: tl.int64, m: tl.int32, eps: tl.float32,
    CDT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n
    ax1, ay1, ax2, ay2, aarea = _load_anchors(a_ptr, rows, rmask, eps, CDT)
    hit = tl.zeros([BLOCK_N], tl.int32)
    for start in range(0, m, BLOCK_M):
        cols = start + tl.arange(0, BLOCK_M)
        cmask = cols < m
        iou = _iou_tile(ax1, ay1, ax2, ay2, aarea, b_ptr, cols, cmask, CDT)
        target = tl.load(target_ptr + cols, mask=cmask, other=0.0)
        equal = (iou == target[None, :]) & cmask[None, :]
        hit = tl.maximum(hit, tl.max(equal.to(tl.int32), axis=1))
    tl.store(out_ptr + rows, hit.to(tl.uint8), mask=rmask)


def _cdt(anchors: Tensor, boxes: Tensor) -> tuple[torch.dtype, tl.dtype]:
    if torch.float64 in (anchors.dtype, boxes.dtype):
        return torch.float64, tl.float64
    return torch.float32, tl.float32


def _eps32(eps: float) -> float:
    """``eps`` as a float32 kernel argument: a positive ``eps`` stays positive and finite (it
    only replaces a zero area, where the IoU is 0 for any positive value)."""
    if eps > 0:
        info = torch.finfo(torch.float32)
        eps = min(max(eps, info.tiny), info.max)
    return float(eps)


@with_fallback("best_box_iou")
def best_box_iou_triton(
    anchors: Tensor, boxes: Tensor, eps: float, reference: Callable | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(anchor_values (N,), anchor_indices (N,), box_values (M,))`` of ``box_iou``.

    Args:
        anchors (Tensor[N, 4]): Floating boxes, ``N >= 1``.
        boxes (Tensor[M, 4]): Floating boxes on the same device, ``M >= 1``.
        eps: `box_iou`'s ``eps``.
        reference: The torch path, run if the kernel fails (None: raise).

    Examples:
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="cuda")  # doctest: +SKIP
        >>> best_box_iou_triton(a, a, 1e-7)  # doctest: +SKIP
        (tensor([1.], device='cuda:0'), tensor([0], device='cuda:0'), tensor([1.], device='cuda:0'))
    """
    anchors, boxes = prepare(anchors), prepare(boxes)
    tdt, cdt = _cdt(anchors, boxes)
    n, m = anchors.shape[0], boxes.shape[0]
    tiles = triton.cdiv(n, _BLOCK_N[tdt])
    programs = min(tiles, _MAX_PROGRAMS)
    values = torch.empty(n, dtype=tdt, device=anchors.device)
    indices = torch.empty(n, dtype=torch.int64, device=anchors.device)
    part = torch.full((programs, m), float("-inf"), dtype=tdt, device=anchors.device)
    launch(
        "best_box_iou", _best_iou_kernel, (programs,), _NUM_WARPS,
        a_ptr=anchors, b_ptr=boxes, best_ptr=values, index_ptr=indices, part_ptr=part,
        n=n, m=m, tiles=tiles, eps=_eps32(eps), CDT=cdt, BLOCK_N=_BLOCK_N[tdt], BLOCK_M=_BLOCK_M[tdt],
    )  # fmt: skip
    box_values = part.amax(dim=0)
    return values, indices, box_values.masked_fill(box_values == float("inf"), float("nan"))


@with_fallback("match_anchors")
def box_iou_reaches_triton(
    anchors: Tensor,
    boxes: Tensor,
    eps: float,
    targets: Tensor,
    reference: Callable | None = None,
) -> Tensor:
    """Whether ``box_iou(anchors, boxes)[i, j] == targets[j]`` for some ``j``: bool ``(N,)``.

    Args:
        anchors (Tensor[N, 4]): Floating boxes, ``N >= 1``.
        boxes (Tensor[M, 4]): Floating boxes on the same device, ``M >= 1``.
        eps: `box_iou`'s ``eps``.
        targets (Tensor[M]): One value per object, in the compute dtype.
        reference: The torch path, run if the kernel fails (None: raise).

    Examples:
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="cuda")  # doctest: +SKIP
        >>> box_iou_reaches_triton(a, a, 1e-7, torch.ones(1, device="cuda"))  # doctest: +SKIP
        tensor([True], device='cuda:0')
    """
    anchors, boxes = prepare(anchors), prepare(boxes)
    tdt, cdt = _cdt(anchors, boxes)
    n, m = anchors.shape[0], boxes.shape[0]
    out = torch.empty(n, dtype=torch.uint8, device=anchors.device)
    launch(
        "match_anchors", _reaches_kernel, (triton.cdiv(n, _BLOCK_N[tdt]),), _NUM_WARPS,
        a_ptr=anchors, b_ptr=boxes, target_ptr=prepare(targets.to(tdt)), out_ptr=out,
        n=n, m=m, eps=_eps32(eps), CDT=cdt, BLOCK_N=_BLOCK_N[tdt], BLOCK_M=_BLOCK_M[tdt],
    )  # fmt: skip
    return out.bool()
