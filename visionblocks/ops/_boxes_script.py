"""TorchScript paths of the box ops and the IoU losses: plain, scriptable reference formulas.

`torch.jit.script` compiles the public functions of `visionblocks.ops.boxes` and
`visionblocks.ops.iou_loss` down to these (the validated fast paths sit under
``if not torch.jit.is_scripting():``, which the compiler skips). Same formulas, same order
of operations and the same numerics as the element-wise core `visionblocks.ops._iou_core`:
the eps rule (``eps`` only where a denominator is exactly zero), the power-of-two rescaling of
huge and tiny boxes (`visionblocks.ops._box_iou.power_of_two_scale`), inverted boxes collapsed
by the box ops, ``atan(w / h)`` as ``+-pi/2`` for ``h = 0`` and 0 for a point box. Values equal
the eager ones up to rounding (identical boxes give exactly 1, zero-area boxes exactly 0).

Differences from the eager paths: whole-tensor ops (a pairwise call materialises a few
``(..., N, M)`` temporaries), gradients by autograd of the formulas below (finite for
degenerate boxes when ``eps > 0``; CIoU's ``alpha`` detached; half-precision gradients not
clamped), only the shape and ``eps`` checks that need no host read, no Triton kernel, and
the losses always rescale huge or tiny boxes (no value checks: a non-finite ``target`` is not
rejected).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "from_xyxy",
    "script_area",
    "script_convert",
    "script_iou_loss",
    "script_overlap",
    "to_xyxy",
]

# TorchScript reads no module globals: the constants are written out where they are used.
# 4 / pi^2 (CIoU's K); 28 (`visionblocks.ops._box_iou.SAFE_EXPONENT`); torch.finfo's tiny/max.


def _limits(dtype: torch.dtype) -> tuple[float, float]:
    """``(tiny, max)`` of float32 or float64 (``torch.finfo`` is not scriptable)."""
    if dtype == torch.float64:
        return 2.2250738585072014e-308, 1.7976931348623157e308
    return 1.1754943508222875e-38, 3.4028234663852886e38


def to_xyxy(boxes: Tensor, fmt: str) -> Tensor:
    a, b, c, d = boxes.unbind(-1)
    if fmt == "xywh":
        return torch.stack((a, b, a + c, b + d), dim=-1)
    if fmt == "cxcywh":
        return torch.stack((a - 0.5 * c, b - 0.5 * d, a + 0.5 * c, b + 0.5 * d), dim=-1)
    return boxes


def from_xyxy(boxes: Tensor, fmt: str) -> Tensor:
    x1, y1, x2, y2 = boxes.unbind(-1)
    if fmt == "xywh":
        return torch.stack((x1, y1, x2 - x1, y2 - y1), dim=-1)
    if fmt == "cxcywh":
        return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), dim=-1)
    return boxes


def _check_last_dim(name: str, boxes: Tensor) -> None:
    if boxes.dim() == 0 or boxes.shape[-1] != 4:
        raise ValueError(name + " must have shape (..., 4), got " + str(boxes.shape))


def script_convert(boxes: Tensor, in_fmt: str, out_fmt: str) -> Tensor:
    """`visionblocks.ops.boxes.box_convert`."""
    formats = ["xyxy", "xywh", "cxcywh"]
    if in_fmt not in formats or out_fmt not in formats:
        raise ValueError(
            "box formats must be 'xyxy', 'xywh' or 'cxcywh', got " + in_fmt + ", " + out_fmt
        )
    _check_last_dim("boxes", boxes)
    if in_fmt == out_fmt:
        return boxes.clone()
    return from_xyxy(to_xyxy(boxes, in_fmt), out_fmt)


def script_area(boxes: Tensor) -> Tensor:
    """`visionblocks.ops.boxes.box_area` (torchvision's ``_upcast`` dtypes)."""
    _check_last_dim("boxes", boxes)
    if boxes.is_floating_point():
        if boxes.dtype != torch.float32 and boxes.dtype != torch.float64:
            boxes = boxes.float()
    elif boxes.dtype != torch.int32 and boxes.dtype != torch.int64:
        boxes = boxes.int()
    x1, y1, x2, y2 = boxes.unbind(-1)
    return (x2 - x1) * (y2 - y1)


def _iou_dtype(boxes1: Tensor, boxes2: Tensor) -> torch.dtype:
    """`visionblocks.ops._box_iou.iou_dtype`: float64 / float32 kept, else the default dtype."""
    dtype = torch.promote_types(boxes1.dtype, boxes2.dtype)
    if dtype == torch.float32 or dtype == torch.float64:
        return dtype
    if boxes1.is_complex() or boxes2.is_complex():
        raise TypeError("boxes must be real (floating-point or integer)")
    return torch.empty(0).dtype  # torch.get_default_dtype(), which is not scriptable


def _power_of_two_scale(boxes: list[Tensor]) -> Tensor:
    """`visionblocks.ops._box_iou.power_of_two_scale`: 0-d ``2**-k``, exact, on the device."""
    dtype, device = boxes[0].dtype, boxes[0].device
    extremes: list[Tensor] = []
    for b in boxes:
        if b.numel() > 0:
            lo, hi = torch.aminmax(b.detach())
            extremes.append(lo)
            extremes.append(hi)
    if len(extremes) == 0:
        return torch.ones((), dtype=dtype, device=device)
    largest = torch.stack(extremes).abs().amax()
    exponent = torch.frexp(largest)[1]
    lowest = -1022 if dtype == torch.float64 else -126  # exponent of the smallest normal
    down = (exponent - 28).clamp_min(0)
    up = exponent.clamp(lowest, 0)
    shift = torch.where(exponent < 0, up, down)
    shift = torch.where(torch.isfinite(largest) & (largest > 0), shift, torch.zeros_like(shift))
    two = torch.full((), 2.0, dtype=dtype, device=device)
    return torch.pow(two, shift.neg().to(dtype))  # exact: a normal power of two


def _eps_tensor(eps: float, area_scale: Tensor, dtype: torch.dtype) -> Tensor:
    """`visionblocks.ops._iou_core.eps_tensor` with an ``area_scale``."""
    scaled = area_scale.to(dtype) * eps
    if eps > 0:
        tiny, big = _limits(dtype)
        scaled = scaled.clamp(tiny, big)
    return scaled


def _nonzero(x: Tensor, eps: Tensor) -> Tensor:
    """The eps rule: ``x + eps`` where ``x == 0``, ``x`` (exactly) elsewhere."""
    return x.addcmul(torch.eq(x, 0).to(x.dtype), eps)


def _angle(w: Tensor, h: Tensor) -> Tensor:
    """``atan(w / h)``: ``+-pi/2`` for ``h = 0`` and 0 for a point box (no gradient there)."""
    flat = h == 0
    limit = (w.detach() / h.detach()).nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf)
    return torch.where(flat, limit.atan(), torch.atan(w / torch.where(flat, torch.ones_like(h), h)))


def _measure(a: Tensor, b: Tensor, kind: int, eps: Tensor) -> Tensor:
    """IoU (0), GIoU (1), DIoU (2) or CIoU (3) of broadcastable ``(..., 4)`` boxes."""
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    aw, ah, bw, bh = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    d_x = torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)  # overlap sides
    d_y = torch.minimum(ay2, by2) - torch.maximum(ay1, by1)
    hull_x, hull_y = (aw + bw) - d_x, (ah + bh) - d_y  # enclosing sides
    inter = torch.relu(d_x) * torch.relu(d_y)  # no gradient through a zero side
    union = (aw * ah + bw * bh) - inter
    iou = inter / _nonzero(union, eps)
    if kind == 0:
        return iou
    if kind == 1:
        area_c = hull_x * hull_y
        return iou - (area_c - union) / _nonzero(area_c, eps)
    diag = _nonzero((hull_x * hull_x).addcmul(hull_y, hull_y), eps)
    delta_x = (ax1 - bx1) + (ax2 - bx2)  # twice the centre offset
    delta_y = (ay1 - by1) + (ay2 - by2)
    out = torch.sub(iou, (delta_x * delta_x).addcmul(delta_y, delta_y) / diag, alpha=0.25)
    if kind == 3:
        dt = _angle(bw, bh) - _angle(aw, ah)
        v = dt * dt * (4.0 / math.pi**2)
        tiny = _limits(v.dtype)[0]
        vc = v.detach()
        alpha = vc / (vc - iou.detach() + 1.0).clamp_min(tiny)  # a constant weight
        out = out.addcmul(alpha, v, value=-1.0)
    return out


def _collapse(boxes: Tensor) -> Tensor:
    """Inverted boxes as zero-width (height) boxes at ``x1`` (``y1``)."""
    lo, hi = boxes[..., :2], boxes[..., 2:]
    return torch.cat([lo, torch.where(hi < lo, lo, hi)], dim=-1)


def _check_eps(eps: float) -> None:
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError("eps must be a finite number >= 0, got " + str(eps))


def script_overlap(boxes1: Tensor, boxes2: Tensor, kind: int, aligned: bool, eps: float) -> Tensor:
    """`visionblocks.ops._box_iou.overlap`: ``kind`` 0-3 (IoU, GIoU, DIoU, CIoU)."""
    _check_eps(eps)
    _check_last_dim("boxes1", boxes1)
    _check_last_dim("boxes2", boxes2)
    if not aligned and (boxes1.dim() < 2 or boxes2.dim() < 2):
        raise ValueError("boxes must have shape (..., N, 4) with at least 2 dims")
    dtype = _iou_dtype(boxes1, boxes2)
    boxes1, boxes2 = boxes1.to(dtype), boxes2.to(dtype)
    scale = _power_of_two_scale([boxes1, boxes2])
    boxes1, boxes2 = _collapse(boxes1 * scale), _collapse(boxes2 * scale)
    eps_t = _eps_tensor(eps, scale.square(), dtype)
    if not aligned:
        boxes1, boxes2 = boxes1.unsqueeze(-2), boxes2.unsqueeze(-3)  # (..., N, 1), (..., 1, M)
    return _measure(boxes1, boxes2, kind, eps_t)


def script_iou_loss(
    pred: Tensor, target: Tensor, kind: int, reduction: str, eps: float, impl: str
) -> Tensor:
    """`visionblocks.ops.iou_loss`: ``1 -`` GIoU (1), DIoU (2) or CIoU (3) of aligned pairs."""
    if impl != "auto" and impl != "torch":
        raise ValueError("impl must be 'auto' or 'torch' under TorchScript, got " + impl)
    if not pred.is_floating_point() or not target.is_floating_point():
        raise TypeError("pred and target must be floating-point tensors")
    _check_last_dim("pred", pred)
    _check_last_dim("target", target)
    if pred.shape != target.shape:
        raise ValueError("pred and target must have the same shape")
    if reduction != "none" and reduction != "mean" and reduction != "sum":
        raise ValueError("reduction must be 'none', 'mean' or 'sum', got " + reduction)
    _check_eps(eps)
    input_dtype = torch.promote_types(pred.dtype, target.dtype)
    cdt = input_dtype
    if cdt != torch.float32 and cdt != torch.float64:
        cdt = torch.float32  # visionblocks._core.reduce.compute_dtype
    p, g = pred.to(cdt), target.to(cdt)
    scale = _power_of_two_scale([p, g])
    eps_t = _eps_tensor(eps, scale.square(), cdt)
    loss = 1.0 - _measure(p * scale, g * scale, kind, eps_t)
    if reduction == "none":
        return loss.to(input_dtype)
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / loss.numel() if loss.numel() > 0 else total * 0.0
