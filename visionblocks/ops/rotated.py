"""Rotated boxes: IoU (pairwise and aligned), the rotated IoU loss, and rotated NMS.

Pure PyTorch (no compiled extension), plus a Triton kernel for the pairwise IoU on CUDA
(`visionblocks.kernels.rotated_iou`). The intersection of two rectangles is computed
exactly as a convex polygon (each box's edges clipped to the other box, the end points
sorted by angle, the shoelace area; `visionblocks.ops._rotated_overlap`), vectorised over
pairs and tiled so that large ``N x M`` problems keep their temporaries to tens of MB (a
few hundred on CUDA); on CPU only the pairs whose bounding boxes overlap are computed.

Precision: every pair is computed in the frame of one of its boxes, and every polygon
vertex comes from one clipping step of the input boxes (no vertex is computed from
another), so nothing cancels catastrophically and float32 needs no float64 step: float32
IoUs are within 1e-5 of the exact (float64) ones, float64 within 1e-12, nested, touching,
nearly coincident and far-from-the-origin pairs included (tests/ops/test_rotated.py holds
them to shapely's polygon intersection).

Convention:
    Formats (``fmt``): torchvision's rotated ``tv_tensors.BoundingBoxFormat`` names, as a
    string in any case or as the enum member.

    - ``"cxcywhr"`` (the default): ``(cx, cy, w, h, r)``, centre, width, height, angle.
    - ``"xywhr"``: ``(x1, y1, w, h, r)``; ``(x1, y1)`` is the box's first corner, the one
      that is top-left when ``r = 0``; the width runs from it along ``u``, the height
      along ``v`` (below).
    - ``"xyxyxyxy"``: the corners ``(x1, y1, x2, y2, x3, y3, x4, y4)`` in torchvision's
      order: ``p2 = p1 + w u``, ``p3 = p2 + h v``, ``p4 = p1 + h v``. Read as the
      rectangle with centre the mean of the corners, ``w = |p2 - p1|``, ``h = |p3 - p2|``
      and the angle of ``p1 -> p2`` (torchvision's conversion for corners in its order; the
      same rectangle for corners listed the other way round).

    A torchvision ``BoundingBoxes`` input must carry the ``fmt`` it is passed with (its
    ``format`` is checked, never its values).

    Angles are in **degrees** in image coordinates (x right, y down), as in torchvision's
    tv_tensors and transforms: the width axis is ``u = (cos r, -sin r)`` and the height axis
    ``v = (sin r, cos r)``, so a positive ``r`` turns the box **counter-clockwise on
    screen** (``r = 90`` points the width axis up). Other libraries:

    - detectron2 ``RotatedBoxes`` ``(x_ctr, y_ctr, w, h, angle)``, degrees,
      counter-clockwise: the same numbers as ``"cxcywhr"`` (its documented vertex formulas
      give the width vector ``(cos a, -sin a)`` and the height vector ``(sin a, cos a)``).
    - mmrotate 1.x ``RotatedBoxes`` ``(x, y, w, h, t)``: radians, **clockwise** on screen
      (its ``rbox2qbox`` puts the width vector at ``(cos t, sin t)``): ``r = -t * 180 / pi``.
      Its ``"le90"`` (``w >= h``, ``t`` in ``[-pi/2, pi/2)``) and ``"oc"`` (OpenCV's
      ``minAreaRect``) regularisations only choose among equivalent representations, which
      give the same IoU here.

    ``(w, h, r)``, ``(w, h, r + 180 k)`` and ``(h, w, r + 90 + 180 k)`` are the same
    rectangle: their IoU is 1 (exactly, when the angles differ by exact multiples of 90, as
    they do for integer angles). A negative ``w`` or ``h`` is read as its absolute value
    (torchvision's ``XYWHR`` conversion does the same). Units are free, as long as both
    sets of boxes agree.

    **Degenerate** boxes (``w == 0`` or ``h == 0``: a segment or a point) have area 0, so
    their IoU is 0, also against an identical box. **eps**, as for the axis-aligned ops
    (`visionblocks.ops.boxes`): it replaces a union that is exactly zero (two degenerate
    boxes), so the result is 0 there, and changes nothing else.

    **Range**: as for the axis-aligned ops, areas must be finite normal numbers (float32:
    sides between about ``1e-18`` and ``1e18``); the polygon is computed relative to one box
    of each pair, so boxes far from the origin lose no precision. Non-finite inputs give NaN.

Dtypes:
    IoUs are computed and returned in float32 for float16, bfloat16, float32 and integer
    boxes, float64 for float64 boxes (mixed inputs promote first), as `box_iou`. Gradients
    to half boxes are computed in float32 and clamped to the half dtype's finite range.
    ``torch.autocast`` changes nothing (no op here is one autocast lowers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.dispatch import validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import REDUCTIONS, check_reduction, reduce_loss
from visionblocks.kernels._dispatch import resolve_impl
from visionblocks.ops._rotated_geometry import (
    ROTATED_FORMATS,
    parse_rotated_format,
    plain,
    to_cxcywhr,
)
from visionblocks.ops._rotated_nms import nms_rotated_op
from visionblocks.ops._rotated_overlap import rotated_iou
from visionblocks.ops.boxes import _upcast, check_eps

__all__ = [
    "batched_nms_rotated",
    "nms_rotated",
    "rotated_box_iou",
    "rotated_box_iou_loss",
]
__dir__ = public_dir(__name__, __all__)


def _check_boxes(name: str, boxes: Any, fmt: str, min_dims: int, exact: bool = False) -> Tensor:
    """Type, dtype and shape of one set of boxes (no values); returns a plain tensor."""
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
    if a.device != b.device:
        raise ValueError(
            f"{name1} and {name2} must be on the same device, "
            f"got {name1} on {a.device}, {name2} on {b.device}"
        )


def _prepared(boxes1: Tensor, boxes2: Tensor, fmt: str) -> tuple[Tensor, Tensor]:
    """Both sets as cxcywhr of one floating dtype: the promoted one for cxcywhr boxes (half
    stays half: the kernel reads it), else converted in float32 (float64), differentiably."""
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

    ``IoU = |A ∩ B| / |A ∪ B|`` with the exact intersection of the two rectangles (a convex
    polygon of up to 8 vertices). Identical boxes (after reducing the angle: see the
    Convention) give exactly 1; a box nested in another gives the ratio of their areas;
    touching boxes give 0; degenerate boxes give 0. Axis-aligned boxes (``r`` a multiple of
    90) give `box_iou` of the same boxes.

    Differentiable: the gradient of the intersection's area is written out (each box edge
    moves the polygon's boundary lying on it), so it is finite for any finite boxes,
    degenerate ones included, with no division by a near-zero quantity; equal boxes get a
    zero gradient (the IoU is at its maximum there). Compiles with
    ``torch.compile(fullgraph=True)`` (a custom op, ``visionblocks::rotated_box_iou``);
    reads no CUDA tensor values on the host (eager CPU calls read the boxes' bounds to skip
    the pairs that are apart, which costs no synchronisation).

    Args:
        boxes1 (Tensor[..., N, K]): First set; ``K`` is 5 (``"cxcywhr"``, ``"xywhr"``) or 8
            (``"xyxyxyxy"``). Floating or integer.
        boxes2 (Tensor[..., M, K]): Second set, same format; leading dims equal to or
            broadcastable with ``boxes1``'s (with ``aligned=True``: all dims but the last).
        fmt: The boxes' format: ``"cxcywhr"``, ``"xywhr"``, ``"xyxyxyxy"`` (any case) or a
            torchvision ``BoundingBoxFormat``.
        aligned: False: every pair, ``(..., N, M)``. True: ``boxes1[..., i, :]`` with
            ``boxes2[..., i, :]``, ``(..., N)``.
        eps: Replaces a union that is exactly zero (the Convention); ``>= 0``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``. The Triton kernel covers the forward
            of the pairwise case of ``(N, K)`` and ``(M, K)`` boxes on CUDA (``"auto"``
            picks it there; the gradient is the torch one); other calls run the torch path.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: IoUs, float32 (float64 for float64 boxes).
        Under ``torch.autocast``: the same.

    Raises:
        TypeError: Boxes not real tensors, ``fmt`` not a str or format, ``aligned`` not a
            bool, ``eps`` not a number.
        ValueError: A last dim that does not fit ``fmt``, fewer than 2 dims (pairwise),
            leading dims that do not broadcast, boxes on different devices, an unknown or
            axis-aligned ``fmt``, a ``BoundingBoxes`` in another format, a negative or
            non-finite ``eps``, an unknown ``impl``.
        RuntimeError: ``impl="triton"`` for a pairwise call where the kernel cannot run.

    Convention:
        See the module docstring: degrees, counter-clockwise on screen (torchvision's
        tv_tensors; detectron2's numbers; mmrotate's ``-t`` in degrees).

    Examples:
        >>> import torch
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0]])
        >>> b = torch.tensor([[1.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 2.0, 2.0, 45.0],
        ...                   [0.0, 0.0, 2.0, 2.0, 90.0]])
        >>> rotated_box_iou(a, b)
        tensor([[0.3333, 0.7071, 1.0000]])
        >>> long = torch.tensor([[5.0, 5.0, 4.0, 1.0, 30.0]])
        >>> same = torch.tensor([[5.0, 5.0, 1.0, 4.0, -60.0]])  # the same rectangle
        >>> rotated_box_iou(long, same, aligned=True)
        tensor([1.])
        >>> corners = torch.tensor([[0.0, 0.0, 2.0, 0.0, 2.0, 2.0, 0.0, 2.0]])
        >>> rotated_box_iou(corners, corners + 1, fmt="xyxyxyxy")
        tensor([[0.1429]])
    """
    fmt = parse_rotated_format(fmt)
    if not isinstance(aligned, bool):
        raise TypeError(f"aligned must be bool, got {type(aligned).__name__} ({aligned!r})")
    eps = check_eps(eps)
    validate_impl(impl)
    min_dims = 1 if aligned else 2
    boxes1 = _check_boxes("boxes1", boxes1, fmt, min_dims)
    boxes2 = _check_boxes("boxes2", boxes2, fmt, min_dims)
    _same_device("boxes1", boxes1, "boxes2", boxes2)
    lead = 1 if aligned else 2
    try:
        torch.broadcast_shapes(boxes1.shape[:-lead], boxes2.shape[:-lead])
    except RuntimeError:
        what = "shapes (all but the last dim)" if aligned else "batch dims (all but the last two)"
        raise ValueError(
            f"{what} of boxes1 and boxes2 must be equal or broadcastable, "
            f"got {tuple(boxes1.shape[:-lead])} and {tuple(boxes2.shape[:-lead])}"
        ) from None
    b1, b2 = _prepared(boxes1, boxes2, fmt)
    use_kernel = (
        not aligned
        and b1.dim() == 2
        and b2.dim() == 2
        and resolve_impl(impl, "rotated_box_iou", b1, b2) == "triton"
    )
    return rotated_iou(b1, b2, aligned, eps, use_kernel, impl)


def rotated_box_iou_loss(
    pred: Tensor,
    target: Tensor,
    reduction: str = "none",
    eps: float = 1e-7,
    fmt: Any = "cxcywhr",
) -> Tensor:
    """Rotated IoU loss ``1 - IoU`` of aligned pairs of rotated boxes, in ``[0, 1]``.

    The IoU is `rotated_box_iou` (``aligned=True``), so the gradient is the written-out one:
    finite everywhere, also for degenerate or disjoint boxes (0 for disjoint boxes, where
    the IoU is flat; a zero-width predicted box overlapping its target is pushed to grow),
    and zero for a prediction equal to its target. Equivalent representations of one
    rectangle (angles 180 degrees apart, or sides swapped with 90 degrees) give the same
    loss.

    Compiles with ``torch.compile(fullgraph=True)``; reads no tensor values on the host.

    Args:
        pred (Tensor[..., K]): Predicted boxes in ``fmt`` (``K`` = 5 or 8), floating point.
        target (Tensor[..., K]): Target boxes of ``pred``'s shape.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"`` (third, as for the other box losses).
        eps: Replaces a union that is exactly zero (two degenerate boxes); ``>= 0``.
        fmt: ``"cxcywhr"`` | ``"xywhr"`` | ``"xyxyxyxy"`` (any case) or a torchvision
            ``BoundingBoxFormat``.

    Returns:
        Tensor: ``"none"``: ``Tensor[...]`` (``pred.shape[:-1]``) in the inputs' (promoted)
        dtype; otherwise a scalar in the compute dtype (float32, float64 for float64
        inputs). The ``"mean"`` of an empty input is a zero still connected to the graph.
        Under ``torch.autocast``: the same.

    Raises:
        TypeError: Non-floating boxes, ``fmt`` not a str or format, ``eps`` not a number.
        ValueError: A last dim that does not fit ``fmt``, ``pred``/``target`` shapes or
            devices that differ, an unknown ``fmt`` or ``reduction``, a negative ``eps``.

    Convention:
        See the module docstring (degrees, counter-clockwise on screen, torchvision's
        formats).

    Examples:
        >>> import torch
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 4.0, 1.0, 0.0]])
        >>> target = torch.tensor([[1.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 1.0, 4.0, 90.0]])
        >>> rotated_box_iou_loss(pred, target)
        tensor([0.6667, 0.0000])
        >>> rotated_box_iou_loss(pred, target, reduction="mean")
        tensor(0.3333)
    """
    fmt = parse_rotated_format(fmt)
    for name, boxes in (("pred", pred), ("target", target)):
        if not isinstance(boxes, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(boxes).__name__}")
        if not boxes.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {boxes.dtype}")
    pred = _check_boxes("pred", pred, fmt, 1)
    target = _check_boxes("target", target, fmt, 1)
    if pred.shape != target.shape:
        raise ValueError(
            f"pred and target must have the same shape, got {tuple(pred.shape)} and "
            f"{tuple(target.shape)}"
        )
    _same_device("pred", pred, "target", target)
    if reduction not in REDUCTIONS:
        check_reduction(reduction)
    eps = check_eps(eps)
    b1, b2 = _prepared(pred, target, fmt)
    iou = rotated_iou(b1, b2, True, eps, False, "torch")
    input_dtype = torch.promote_types(pred.dtype, target.dtype)
    return reduce_loss(torch.rsub(iou, 1.0), reduction, input_dtype=input_dtype)


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
    dtype = torch.float64 if boxes.dtype == torch.float64 else torch.float32
    cxcywhr = to_cxcywhr(boxes.detach().to(dtype), fmt)
    return nms_rotated_op(cxcywhr, scores.detach(), idxs, threshold)


def nms_rotated(
    boxes: Tensor, scores: Tensor, iou_threshold: float, fmt: Any = "cxcywhr"
) -> Tensor:
    """Greedy non-maximum suppression of rotated boxes; the kept indices, best first.

    Boxes are taken by decreasing score (ties in index order: a stable sort, as
    ``torchvision.ops.nms``); each kept box removes every later box whose `rotated_box_iou`
    with it is greater than ``iou_threshold``. The same answer as the textbook greedy loop,
    and as torchvision's ``nms`` for axis-aligned boxes (``r = 0``), computed in blocks of
    boxes on the device (the IoU through the Triton kernel on CUDA). Degenerate boxes
    overlap nothing, so they are never suppressed and suppress nothing. NaN scores sort
    first, as in ``torch.sort``.

    Host reads: the number of kept boxes depends on the values, so an eager call waits for
    the device: once per round of the greedy pass inside a block of boxes (4,096 on CUDA,
    1,024 on CPU; as many rounds as the longest chain of suppressions, a handful in
    practice), once per block and once for the output's length. Memory: a block's
    ``block x block`` comparisons, besides the output. It is a custom op (``visionblocks::nms_rotated``), so
    ``torch.compile(fullgraph=True)`` traces it as one node with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` (as torchvision's
    ``nms``), and fake tensors read nothing.

    Args:
        boxes (Tensor[N, K]): Boxes in ``fmt`` (``K`` = 5 or 8); floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        iou_threshold: Boxes overlapping a kept one by more than this are removed; in
            ``[0, 1]``.
        fmt: ``"cxcywhr"`` | ``"xywhr"`` | ``"xyxyxyxy"`` (any case) or a torchvision
            ``BoundingBoxFormat``.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score. No
        gradient.

    Raises:
        TypeError: Non-tensor or complex/bool boxes, non-floating scores, a non-number
            threshold, ``fmt`` not a str or format.
        ValueError: Boxes not ``(N, K)`` for ``fmt``, ``scores`` not ``(N,)``, tensors on
            different devices, a threshold outside ``[0, 1]``, an unknown ``fmt``.

    Convention:
        See the module docstring (degrees, counter-clockwise on screen, torchvision's
        formats).

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
    index order), as ``torchvision.ops.batched_nms``. Computed in one pass (the IoU of boxes
    of different categories is masked out, not offset, so no precision is lost to moving
    boxes apart); host reads as `nms_rotated`.

    Args:
        boxes (Tensor[N, K]): Boxes in ``fmt`` (``K`` = 5 or 8); floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        idxs (Tensor[N]): Integer category of each box.
        iou_threshold: Boxes overlapping a kept one of their category by more than this
            are removed; in ``[0, 1]``.
        fmt: ``"cxcywhr"`` | ``"xywhr"`` | ``"xyxyxyxy"`` (any case) or a torchvision
            ``BoundingBoxFormat``.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score.

    Raises:
        TypeError: As `nms_rotated`, or non-integer ``idxs``.
        ValueError: As `nms_rotated`, or ``idxs`` not ``(N,)`` or on another device.

    Convention:
        See the module docstring.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.0], [0.2, 0.0, 4.0, 2.0, 5.0],
        ...                       [0.1, 0.0, 4.0, 2.0, 0.0]])
        >>> scores = torch.tensor([0.9, 0.8, 0.7])
        >>> batched_nms_rotated(boxes, scores, torch.tensor([0, 1, 0]), 0.5)
        tensor([0, 1])
    """
    return _nms(boxes, scores, idxs, iou_threshold, fmt, batched=True)
