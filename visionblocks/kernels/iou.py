"""Fused Triton kernels for the GIoU / DIoU / CIoU losses of aligned box pairs.

Called by `visionblocks.losses.iou` (after validation) as
``generalized_box_iou_loss_triton(pred, target, eps, reference=...)`` (and the
``distance_``/``complete_`` variants): ``(N, 4)`` xyxy boxes of one floating dtype; the
per-pair loss ``(N,)`` in float32 (float64 for float64 boxes), differentiable in both inputs.

One kernel body, specialised by the constexpr ``MODE`` (0 GIoU, 1 DIoU, 2 CIoU), one pair per
lane, coordinates cast to the compute dtype before any math. Forward writes the loss only;
backward recomputes the pair's terms (cheaper than saving them, and holds no memory) and
writes ``grad_out * dloss/dbox`` in each input's dtype, clamped to its finite range. The
formulas, the eps rule (`_nonzero`), the tie convention of ``max``/``min`` (ties split the
gradient, as autograd does) and the degenerate-box policy are those of the torch formula,
`visionblocks.ops.boxes._measure`. ``atan`` is a Cephes rational approximation (libdevice
does not run in the interpreter), taken of ``min / max`` of ``|w|, |h|``: no division by zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.namespace import public_dir
from visionblocks.kernels._launch import (
    KernelFailure,
    jit,
    launch,
    prepare,
    reference_grads,
    with_fallback,
)

__all__ = [
    "complete_box_iou_loss_triton",
    "distance_box_iou_loss_triton",
    "generalized_box_iou_loss_triton",
]
__dir__ = public_dir(__name__, __all__)

_BLOCK = 256  # pairs per program: one per thread (the pair terms need many registers)
_NUM_WARPS = 8
_GIOU, _DIOU, _CIOU = 0, 1, 2
_TWO_OVER_PI = tl.constexpr(2.0 / math.pi)
_HALF_PI = tl.constexpr(math.pi / 2)
_QUARTER_PI = tl.constexpr(math.pi / 4)
_HALF_MAX = tl.constexpr(65504.0)  # largest finite float16
_BF16_MAX = tl.constexpr(3.3895313892515355e38)  # largest finite bfloat16


@triton.jit
def _atan01(t):
    """``atan(t)`` for ``t`` in ``[0, 1]`` (Cephes ``atan``: reduction at 0.66, rational P/Q)."""
    mid = t > 0.66
    x = tl.where(mid, (t - 1.0) / (t + 1.0), t)
    z = x * x
    p = (((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z
          - 7.500855792314704667340e1) * z - 1.228866684490136173410e2) * z \
        - 6.485021904942025371773e1  # fmt: skip
    q = ((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z
          + 4.328810604912902668951e2) * z + 4.853903996359136964868e2) * z \
        + 1.945506571482613964425e2  # fmt: skip
    r = x + x * (z * p / q)
    return tl.where(mid, _QUARTER_PI + (r + 3.061616997868382943065e-17), r)


@triton.jit
def _angle(w, h):
    """``atan(w / h)``; ``+-pi/2`` where ``h = 0``, ``0`` for a point box."""
    a = tl.abs(w)
    b = tl.abs(h)
    big = tl.maximum(a, b)
    base = _atan01(tl.minimum(a, b) / tl.where(big > 0, big, 1.0))
    base = tl.where(a > b, _HALF_PI - base, base)
    return tl.where((w < 0) != (h < 0), -base, base)


@triton.jit
def _sign(a, b):
    """``sign(a - b)`` as 1, 0 or -1 in ``a``'s dtype."""
    return (a > b).to(a.dtype) - (a < b).to(a.dtype)


@triton.jit
def _load_box(ptr, base, mask, CDT: tl.constexpr):
    x1 = tl.load(ptr + base, mask=mask, other=0.0).to(CDT)
    y1 = tl.load(ptr + base + 1, mask=mask, other=0.0).to(CDT)
    x2 = tl.load(ptr + base + 2, mask=mask, other=1.0).to(CDT)
    y2 = tl.load(ptr + base + 3, mask=mask, other=1.0).to(CDT)
    return x1, y1, x2, y2


@triton.jit
def _store_box(ptr, base, mask, x1, y1, x2, y2):
    """Store a box's gradient in ``ptr``'s dtype, clamped to its finite range (half dtypes)."""
    ty = ptr.dtype.element_ty
    tl.store(ptr + base, _finite(x1, ty).to(ty), mask=mask)
    tl.store(ptr + base + 1, _finite(y1, ty).to(ty), mask=mask)
    tl.store(ptr + base + 2, _finite(x2, ty).to(ty), mask=mask)
    tl.store(ptr + base + 3, _finite(y2, ty).to(ty), mask=mask)


@triton.jit
def _finite(x, ty: tl.constexpr):
    """``x`` clamped to ``ty``'s finite range when ``ty`` is a half dtype (NaN stays NaN)."""
    if ty == tl.float16:
        x = tl.where(x > _HALF_MAX, _HALF_MAX, tl.where(x < -_HALF_MAX, -_HALF_MAX, x))
    elif ty == tl.bfloat16:
        x = tl.where(x > _BF16_MAX, _BF16_MAX, tl.where(x < -_BF16_MAX, -_BF16_MAX, x))
    return x


@triton.jit
def _nonzero(x, eps):
    """The eps rule: ``eps`` where ``x == 0``, ``x`` elsewhere."""
    return tl.where(x == 0, eps, x)


@triton.jit
def _pair_terms(p_ptr, g_ptr, base, mask, eps, MODE: tl.constexpr, CDT: tl.constexpr):
    """Loss and unit-grad-output gradients (pred, then target, xyxy: 9 values) of the pairs
    at ``base``.

    Computed as the measure ``m`` and its gradient, then negated: the loss is ``1 - m``.
    """
    px1, py1, px2, py2 = _load_box(p_ptr, base, mask, CDT)
    gx1, gy1, gx2, gy2 = _load_box(g_ptr, base, mask, CDT)
    w = px2 - px1
    h = py2 - py1
    wg = gx2 - gx1
    hg = gy2 - gy1
    dx = tl.minimum(px2, gx2) - tl.maximum(px1, gx1)  # overlap sides
    dy = tl.minimum(py2, gy2) - tl.maximum(py1, gy1)
    cw = (w + wg) - dx  # enclosing sides
    ch = (h + hg) - dy
    iw = tl.maximum(dx, 0.0)
    ih = tl.maximum(dy, 0.0)
    inter = iw * ih
    union = w * h + wg * hg - inter
    ue = _nonzero(union, eps)
    iou = inter / ue
    zero = tl.zeros_like(iou)
    kd_x = zero
    kd_y = zero
    c_ang = zero
    if MODE == 0:
        area_c = cw * ch
        ce = _nonzero(area_c, eps)
        pen = (area_c - union) / ce
        m = iou - pen
        g_u = 1.0 / ce - iou / ue  # dm/dU
        g_c = (pen - 1.0) / ce  # dm/dC
        kc_x = g_c * ch
        kc_y = g_c * cw
    else:
        qe = _nonzero(cw * cw + ch * ch, eps)
        ex = (px1 + px2) - (gx1 + gx2)  # twice the centre offset
        ey = (py1 + py2) - (gy1 + gy2)
        dist = (ex * ex + ey * ey) * 0.25
        m = iou - dist / qe
        g_u = -iou / ue
        g2q = 2.0 * (dist / qe) / qe  # twice dm/dQ (no qe * qe: it overflows for big boxes)
        kc_x = g2q * cw
        kc_y = g2q * ch
        kd_x = -0.5 * ex / qe  # dm/d(x1 or x2) through the centre
        kd_y = -0.5 * ey / qe
        if MODE == 2:
            dt = _TWO_OVER_PI * (_angle(wg, hg) - _angle(w, h))
            v = dt * dt
            sv = 1.0 - iou + v
            alpha = tl.where(sv > 0, v / tl.where(sv > 0, sv, 1.0), 0.0)
            m = m - alpha * v
            c_ang = 2.0 * _TWO_OVER_PI * alpha * dt  # dm/d angle_pred, alpha held constant
    g_i = 1.0 / ue - g_u  # dm/dI, through U as well
    ki_x = tl.where(iw > 0, g_i * ih, 0.0)  # torchvision's mask: iw > 0 and ih > 0
    ki_y = tl.where(ih > 0, g_i * iw, 0.0)
    m_x = (ki_x + kc_x) * 0.5
    m_y = (ki_y + kc_y) * 0.5
    k_x = (ki_x - kc_x) * 0.5
    k_y = (ki_y - kc_y) * 0.5
    n_p = w * w + h * h
    n_g = wg * wg + hg * hg
    cn_p = c_ang / tl.where(n_p == 0, 1.0, n_p)  # a point box: w = h = 0 below anyway
    cn_g = c_ang / tl.where(n_g == 0, 1.0, n_g)
    wp_x = h * (g_u + cn_p) + m_x
    wp_y = w * (g_u - cn_p) + m_y
    wg_x = hg * (g_u - cn_g) + m_x
    wg_y = wg * (g_u + cn_g) + m_y
    slx = k_x * _sign(px1, gx1)
    sly = k_y * _sign(py1, gy1)
    shx = k_x * _sign(px2, gx2)
    shy = k_y * _sign(py2, gy2)
    # One flat tuple: triton 3.0 to 3.2 cannot return nested ones.
    return (
        1.0 - m,
        wp_x + slx - kd_x, wp_y + sly - kd_y, shx - wp_x - kd_x, shy - wp_y - kd_y,
        wg_x - slx + kd_x, wg_y - sly + kd_y, -wg_x - shx + kd_x, -wg_y - shy + kd_y,
    )  # fmt: skip


@jit
def _iou_loss_fwd_kernel(
    p_ptr, g_ptr, loss_ptr, n: tl.int64, eps: tl.float32,
    MODE: tl.constexpr, CDT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    loss, _, _, _, _, _, _, _, _ = _pair_terms(p_ptr, g_ptr, offs * 4, mask, eps, MODE, CDT)
    tl.store(loss_ptr + offs, loss.to(loss_ptr.dtype.element_ty), mask=mask)


@jit
def _iou_loss_bwd_kernel(
    p_ptr, g_ptr, go_ptr, gp_ptr, gg_ptr, n: tl.int64, eps: tl.float32,
    grad_p: tl.int32, grad_g: tl.int32,
    MODE: tl.constexpr, CDT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    base = offs * 4
    _, p0, p1, p2, p3, g0, g1, g2, g3 = _pair_terms(p_ptr, g_ptr, base, mask, eps, MODE, CDT)
    go = tl.load(go_ptr + offs, mask=mask, other=0.0).to(CDT)
    if grad_p != 0:
        _store_box(gp_ptr, base, mask, p0 * go, p1 * go, p2 * go, p3 * go)
    if grad_g != 0:
        _store_box(gg_ptr, base, mask, g0 * go, g1 * go, g2 * go, g3 * go)


def _cdt(dtype: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


_OPS = ("generalized_box_iou_loss", "distance_box_iou_loss", "complete_box_iou_loss")


class _BoxIoULossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pred, target, eps, mode, reference):  # type: ignore[override]
        pred, target = prepare(pred), prepare(target)
        if eps > 0:  # a float32 kernel argument: keep a rescaled eps positive and finite
            info = torch.finfo(torch.float32)
            eps = min(max(eps, info.tiny), info.max)
        n = pred.shape[0]
        tdt, cdt = _cdt(pred.dtype)
        loss = torch.empty(n, dtype=tdt, device=pred.device)
        if n:
            launch(
                _OPS[mode], _iou_loss_fwd_kernel, (triton.cdiv(n, _BLOCK),), _NUM_WARPS,
                p_ptr=pred, g_ptr=target, loss_ptr=loss, n=n, eps=eps,
                MODE=mode, CDT=cdt, BLOCK=_BLOCK,
            )  # fmt: skip
        ctx.save_for_backward(pred, target)
        ctx.mode, ctx.eps, ctx.reference = mode, eps, reference
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        pred, target = ctx.saved_tensors
        need_p, need_g = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_p = torch.empty_like(pred) if need_p else None
        grad_g = torch.empty_like(target) if need_g else None
        n = pred.shape[0]
        try:
            if n and (need_p or need_g):
                launch(
                    _OPS[ctx.mode], _iou_loss_bwd_kernel, (triton.cdiv(n, _BLOCK),), _NUM_WARPS,
                    p_ptr=pred, g_ptr=target, go_ptr=prepare(grad_out),
                    gp_ptr=pred if grad_p is None else grad_p,  # never written without grad_p
                    gg_ptr=target if grad_g is None else grad_g,
                    n=n, eps=ctx.eps, grad_p=int(need_p), grad_g=int(need_g),
                    MODE=ctx.mode, CDT=_cdt(pred.dtype)[1], BLOCK=_BLOCK,
                )  # fmt: skip
        except KernelFailure as exc:
            grads = reference_grads(
                _OPS[ctx.mode], exc, ctx.reference, (pred, target, ctx.eps),
                ctx.needs_input_grad[:3], (grad_out,),
            )  # fmt: skip
            return (*grads, None, None)
        return grad_p, grad_g, None, None, None


_Reference = Callable[[Tensor, Tensor, float], Tensor]


@with_fallback("generalized_box_iou_loss")
def generalized_box_iou_loss_triton(
    pred: Tensor, target: Tensor, eps: float, reference: _Reference | None = None
) -> Tensor:
    """Per-pair GIoU loss ``(N,)`` of ``(N, 4)`` boxes (fused forward and backward).

    ``reference(pred, target, eps)`` is the torch path, run instead if a kernel fails (None:
    raise `KernelFailure` instead).

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="cuda")  # doctest: +SKIP
        >>> generalized_box_iou_loss_triton(pred, pred + 1, 1e-7)  # doctest: +SKIP
        tensor([1.0794], device='cuda:0')
    """
    return _BoxIoULossTriton.apply(pred, target, eps, _GIOU, reference)


@with_fallback("distance_box_iou_loss")
def distance_box_iou_loss_triton(
    pred: Tensor, target: Tensor, eps: float, reference: _Reference | None = None
) -> Tensor:
    """Per-pair DIoU loss ``(N,)`` of ``(N, 4)`` boxes; as `generalized_box_iou_loss_triton`.

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="cuda")  # doctest: +SKIP
        >>> distance_box_iou_loss_triton(pred, pred + 1, 1e-7)  # doctest: +SKIP
        tensor([0.9683], device='cuda:0')
    """
    return _BoxIoULossTriton.apply(pred, target, eps, _DIOU, reference)


@with_fallback("complete_box_iou_loss")
def complete_box_iou_loss_triton(
    pred: Tensor, target: Tensor, eps: float, reference: _Reference | None = None
) -> Tensor:
    """Per-pair CIoU loss ``(N,)`` of ``(N, 4)`` boxes; as `generalized_box_iou_loss_triton`.

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0]], device="cuda")  # doctest: +SKIP
        >>> complete_box_iou_loss_triton(pred, pred + 1, 1e-7)  # doctest: +SKIP
        tensor([0.9683], device='cuda:0')
    """
    return _BoxIoULossTriton.apply(pred, target, eps, _CIOU, reference)
