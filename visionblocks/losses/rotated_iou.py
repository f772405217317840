"""Rotated IoU loss ``1 - IoU`` of aligned rotated box pairs: the function (exported by
`visionblocks.ops` too) and its module, registered in ``LOSSES`` as ``"rotated_iou"``.

The IoU is `visionblocks.ops.rotated_box_iou`'s (its module holds the formats and the angle
convention).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import check_same_device
from visionblocks.losses._reduce import REDUCTIONS, check_reduction, reduce_loss
from visionblocks.ops._rotated_geometry import parse_rotated_format, warn_radians
from visionblocks.ops._rotated_overlap import rotated_iou
from visionblocks.ops.boxes import check_eps
from visionblocks.ops.rotated import _check_boxes, _prepared

__all__ = ["RotatedBoxIoULoss", "rotated_box_iou_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


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
        fmt: As `rotated_box_iou`: ``"cxcywhr"`` | ``"xywhr"`` | ``"xyxyxyxy"`` |
            ``"cxcywhr_rad_cw"`` (ultralytics' ``xywhr``) or a torchvision ``BoundingBoxFormat``.

    Returns:
        Tensor: ``"none"``: ``Tensor[...]`` (``pred.shape[:-1]``) in the inputs' (promoted)
        dtype; otherwise a scalar in the compute dtype (float32, float64 for float64
        inputs). The ``"mean"`` of an empty input is a zero still connected to the graph.
        Under ``torch.autocast``: the same.

    Raises:
        TypeError: Non-floating boxes, ``fmt`` not a str or format, ``eps`` not a number.
        ValueError: A last dim that does not fit ``fmt``, ``pred``/``target`` shapes or
            devices that differ, an unknown ``fmt`` or ``reduction``, a negative ``eps``.

    Examples:
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
    check_same_device(pred=pred, target=target)
    if reduction not in REDUCTIONS:
        check_reduction(reduction)
    eps = check_eps(eps)
    warn_radians("rotated_box_iou_loss", fmt, pred, target)
    b1, b2 = _prepared(pred, target, fmt)
    iou = rotated_iou(b1, b2, True, eps, "torch")
    return reduce_loss(
        torch.rsub(iou, 1.0), reduction, torch.promote_types(pred.dtype, target.dtype)
    )


@LOSSES.register(name="rotated_iou", aliases=("rotated_box_iou",))
class RotatedBoxIoULoss(nn.Module):
    """Module form of `rotated_box_iou_loss` (``1 - IoU``).

    Registered in ``LOSSES`` as ``"rotated_iou"`` (alias ``"rotated_box_iou"``).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"`` like torch's
            loss modules (the function's default is ``"none"``).
        eps: Number ``>= 0`` used in place of a union that is exactly zero.
        fmt: The boxes' format, as `rotated_box_iou_loss` (default ``"cxcywhr"``: angles in
            degrees, counter-clockwise on screen, as torchvision's tv_tensors).


    Examples:
        >>> loss_fn = RotatedBoxIoULoss()
        >>> loss_fn
        RotatedBoxIoULoss(reduction='mean', eps=1e-07, fmt='cxcywhr')
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 4.0, 1.0, 0.0]])
        >>> target = torch.tensor([[1.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 1.0, 4.0, 90.0]])
        >>> loss_fn(pred, target)
        tensor(0.3333)
    """

    def __init__(self, reduction: Reduction = "mean", eps: float = 1e-7, fmt: Any = "cxcywhr"):
        super().__init__()
        check_reduction(reduction)
        self.reduction = reduction
        self.eps = check_eps(eps)
        self.fmt = parse_rotated_format(fmt)

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Loss of aligned ``(..., K)`` rotated box pairs, with this module's options."""
        return rotated_box_iou_loss(pred, target, self.reduction, self.eps, self.fmt)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, eps={self.eps}, fmt={self.fmt!r}"
