"""Module forms of the GIoU / DIoU / CIoU box losses, registered in ``LOSSES``.

The functions live in `visionblocks.ops.iou_loss` (their docstrings hold the box convention,
the degenerate-box policy and the dtype policy); these modules only keep the options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.dispatch import IMPLS
from visionblocks._core.reduce import check_reduction
from visionblocks._core.registry import LOSSES
from visionblocks.ops.iou_loss import (
    check_eps,
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

__all__ = ["CIoULoss", "DIoULoss", "GIoULoss"]

Reduction = Literal["none", "mean", "sum"]


class _BoxIoULoss(nn.Module):
    """Shared options and forward of the three box losses."""

    _fn: Callable[..., Tensor]

    def __init__(self, reduction: Reduction = "mean", eps: float = 1e-7, impl: str = "auto"):
        super().__init__()
        check_reduction(reduction)
        check_type("impl", impl, str)
        check_choice("impl", impl, IMPLS)
        self.reduction = reduction
        self.eps = check_eps(eps)
        self.impl = impl

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Loss of aligned ``(..., 4)`` xyxy box pairs, with this module's options."""
        return type(self)._fn(pred, target, self.reduction, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, eps={self.eps}"


@LOSSES.register(name="giou")
class GIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.generalized_box_iou_loss`.

    Registered in ``LOSSES`` as ``"giou"``.

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"`` like torch's
            loss modules (the function's default, ``"none"``, is torchvision's).
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Examples:
        >>> import torch
        >>> loss_fn = GIoULoss()
        >>> loss_fn
        GIoULoss(reduction='mean', eps=1e-07)
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> loss_fn(pred, target)
        tensor(1.2063)
    """

    _fn = staticmethod(generalized_box_iou_loss)


@LOSSES.register(name="diou")
class DIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.distance_box_iou_loss`.

    Registered in ``LOSSES`` as ``"diou"``.

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Examples:
        >>> import torch
        >>> loss_fn = DIoULoss(reduction="none")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]]))
        tensor([0.9683])
    """

    _fn = staticmethod(distance_box_iou_loss)


@LOSSES.register(name="ciou")
class CIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.complete_box_iou_loss`.

    Registered in ``LOSSES`` as ``"ciou"``.

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Examples:
        >>> import torch
        >>> loss_fn = CIoULoss(reduction="sum")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 1.0]]), torch.tensor([[0.0, 0.0, 1.0, 2.0]]))
        tensor(0.7629)
    """

    _fn = staticmethod(complete_box_iou_loss)
