"""The lean torch path of aligned box pairs: the GIoU / DIoU / CIoU losses and aligned IoUs.

One ``torch.autograd.Function`` (`AlignedIoUFunction`): forward computes, for ``N`` pairs of
``(N, 4)`` boxes, the measure (aligned `visionblocks.ops.boxes` ops) or the loss ``1 - measure``
(`visionblocks.ops.iou_loss`), per pair or summed, *and*, for the inputs that need it, the
analytic gradient of each pair's value with respect to its 8 coordinates, in one sweep
(formulas and eps rule: `visionblocks.ops._iou_core`). It saves only those ``(N, 4)``
gradients; backward is one multiplication by the incoming gradient (none after a plain sum).
No double backward.

Speed on CPU: float32 pairs go to a C kernel (`visionblocks.ops._iou_loss_native`, built on
first use; one loop per pair computes the value and the gradients in registers, 5-7x faster
than the torch ops below on 1M pairs) when it is available and may read the tensors' memory
(`visionblocks._core.native.plain`: no trace, compile, vmap or forward-mode dual). It splits the
pairs into the same parts, and its sums, too, do not depend on the thread count.

Otherwise (float64, no C compiler, ``VISIONBLOCKS_DISABLE_NATIVE=1``, a trace) torch ops run:
the pairs are cut into parts that `visionblocks._core.parallel.parallel_for` spreads over threads
running torch with one intra-op thread each (one fork/join per call, so a busy neighbour
delays one part, not every op). A part works on pieces of ``_PIECE`` pairs: it gathers their
coordinates into planar rows (``x1``, ``y1``, ``x2``, ``y2`` of both boxes, one ``stack``),
runs every op on contiguous piece-sized buffers carved from a per-thread
`visionblocks._core.parallel.workspace` (allocated once, reused), and stores the gradient back with
one transposing multiply. Summed values add per-piece sums in part order, so they do not
depend on the thread count. On GPUs the sweep runs whole-tensor ops on pieces of
``_CUDA_PIECE`` pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.parallel import parallel_for
from visionblocks.ops import _iou_core
from visionblocks.ops._iou_core import (
    CIOU,
    DIOU,
    GIOU,
    IOU,
    Arena,
    Side,
    arena,
    combine,
    fold_centre,
    rows_of_z,
    terms,
)
from visionblocks.ops._iou_loss_native import native_sweep

__all__ = ["CIOU", "DIOU", "GIOU", "IOU", "AlignedIoUFunction", "aligned_sweep"]

_PIECE = 1 << 16  # pairs per piece on CPU (bench *_loss_1m: 16K and 128K are slower)
_PIECES_PER_PART = 1  # the unit of load balancing: 1M pairs give 16 parts
_CUDA_PIECE = 1 << 20
_UNITS = 56  # piece-sized buffers a piece takes at most (CIoU, both gradients: 55)
_ONE = torch.ones(())
#: Multiplies the planar output of `combine` into a gradient: lo corners were negated and
#: everything doubled.
_HALVES = (-0.5, -0.5, 0.5, 0.5)


def _sides(ab: Tensor, kind: int, ws: Arena) -> tuple[Side, Side]:
    """Both sides' columns from planar boxes ``(2, 4, n)``, one op per quantity."""
    n = ab.shape[-1]
    wh, area = ws.take(2, 2, n), ws.take(2, n)
    angle = ws.take(2, n) if kind == CIOU else None

    def views(_: Tensor) -> tuple:
        a_lo, a_hi = ab[:, :2], ab[:, 2:]
        sides = tuple(
            Side(ab[i], a_lo[i], a_hi[i], wh[i], area[i], None if angle is None else angle[i])
            for i in (0, 1)
        )
        return a_lo, a_hi, wh[:, 0], wh[:, 1], sides

    a_lo, a_hi, w, h, sides = ws.cached(ab, "sides", views)
    torch.sub(a_hi, a_lo, out=wh)
    torch.mul(w, h, out=area)
    if angle is not None:
        torch.div(w, h, out=angle)
        # atan(w / h): +-pi/2 for h = 0, and 0 for a point box (0 / 0), as in the losses' notes.
        angle.nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf")).atan_()
    return sides


def aligned_sweep(
    pred: Tensor,
    target: Tensor,
    kind: int,
    eps: Tensor,
    *,
    loss: bool,
    reduce_sum: bool,
    need_pred: bool,
    need_target: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Value (``(N,)``, or its 0-d sum) and the unit-grad-output gradients ``(N, 4)`` asked for.

    ``pred`` and ``target`` are ``(N, 4)`` boxes of one float32/float64 dtype and device;
    ``loss`` returns ``1 - measure`` (and its gradient); ``eps`` is a 0-d tensor
    (`visionblocks.ops._iou_core.eps_tensor`).
    """
    n = int(pred.shape[0])  # a tensor while tracing: the trace is specific to N
    dtype, dev = pred.dtype, pred.device
    cpu = _iou_core.on_cpu(dev)
    if cpu:
        found = native_sweep(
            pred, target, kind, eps, loss=loss, reduce_sum=reduce_sum,
            need_pred=need_pred, need_target=need_target, grain=_PIECE * _PIECES_PER_PART,
        )  # fmt: skip
        if found is not None:
            return found
    values = None if reduce_sum else pred.new_empty(n)
    grads = [pred.new_empty(n, 4) if need else None for need in (need_pred, need_target)]
    want_grad = need_pred or need_target
    factor = torch.tensor(_HALVES, dtype=dtype, device=dev)
    if loss:
        factor = factor.neg_()
    rows = rows_of_z(kind)
    piece = _PIECE if cpu else _CUDA_PIECE

    def part(lo: int, hi: int) -> Tensor | None:
        size = min(piece, hi - lo)
        ws = arena("iou.aligned", _UNITS, size, dtype, dev)
        sums = []
        for start in range(lo, hi, size):
            stop = min(hi, start + size)
            m = stop - start
            ws.reset()
            ab = ws.take(2, 4, m)
            columns = (*pred[start:stop].unbind(1), *target[start:stop].unbind(1))
            torch.stack(columns, out=ws.cached(ab, "flat", lambda t: t.view(8, -1)))
            a, b = _sides(ab, kind, ws)
            out = ws.take(m) if values is None else values[start:stop]
            z = ws.take(rows, m) if want_grad else None
            terms(a, b, kind, eps, out, ws, z)
            if loss:
                torch.sub(_ONE, out, out=out)
            if values is None:
                sums.append(out.sum())
            if z is None:
                continue
            fold_centre(z, kind)
            mark = ws.mark()
            for grad, s, sigma in ((grads[0], a, 1.0), (grads[1], b, -1.0)):
                if grad is not None:
                    ws.release(mark)
                    g4 = combine(z, s.wh, kind, sigma, ws)
                    torch.mul(ws.cached(g4, "t", Tensor.t), factor, out=grad[start:stop])
        return torch.stack(sums).sum() if sums else None

    grain = piece * _PIECES_PER_PART if cpu else max(n, 1)
    if torch.jit.is_tracing():  # one part, in this thread: a trace records only its own ops
        grain = max(n, 1)
    results = parallel_for(part, n, grain)
    if values is None:
        values = torch.stack(results).sum() if results else pred.new_zeros(())
    return values, grads[0], grads[1]


class AlignedIoUFunction(torch.autograd.Function):
    """Aligned measure or loss of ``(N, 4)`` float32/float64 box pairs; analytic backward.

    ``apply(pred, target, kind, eps, loss, reduce_sum)``: ``kind`` one of `IOU`, `GIOU`,
    `DIOU`, `CIOU` (`IOU` only as a measure), ``eps`` a 0-d tensor
    (`visionblocks.ops._iou_core.eps_tensor`); returns ``(N,)`` values or their 0-d sum.
    """

    @staticmethod
    def forward(ctx, pred, target, kind, eps, loss, reduce_sum):  # type: ignore[override]
        need_p, need_g = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        value, grad_p, grad_g = aligned_sweep(
            pred, target, kind, eps, loss=loss, reduce_sum=reduce_sum,
            need_pred=need_p, need_target=need_g,
        )  # fmt: skip
        ctx.save_for_backward(grad_p, grad_g)
        return value

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        grads = ctx.saved_tensors
        if grad_out.dim() == 0:
            if grad_out.device.type == "cpu" and grad_out.item() == 1:
                return (*grads, None, None, None, None)  # after a plain sum: the gradient itself
            scale = grad_out
        else:
            scale = grad_out.unsqueeze(-1)
        # Out of place: backward may run twice (retain_graph).
        return (*(None if g is None else g * scale for g in grads), None, None, None, None)
