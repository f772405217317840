"""Box coders: boxes to regression targets and back, relative to anchor points or anchor boxes.

- distances (anchor-free heads: FCOS, YOLOv8-11, TOOD): `encode_distances` /
  `decode_distances`, ultralytics' ``bbox2dist`` / ``dist2bbox`` (``reg_max`` clamp included);
- deltas (anchor-based heads: RetinaNet, Faster R-CNN): `encode_deltas` / `decode_deltas`,
  torchvision's ``BoxCoder.encode_single`` / ``decode_single`` (``weights`` and
  ``bbox_xform_clip`` included).

Each takes the reference (points or anchors) first, then what it codes, with leading dims
that broadcast: anchors ``(A, 4)`` with deltas ``(B, A, 4)`` decode a batch; Faster R-CNN's
per-class deltas ``(N, K * 4)`` are ``deltas.view(N, K, 4)`` with ``anchors[:, None]``. The
deltas' second argument is keyword-only (``decode_deltas(anchors, deltas=d)``): torchvision
takes the codes first in ``decode_single`` and the targets first in ``encode_single``, and an
``(N, 4)`` pair cannot tell the two apart. Nothing is checked on the values (a check would
make the GPU wait): zero-size anchors give ``inf`` / ``NaN`` deltas, as torchvision's.

Convention:
    Boxes are ``"xyxy"`` (`visionblocks.ops.boxes`), points ``(x, y)``, in one unit.
    Distances are ``(left, top, right, bottom)`` from the point to the box's sides. Deltas are
    ``(wx * dx / w_a, wy * dy / h_a, ww * log(w / w_a), wh * log(h / h_a))``, ``(dx, dy)`` the
    shift of the centre and ``(w_a, h_a)`` the anchor's size.

Dtypes:
    Computed and returned in float32 for float16, bfloat16 and integer inputs (float64 for
    float64; mixed inputs promote first): half precision cannot hold a box coordinate of a
    large image to a pixel, and ``exp`` overflows it. float32 and float64 results equal
    ultralytics' and torchvision's exactly (the same operations in the same order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_int, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_last_dim,
    check_real,
    check_same_device,
    compute_dtype,
)

__all__ = ["decode_deltas", "decode_distances", "encode_deltas", "encode_distances"]
__dir__ = public_dir(__name__, __all__)

_UNREAL = frozenset({torch.bool, torch.complex32, torch.complex64, torch.complex128})
_FLOATS = (torch.float32, torch.float64)


def _pair(
    name_a: str, a: Any, size_a: int, name_b: str, b: Any, size_b: int, lazy: bool = False
) -> torch.dtype:
    """Check two coded tensors (types, last dims, devices, broadcastable leading dims); return
    the compute dtype. The common case costs a few attribute reads (these ops are small);
    ``lazy``: unequal leading dims are left to the op, which calls this again if it fails."""
    if (
        type(a) is Tensor
        and type(b) is Tensor
        and (dtype := a.dtype) is b.dtype
        and dtype in _FLOATS
        and a.device == b.device
        and (shape_a := a.shape)
        and shape_a[-1] == size_a
        and (shape_b := b.shape)
        and shape_b[-1] == size_b
        and (lazy or shape_a[:-1] == shape_b[:-1])
    ):
        return dtype
    if (
        not isinstance(a, Tensor)
        or not isinstance(b, Tensor)
        or a.dtype in _UNREAL
        or b.dtype in _UNREAL
    ):
        check_real(name_a, a)
        check_real(name_b, b)
    shape_a, shape_b = a.shape, b.shape
    if not shape_a or shape_a[-1] != size_a or not shape_b or shape_b[-1] != size_b:
        check_last_dim(name_a, a, size_a)
        check_last_dim(name_b, b, size_b)
    if a.device != b.device:
        check_same_device(**{name_a: a, name_b: b})
    # torch.broadcast_shapes' rule, without its cost on small inputs
    if shape_a[:-1] != shape_b[:-1] and any(
        x != y and x != 1 and y != 1 for x, y in zip(shape_a[-2::-1], shape_b[-2::-1])
    ):
        raise ValueError(
            f"{name_a} and {name_b} must have leading dims that broadcast, got "
            f"{tuple(shape_a)} and {tuple(shape_b)}"
        )
    return compute_dtype(torch.promote_types(a.dtype, b.dtype))


def _as(dtype: torch.dtype, *tensors: Tensor) -> list[Tensor]:
    return [t if t.dtype == dtype else t.to(dtype) for t in tensors]


def _weights(weights: Any) -> tuple[float, float, float, float]:
    if isinstance(weights, (str, Tensor)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be 4 numbers (wx, wy, ww, wh), got {weights!r}")
    if len(weights) != 4:
        raise ValueError(f"weights must be 4 numbers (wx, wy, ww, wh), got {weights!r}")
    out = tuple(check_number("weights", w, 0.0, low_inclusive=False) for w in weights)
    if any(w - w != 0 for w in out):
        raise ValueError(f"weights must be finite, got {weights!r}")
    return out  # type: ignore[return-value]


def encode_distances(points: Tensor, boxes: Tensor, reg_max: int | None = None) -> Tensor:
    """Distances from points to the sides of boxes: ultralytics' ``bbox2dist``.

    Equal to ``ultralytics.utils.tal.bbox2dist(points, boxes, reg_max)``: with ``reg_max``,
    clamped to ``[0, reg_max - 0.01]`` (the distribution focal loss's last bin; YOLOv8's
    16 bins pass 15, as its loss does). Distances are in the unit of the points: grid units
    for ultralytics' points and boxes divided by the strides.

    Args:
        points (Tensor[..., 2]): Anchor points ``(x, y)``.
        boxes (Tensor[..., 4]): ``"xyxy"`` boxes (leading dims broadcast with the points').
        reg_max: The largest distance bin, or ``None`` for no clamp.

    Returns:
        Tensor[..., 4]: ``(left, top, right, bottom)``, float32 (float64 for float64 inputs).

    Raises:
        TypeError: ``points`` or ``boxes`` not a real tensor; ``reg_max`` not an int.
        ValueError: Last dims not 2 and 4, leading dims that do not broadcast, tensors on
            different devices, ``reg_max`` below 1.

    Examples:
        >>> points = torch.tensor([[2.5, 2.5]])
        >>> encode_distances(points, torch.tensor([[0.0, 1.0, 30.0, 4.0]]), reg_max=15)
        tensor([[ 2.5000,  1.5000, 14.9900,  1.5000]])
    """
    dtype = _pair("points", points, 2, "boxes", boxes, 4, lazy=True)
    if reg_max is not None and (type(reg_max) is not int or reg_max < 1):
        check_int("reg_max", reg_max, 1)
    if points.dtype is not dtype or boxes.dtype is not dtype:
        points, boxes = _as(dtype, points, boxes)
    x1y1, x2y2 = boxes.chunk(2, -1)
    try:
        dist = torch.cat((points - x1y1, x2y2 - points), -1)
    except RuntimeError:  # leading dims that do not broadcast: a named error
        _pair("points", points, 2, "boxes", boxes, 4)
        raise
    return dist if reg_max is None else dist.clamp_(0, reg_max - 0.01)


def decode_distances(points: Tensor, distances: Tensor, fmt: str = "xyxy") -> Tensor:
    """Boxes from points and their distances to the four sides: ultralytics' ``dist2bbox``.

    Equal to ``ultralytics.utils.tal.dist2bbox(distances, points, xywh=fmt == "cxcywh")``
    (the last dim; ultralytics' ``dim=1`` layout ``(B, 4, A)`` is ``.transpose(1, 2)`` here).

    Args:
        points (Tensor[..., 2]): Anchor points ``(x, y)``.
        distances (Tensor[..., 4]): ``(left, top, right, bottom)`` (leading dims broadcast with
            the points').
        fmt: ``"xyxy"`` or ``"cxcywh"`` (ultralytics' ``xywh=True``, its default).

    Returns:
        Tensor[..., 4]: Boxes in ``fmt``, float32 (float64 for float64 inputs).

    Raises:
        TypeError: ``points`` or ``distances`` not a real tensor.
        ValueError: Last dims not 2 and 4, leading dims that do not broadcast, tensors on
            different devices, an unknown ``fmt``.

    Examples:
        >>> decode_distances(torch.tensor([[10.0, 20.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        tensor([[ 9., 18., 13., 24.]])
    """
    dtype = _pair("points", points, 2, "distances", distances, 4, lazy=True)
    if fmt != "xyxy" and fmt != "cxcywh":
        check_choice("fmt", fmt, ("xyxy", "cxcywh"))
    if points.dtype is not dtype or distances.dtype is not dtype:
        points, distances = _as(dtype, points, distances)
    lt, rb = distances.chunk(2, -1)
    try:
        x1y1, x2y2 = points - lt, points + rb
    except RuntimeError:  # leading dims that do not broadcast: a named error
        _pair("points", points, 2, "distances", distances, 4)
        raise
    if fmt == "cxcywh":
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1)
    return torch.cat((x1y1, x2y2), -1)


def encode_deltas(
    anchors: Tensor, *, boxes: Tensor, weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0)
) -> Tensor:
    """Deltas of boxes relative to anchors: torchvision's ``BoxCoder.encode_single``.

    Equal to ``BoxCoder(weights).encode_single(boxes, anchors)`` (note its order: targets
    first).

    Args:
        anchors (Tensor[..., 4]): ``"xyxy"`` anchors (or proposals), positive sizes.
        boxes (Tensor[..., 4]): ``"xyxy"`` boxes to encode, positive sizes (keyword-only;
            leading dims broadcast with the anchors').
        weights: ``(wx, wy, ww, wh)``, positive (RetinaNet and the RPN: 1; Faster R-CNN's box
            head: ``(10, 10, 5, 5)``).

    Returns:
        Tensor[..., 4]: Deltas ``(dx, dy, dw, dh)`` (module Convention), float32 (float64 for
        float64 inputs).

    Raises:
        TypeError: ``anchors`` or ``boxes`` not a real tensor, ``boxes`` given by position,
            ``weights`` not numbers.
        ValueError: Last dims not 4, leading dims that do not broadcast, tensors on different
            devices, weights not 4 positive finite numbers.

    Examples:
        >>> anchors = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
        >>> encode_deltas(anchors, boxes=torch.tensor([[5.0, 0.0, 15.0, 20.0]]))
        tensor([[0.5000, 0.5000, 0.0000, 0.6931]])
    """
    dtype = _pair("anchors", anchors, 4, "boxes", boxes, 4)
    wx, wy, ww, wh = _weights(weights)
    anchors, boxes = _as(dtype, anchors, boxes)
    ax1, ay1, ax2, ay2 = anchors.unbind(-1)
    bx1, by1, bx2, by2 = boxes.unbind(-1)
    ex_w, ex_h = ax2 - ax1, ay2 - ay1
    ex_x, ex_y = ax1 + 0.5 * ex_w, ay1 + 0.5 * ex_h
    gt_w, gt_h = bx2 - bx1, by2 - by1
    gt_x, gt_y = bx1 + 0.5 * gt_w, by1 + 0.5 * gt_h
    dx = wx * (gt_x - ex_x) / ex_w
    dy = wy * (gt_y - ex_y) / ex_h
    dw = ww * torch.log(gt_w / ex_w)
    dh = wh * torch.log(gt_h / ex_h)
    return torch.stack((dx, dy, dw, dh), -1)


def decode_deltas(
    anchors: Tensor,
    *,
    deltas: Tensor,
    weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
    bbox_xform_clip: float = math.log(1000.0 / 16),
) -> Tensor:
    """Boxes from anchors and deltas: torchvision's ``BoxCoder.decode_single``.

    Equal to ``BoxCoder(weights, bbox_xform_clip).decode_single(deltas, anchors)``: the width
    and height deltas (divided by their weights) are clamped above at ``bbox_xform_clip``
    before ``exp``.

    Args:
        anchors (Tensor[..., 4]): ``"xyxy"`` anchors (or proposals).
        deltas (Tensor[..., 4]): ``(dx, dy, dw, dh)`` (keyword-only; leading dims broadcast
            with the anchors').
        weights: ``(wx, wy, ww, wh)``, positive, as given to `encode_deltas`.
        bbox_xform_clip: Largest ``dw / ww`` and ``dh / wh`` (>= 0; ``math.inf``: no clamp).

    Returns:
        Tensor[..., 4]: ``"xyxy"`` boxes, float32 (float64 for float64 inputs).

    Raises:
        TypeError: ``anchors`` or ``deltas`` not a real tensor, ``deltas`` given by position,
            ``weights`` or ``bbox_xform_clip`` not numbers.
        ValueError: Last dims not 4, leading dims that do not broadcast, tensors on different
            devices, weights not 4 positive finite numbers, ``bbox_xform_clip`` negative or NaN.

    Examples:
        >>> anchors = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
        >>> decode_deltas(anchors, deltas=torch.tensor([[0.5, 0.5, 0.0, 0.6931472]]))
        tensor([[ 5.,  0., 15., 20.]])
    """
    dtype = _pair("anchors", anchors, 4, "deltas", deltas, 4)
    wx, wy, ww, wh = _weights(weights)
    check_type("bbox_xform_clip", bbox_xform_clip, (int, float))
    clip = check_number("bbox_xform_clip", bbox_xform_clip, 0.0)
    anchors, deltas = _as(dtype, anchors, deltas)
    ax1, ay1, ax2, ay2 = anchors.unbind(-1)
    dx, dy, dw, dh = deltas.unbind(-1)
    widths, heights = ax2 - ax1, ay2 - ay1
    ctr_x, ctr_y = ax1 + 0.5 * widths, ay1 + 0.5 * heights
    dw = torch.clamp(dw / ww, max=clip)
    dh = torch.clamp(dh / wh, max=clip)
    pred_x = dx / wx * widths + ctr_x
    pred_y = dy / wy * heights + ctr_y
    half_w = 0.5 * (torch.exp(dw) * widths)
    half_h = 0.5 * (torch.exp(dh) * heights)
    return torch.stack((pred_x - half_w, pred_y - half_h, pred_x + half_w, pred_y + half_h), -1)
