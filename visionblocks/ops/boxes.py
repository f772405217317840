"""Axis-aligned boxes: format conversion, area, and the IoU family (IoU, GIoU, DIoU, CIoU).

Every function takes boxes with any number of leading dims, ``(..., 4)``. The four overlap
measures come in two shapes: **pairwise** (``aligned=False``, the default) compares every box
of ``boxes1 (..., N, 4)`` with every box of ``boxes2 (..., M, 4)`` and returns ``(..., N, M)``;
**aligned** (``aligned=True``) compares ``boxes1[..., i, :]`` with ``boxes2[..., i, :]`` and
returns ``(..., N)`` — the diagonal of the pairwise matrix, without the ``N×M`` cost.
Leading (batch) dims must be equal or broadcastable, as in ``torch.matmul`` (pairwise) or
element-wise ops (aligned): one set of ground-truth boxes ``(M, 4)`` against a batch of
predictions ``(B, N, 4)`` gives ``(B, N, M)``.

The pairwise results equal torchvision's `box_iou`, `generalized_box_iou`, `distance_box_iou`
and `complete_box_iou` for valid boxes, up to torchvision's ``eps`` (see below). Unlike
torchvision, identical boxes give exactly 1 however small, degenerate boxes give finite
values and gradients, and nothing ``N×M`` beyond the output is materialised or kept for the
backward pass: the work runs on cache-sized pieces of rows, spread over the CPU threads (see
the benchmarks page for the measured speed and memory).

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
    where it is exactly zero. There its numerator is zero too, so the value is 0, as with
    torchvision's ``+ eps``; everywhere else no ``eps`` enters and the formulas are exact:
    identical boxes give IoU = GIoU = DIoU = CIoU = 1 whether they are 2e-4 or 2e4 wide.
    Gradients at a zero denominator use ``eps`` (finite, up to about ``1 / eps``: e.g. GIoU
    of two collinear zero-width boxes). ``eps=0`` gives torchvision's 0 / 0 = NaN there.

    A **zero-area** (degenerate) box has ``w == 0`` or ``h == 0`` (a line or a point). Its
    intersection with anything is 0, so its IoU is 0 — also against an identical box, which
    torchvision answers with 0 / 0 = NaN.

    **Huge and tiny coordinates**: the four measures are scale invariant, so boxes whose
    largest ``|coordinate|`` reaches ``2**28``, or stays below 0.5, are first multiplied by a
    power of two that brings it below ``2**28`` (or into ``[0.5, 1)``), ``eps`` by its square,
    found on the device without a host sync: exactly the unscaled arithmetic, so coordinates
    of ``1e19`` (whose areas overflow float32), ``3e38`` or ``1e-30`` give the values of
    ordinary ones.

    An **inverted** box (``x2 < x1`` or ``y2 < y1``) is not valid. It is not rejected (a check
    would make the GPU wait for the host); the IoU family collapses it to a zero-width
    (zero-height) box at ``x1`` (``y1``), so results stay finite and in range: IoU 0, GIoU in
    ``[-1, 0]``. `box_area` returns its negative area, as torchvision does.

Dtypes:
    The IoU family computes and returns float32 for float16, bfloat16 and integer boxes
    (torchvision upcasts half boxes with ``_upcast`` and divides integer areas, giving
    float32), float64 for float64 boxes; mixed inputs promote first. Gradients flowing back
    to float16 or bfloat16 boxes are computed in float32 and clamped to the half dtype's
    finite range, so they stay finite. Gradients are analytic (no double backward). `box_area` follows
    torchvision's ``_upcast``: float16/bfloat16 → float32, integers narrower than 32 bits →
    int32, otherwise the input dtype. `box_convert` keeps the input dtype (integer boxes
    give floating centres for ``"cxcywh"``, as torchvision's do). ``torch.autocast``
    changes none of this: no op here is one that autocast runs in lower precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_last_dim, check_tensor
from visionblocks.ops._box_iou import overlap
from visionblocks.ops._boxes_script import (
    from_xyxy,
    script_area,
    script_convert,
    script_overlap,
    to_xyxy,
)

__all__ = [
    "BOX_FORMATS",
    "box_area",
    "box_convert",
    "box_iou",
    "complete_box_iou",
    "distance_box_iou",
    "generalized_box_iou",
]
__dir__ = public_dir(__name__, __all__)

BOX_FORMATS: tuple[str, ...] = ("xyxy", "xywh", "cxcywh")
"""The box formats `box_convert` understands: ``"xyxy"`` corners ``(x1, y1, x2, y2)``,
``"xywh"`` top-left corner and size ``(x1, y1, w, h)`` (COCO's ``bbox``), ``"cxcywh"`` centre
and size ``(cx, cy, w, h)``."""


def _check_convert(boxes: Tensor, in_fmt: str, out_fmt: str) -> Tensor:
    boxes = check_tensor("boxes", boxes)
    for name, fmt in (("in_fmt", in_fmt), ("out_fmt", out_fmt)):
        check_type(name, fmt, str)
        check_choice(name, fmt, BOX_FORMATS)
    check_last_dim("boxes", boxes, 4, what=f"in {in_fmt!r} format")
    return boxes


def box_convert(boxes: Tensor, in_fmt: str, out_fmt: str) -> Tensor:
    """Convert boxes between the ``"xyxy"``, ``"xywh"`` and ``"cxcywh"`` formats.

    Same values as ``torchvision.ops.box_convert`` for these formats (conversions between
    ``"xywh"`` and ``"cxcywh"`` go through ``"xyxy"``, as there).

    Scriptable with ``torch.jit.script`` (same values; see `visionblocks.ops._boxes_script`).

    Args:
        boxes (Tensor[..., 4]): Boxes in ``in_fmt``; any leading dims.
        in_fmt: Format of ``boxes``: ``"xyxy"``, ``"xywh"`` or ``"cxcywh"``.
        out_fmt: Format to return.

    Returns:
        Tensor[..., 4]: A new tensor (a copy when ``in_fmt == out_fmt``), in ``boxes``' dtype
        — except that integer boxes give floating-point ``"cxcywh"`` centres and ``"xyxy"``
        corners from ``"cxcywh"``, as in torchvision. Under ``torch.autocast``: the same
        (computed in that dtype, as torchvision; half boxes within one ulp).

    Raises:
        TypeError: ``boxes`` is not a tensor, or a format is not a str.
        ValueError: Unknown format (the message lists the valid ones), or last dim not 4.

    Convention:
        See the module docstring: x right, y down, ``w = x2 - x1``, no ``+ 1``.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[10.0, 20.0, 30.0, 60.0]])
        >>> box_convert(boxes, "xyxy", "cxcywh")
        tensor([[20., 40., 20., 40.]])
        >>> box_convert(boxes, "xyxy", "xywh")
        tensor([[10., 20., 20., 40.]])
        >>> box_convert(box_convert(boxes, "xyxy", "cxcywh"), "cxcywh", "xyxy")
        tensor([[10., 20., 30., 60.]])
    """
    if not torch.jit.is_scripting():
        boxes = _check_convert(boxes, in_fmt, out_fmt)
        if in_fmt == out_fmt:
            return boxes.clone()
        return from_xyxy(to_xyxy(boxes, in_fmt), out_fmt)
    return script_convert(boxes, in_fmt, out_fmt)


def box_area(boxes: Tensor) -> Tensor:
    """Area ``(x2 - x1) * (y2 - y1)`` of ``"xyxy"`` boxes.

    Scriptable with ``torch.jit.script`` (same values; see `visionblocks.ops._boxes_script`).

    Args:
        boxes (Tensor[..., 4]): Boxes in ``(x1, y1, x2, y2)``; any leading dims.

    Returns:
        Tensor[...]: Areas. dtype as torchvision's ``box_area``: float16/bfloat16 give float32,
        integers narrower than 32 bits give int32, other dtypes are kept. Inverted boxes give
        negative areas (no check: it would synchronise the GPU). Under ``torch.autocast``:
        the same.

    Raises:
        TypeError: ``boxes`` is not a tensor.
        ValueError: Last dim not 4.

    Convention:
        See the module docstring: ``"xyxy"``, x right, y down, no ``+ 1``.

    Examples:
        >>> import torch
        >>> box_area(torch.tensor([[0.0, 0.0, 4.0, 2.0], [1.0, 1.0, 1.0, 3.0]]))
        tensor([8., 0.])
        >>> box_area(torch.tensor([0, 0, 3, 3], dtype=torch.uint8))
        tensor(9, dtype=torch.int32)
    """
    if not torch.jit.is_scripting():
        boxes = check_tensor("boxes", boxes)
        check_last_dim("boxes", boxes, 4, what="(x1, y1, x2, y2)")
    return script_area(boxes)


def box_iou(boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7) -> Tensor:
    """Intersection over union (Jaccard index) of ``"xyxy"`` boxes, in ``[0, 1]``.

    ``IoU = |A ∩ B| / |A ∪ B|``; a zero union (two zero-area boxes) gets ``eps``, so a
    zero-area box gives 0 (torchvision: NaN). Otherwise equal to ``torchvision.ops.box_iou``;
    identical boxes give exactly 1.

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formulas (values equal up to rounding; gradients by autograd, not clamped for
    half boxes; no check that needs a host read; see `visionblocks.ops._boxes_script`).

    Args:
        boxes1 (Tensor[..., N, 4]): First set, ``(x1, y1, x2, y2)``.
        boxes2 (Tensor[..., M, 4]): Second set; leading dims equal to or broadcastable with
            ``boxes1``'s (with ``aligned=True``: all dims but the last).
        aligned: False: every pair, ``(..., N, M)``. True: ``boxes1[..., i, :]`` with
            ``boxes2[..., i, :]``, ``(..., N)``.
        eps: Used in place of a denominator that is exactly zero (the module's Convention);
            ``>= 0``. It never changes a result whose denominators are positive.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: ``(..., N, M)`` for every pair, ``(..., N)``
        with ``aligned=True``. float32 for float16, bfloat16 and integer boxes, else the
        (promoted) input dtype. Under ``torch.autocast``: the same, computed in float32 (or
        float64). Finite, with finite gradients, for any finite boxes when ``eps > 0``.

    Raises:
        TypeError: Boxes not tensors (or complex), ``aligned`` not a bool, ``eps`` not a number.
        ValueError: Last dim not 4, fewer than 2 dims (pairwise), leading dims that do not
            broadcast, boxes on different devices, ``eps`` negative or not finite.

    Convention:
        ``"xyxy"``, x right, y down; zero-area and inverted boxes as in the module docstring.

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
    """
    if not torch.jit.is_scripting():
        return overlap(boxes1, boxes2, "iou", aligned=aligned, eps=eps)
    return script_overlap(boxes1, boxes2, 0, aligned, eps)


def generalized_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Generalised IoU of ``"xyxy"`` boxes, in ``[-1, 1]`` and never above IoU.

    ``GIoU = IoU - (|C| - |A ∪ B|) / |C|``, ``C`` the smallest box enclosing both. A zero
    union or ``|C|`` gets ``eps``, so two identical zero-area boxes give 0 (no penalty: the
    enclosing box is the union). Otherwise equal to ``torchvision.ops.generalized_box_iou``
    up to its ``eps``.

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formulas (values equal up to rounding; gradients by autograd, not clamped for
    half boxes; no check that needs a host read; see `visionblocks.ops._boxes_script`).

    Args:
        boxes1 (Tensor[..., N, 4]): First set, ``(x1, y1, x2, y2)``.
        boxes2 (Tensor[..., M, 4]): Second set; leading dims equal to or broadcastable with
            ``boxes1``'s (with ``aligned=True``: all dims but the last).
        aligned: False: every pair, ``(..., N, M)``. True: ``boxes1[..., i, :]`` with
            ``boxes2[..., i, :]``, ``(..., N)``.
        eps: Used in place of a denominator that is exactly zero (the module's Convention);
            ``>= 0``. It never changes a result whose denominators are positive.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: ``(..., N, M)`` for every pair, ``(..., N)``
        with ``aligned=True``. float32 for float16, bfloat16 and integer boxes, else the
        (promoted) input dtype. Under ``torch.autocast``: the same, computed in float32 (or
        float64). Finite, with finite gradients, for any finite boxes when ``eps > 0``.

    Raises:
        TypeError: Boxes not tensors (or complex), ``aligned`` not a bool, ``eps`` not a number.
        ValueError: Last dim not 4, fewer than 2 dims (pairwise), leading dims that do not
            broadcast, boxes on different devices, ``eps`` negative or not finite.

    Convention:
        ``"xyxy"``, x right, y down; zero-area and inverted boxes as in the module docstring.

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
        return overlap(boxes1, boxes2, "giou", aligned=aligned, eps=eps)
    return script_overlap(boxes1, boxes2, 1, aligned, eps)


def distance_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Distance IoU of ``"xyxy"`` boxes, in ``[-1, 1]`` and never above IoU.

    ``DIoU = IoU - ρ² / c²``, ``ρ`` the distance between the box centres and ``c`` the
    diagonal of the smallest enclosing box (``eps`` where ``c = 0``, i.e. for two coincident
    points). Equal to ``torchvision.ops.distance_box_iou`` for valid boxes, up to
    torchvision's ``eps`` (``c² + eps``).

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formulas (values equal up to rounding; gradients by autograd, not clamped for
    half boxes; no check that needs a host read; see `visionblocks.ops._boxes_script`).

    Args:
        boxes1 (Tensor[..., N, 4]): First set, ``(x1, y1, x2, y2)``.
        boxes2 (Tensor[..., M, 4]): Second set; leading dims equal to or broadcastable with
            ``boxes1``'s (with ``aligned=True``: all dims but the last).
        aligned: False: every pair, ``(..., N, M)``. True: ``boxes1[..., i, :]`` with
            ``boxes2[..., i, :]``, ``(..., N)``.
        eps: Used in place of a denominator that is exactly zero (the module's Convention);
            ``>= 0``. It never changes a result whose denominators are positive.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: ``(..., N, M)`` for every pair, ``(..., N)``
        with ``aligned=True``. float32 for float16, bfloat16 and integer boxes, else the
        (promoted) input dtype. Under ``torch.autocast``: the same, computed in float32 (or
        float64). Finite, with finite gradients, for any finite boxes when ``eps > 0``.

    Raises:
        TypeError: Boxes not tensors (or complex), ``aligned`` not a bool, ``eps`` not a number.
        ValueError: Last dim not 4, fewer than 2 dims (pairwise), leading dims that do not
            broadcast, boxes on different devices, ``eps`` negative or not finite.

    Convention:
        ``"xyxy"``, x right, y down; zero-area and inverted boxes as in the module docstring.

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
        return overlap(boxes1, boxes2, "diou", aligned=aligned, eps=eps)
    return script_overlap(boxes1, boxes2, 2, aligned, eps)


def complete_box_iou(
    boxes1: Tensor, boxes2: Tensor, aligned: bool = False, eps: float = 1e-7
) -> Tensor:
    """Complete IoU of ``"xyxy"`` boxes: DIoU with an aspect-ratio penalty, in ``(-2, 1]``.

    ``CIoU = DIoU - α v`` with ``v = 4/π² (atan(w1/h1) - atan(w2/h2))²`` and the weight
    ``α = v / (1 - IoU + v)`` (0 where ``v = 0``) treated as a constant (no gradient), as in
    the paper and in ``torchvision.ops.complete_box_iou``, which it equals for valid boxes
    up to torchvision's ``eps``. A box with ``h == 0`` gets the angle π/2 and a finite
    gradient (torchvision divides by zero there), a point box gets 0.

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formulas (values equal up to rounding; gradients by autograd, not clamped for
    half boxes; no check that needs a host read; see `visionblocks.ops._boxes_script`).

    Args:
        boxes1 (Tensor[..., N, 4]): First set, ``(x1, y1, x2, y2)``.
        boxes2 (Tensor[..., M, 4]): Second set; leading dims equal to or broadcastable with
            ``boxes1``'s (with ``aligned=True``: all dims but the last).
        aligned: False: every pair, ``(..., N, M)``. True: ``boxes1[..., i, :]`` with
            ``boxes2[..., i, :]``, ``(..., N)``.
        eps: Used in place of a denominator that is exactly zero (the module's Convention);
            ``>= 0``. It never changes a result whose denominators are positive.

    Returns:
        Tensor[..., N, M] or Tensor[..., N]: ``(..., N, M)`` for every pair, ``(..., N)``
        with ``aligned=True``. float32 for float16, bfloat16 and integer boxes, else the
        (promoted) input dtype. Under ``torch.autocast``: the same, computed in float32 (or
        float64). Finite, with finite gradients, for any finite boxes when ``eps > 0``.

    Raises:
        TypeError: Boxes not tensors (or complex), ``aligned`` not a bool, ``eps`` not a number.
        ValueError: Last dim not 4, fewer than 2 dims (pairwise), leading dims that do not
            broadcast, boxes on different devices, ``eps`` negative or not finite.

    Convention:
        ``"xyxy"``, x right, y down; zero-area and inverted boxes as in the module docstring.

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
        return overlap(boxes1, boxes2, "ciou", aligned=aligned, eps=eps)
    return script_overlap(boxes1, boxes2, 3, aligned, eps)
