"""Axis-aligned boxes: format conversion, area, the IoU family (IoU, GIoU, DIoU, CIoU), clipping
to the image and the removal of small boxes.

Every function takes boxes with any number of leading dims, ``(..., 4)``. The four overlap
measures are **pairwise** (``aligned=False``: ``(..., N, 4)`` against ``(..., M, 4)`` gives
``(..., N, M)``) or **aligned** (``boxes1[..., i, :]`` with ``boxes2[..., i, :]`` gives
``(..., N)``, without the ``N×M`` cost). Leading dims broadcast (as ``torch.matmul`` when
pairwise): ground truths ``(M, 4)`` against predictions ``(B, N, 4)`` give ``(B, N, M)``.

The pairwise results equal torchvision's for valid boxes, up to its ``eps`` (below); unlike
torchvision, identical boxes give exactly 1 however small, and degenerate boxes give finite values
and gradients. Every function scripts (without the input checks, and gradients to half boxes not
clamped), compiles with ``torch.compile(fullgraph=True)`` and reads no CUDA tensor values on
the host; on CPU the IoU family reads each set once (the Range check below), and
`remove_small_boxes`, whose output size depends on the values, reads them on every device.
``ValueError``: a last dim other than 4, fewer than 2 dims (pairwise), leading dims that do not
broadcast, boxes on different devices, a negative or non-finite ``eps``, or CPU boxes beyond
the Range (the IoU family).

Convention:
    Formats (``fmt`` strings of `box_convert`):

    - ``"xyxy"``: ``(x1, y1, x2, y2)``, top-left and bottom-right corners. The format of
      `box_area` and of the IoU family.
    - ``"xywh"``: ``(x1, y1, w, h)``, top-left corner, width and height.
    - ``"cxcywh"``: ``(cx, cy, w, h)``, centre, width and height.

    x grows to the right and y downwards (image coordinates), so a valid box has
    ``x1 <= x2`` and ``y1 <= y2``; ``w = x2 - x1`` and ``h = y2 - y1`` with no ``+ 1``
    (continuous coordinates: the box ``(0, 0, 2, 2)`` covers 2×2 pixels). Units are free —
    pixels or coordinates normalised to ``[0, 1]`` — as long as both sets of boxes agree.

    **eps** — one rule for every box op, box loss and implementation: a denominator that can
    vanish (the union, the enclosing box's area, its squared diagonal) gets ``eps`` only
    where it is exactly zero, where its numerator is zero too: the value is 0, as with
    torchvision's ``+ eps``. Elsewhere the formulas are exact: identical boxes give
    IoU = GIoU = DIoU = CIoU = 1 at any size. Gradients at a zero denominator are finite (up
    to about ``1 / eps``). ``eps=0`` gives torchvision's 0 / 0 = NaN there; with ``eps > 0``
    every result and gradient is finite for finite boxes.

    A **zero-area** (degenerate) box (``w == 0`` or ``h == 0``) intersects nothing: its IoU
    is 0, also against an identical box (torchvision: 0 / 0 = NaN).

    **Range**: for exact results every area, enclosing box and squared distance must be a
    finite number: float32 coordinates below ``2**61`` (about ``2.3e18``) in magnitude
    (float64: ``2**509``, about ``1.7e153``), sizes above about ``1e-18`` (float64:
    ``1e-150``). Beyond, torchvision's float32 results are NaN, ``inf`` or (``box_iou``) 0.
    Here the IoU family refuses finite CPU boxes beyond it, a value check
    (`visionblocks.set_value_checks`: one read of each set, a few microseconds) that raises
    a ``ValueError`` naming the set; CUDA boxes are not read (no host synchronisation), so
    there, and with value checks off, the results beyond the range are torchvision's.
    ``boxes.double()`` computes in float64, whose range holds every finite float32 box:
    finite values and gradients for all of them. `box_area` is not checked: it is ``inf``
    where an area exceeds the dtype's maximum (the float32 rounding of the true area), NaN
    where a side does (coordinates beyond about ``±1.7e38``).

    An **inverted** box (``x2 < x1`` or ``y2 < y1``) is invalid but not rejected (a check would make
    the GPU wait): the IoU family collapses it to zero width (height) at ``x1`` (``y1``), so IoU is
    0 and GIoU in ``[-1, 0]``; `box_area` returns its negative area, as torchvision.

Dtypes:
    The IoU family computes and returns float32 for float16, bfloat16 and integer boxes
    (torchvision upcasts half boxes and divides integer areas, giving float32), float64 for
    float64 boxes; mixed inputs promote first. Gradients flowing back to float16 or bfloat16
    boxes are computed in float32 and clamped to the half dtype's finite range.

    `box_area` gives float32 for float16/bfloat16 boxes (torchvision's ``_upcast``) and int64
    for integer boxes, so no side or product overflows (torchvision's int32 overflows for an
    int16 box ``[-30000, -30000, 30000, 30000]``); float32 and float64 keep their dtype.

    `box_convert` keeps the input dtype, except that integer boxes give float32 where the result
    involves centres (as torchvision). No sum overflows: half boxes are computed in float64, integer
    boxes in int64 (float64 with centres), rounded once; only a result outside the output dtype
    (uint8 ``x + w > 255``) wraps. float32 and float64 boxes give torchvision's values exactly.

    ``torch.autocast`` changes none of this: no op here is one that autocast lowers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_int, check_number, check_type
from visionblocks._core.dispatch import reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_last_dim,
    check_real,
    check_same_device,
    compute_dtype,
)

__all__ = [
    "BOX_FORMATS",
    "box_area",
    "box_convert",
    "box_iou",
    "clip_boxes_to_image",
    "complete_box_iou",
    "distance_box_iou",
    "generalized_box_iou",
    "remove_small_boxes",
]
__dir__ = public_dir(__name__, __all__)

BOX_FORMATS: tuple[str, ...] = ("xyxy", "xywh", "cxcywh")
"""The formats of `box_convert` (the module's Convention); ``"xywh"`` is COCO's ``bbox``."""


def _to_xyxy(boxes: Tensor, fmt: str) -> Tensor:
    a, b, c, d = boxes.unbind(-1)
    if fmt == "xywh":
        return torch.stack((a, b, a + c, b + d), dim=-1)
    if fmt == "cxcywh":
        return torch.stack((a - 0.5 * c, b - 0.5 * d, a + 0.5 * c, b + 0.5 * d), dim=-1)
    return boxes


def _from_xyxy(boxes: Tensor, fmt: str) -> Tensor:
    x1, y1, x2, y2 = boxes.unbind(-1)
    if fmt == "xywh":
        return torch.stack((x1, y1, x2 - x1, y2 - y1), dim=-1)
    if fmt == "cxcywh":
        return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), dim=-1)
    return boxes


def _check_convert(boxes: Tensor, in_fmt: str, out_fmt: str) -> None:
    check_real("boxes", boxes)
    for name, fmt in (("in_fmt", in_fmt), ("out_fmt", out_fmt)):
        check_type(name, fmt, str)
        check_choice(name, fmt, BOX_FORMATS)
    check_last_dim("boxes", boxes, 4, what=f"in {in_fmt!r} format")


def box_convert(boxes: Tensor, in_fmt: str, out_fmt: str) -> Tensor:
    """Convert boxes between the ``"xyxy"``, ``"xywh"`` and ``"cxcywh"`` formats.

    Same values as ``torchvision.ops.box_convert`` (between ``"xywh"`` and ``"cxcywh"``
    through ``"xyxy"``, as there).

    Args:
        boxes (Tensor[..., 4]): Boxes in ``in_fmt``; any leading dims.
        in_fmt: Format of ``boxes``: ``"xyxy"``, ``"xywh"`` or ``"cxcywh"``.
        out_fmt: Format to return.

    Returns:
        Tensor[..., 4]: A new tensor (a copy when ``in_fmt == out_fmt``), in ``boxes``' dtype
        except for integer boxes with centres (see the module's Dtypes: no sum overflows).

    Raises:
        TypeError: ``boxes`` is not a real tensor (complex and bool are refused), or a
            format is not a str.
        ValueError: Unknown format (the message lists the valid ones), or last dim not 4.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[10.0, 20.0, 30.0, 60.0]])
        >>> box_convert(boxes, "xyxy", "cxcywh")
        tensor([[20., 40., 20., 40.]])
        >>> box_convert(boxes, "xyxy", "xywh")
        tensor([[10., 20., 20., 40.]])
    """
    if not torch.jit.is_scripting():
        _check_convert(boxes, in_fmt, out_fmt)
    elif in_fmt not in ["xyxy", "xywh", "cxcywh"] or out_fmt not in ["xyxy", "xywh", "cxcywh"]:
        raise ValueError(
            "box formats must be 'xyxy', 'xywh' or 'cxcywh', got " + in_fmt + ", " + out_fmt
        )
    if in_fmt == out_fmt:
        return boxes.clone()
    centres = in_fmt == "cxcywh" or out_fmt == "cxcywh"
    if boxes.is_floating_point():  # half: computed in float64 (exact sums), rounded once
        wide = boxes if boxes.element_size() >= 4 else boxes.double()
        return _from_xyxy(_to_xyxy(wide, in_fmt), out_fmt).to(boxes.dtype)
    if centres:  # integers: halves need a float; float64 holds every sum exactly
        out = _from_xyxy(_to_xyxy(boxes.double(), in_fmt), out_fmt)
        return out.float()
    out = _from_xyxy(_to_xyxy(boxes.long(), in_fmt), out_fmt)  # no wrap in the sums
    return out.to(boxes.dtype)


def box_area(boxes: Tensor) -> Tensor:
    """Area ``(x2 - x1) * (y2 - y1)`` of ``"xyxy"`` boxes.

    Args:
        boxes (Tensor[..., 4]): Boxes in ``(x1, y1, x2, y2)``; any leading dims.

    Returns:
        Tensor[...]: Areas in the module's Dtypes; inverted boxes give negative areas (a check
        would synchronise the GPU).

    Raises:
        TypeError: ``boxes`` is not a real tensor (complex and bool are refused).
        ValueError: Last dim not 4.

    Examples:
        >>> import torch
        >>> box_area(torch.tensor([[0.0, 0.0, 4.0, 2.0], [1.0, 1.0, 1.0, 3.0]]))
        tensor([8., 0.])
        >>> box_area(torch.tensor([0, 0, 3, 3], dtype=torch.uint8))
        tensor(9)
    """
    if not torch.jit.is_scripting():
        check_real("boxes", boxes)
        check_last_dim("boxes", boxes, 4, what="(x1, y1, x2, y2)")
    if boxes.is_floating_point():  # torchvision's _upcast
        if boxes.dtype != torch.float32 and boxes.dtype != torch.float64:
            boxes = boxes.float()
    else:  # int64: no product of two int16 or int32 sides overflows
        boxes = boxes.long()
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def check_eps(eps: float) -> float:
    """Validate an ``eps``: a finite real number ``>= 0``; return it as a float.

    Examples:
        >>> check_eps(-1.0)
        Traceback (most recent call last):
        ...
        ValueError: eps must be a finite number >= 0, got -1.0
    """
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"eps must be a float, got {type(eps).__name__} ({eps!r})")
    if not 0 <= eps < math.inf:  # also False for NaN
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _check_iou_inputs(boxes1: Tensor, boxes2: Tensor, aligned: bool, eps: float) -> None:
    """The input checks of the IoU family (shapes, dtypes, devices and options; no values)."""
    if not isinstance(aligned, bool):
        raise TypeError(f"aligned must be bool, got {type(aligned).__name__} ({aligned!r})")
    check_eps(eps)
    lead = 1 if aligned else 2  # dims kept out of the batch dims
    for name, boxes in (("boxes1", boxes1), ("boxes2", boxes2)):
        if not isinstance(boxes, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(boxes).__name__}")
        shape = tuple(boxes.shape)
        if shape[-1:] != (4,):
            raise ValueError(f"{name} must have shape (..., 4) (x1, y1, x2, y2), got {shape}")
        if len(shape) < lead:
            raise ValueError(
                f"{name} must have shape (..., N, 4) with at least 2 dims, got {shape}"
            )
        if boxes.is_complex():
            raise TypeError(f"boxes must be real (floating-point or integer), got {boxes.dtype}")
    check_pair(boxes1, boxes2, aligned)
    check_range(boxes1, boxes2)


def check_pair(boxes1: Tensor, boxes2: Tensor, aligned: bool) -> None:
    """Both sets on one device, their leading dims (all but the last one or two) broadcastable."""
    if boxes1.device != boxes2.device:
        check_same_device(boxes1=boxes1, boxes2=boxes2)
    lead = 1 if aligned else 2
    batch1, batch2 = boxes1.shape[:-lead], boxes2.shape[:-lead]
    if batch1 != batch2:
        try:
            torch.broadcast_shapes(batch1, batch2)
        except RuntimeError:
            what = (
                "shapes (all but the last dim)" if aligned else "batch dims (all but the last two)"
            )
            raise ValueError(
                f"{what} of boxes1 and boxes2 must be equal or broadcastable, "
                f"got {tuple(batch1)} and {tuple(batch2)}"
            ) from None


_RANGE = {torch.float32: 2.0**61, torch.float64: 2.0**509}
"""Largest coordinate magnitude by compute dtype (the module's Range): with coordinates in
``[-r, r]``, ``32 r**2`` (the largest squared centre distance, DIoU/CIoU) is finite."""
_WIDE = {
    torch.float32: (torch.float32, torch.bfloat16, torch.int64),
    torch.float64: (torch.float64,),
}
"""The input dtypes whose values can reach `_RANGE` of each compute dtype."""


def check_range(
    boxes1: Tensor, boxes2: Tensor, names: tuple[str, str] = ("boxes1", "boxes2")
) -> None:
    """Refuse finite coordinates beyond the module's Range for the compute dtype of the two
    sets (float32, or float64 if one is float64), naming the set: on CPU, one read of each;
    nothing on other devices, for dtypes that cannot exceed the range, or with value checks
    off (`visionblocks.set_value_checks`). NaN and inf are not refused.

    Examples:
        >>> huge = torch.tensor([[0.0, 0.0, 1e19, 1e19]])
        >>> check_range(huge, huge, ("pred", "target"))
        Traceback (most recent call last):
        ...
        ValueError: pred holds a coordinate of 1e+19: float32 boxes must stay within ±2**61 (about 2.3e+18), where every area and squared distance is finite; convert them with .double() (float64 holds every finite float32 box)
    """
    if not reads_values(boxes1, boxes2):
        return
    dtype = torch.float64 if torch.float64 in (boxes1.dtype, boxes2.dtype) else torch.float32
    wide, limit = _WIDE[dtype], _RANGE[dtype]
    for name, t in zip(names, (boxes1, boxes2) if boxes2 is not boxes1 else (boxes1,)):
        if t.dtype in wide and t.numel():
            low, high = torch.aminmax(t.detach() if t.requires_grad else t)
            if not -limit < float(low) <= float(high) < limit:  # beyond, NaN or inf
                finite = torch.where(t.isfinite(), t, 0)  # NaN and inf are not refused
                low, high = (float(v) for v in torch.aminmax(finite.detach()))
                for value in (high, low):
                    if abs(value) >= limit:
                        raise ValueError(_range_message(name, value, t, dtype, limit))


def _range_message(name: str, value: float, t: Tensor, dtype: torch.dtype, limit: float) -> str:
    got = f"a coordinate of {value:.3g}"
    given = str(t.dtype).removeprefix("torch.")
    computed = "" if t.dtype == dtype else f" (computed in {str(dtype)[6:]})"
    rule = (
        f"{given} boxes{computed} must stay within ±2**{int(math.log2(limit))} "
        f"(about {limit:.2g}), where every area and squared distance is finite"
    )
    route = "scale them down" if dtype == torch.float64 else (
        "convert them with .double() (float64 holds every finite float32 box)"
    )  # fmt: skip
    return f"{name} holds {got}: {rule}; {route}"


class _CastClamped(torch.autograd.Function):
    """``x.to(dtype)`` whose gradient is clamped to ``x.dtype``'s finite range."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:  # type: ignore[override]
        ctx.input_dtype = x.dtype
        return x.to(dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        big = torch.finfo(ctx.input_dtype).max
        return grad.clamp(-big, big).to(ctx.input_dtype), None


def _upcast(boxes: Tensor, dtype: torch.dtype) -> Tensor:
    """``boxes`` in the compute ``dtype``; gradients to half boxes stay finite (eager only)."""
    if boxes.dtype == dtype:
        return boxes
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips this block)
        if boxes.requires_grad and boxes.dtype in (torch.float16, torch.bfloat16):
            return _CastClamped.apply(boxes, dtype)
    return boxes.to(dtype)


def _columns(boxes: Tensor, collapse: bool, contiguous: bool = False) -> list[Tensor]:
    """``x1, y1, x2, y2`` columns of ``(..., 4)`` boxes (optionally contiguous); with
    ``collapse``, inverted boxes become zero-width (zero-height) boxes at ``x1`` (``y1``)."""
    if contiguous:
        x1, y1, x2, y2 = boxes.movedim(-1, 0).contiguous().unbind(0)
    else:
        x1, y1, x2, y2 = boxes.unbind(-1)
    if collapse:
        x2, y2 = torch.where(x2 < x1, x1, x2), torch.where(y2 < y1, y1, y2)
    return [x1, y1, x2, y2]


def _nonzero(x: Tensor, eps: float) -> Tensor:
    """The eps rule: ``eps`` where the denominator ``x`` is exactly zero, ``x`` elsewhere
    (``logical_not``: ``x == 0`` without a scalar operand, a third cheaper on a few boxes)."""
    return x.masked_fill(x.logical_not(), eps)


def _angle(w: Tensor, h: Tensor) -> Tensor:
    """``atan(w / h)`` for ``w, h >= 0``: ``pi / 2`` at ``h = 0``, 0 (no gradient) for a point."""
    point = w.logical_not() & h.logical_not()  # w == 0 and h == 0 (see `_nonzero`)
    return torch.atan2(w, h.masked_fill(point, 1.0)).masked_fill(point, 0.0)


def _measure(a: list[Tensor], b: list[Tensor], kind: int, eps: float) -> Tensor:
    """IoU (``kind`` 0), GIoU (1), DIoU (2) or CIoU (3) of boxes ``a`` and ``b`` given as
    `_columns` of broadcastable shapes: ``(N, 1)`` and ``(M,)`` give every pair."""
    ax1, ay1, ax2, ay2 = a[0], a[1], a[2], a[3]
    bx1, by1, bx2, by2 = b[0], b[1], b[2], b[3]
    aw, ah, bw, bh = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    if kind == 0:  # sides at 0, the collapsed boxes' (relu: cheaper than clamp_min(0))
        aw, ah, bw, bh = aw.relu(), ah.relu(), bw.relu(), bh.relu()
    area_a, area_b = aw * ah, bw * bh
    dx = torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)  # overlap sides, < 0 if apart
    dy = torch.minimum(ay2, by2) - torch.maximum(ay1, by1)
    inter = dx.relu() * dy.relu()  # relu: no gradient through a side that is 0
    if kind == 0:
        # A union is zero only where both areas are, and beside a zero-area box inter = 0:
        # eps in place of a zero area_a (O(N), not O(NM)) is the eps rule, value and gradient.
        return inter / ((_nonzero(area_a, eps) + area_b) - inter)
    union = (area_a + area_b) - inter
    iou = inter / _nonzero(union, eps)
    cw, ch = (aw + bw) - dx, (ah + bh) - dy  # sides of the smallest enclosing box
    if kind == 1:
        hull = cw * ch
        return iou - (hull - union) / _nonzero(hull, eps)
    ex, ey = (ax1 + ax2) - (bx1 + bx2), (ay1 + ay2) - (by1 + by2)  # twice the centre offset
    diou = iou - 0.25 * (ex * ex + ey * ey) / _nonzero(cw * cw + ch * ch, eps)
    if kind == 2:
        return diou
    v = (4 / math.pi**2) * (_angle(bw, bh) - _angle(aw, ah)) ** 2
    v_c = v.detach()  # alpha = v / (1 - IoU + v) is a constant weight, 0 where v = 0
    alpha = (v_c / ((1 - iou.detach()) + v_c)).masked_fill(v_c.logical_not(), 0.0)
    return diou - alpha * v


def _overlap(boxes1: Tensor, boxes2: Tensor, kind: int, aligned: bool, eps: float) -> Tensor:
    """`_measure` of checked boxes: float32 (float64) columns, inverted boxes collapsed."""
    dtype = compute_dtype(torch.promote_types(boxes1.dtype, boxes2.dtype))
    if not aligned:  # (..., N, 1, 4) with (..., 1, M, 4)
        boxes1, boxes2 = boxes1.unsqueeze(-2), boxes2.unsqueeze(-3)
    collapse = kind != 0  # IoU: `_measure` clamps the sides instead, which gives the same
    a = _columns(_upcast(boxes1, dtype), collapse)
    # Pairwise, the inner loop runs along boxes2: contiguous columns pay off from ~100 boxes.
    b = _columns(_upcast(boxes2, dtype), collapse, not aligned and boxes2.shape[-2] > 64)
    return _measure(a, b, kind, eps)


def box_iou(boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7) -> Tensor:
    """Intersection over union (Jaccard index) of ``"xyxy"`` boxes, in ``[0, 1]``.

    ``IoU = |A ∩ B| / |A ∪ B|``; equal to ``torchvision.ops.box_iou`` except that a zero-area
    box gives 0 (torchvision: NaN) and identical boxes exactly 1.

    Args:
        boxes1 (Tensor[..., N, 4]): First set, ``(x1, y1, x2, y2)``.
        boxes2 (Tensor[..., M, 4]): Second set; leading dims broadcastable with ``boxes1``'s.
        aligned: Every pair, ``(..., N, M)`` (False), or index by index, ``(..., N)`` (True).
        eps: Replaces a denominator that is exactly zero (the module's Convention); ``>= 0``.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: float32 (float64 for float64 boxes; Dtypes).

    Raises:
        TypeError: Boxes not real tensors, ``aligned`` not a bool, ``eps`` not a number.
        ValueError: Bad shapes, devices or ``eps`` (listed in the module notes); CPU boxes
            beyond the Range (the module notes).

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        >>> b = torch.tensor([[1.0, 0.0, 3.0, 2.0], [5.0, 5.0, 6.0, 6.0], [0.0, 0.0, 0.0, 0.0]])
        >>> box_iou(a, b)
        tensor([[0.3333, 0.0000, 0.0000]])
        >>> box_iou(b, b, aligned=True)
        tensor([1., 1., 0.])
        >>> tiny = torch.tensor([[0.3, 0.3, 0.3002, 0.3002]])  # identical: 1 at any size
        >>> box_iou(tiny, tiny)
        tensor([[1.]])
        >>> box_iou(a * 1e19, b)  # beyond float32's range; (a * 1e19).double() computes it
        Traceback (most recent call last):
        ...
        ValueError: boxes1 holds a coordinate of 2e+19: float32 boxes must stay within ±2**61 (about 2.3e+18), where every area and squared distance is finite; convert them with .double() (float64 holds every finite float32 box)
    """
    if not torch.jit.is_scripting():
        _check_iou_inputs(boxes1, boxes2, aligned, eps)
    return _overlap(boxes1, boxes2, 0, aligned, eps)


def generalized_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Generalised IoU of ``"xyxy"`` boxes, in ``[-1, 1]`` and never above IoU.

    ``GIoU = IoU - (|C| - |A ∪ B|) / |C|``, ``C`` the smallest box enclosing both; equal to
    ``torchvision.ops.generalized_box_iou`` up to its ``eps``, except that two identical
    zero-area boxes give 0 (no penalty: the enclosing box is the union).

    Args:
        boxes1 (Tensor[..., N, 4]): First set.
        boxes2 (Tensor[..., M, 4]): Second set.
        aligned: As `box_iou`.
        eps: As `box_iou`.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: As `box_iou`.

    Raises:
        TypeError, ValueError: As `box_iou`.

    References:
        Rezatofighi et al., "Generalized Intersection over Union: A Metric and A Loss for
        Bounding Box Regression", CVPR 2019. https://arxiv.org/abs/1902.09630

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        >>> b = torch.tensor([[1.0, 0.0, 3.0, 2.0], [4.0, 0.0, 6.0, 2.0]])
        >>> generalized_box_iou(a, b)
        tensor([[ 0.3333, -0.3333]])
    """
    if not torch.jit.is_scripting():
        _check_iou_inputs(boxes1, boxes2, aligned, eps)
    return _overlap(boxes1, boxes2, 1, aligned, eps)


def distance_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Distance IoU of ``"xyxy"`` boxes, in ``[-1, 1]`` and never above IoU.

    ``DIoU = IoU - ρ² / c²``, ``ρ`` the distance between the box centres and ``c`` the
    diagonal of the smallest enclosing box (``eps`` where ``c = 0``, i.e. for two coincident
    points). Equal to ``torchvision.ops.distance_box_iou`` for valid boxes, up to
    torchvision's ``eps`` (``c² + eps``).

    Args:
        boxes1 (Tensor[..., N, 4]): First set.
        boxes2 (Tensor[..., M, 4]): Second set.
        aligned: As `box_iou`.
        eps: As `box_iou`.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: As `box_iou`.

    Raises:
        TypeError, ValueError: As `box_iou`.

    References:
        Zheng et al., "Distance-IoU Loss: Faster and Better Learning for Bounding Box
        Regression", AAAI 2020. https://arxiv.org/abs/1911.08287

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        >>> b = torch.tensor([[1.0, 0.0, 3.0, 2.0], [0.0, 0.0, 2.0, 2.0]])
        >>> distance_box_iou(a, b)
        tensor([[0.2564, 1.0000]])
    """
    if not torch.jit.is_scripting():
        _check_iou_inputs(boxes1, boxes2, aligned, eps)
    return _overlap(boxes1, boxes2, 2, aligned, eps)


def complete_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Complete IoU of ``"xyxy"`` boxes: DIoU with an aspect-ratio penalty, in ``(-2, 1]``.

    ``CIoU = DIoU - α v``, ``v = 4/π² (atan(w1/h1) - atan(w2/h2))²``, the weight
    ``α = v / (1 - IoU + v)`` (0 where ``v = 0``) a constant (no gradient), as in the paper and
    ``torchvision.ops.complete_box_iou`` (equal for valid boxes up to its ``eps``). A box with
    ``h == 0`` gets the angle π/2 and a finite gradient (torchvision: division by zero), a point 0.

    Args:
        boxes1 (Tensor[..., N, 4]): First set.
        boxes2 (Tensor[..., M, 4]): Second set.
        aligned: As `box_iou`.
        eps: As `box_iou`.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: As `box_iou`.

    Raises:
        TypeError, ValueError: As `box_iou`.

    References:
        Zheng et al., "Distance-IoU Loss: Faster and Better Learning for Bounding Box
        Regression", AAAI 2020. https://arxiv.org/abs/1911.08287

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        >>> b = torch.tensor([[1.0, 0.0, 3.0, 2.0], [0.0, 0.0, 4.0, 2.0]])
        >>> complete_box_iou(a, b)
        tensor([[0.2564, 0.4468]])
    """
    if not torch.jit.is_scripting():
        _check_iou_inputs(boxes1, boxes2, aligned, eps)
    return _overlap(boxes1, boxes2, 3, aligned, eps)


def _check_clip(boxes: Tensor, size: tuple[int, int]) -> None:
    check_real("boxes", boxes)
    check_last_dim("boxes", boxes, 4, what="(x1, y1, x2, y2)")
    check_type("size", size, (tuple, list))
    if len(size) != 2:
        raise ValueError(f"size must be (height, width), got {size!r}")
    for side in size:
        check_int("size", side, 0)


def clip_boxes_to_image(boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """Clamp ``"xyxy"`` boxes into an image: ``x`` to ``[0, width]``, ``y`` to ``[0, height]``.

    torchvision's ``clip_boxes_to_image`` (the same values and dtype).

    Args:
        boxes (Tensor[..., 4]): Boxes in ``(x1, y1, x2, y2)``; any leading dims.
        size: The image's ``(height, width)``, ints ``>= 0``.

    Returns:
        Tensor[..., 4]: The clamped boxes, in ``boxes``' dtype.

    Raises:
        TypeError: ``boxes`` not a real tensor, ``size`` not a pair of ints.
        ValueError: Last dim not 4, a negative side.

    Examples:
        >>> import torch
        >>> clip_boxes_to_image(torch.tensor([[-2.0, 3.0, 12.0, 7.5]]), (6, 10))
        tensor([[ 0.,  3., 10.,  6.]])
    """
    if not torch.jit.is_scripting():
        _check_clip(boxes, size)
    height, width = size
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def _check_small(boxes: Tensor, min_size: float) -> None:
    check_real("boxes", boxes)
    if boxes.dim() != 2:
        raise ValueError(f"boxes must have shape (N, 4), got {tuple(boxes.shape)}")
    check_last_dim("boxes", boxes, 4, what="(x1, y1, x2, y2)")
    if boxes.is_meta:
        raise ValueError("boxes are on the meta device: the kept count needs their values")
    check_number("min_size", min_size)


def remove_small_boxes(boxes: Tensor, min_size: float) -> Tensor:
    """Indices of the ``"xyxy"`` boxes whose width and height are both ``>= min_size``.

    torchvision's ``remove_small_boxes``. Like `visionblocks.ops.nms`, the number of indices
    depends on the values: on CUDA it waits for the GPU (one host read), and under
    ``torch.compile`` it needs dynamic output shapes (a graph break without
    ``capture_dynamic_output_shape_ops``). Inverted boxes have a negative side: removed.

    Args:
        boxes (Tensor[N, 4]): Boxes in ``(x1, y1, x2, y2)``.
        min_size: The smallest side kept, a real number.

    Returns:
        Tensor[K]: int64 indices of the kept boxes, in increasing order.

    Raises:
        TypeError: ``boxes`` not a real tensor, ``min_size`` not a number.
        ValueError: ``boxes`` not ``(N, 4)`` or on the meta device, a NaN ``min_size``.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 4.0, 0.5], [1.0, 1.0, 3.0, 2.0]])
        >>> remove_small_boxes(boxes, 1.0)
        tensor([0, 2])
    """
    if not torch.jit.is_scripting():
        _check_small(boxes, min_size)
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return torch.where((ws >= min_size) & (hs >= min_size))[0]
