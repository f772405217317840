"""Module forms of the GIoU / DIoU / CIoU box losses, registered in ``LOSSES``.

The functions live in `visionblocks.ops.iou_loss` (their docstrings hold the box convention,
the degenerate-box policy and the dtype policy); these modules only keep the options. Each
module has its function's stem: `GeneralizedBoxIoULoss` is the module form of
``generalized_box_iou_loss``, and so on. ``GIoULoss``, ``DIoULoss`` and ``CIoULoss`` are
deprecated aliases (removed in 0.3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import IMPLS
from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import check_reduction
from visionblocks._core.registries import LOSSES
from visionblocks.ops.boxes import check_eps
from visionblocks.ops.iou_loss import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

__all__ = ["CompleteBoxIoULoss", "DistanceBoxIoULoss", "GeneralizedBoxIoULoss"]
__dir__ = public_dir(__name__, __all__)

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


@LOSSES.register(name="giou", aliases=("generalized_box_iou",))
class GeneralizedBoxIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.generalized_box_iou_loss`.

    Registered in ``LOSSES`` as ``"giou"`` (alias ``"generalized_box_iou"``). ``GIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"`` like torch's
            loss modules (the function's default, ``"none"``, is torchvision's).
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Under ``torch.autocast``: as `generalized_box_iou_loss` (half boxes computed in float32;
    ``"sum"``/``"mean"`` float32, ``"none"`` the boxes' promoted dtype).

    Examples:
        >>> import torch
        >>> loss_fn = GeneralizedBoxIoULoss()
        >>> loss_fn
        GeneralizedBoxIoULoss(reduction='mean', eps=1e-07)
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> loss_fn(pred, target)
        tensor(1.2063)
    """

    _fn = staticmethod(generalized_box_iou_loss)


@LOSSES.register(name="diou", aliases=("distance_box_iou",))
class DistanceBoxIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.distance_box_iou_loss`.

    Registered in ``LOSSES`` as ``"diou"`` (alias ``"distance_box_iou"``). ``DIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Under ``torch.autocast``: as `distance_box_iou_loss` (half boxes computed in float32;
    ``"sum"``/``"mean"`` float32, ``"none"`` the boxes' promoted dtype).

    Examples:
        >>> import torch
        >>> loss_fn = DistanceBoxIoULoss(reduction="none")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]]))
        tensor([0.9683])
    """

    _fn = staticmethod(distance_box_iou_loss)


@LOSSES.register(name="ciou", aliases=("complete_box_iou",))
class CompleteBoxIoULoss(_BoxIoULoss):
    """Module form of `visionblocks.ops.iou_loss.complete_box_iou_loss`.

    Registered in ``LOSSES`` as ``"ciou"`` (alias ``"complete_box_iou"``). ``CIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Under ``torch.autocast``: as `complete_box_iou_loss` (half boxes computed in float32;
    ``"sum"``/``"mean"`` float32, ``"none"`` the boxes' promoted dtype).

    Examples:
        >>> import torch
        >>> loss_fn = CompleteBoxIoULoss(reduction="sum")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 1.0]]), torch.tensor([[0.0, 0.0, 1.0, 2.0]]))
        tensor(0.7629)
    """

    _fn = staticmethod(complete_box_iou_loss)


_DEPRECATED = {
    "GIoULoss": ("GeneralizedBoxIoULoss", "0.3"),
    "DIoULoss": ("DistanceBoxIoULoss", "0.3"),
    "CIoULoss": ("CompleteBoxIoULoss", "0.3"),
}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
