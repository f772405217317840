"""Greedy non-maximum suppression of axis-aligned boxes: torchvision's kernels, our checks.

`nms` and `batched_nms` run ``torchvision.ops.nms`` and ``torchvision.ops.batched_nms``
(their kernel, and their way of keeping categories apart: the same results, the kept
indices by decreasing score, ties in index order) after checking
shapes, dtypes, devices and the threshold, with errors that name the argument; integer and
half-precision boxes are accepted (computed in float32, float64 stays float64), where
torchvision's kernels refuse them or scores of another dtype. The variants that decay scores
rather than remove boxes are `visionblocks.ops.soft_nms` and `visionblocks.ops.matrix_nms`;
rotated boxes: `visionblocks.ops.nms_rotated`.

Convention:
    Boxes are ``"xyxy"`` ``(x1, y1, x2, y2)`` with no ``+ 1`` (`visionblocks.ops.boxes`); a
    box is removed when its IoU with a kept, higher-scoring box is greater than
    ``iou_threshold``. The number of kept boxes depends on the values: an eager CUDA call
    waits for the device once (as torchvision's), and ``torch.compile(fullgraph=True)``
    traces the call as one node with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops = True``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_real, compute_dtype
from visionblocks.ops.rotated import _check_per_box, _check_threshold, _is_integer

__all__ = ["batched_nms", "nms"]
__dir__ = public_dir(__name__, __all__)

_FLOATS = (torch.float32, torch.float64)


def check_nms_inputs(
    boxes: Any, scores: Any, idxs: Any, iou_threshold: Any, batched: bool
) -> tuple[Tensor, Tensor, float]:
    """Checked ``(N, 4)`` boxes and ``(N,)`` scores, detached, in one floating compute
    dtype, and the threshold (shared with `visionblocks.ops.soft_nms`)."""
    if (  # the usual call costs a few attribute reads; anything else takes the full checks
        type(iou_threshold) is float
        and 0 <= iou_threshold <= 1
        and type(boxes) is Tensor
        and type(scores) is Tensor
        and boxes.dtype == scores.dtype
        and boxes.dtype in _FLOATS
        and boxes.dim() == 2
        and boxes.shape[1] == 4
        and scores.shape == boxes.shape[:1]
        and scores.device == boxes.device
        and (
            not batched
            or (
                type(idxs) is Tensor
                and _is_integer(idxs)
                and idxs.shape == scores.shape
                and idxs.device == boxes.device
            )
        )
    ):
        if boxes.requires_grad or scores.requires_grad:
            boxes, scores = boxes.detach(), scores.detach()
        return boxes, scores, iou_threshold
    threshold = _check_threshold(iou_threshold)
    check_real("boxes", boxes)
    if boxes.dim() != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must have shape (N, 4) in 'xyxy' format, got {tuple(boxes.shape)}")
    _check_per_box("scores", scores, boxes, "a floating-point", Tensor.is_floating_point)
    if batched:
        _check_per_box("idxs", idxs, boxes, "an integer", _is_integer)
    dtype = compute_dtype(torch.promote_types(boxes.dtype, scores.dtype))
    return boxes.detach().to(dtype), scores.detach().to(dtype), threshold


def _kernels() -> Any:
    """``torch.ops.torchvision``, the kernels that ``torchvision.ops`` wraps (registered by
    importing it, on first use: importing visionblocks loads no ``torchvision.ops``)."""
    import torchvision.ops  # noqa: F401

    return torch.ops.torchvision


def _kernel_nms(boxes: Tensor, scores: Tensor, threshold: float) -> Tensor:
    """torchvision's NMS kernel on checked inputs. While tracing (``torch.export``,
    ``torch.compile``), two boxes apart from all others are added and filtered out again:
    torchvision's fake ``nms`` assumes at least two kept boxes, which an exported program
    then asserts at run time (it failed on 0 or 1 kept box)."""
    if not torch.compiler.is_compiling():
        return _kernels().nms(boxes, scores, threshold)
    n = boxes.shape[0]
    far = torch.cat([boxes.detach().flatten(), boxes.new_zeros(1)]).max() + 1  # beyond all
    unit = boxes.new_tensor([[0, 0, 1, 1], [2, 2, 3, 3]])
    keep = _kernels().nms(
        torch.cat([boxes, unit + far]), torch.cat([scores, scores.new_zeros(2)]), threshold
    )
    return keep[keep < n]


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression (``torchvision.ops.nms``); the kept indices, best first.

    Boxes are taken by decreasing score (ties in index order); each kept box removes every
    later box whose IoU with it is greater than ``iou_threshold``.

    Args:
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes; floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        iou_threshold: Boxes overlapping a kept one by more than this are removed; in ``[0, 1]``.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score.

    Raises:
        TypeError: Non-tensor, complex or bool boxes, non-floating scores, a non-number threshold.
        ValueError: Boxes not ``(N, 4)``, scores not ``(N,)``, tensors on different devices, a
            threshold outside ``[0, 1]``.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
        >>> nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)  # integer boxes accepted
        tensor([0, 2])
    """
    boxes, scores, threshold = check_nms_inputs(boxes, scores, None, iou_threshold, False)
    return _kernel_nms(boxes, scores, threshold)


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """`nms` per category (``torchvision.ops.batched_nms``): different ``idxs`` never suppress.

    The result is every category's `nms` merged by decreasing score (ties in index order).

    Args:
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes; floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        idxs (Tensor[N]): Integer category of each box.
        iou_threshold: Boxes overlapping a kept one of their category by more than this are
            removed; in ``[0, 1]``.

    Returns:
        Tensor[K]: int64 indices into ``boxes`` of the kept boxes, by decreasing score.

    Raises:
        TypeError: As `nms`, or non-integer ``idxs``.
        ValueError: As `nms`, or ``idxs`` not ``(N,)`` or on another device.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0],
        ...                       [0.5, 0.5, 10.5, 10.5]])
        >>> batched_nms(boxes, torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0, 1, 0]), 0.5)
        tensor([0, 1])
    """
    boxes, scores, threshold = check_nms_inputs(boxes, scores, idxs, iou_threshold, True)
    if boxes.numel() > (4000 if boxes.device.type == "cpu" else 100_000):
        import torchvision.ops  # its loop over the categories, faster there

        return torchvision.ops.batched_nms(boxes, scores, idxs, threshold)
    if boxes.numel() == 0:
        return idxs.new_empty(0, dtype=torch.int64)
    # torchvision's trick below those sizes: categories moved apart never overlap
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return _kernel_nms(boxes + offsets[:, None], scores, threshold)
