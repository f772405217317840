"""The IoU family and the IoU losses as torchvision and the papers write them, in float64.

For boxes ``A``, ``B`` in ``(x1, y1, x2, y2)``, with the smallest enclosing box ``C``:

- IoU = |A ∩ B| / |A ∪ B|
- GIoU = IoU - (|C| - |A ∪ B|) / |C|                  (Rezatofighi et al., CVPR 2019)
- DIoU = IoU - rho² / c²,  rho the distance of the centres, c the diagonal of C
- CIoU = DIoU - alpha v,   v = (4 / pi²) (atan(w_B / h_B) - atan(w_A / h_A))²,
  alpha = v / (1 - IoU + v), a constant weight (no gradient)   (Zheng et al., AAAI 2020)
- the losses are ``1 - GIoU``, ``1 - DIoU``, ``1 - CIoU``.

The library's conventions, written in the plainest form (see `visionblocks.ops.boxes`):

- eps rule: a denominator gets ``eps`` only where it is exactly zero (`_den`);
  ``alpha`` is 0 where ``v = 0``;
- the intersection is ``max(d_x, 0) * max(d_y, 0)`` with no gradient through a side that is 0
  (as torchvision's losses mask it);
- ``atan(w / h)`` is ``pi / 2`` for ``h = 0``, and 0 with a zero gradient for a point box;
- the box ops (not the losses) first collapse inverted boxes (``x2 < x1``) to ``x2 = x1``.

Everything is computed in float64 with ordinary autograd, so values and gradients of the fast
paths are checked against it. Pairwise: ``pairwise(fn, boxes1 (N, 4), boxes2 (M, 4))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

Measure = Callable[[Tensor, Tensor, float], Tensor]


def _den(x: Tensor, eps: float) -> Tensor:
    """The eps rule: ``eps`` where ``x == 0``, ``x`` elsewhere."""
    return torch.where(x == 0, torch.full_like(x, eps), x)


def _pos(x: Tensor) -> Tensor:
    """``max(x, 0)`` with a zero gradient at 0."""
    return torch.where(x > 0, x, torch.zeros_like(x))


def _angle(w: Tensor, h: Tensor) -> Tensor:
    """``atan(w / h)``; its limit ``+-pi/2`` where ``h = 0`` (gradient ``(h, -w) / (w² + h²)``,
    as ``atan2``); 0 with no gradient for a point box."""
    flat = h == 0
    point = flat & (w == 0)
    one = torch.ones_like(h)
    value = torch.where(
        flat, torch.atan2(w, torch.where(point, one, h)), torch.atan(w / torch.where(flat, one, h))
    )
    return torch.where(point, torch.zeros_like(w), value)


def _parts(a: Tensor, b: Tensor, eps: float) -> dict[str, Tensor]:
    """Everything the four measures need, for broadcastable ``(..., 4)`` float64 boxes."""
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    area_a = (ax2 - ax1) * (ay2 - ay1)
    area_b = (bx2 - bx1) * (by2 - by1)
    iw = _pos(torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1))
    ih = _pos(torch.minimum(ay2, by2) - torch.maximum(ay1, by1))
    inter = iw * ih
    union = area_a + area_b - inter
    cw = torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)
    ch = torch.maximum(ay2, by2) - torch.minimum(ay1, by1)
    rho2 = ((ax1 + ax2) / 2 - (bx1 + bx2) / 2) ** 2 + ((ay1 + ay2) / 2 - (by1 + by2) / 2) ** 2
    iou = inter / _den(union, eps)
    return {
        "iou": iou,
        "union": union,
        "hull_area": cw * ch,
        "rho2": rho2,
        "diag2": cw**2 + ch**2,
        "v": (4 / math.pi**2) * (_angle(bx2 - bx1, by2 - by1) - _angle(ax2 - ax1, ay2 - ay1)) ** 2,
    }


def _f64(*boxes: Tensor) -> list[Tensor]:
    return [b.to(torch.float64) for b in boxes]


def iou(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """IoU of broadcastable boxes ``(..., 4)`` (element-wise), float64."""
    return _parts(*_f64(a, b), eps)["iou"]


def giou(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """Generalized IoU, element-wise, float64."""
    p = _parts(*_f64(a, b), eps)
    return p["iou"] - (p["hull_area"] - p["union"]) / _den(p["hull_area"], eps)


def diou(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """Distance IoU, element-wise, float64."""
    p = _parts(*_f64(a, b), eps)
    return p["iou"] - p["rho2"] / _den(p["diag2"], eps)


def ciou(a: Tensor, b: Tensor, eps: float = 1e-7) -> Tensor:
    """Complete IoU, element-wise, float64 (``alpha`` held constant)."""
    p = _parts(*_f64(a, b), eps)
    v = p["v"]
    with torch.no_grad():
        s = 1 - p["iou"] + v
        alpha = torch.where(v == 0, torch.zeros_like(v), v / torch.where(s == 0, 1.0, s))
    return p["iou"] - p["rho2"] / _den(p["diag2"], eps) - alpha * v


MEASURES: dict[str, Measure] = {"iou": iou, "giou": giou, "diou": diou, "ciou": ciou}


def collapse(boxes: Tensor) -> Tensor:
    """Inverted boxes as zero-width (height) boxes at ``x1`` (``y1``), as the box ops do."""
    lo, hi = boxes[..., :2], boxes[..., 2:]
    return torch.cat([lo, torch.where(hi < lo, lo, hi)], dim=-1)


def pairwise(fn: Measure, boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """``fn`` of every pair: ``(..., N, 4)`` and ``(..., M, 4)`` give ``(..., N, M)``."""
    return fn(collapse(boxes1).unsqueeze(-2), collapse(boxes2).unsqueeze(-3), eps)


def aligned(fn: Measure, boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """``fn`` of ``boxes1[..., i, :]`` and ``boxes2[..., i, :]`` (broadcastable)."""
    return fn(collapse(boxes1), collapse(boxes2), eps)


def loss(name: str, pred: Tensor, target: Tensor, eps: float = 1e-7) -> Tensor:
    """``1 - measure`` of aligned pairs, no collapsing (the losses take valid boxes)."""
    return 1 - MEASURES[name](pred, target, eps)
