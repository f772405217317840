"""Module form of the rotated IoU loss, registered in ``LOSSES`` as ``"rotated_iou"``.

The function lives in `visionblocks.ops.rotated` (its docstring holds the formats, the angle
convention and the dtype policy); this module only keeps the options.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import check_reduction
from visionblocks._core.registries import LOSSES
from visionblocks.ops._rotated_geometry import parse_rotated_format
from visionblocks.ops.boxes import check_eps
from visionblocks.ops.rotated import rotated_box_iou_loss

__all__ = ["RotatedBoxIoULoss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


@LOSSES.register(name="rotated_iou", aliases=("rotated_box_iou",))
class RotatedBoxIoULoss(nn.Module):
    """Module form of `visionblocks.ops.rotated.rotated_box_iou_loss` (``1 - IoU``).

    Registered in ``LOSSES`` as ``"rotated_iou"`` (alias ``"rotated_box_iou"``).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"`` like torch's
            loss modules (the function's default is ``"none"``).
        eps: Number ``>= 0`` used in place of a union that is exactly zero.
        fmt: The boxes' format: ``"cxcywhr"`` (default), ``"xywhr"``, ``"xyxyxyxy"`` (any
            case) or a torchvision ``BoundingBoxFormat``; angles in degrees,
            counter-clockwise on screen, as torchvision's tv_tensors.

    Under ``torch.autocast``: as `rotated_box_iou_loss` (computed in float32; ``"sum"``/
    ``"mean"`` float32, ``"none"`` the boxes' promoted dtype).

    Examples:
        >>> import torch
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
