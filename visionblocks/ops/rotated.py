"""Rotated boxes: IoU (pairwise and aligned) and rotated NMS (the loss: `visionblocks.losses.rotated_iou`).

Pure PyTorch, plus a Triton kernel for the pairwise IoU on CUDA
(`visionblocks.kernels.rotated_iou`). The intersection is computed exactly as a convex
polygon, in tiles of pairs (on CPU only pairs whose bounding boxes overlap), in the frame of
one box, so nothing cancels catastrophically: float32 IoUs are within 1e-5 of the exact
ones, float64 within 1e-12, nested, touching, nearly coincident and far-off pairs included.

Convention:
    Formats (``fmt``): torchvision's rotated ``tv_tensors.BoundingBoxFormat`` names, as a
    string in any case or as the enum member (a ``BoundingBoxes`` input must carry its own).

    - ``"cxcywhr"`` (the default): ``(cx, cy, w, h, r)``, centre, width, height, angle.
    - ``"xywhr"``: ``(x1, y1, w, h, r)``; ``(x1, y1)`` is the first corner (top-left when
      ``r = 0``), the width runs from it along ``u``, the height along ``v`` (below).
    - ``"xyxyxyxy"``: the corners ``(x1, y1, ..., x4, y4)`` in torchvision's order:
      ``p2 = p1 + w u``, ``p3 = p2 + h v``, ``p4 = p1 + h v``; read as torchvision does, the
      rectangle with centre the corners' mean, ``w = |p2 - p1|``, ``h = |p3 - p2|`` and the
      angle of ``p1 -> p2`` (corners listed the other way round give the same rectangle).
    - ``"cxcywhr_rad_cw"``: ``(cx, cy, w, h, t)`` with ``t`` in **radians**, turning
      **clockwise** on screen (width vector ``(cos t, sin t)``): ``r = -t * 180 / pi``.

    Angles are in **degrees** in image coordinates (x right, y down), as in torchvision's
    tv_tensors and transforms: the width axis is ``u = (cos r, -sin r)`` and the height axis
    ``v = (sin r, cos r)``, so a positive ``r`` turns the box **counter-clockwise on
    screen** (``r = 90`` points the width axis up). Other libraries:

    - detectron2 ``RotatedBoxes`` ``(x_ctr, y_ctr, w, h, angle)``, degrees,
      counter-clockwise: the same numbers as ``"cxcywhr"``.
    - mmrotate 1.x ``RotatedBoxes`` ``(x, y, w, h, t)`` and ultralytics' ``xywhr``
      (``Results.obb.xywhr``; not torchvision's ``"xywhr"``): ``"cxcywhr_rad_cw"``. Their
      regularisations (``"le90"``, ``"oc"``, ultralytics' ``[0, pi/2)``) only choose among
      equivalent representations (the same IoU here). ultralytics' ``xyxyxyxy``
      ``(..., 4, 2)`` flattened to ``(..., 8)`` is ``"xyxyxyxy"``.

    A value check (CPU tensors; `visionblocks.value_checks`) warns where every angle given
    in degrees lies in ``[0, pi/2]`` and one is above 0.1: ultralytics' radians, likely.

    ``(w, h, r)``, ``(w, h, r + 180 k)`` and ``(h, w, r + 90 + 180 k)`` are the same
    rectangle: their IoU is 1 (exactly, for angles differing by exact multiples of 90). A
    negative ``w`` or ``h`` is read as its absolute value (as torchvision's ``XYWHR``
    conversion). Lengths are in any unit, as long as both sets of boxes agree.

    **Degenerate** boxes (``w == 0`` or ``h == 0``) have IoU 0, also against an identical
    box. **eps**, as for the axis-aligned ops (`visionblocks.ops.boxes`), replaces a union
    that is exactly zero (two degenerate boxes) and changes nothing else.

    **Range**: as for the axis-aligned ops, areas must be finite normal numbers (float32:
    sides between about ``1e-18`` and ``1e18``). Non-finite inputs give NaN.

Dtypes:
    IoUs are computed and returned in float32 (float64 for float64 boxes; mixed inputs
    promote) and gradients to half boxes clamped to their finite range, as `box_iou`.
    ``torch.autocast`` changes nothing (no op here is one autocast lowers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.dispatch import forced_triton, use_triton, validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_same_device, compute_dtype
from visionblocks.ops._rotated_geometry import (
    ROTATED_FORMATS,
    parse_rotated_format,
    plain,
    to_cxcywhr,
    warn_radians,
)
from visionblocks.ops._rotated_nms import nms_rotated_op
from visionblocks.ops._rotated_overlap import rotated_iou
from visionblocks.ops.boxes import _upcast, check_eps, check_pair

__all__ = ["batched_nms_rotated", "nms_rotated", "rotated_box_iou"]
__dir__ = public_dir(__name__, __all__)


def _check_boxes(name: str, boxes: Any, fmt: str, min_dims: int, exact: bool = False) -> Tensor:
    """Type, dtype and shape of one set of boxes; returns a plain tensor."""
    if not isinstance(boxes, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(boxes).__name__}")
    if boxes.is_complex() or boxes.dtype == torch.bool:
        raise TypeError(
            f"{name} must be a real tensor (floating or integer), got dtype {boxes.dtype}"
        )
    size = ROTATED_FORMATS[fmt]
    shape = tuple(boxes.shape)
    wrong_rank = len(shape) != min_dims if exact else len(shape) < min_dims
    if wrong_rank or shape[-1:] != (size,):
        lead = "(" if exact else "(..., "
        lead += "N, " if min_dims > 1 else ""
        raise ValueError(f"{name} must have shape {lead}{size}) in {fmt!r} format, got {shape}")
    return plain(boxes, fmt, name)


def _same_device(name1: str, a: Tensor, name2: str, b: Tensor) -> None:
    check_same_device(**{name1: a, name2: b})


def _prepared(boxes1: Tensor, boxes2: Tensor, fmt: str) -> tuple[Tensor, Tensor]:
    """Both sets as cxcywhr of one floating dtype (half cxcywhr stays half for the kernel)."""
    dtype = torch.promote_types(boxes1.dtype, boxes2.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float32
    if fmt != "cxcywhr" and dtype != torch.float64:
        dtype = torch.float32
    b1 = _upcast(boxes1, dtype) if boxes1.is_floating_point() else boxes1.to(dtype)
    b2 = _upcast(boxes2, dtype) if boxes2.is_floating_point() else boxes2.to(dtype)
    return to_cxcywhr(b1, fmt), to_cxcywhr(b2, fmt)


def rotated_box_iou(
    boxes1: Tensor,
    boxes2: Tensor,
    fmt: Any = "cxcywhr",
    aligned: bool = False,
    eps: float = 1e-7,
    impl: str = "auto",
) -> Tensor:
    """Intersection over union of rotated boxes, in ``[0, 1]``.

    ``IoU = |A ∩ B| / |A ∪ B|`` with the exact intersection polygon: identical boxes (the
    Convention) give exactly 1, nested ones their area ratio, touching or degenerate ones 0,
    axis-aligned ones `box_iou`. Differentiable (finite gradients, zero for equal boxes);
    compiles with ``torch.compile(fullgraph=True)``; reads no CUDA tensor values on the host.

    Args:
        boxes1 (Tensor[..., N, K]): First set; ``K`` is 5 (``"cxcywhr"``, ``"xywhr"``,
            ``"cxcywhr_rad_cw"``) or 8 (``"xyxyxyxy"``). Floating or integer.
        boxes2 (Tensor[..., M, K]): Second set, same format; leading dims broadcastable with
            ``boxes1``'s, as for `box_iou`.
        fmt: ``"cxcywhr"``, ``"xywhr"``, ``"xyxyxyxy"``, ``"cxcywhr_rad_cw"`` (ultralytics'
            ``xywhr``; the Convention) in any case, or a torchvision ``BoundingBoxFormat``.
        aligned: Every pair, ``(..., N, M)`` (False), or index by index, ``(..., N)`` (True).
        eps: Replaces a union that is exactly zero (the Convention); ``>= 0``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``. The Triton kernel runs the forward of
            pairwise ``(N, K)`` x ``(M, K)`` calls on CUDA (``"auto"`` picks it there).

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: IoUs, float32 (float64 for float64 boxes).

    Raises:
        TypeError: Boxes not real tensors, ``fmt`` not a str or format, ``aligned`` not a
            bool, ``eps`` not a number.
        ValueError: Shapes, devices or ``eps`` as for `box_iou` (a last dim that does not
            fit ``fmt``), an unknown or axis-aligned ``fmt``, a ``BoundingBoxes`` in another
            format, an unknown ``impl``.
        RuntimeError: ``impl="triton"`` for a pairwise call where the kernel cannot run.

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0]])
        >>> b = torch.tensor([[1.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 2.0, 2.0, 45.0],
        ...                   [0.0, 0.0, 2.0, 2.0, 90.0]])
        >>> rotated_box_iou(a, b)
        tensor([[0.3333, 0.7071, 1.0000]])
        >>> corners = torch.tensor([[0.0, 0.0, 2.0, 0.0, 2.0, 2.0, 0.0, 2.0]])
        >>> rotated_box_iou(corners, corners + 1, fmt="xyxyxyxy")
        tensor([[0.1429]])
        >>> rotated_box_iou(a, torch.tensor([[0.0, 0.0, 2.0, 2.0, -torch.pi / 4]]),
        ...                 fmt="cxcywhr_rad_cw")  # ultralytics' xywhr: -pi/4 is our 45
        tensor([[0.7071]])
    """
    fmt = parse_rotated_format(fmt)
    if not isinstance(aligned, bool):
        raise TypeError(f"aligned must be bool, got {type(aligned).__name__} ({aligned!r})")
    eps = check_eps(eps)
    validate_impl(impl)
    min_dims = 1 if aligned else 2
    boxes1 = _check_boxes("boxes1", boxes1, fmt, min_dims)
    boxes2 = _check_boxes("boxes2", boxes2, fmt, min_dims)
    check_pair(boxes1, boxes2, aligned)
    warn_radians("rotated_box_iou", fmt, boxes1, boxes2)
    b1, b2 = _prepared(boxes1, boxes2, fmt)
    if forced_triton(impl) and not aligned and b1.dim() == 2 and b2.dim() == 2:
        use_triton("rotated_box_iou", impl, b1, b2)  # raises here where the kernel cannot run
    return rotated_iou(b1, b2, aligned, eps, impl)


def _check_threshold(iou_threshold: Any) -> float:
    if isinstance(iou_threshold, bool) or not isinstance(iou_threshold, int | float):
        raise TypeError(
            f"iou_threshold must be a float, got {type(iou_threshold).__name__} ({iou_threshold!r})"
        )
    if not 0 <= iou_threshold <= 1:  # also False for NaN
        raise ValueError(f"iou_threshold must be a number in [0, 1], got {iou_threshold!r}")
    return float(iou_threshold)


def _is_integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _check_per_box(
    name: str, value: Any, boxes: Tensor, kind: str, ok: Callable[[Tensor], bool]
) -> None:
    """``value`` is a tensor of ``kind`` dtype (``ok``), one entry per box, on boxes' device."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not ok(value):
        raise TypeError(f"{name} must be {kind} tensor, got dtype {value.dtype}")
    if tuple(value.shape) != (boxes.shape[0],):
        raise ValueError(
            f"{name} must have shape (N,) = ({boxes.shape[0]},) like boxes, "
            f"got {tuple(value.shape)}"
        )
    _same_device("boxes", boxes, name, value)


def _nms(
    boxes: Tensor,
    scores: Tensor,
    idxs: Tensor | None,
    iou_threshold: Any,
    fmt: Any,
    batched: bool = False,
) -> Tensor:
    fmt = parse_rotated_format(fmt)
    threshold = _check_threshold(iou_threshold)
    boxes = _check_boxes("boxes", boxes, fmt, 2, exact=True)
    _check_per_box("scores", scores, boxes, "a floating-point", Tensor.is_floating_point)
    if batched:
        _check_per_box("idxs", idxs, boxes, "an integer", _is_integer)
    warn_radians("batched_nms_rotated" if batched else "nms_rotated", fmt, boxes, stacklevel=4)
    cxcywhr = to_cxcywhr(boxes.detach().to(compute_dtype(boxes.dtype)), fmt)
    return nms_rotated_op(cxcywhr, scores.detach(), idxs, threshold)


def nms_rotated(
    boxes: Tensor, scores: Tensor, iou_threshold: float, fmt: Any = "cxcywhr"
) -> Tensor:
    """Greedy non-maximum suppression of rotated boxes; the kept indices, best first.

    Boxes are taken by decreasing score (ties in index order, as ``torchvision.ops.nms``);
    each kept box removes every later box whose `rotated_box_iou` with it is greater than
    ``iou_threshold``: torchvision's ``nms`` for axis-aligned boxes (``r = 0``). Degenerate
    boxes overlap nothing, so they never suppress nor are suppressed; NaN scores sort first.

    The output's length depends on the values, so an eager call reads the device. A custom
    op: ``torch.compile(fullgraph=True)`` traces it as one node with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` (as torchvision's ``nms``).

    Args:
        boxes (Tensor[N, K]): Boxes in ``fmt`` (``K`` = 5 or 8); floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        iou_threshold: Boxes overlapping a kept one by more than this are removed; in ``[0, 1]``.
        fmt: As `rotated_box_iou`.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score.

    Raises:
        TypeError: Non-tensor or complex/bool boxes, non-floating scores, a non-number
            threshold, ``fmt`` not a str or format.
        ValueError: Boxes not ``(N, K)`` for ``fmt``, ``scores`` not ``(N,)``, tensors on
            different devices, a threshold outside ``[0, 1]``, an unknown ``fmt``.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.0], [0.2, 0.0, 4.0, 2.0, 5.0],
        ...                       [0.0, 0.0, 4.0, 2.0, 90.0], [9.0, 9.0, 2.0, 2.0, 30.0]])
        >>> scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
        >>> nms_rotated(boxes, scores, 0.5)
        tensor([0, 2, 3])
    """
    return _nms(boxes, scores, None, iou_threshold, fmt)


def batched_nms_rotated(
    boxes: Tensor,
    scores: Tensor,
    idxs: Tensor,
    iou_threshold: float,
    fmt: Any = "cxcywhr",
) -> Tensor:
    """`nms_rotated` per category: boxes with different ``idxs`` never suppress each other.

    The result is every category's `nms_rotated` result merged by decreasing score (ties in
    index order), as ``torchvision.ops.batched_nms``, computed in one pass (categories are
    masked, not offset, so no precision is lost); host reads as `nms_rotated`.

    Args:
        boxes (Tensor[N, K]): Boxes in ``fmt`` (``K`` = 5 or 8); floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        idxs (Tensor[N]): Integer category of each box.
        iou_threshold: Boxes overlapping a kept one of their category by more than this
            are removed; in ``[0, 1]``.
        fmt: As `nms_rotated`.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score.

    Raises:
        TypeError: As `nms_rotated`, or non-integer ``idxs``.
        ValueError: As `nms_rotated`, or ``idxs`` not ``(N,)`` or on another device.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.0], [0.2, 0.0, 4.0, 2.0, 5.0],
        ...                       [0.1, 0.0, 4.0, 2.0, 0.0]])
        >>> scores = torch.tensor([0.9, 0.8, 0.7])
        >>> batched_nms_rotated(boxes, scores, torch.tensor([0, 1, 0]), 0.5)
        tensor([0, 1])
    """
    return _nms(boxes, scores, idxs, iou_threshold, fmt, batched=True)
