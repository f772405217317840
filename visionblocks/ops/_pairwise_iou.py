"""Pairwise IoU / GIoU / DIoU / CIoU of two sets of boxes: values and analytic gradients.

`PairwiseIoUFunction` takes ``boxes1 (B, N, 4)`` and ``boxes2 (B, M, 4)`` (valid float32 or
float64 boxes: `visionblocks.ops._box_iou` upcasts, rescales and collapses inverted boxes
first) and returns the ``(B, N, M)`` matrix. Only the output is ``N×M``: the work runs on
pieces of whole rows (``r`` rows × ``M`` columns, about ``_PIECE`` pairs), on per-box planar
columns (`visionblocks.ops._iou_core`), and nothing ``N×M`` is saved for backward.

Backward recomputes each piece and reduces the gradient coefficients of `_iou_core.terms`
(already multiplied by the incoming gradient) over the piece's columns, giving each row's box
its gradient, and over its rows, adding to the column boxes' gradient; the per-box
coefficients are then turned into gradients with `_iou_core.combine` (``O(N + M)``). A plain
``.sum()`` upstream sends a broadcast gradient, whose single value multiplies the per-box
result instead of every pair.

Speed on CPU: rows are cut into parts that `visionblocks._core.parallel.parallel_for` spreads over
threads running torch with one intra-op thread each; each piece's ops write into a per-thread
`visionblocks._core.parallel.workspace` (allocated once, reused). Column sums are added per
part and then in part order, so results do not depend on the thread count. On GPUs the pieces
are ``_CUDA_PIECE`` pairs of whole-tensor ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.parallel import parallel_for
from visionblocks.ops import _iou_core
from visionblocks.ops._iou_core import (
    Arena,
    Side,
    arena,
    combine,
    fold_centre,
    rows_of_z,
    side,
    terms,
)

__all__ = ["PairwiseIoUFunction"]

_PIECE = 1 << 17  # pairs per piece on CPU (bench pairwise_*_3000: 64K and 256K are slower)
_PIECES_PER_PART = 1  # 3000×3000 gives 69 parts of 43 rows
_CUDA_PIECE = 1 << 20
_UNITS = 32  # piece-sized buffers a piece takes at most (CIoU backward: 31)
_MAX_WORKSPACE = 1 << 22  # a larger piece (one huge row) uses fresh buffers, not kept ones
_HALVES = torch.tensor([-0.5, -0.5, 0.5, 0.5])


def _planar(boxes: Tensor, kind: int, dim: int) -> Side:
    """Columns of ``boxes (B, K, 4)``: a `Side` of planar ``(4, B, K)`` coordinates with a
    size-1 dim inserted at ``dim`` (-1: rows ``(.., K, 1)``; -2: columns ``(.., 1, K)``)."""
    s = side(boxes.permute(2, 0, 1).contiguous(), kind)
    return Side(*(None if c is None else c.unsqueeze(dim) for c in s))


def _row_piece(s: Side, item: int, r0: int, r1: int) -> Side:
    """Rows ``r0:r1`` of batch item ``item``, shaped ``(.., r, 1)``."""
    angle = None if s.angle is None else s.angle[item, r0:r1]
    return Side(*(c[:, item, r0:r1] for c in s[:4]), s.area[item, r0:r1], angle)


def _col_piece(s: Side, item: int) -> Side:
    """All boxes of batch item ``item`` as columns, shaped ``(.., 1, M)``."""
    return Side(*(None if c is None else c[item] if c.dim() == 3 else c[:, item] for c in s))


Piece = Callable[[int, int, int, int, Arena, Side, Side], None]


def _sweep(a: Side, b: Side, fn: Piece) -> None:
    """Run ``fn(item, r0, r1, part, arena, rows, cols)`` on every piece: rows ``r0:r1`` of
    batch item ``item`` (`Side` ``rows``) against all its columns (``cols``); ``part`` is the
    first row of the piece's part."""
    batch, n = a.area.shape[:2]
    m = b.area.shape[-1]
    dtype, dev = a.area.dtype, a.area.device
    cpu = _iou_core.on_cpu(dev)
    step = max(1, (_PIECE if cpu else _CUDA_PIECE) // max(m, 1))

    def part(lo: int, hi: int) -> None:
        size = min(step, hi - lo) * m
        keep = cpu and size <= _MAX_WORKSPACE
        ws = arena("iou.pairwise", _UNITS, size, dtype, dev) if keep else Arena(None, dtype, dev)
        row, item, cols = lo, -1, b
        while row < hi:
            if row // n != item:
                item = row // n
                cols = _col_piece(b, item)
            r0 = row - item * n
            r1 = min(n, r0 + step, r0 + hi - row)
            fn(item, r0, r1, lo, ws.reset(), _row_piece(a, item, r0, r1), cols)
            row += r1 - r0

    parallel_for(part, batch * n, step * _PIECES_PER_PART if cpu else max(batch * n, 1))


class PairwiseIoUFunction(torch.autograd.Function):
    """``apply(boxes1, boxes2, kind, eps)``: ``(B, N, M)`` measures of valid boxes.

    ``kind`` is one of `_iou_core.IOU`, ``GIOU``, ``DIOU``, ``CIOU``; ``eps`` a 0-d tensor
    (`_iou_core.eps_tensor`). No double backward.
    """

    @staticmethod
    def forward(ctx, boxes1, boxes2, kind, eps):  # type: ignore[override]
        batch, n, m = boxes1.shape[0], boxes1.shape[1], boxes2.shape[1]
        out = boxes1.new_empty(batch, n, m)
        if out.numel():
            a, b = _planar(boxes1, kind, -1), _planar(boxes2, kind, -2)

            def piece(item: int, r0: int, r1: int, part: int, ws: Arena, ra: Side, cb: Side):
                terms(ra, cb, kind, eps, out[item, r0:r1], ws)

            _sweep(a, b, piece)
        ctx.save_for_backward(boxes1, boxes2, eps)
        ctx.kind = kind
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        boxes1, boxes2, eps = ctx.saved_tensors
        kind = ctx.kind
        batch, n, m = grad_out.shape
        dtype, dev = boxes1.dtype, boxes1.device
        k = rows_of_z(kind)
        row_sums = torch.zeros(k, batch, n, dtype=dtype, device=dev)
        col_sums = torch.zeros(k, batch, m, dtype=dtype, device=dev)
        # A broadcast gradient (after `.sum()`): one value, applied to the per-box results.
        uniform = grad_out.numel() > 0 and all(st == 0 for st in grad_out.stride())
        if grad_out.numel():
            a, b = _planar(boxes1, kind, -1), _planar(boxes2, kind, -2)
            sums: dict[tuple[int, int], Tensor] = {}  # (part, item) -> column sums

            def piece(item: int, r0: int, r1: int, part: int, ws: Arena, ra: Side, cb: Side):
                r = r1 - r0
                z = ws.take(k, r, m)
                go = None if uniform else grad_out[item, r0:r1]
                terms(ra, cb, kind, eps, ws.take(r, m), ws, z, go)
                torch.sum(z, -1, out=row_sums[:, item, r0:r1])
                acc = sums.get((part, item))
                if acc is None:
                    sums[(part, item)] = z.sum(1)
                else:
                    acc.add_(z.sum(1))

            _sweep(a, b, piece)
            for key in sorted(sums):  # part order: independent of the thread count
                col_sums[:, key[1]].add_(sums[key])
        grads = []
        for need, sums_, s, sigma in (
            (ctx.needs_input_grad[0], row_sums, boxes1, 1.0),
            (ctx.needs_input_grad[1], col_sums, boxes2, -1.0),
        ):
            if not need:
                grads.append(None)
                continue
            fold_centre(sums_, kind)
            wh = s.permute(2, 0, 1)[2:] - s.permute(2, 0, 1)[:2]
            g4 = combine(sums_, wh, kind, sigma, Arena(None, dtype, dev))
            factor = _HALVES.to(dtype=dtype, device=dev).view(4, 1, 1)
            if uniform:
                factor = factor * grad_out.reshape(-1)[0]
            grads.append((g4 * factor).permute(1, 2, 0).contiguous())
        return (*grads, None, None)
