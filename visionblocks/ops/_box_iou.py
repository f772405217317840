"""The computation behind `box_iou` and its generalised / distance / complete variants.

One element-wise core (`_overlap`) evaluates any of the four measures on *broadcastable*
per-box columns: ``(N, 1)`` against ``(1, M)`` columns gives the pairwise ``N×M`` matrix,
``(N,)`` against ``(N,)`` the aligned vector. Pairwise problems are cut into chunks of rows
of ``boxes1`` so that the ``N×M`` temporaries of one chunk stay below `CHUNK_ELEMENTS`
elements each (`CUDA_CHUNK_ELEMENTS` on GPUs); only the output itself is ``N×M``. With
autograd, each chunk's saved tensors are kept for the backward pass (``O(N×M)`` as in
torchvision, but fewer of them).

Numerics (see the `visionblocks.ops.boxes` module docstring for the user-facing rules):

- coordinates are computed in `iou_dtype` (float32 for half, bfloat16 and integer boxes);
- an inverted box (``x2 < x1`` or ``y2 < y1``) is collapsed to a zero-width (height) box
  at ``x1`` (``y1``) before anything else, so every box the core sees is valid or degenerate;
- denominators that can be zero are clamped to ``eps`` (union and enclosing area); the
  centre-distance denominator is ``diagonal² + eps`` as in torchvision, so valid boxes give
  torchvision's values; numerators never get an ``eps``;
- the aspect-ratio angle of CIoU is ``atan2(w, h)`` per box (equal to ``atan(w / h)`` for
  ``h > 0``), with ``h`` replaced by 1 for a point box, so its value and gradient stay finite;
- huge coordinates: all four measures are scale invariant, so boxes whose largest
  ``|coordinate|`` reaches ``2**SAFE_EXPONENT`` are multiplied by a power of two
  (`power_of_two_scale`) that brings it below, with the area-like ``eps`` scaled by its
  square: exactly the unscaled arithmetic, without areas (or the squares autograd forms
  from them) overflowing float32. The factor is found on the device from the per-box
  columns (``O(N + M)``, no host sync) and is 1 for ordinary boxes.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from visionblocks._check import (
    check_finite,
    check_last_dim,
    check_range,
    check_same_device,
    check_tensor,
    check_type,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "CUDA_CHUNK_ELEMENTS",
    "SAFE_EXPONENT",
    "Kind",
    "iou_dtype",
    "overlap",
    "power_of_two_scale",
]

Kind = Literal["iou", "giou", "diou", "ciou"]

#: Elements of one ``N×M`` temporary per chunk on CPU: 1 MiB in float32, so a chunk's working
#: set (~5 temporaries) stays in cache. 3000×3000 GIoU, 2 threads (``pairwise_giou_3000``):
#: 2**17 and 2**18 are fastest, 2**19 ~15 % slower, 2**16 ~30 %, 2**20 ~40 %.
CHUNK_ELEMENTS = 2**18
#: The same on GPUs, where a chunk costs ~15 kernel launches: 16 MiB per float32 temporary.
CUDA_CHUNK_ELEMENTS = 2**22

_FOUR_OVER_PI_SQ = 4.0 / math.pi**2

#: Boxes are rescaled so that every finite ``|coordinate|`` is below ``2**SAFE_EXPONENT``:
#: areas stay below ``2**58`` and their squares (autograd's ``inter / union**2``) below
#: ``2**116``, inside float32's range (``2**128``).
SAFE_EXPONENT = 28


def _power_of_two(exponent: Tensor, dtype: torch.dtype) -> Tensor:
    """``2.0 ** -exponent`` in ``dtype``, built from its bits (exact), for ``0 <= exponent``."""
    if dtype == torch.float64:
        return ((1023 - exponent.to(torch.int64)) << 52).view(torch.float64)
    return ((127 - exponent.to(torch.int32)) << 23).view(torch.float32)


def power_of_two_scale(*boxes: Tensor) -> Tensor:
    """0-d factor ``2**-k`` (``k >= 0``) bringing every finite ``|coordinate|`` of ``boxes``
    below ``2**SAFE_EXPONENT`` (1 for ordinary boxes, and when some coordinate is not finite).

    ``boxes`` share a float32 or float64 dtype and a device; no host synchronisation.

    Examples:
        >>> float(power_of_two_scale(torch.tensor([[0.0, 0.0, 1e19, 1e19]]))) == 2.0**-36
        True
        >>> power_of_two_scale(torch.tensor([[0.0, 0.0, 640.0, 480.0]]))
        tensor(1.)
    """
    dtype, device = boxes[0].dtype, boxes[0].device
    extremes = [v for b in boxes if b.numel() for v in torch.aminmax(b.detach())]
    if not extremes:
        return torch.ones((), dtype=dtype, device=device)
    largest = torch.stack(extremes).abs().amax()
    shift = (torch.frexp(largest).exponent - SAFE_EXPONENT).clamp_min(0)
    shift = torch.where(torch.isfinite(largest), shift, 0)
    return _power_of_two(shift, dtype)


class _Columns(NamedTuple):
    """Per-box quantities, shaped so that a pair of them broadcasts to the output."""

    x1: Tensor
    y1: Tensor
    x2: Tensor
    y2: Tensor
    area: Tensor
    cx: Tensor  # centre (DIoU, CIoU)
    cy: Tensor
    angle: Tensor  # atan2(w, h) (CIoU)


def iou_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype IoU values are computed and returned in.

    float64 stays float64, float32 stays float32; float16, bfloat16, integer and bool
    boxes give ``torch.get_default_dtype()`` (float32 unless changed) — the result dtype of
    torchvision's functions, which upcast half boxes to float32 (``_upcast``) and divide
    integer areas with true division.

    Examples:
        >>> iou_dtype(torch.float16)
        torch.float32
        >>> iou_dtype(torch.float32, torch.float64)
        torch.float64
        >>> iou_dtype(torch.int64)
        torch.float32
    """
    dtype = dtypes[0]
    for other in dtypes[1:]:
        dtype = torch.promote_types(dtype, other)
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype.is_complex:
        raise TypeError(f"boxes must be real (floating-point or integer), got dtype {dtype}")
    return torch.get_default_dtype()


def _columns(boxes: Tensor, unsqueeze: int | None) -> _Columns:
    """Per-box columns of ``boxes (..., K, 4)``, with a size-1 dim inserted at ``unsqueeze``.

    Everything any measure needs is computed: per-box work is negligible next to ``N×M``.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    # Inverted boxes collapse to zero width/height at (x1, y1); valid boxes are unchanged.
    x2 = torch.maximum(x1, x2)
    y2 = torch.maximum(y1, y2)
    w = x2 - x1
    h = y2 - y1
    point = (w == 0) & (h == 0)  # atan2(0, 0) has a 0/0 gradient
    angle = torch.atan2(w, torch.where(point, torch.ones_like(h), h))
    cols = [x1, y1, x2, y2, w * h, (x1 + x2) / 2, (y1 + y2) / 2, angle]
    if unsqueeze is not None:
        cols = [c.unsqueeze(unsqueeze) for c in cols]
    return _Columns(*cols)


def _overlap(a: _Columns, b: _Columns, kind: Kind, eps: float, area_eps: Tensor) -> Tensor:
    """IoU / GIoU / DIoU / CIoU of broadcastable columns ``a`` and ``b`` (one new tensor).

    ``area_eps`` is ``eps`` in the (rescaled) squared units of the columns; ``eps`` itself is
    only used where it is dimensionless (CIoU's ``alpha``). In-place ops on fresh temporaries
    keep the working set small; autograd checks every in-place op against what it saved
    (version counters), and float64 gradcheck covers them.
    """
    inter = torch.minimum(a.x2, b.x2).sub_(torch.maximum(a.x1, b.x1)).clamp_(min=0)
    inter_h = torch.minimum(a.y2, b.y2).sub_(torch.maximum(a.y1, b.y1)).clamp_(min=0)
    inter = inter.mul_(inter_h)
    del inter_h
    union = (a.area + b.area).sub_(inter).clamp_(min=area_eps)
    iou = inter.div_(union)
    if kind == "iou":
        return iou
    # Enclosing box: never negative, since every box here has x1 <= x2 and y1 <= y2.
    hull_w = torch.maximum(a.x2, b.x2).sub_(torch.minimum(a.x1, b.x1))
    hull_h = torch.maximum(a.y2, b.y2).sub_(torch.minimum(a.y1, b.y1))
    if kind == "giou":
        # iou - (hull - union) / hull, written as iou - 1 + union / hull.
        hull = hull_w.mul_(hull_h).clamp_(min=area_eps)
        return torch.div(union, hull).add_(iou).sub_(1.0)
    del union
    diagonal = hull_w.square_().add_(hull_h.square_()).add_(area_eps)
    del hull_h
    distance = (a.cx - b.cx).square_().add_((a.cy - b.cy).square_())
    penalty = distance.div_(diagonal)
    del diagonal
    if kind == "ciou":
        v = (a.angle - b.angle).square_().mul_(_FOUR_OVER_PI_SQ)
        with torch.no_grad():  # alpha is a constant weight, as in the paper and torchvision
            alpha = v / torch.add(v, 1.0 + eps).sub_(iou)
        penalty = penalty.add_(v.mul_(alpha))
    return iou - penalty


def _check_boxes(name: str, boxes: object, min_dim: int, shape: str) -> Tensor:
    boxes = check_tensor(name, boxes)
    if boxes.dim() < min_dim:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(boxes.shape)}")
    check_last_dim(name, boxes, 4, what="(x1, y1, x2, y2)")
    return boxes


def _broadcast(what: str, shape1: torch.Size, shape2: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(shape1, shape2)
    except RuntimeError:
        raise ValueError(
            f"{what} of boxes1 and boxes2 must be equal or broadcastable, "
            f"got {tuple(shape1)} and {tuple(shape2)}"
        ) from None


def overlap(boxes1: Tensor, boxes2: Tensor, kind: Kind, *, aligned: bool, eps: float) -> Tensor:
    """Validate, upcast, and compute ``kind`` pairwise (chunked) or aligned.

    Raises:
        TypeError: Non-tensor boxes, complex boxes, non-bool ``aligned``, non-number ``eps``.
        ValueError: Last dim not 4, too few dims, batch dims that do not broadcast, ``eps < 0``.
    """
    check_type("aligned", aligned, bool)
    if isinstance(eps, bool):
        raise TypeError(f"eps must be float, got bool ({eps!r})")
    check_type("eps", eps, (float, int))
    check_range("eps", eps, 0.0)
    check_finite("eps", eps)
    shape = "(..., 4)" if aligned else "(..., N, 4) with at least 2 dims"
    boxes1 = _check_boxes("boxes1", boxes1, 1 if aligned else 2, shape)
    boxes2 = _check_boxes("boxes2", boxes2, 1 if aligned else 2, shape)
    check_same_device(boxes1=boxes1, boxes2=boxes2)
    dtype = iou_dtype(boxes1.dtype, boxes2.dtype)
    boxes1, boxes2 = boxes1.to(dtype), boxes2.to(dtype)
    eps = float(eps)
    if aligned:
        _broadcast("shapes (all but the last dim)", boxes1.shape[:-1], boxes2.shape[:-1])
    else:
        batch = _broadcast(
            "batch dims (all but the last two)", boxes1.shape[:-2], boxes2.shape[:-2]
        )
    scale = power_of_two_scale(boxes1, boxes2)
    boxes1, boxes2 = boxes1 * scale, boxes2 * scale
    area_eps = eps * scale.square()
    if eps > 0:  # a huge scale-down must not turn eps into 0 (0 / 0 for degenerate boxes)
        area_eps = area_eps.clamp_min(torch.finfo(dtype).tiny)
    if aligned:
        return _overlap(_columns(boxes1, None), _columns(boxes2, None), kind, eps, area_eps)
    return _pairwise(boxes1, boxes2, batch, kind, eps, area_eps)


def _pairwise(
    boxes1: Tensor, boxes2: Tensor, batch: torch.Size, kind: Kind, eps: float, area_eps: Tensor
) -> Tensor:
    n, m = boxes1.shape[-2], boxes2.shape[-2]
    batch_size = math.prod(batch)
    budget = CHUNK_ELEMENTS if boxes1.device.type == "cpu" else CUDA_CHUNK_ELEMENTS
    rows = max(1, budget // max(m, 1))  # rows of boxes1 per chunk
    if batch_size * n <= rows or batch_size * n * m == 0:
        # One chunk: broadcasting handles the batch dims, nothing is copied.
        return _overlap(_columns(boxes1, -1), _columns(boxes2, -2), kind, eps, area_eps)
    # Flatten the (broadcast) batch dims; a chunk is whole batch items or rows of one item.
    boxes1 = boxes1.expand(*batch, n, 4).reshape(batch_size, n, 4)
    boxes2 = boxes2.expand(*batch, m, 4).reshape(batch_size, m, 4)
    a = _columns(boxes1, -1)  # (B, N, 1) each
    b = _columns(boxes2, -2)  # (B, 1, M) each
    if rows >= n:
        step = rows // n
        chunks = [(slice(i, i + step), slice(None)) for i in range(0, batch_size, step)]
    else:
        chunks = [
            (slice(i, i + 1), slice(r, r + rows))
            for i in range(batch_size)
            for r in range(0, n, rows)
        ]

    def piece(items: slice, rows_: slice) -> Tensor:  # (k, M): k consecutive output rows
        a_part = _Columns(*(c[items, rows_] for c in a))
        b_part = _Columns(*(c[items] for c in b))
        return _overlap(a_part, b_part, kind, eps, area_eps).reshape(-1, m)

    if torch.is_grad_enabled() and (boxes1.requires_grad or boxes2.requires_grad):
        # Autograd keeps every chunk's graph anyway; `cat` has a cheap backward (slicing),
        # where writing into a preallocated output would copy its gradient once per chunk.
        out = torch.cat([piece(*chunk) for chunk in chunks])
    else:
        out = boxes1.new_empty(batch_size * n, m)
        start = 0
        for chunk in chunks:
            values = piece(*chunk)
            out[start : start + values.shape[0]] = values
            start += values.shape[0]
    return out.reshape(*batch, n, m)
