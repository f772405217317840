"""Distribution focal loss (GFL, YOLOv8): cross entropy of a box side's distance distribution.

Convention: ``pred (..., reg_max + 1)`` holds logits over the bins ``0, 1, ..., reg_max``
(ultralytics' ``reg_max`` is that number of bins, 16; mmdet's and the paper's is the largest
bin, 16 for 17 bins); ``target (...)`` holds distances in bins, in ``[0, reg_max]``. A
distance ``t`` between bins ``l = floor(t)`` and ``l + 1`` puts the weights ``l + 1 - t`` and
``t - l`` on them (``t = reg_max`` puts 1 on the last bin).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_range
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import check_floating, check_same_device, compute_dtype
from visionblocks.losses._reduce import (
    REDUCTIONS,
    check_normalizer,
    check_reduction,
    check_target_range,
    reduce_loss,
)

__all__ = ["DistributionFocalLoss", "distribution_focal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def check_loss_options(
    pred: Tensor,
    target: Tensor,
    weight: Tensor | None,
    reduction: str,
    normalizer: float | Tensor | None,
) -> float | Tensor | None:
    """Check ``weight`` (floating, broadcasting to ``target``'s shape: the loss's), one device,
    ``reduction`` and ``normalizer`` (returned checked), after the caller's checks of
    ``pred`` and ``target``."""
    loss_shape = target.shape
    if reduction not in REDUCTIONS:
        check_reduction(reduction)
    if weight is not None:
        check_floating("weight", weight)
        # broadcasts to loss_shape (torch.broadcast_shapes costs more than the loss when small)
        ok = weight.dim() <= len(loss_shape) and all(
            w == 1 or w == n for w, n in zip(reversed(weight.shape), reversed(loss_shape))
        )
        k = weight.dim()  # (P,) against (P, P): one value per row, or (broadcast) per column?
        per_row = 0 < k < len(loss_shape) and weight.shape == loss_shape[:k]
        if not ok or (per_row and weight.numel() > 1):
            rows = (*weight.shape, *(1,) * (len(loss_shape) - k))
            hint = f"; pass shape {rows} for one value per row" if per_row else ""
            what = "is ambiguous for" if ok else "must broadcast to"
            raise ValueError(
                f"weight {what} the loss's shape {tuple(loss_shape)} (broadcasting aligns the "
                f"last dims), got {tuple(weight.shape)}{hint}"
            )
    if target.device != pred.device or (weight is not None and weight.device != pred.device):
        check_same_device(pred=pred, target=target, weight=weight)
    return check_normalizer(normalizer, pred.device)


def check_non_negative(name: str, value: float) -> None:
    """Raise unless ``value`` is a finite real number ``>= 0`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a non-negative float, got {type(value).__name__}")
    check_range(name, float(value), 0.0, math.inf, high_inclusive=False)


def distribution_focal_loss(
    pred: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    reduction: Reduction = "mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Distribution focal loss: cross entropy against the two bins around each distance.

    With ``l = floor(t)`` (``reg_max - 1`` at ``t = reg_max``) and ``log p = log_softmax(pred)``:

        loss = -((l + 1 - t) log p[l] + (t - l) log p[l + 1])

    per distance. Equal to ultralytics' ``DFLoss`` (which clamps ``t`` to
    ``reg_max - 0.01`` first and averages the 4 sides: ``.mean(-1, keepdim=True)`` of this
    ``"none"`` result) and to mmdet's ``distribution_focal_loss``. ``"mean"`` divides by the
    number of distances (``weight`` does not change it); ``normalizer`` replaces that count and
    divides ``"sum"`` and ``"none"`` too (ultralytics' ``loss_dfl``: ``weight`` ``(P, 1)``,
    ``reduction="sum"``, ``normalizer=4 * target_scores_sum``).

    Value check (`visionblocks.set_value_checks`): ``target`` in ``[0, reg_max]``; read on
    CPU, a device-side assert on CUDA. Dtype policy: half inputs are computed in float32;
    ``"none"`` returns ``pred``'s dtype, ``"sum"``/``"mean"`` the compute dtype; the same
    under ``torch.autocast``. Gradients flow to ``pred``, ``target`` and ``weight``; compiles
    with ``torch.compile(fullgraph=True)``.

    Args:
        pred (Tensor[..., reg_max + 1]): Logits over the bins (floating, ``reg_max >= 1``).
        target (Tensor[...]): Distances in bins, ``pred.shape[:-1]``, in ``[0, reg_max]``.
        weight (Tensor, optional): Per-distance weight broadcastable to ``target``'s shape
            (per box ``(P, 1)`` for ``(P, 4)`` distances).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        normalizer (float or Tensor, optional): Divides the summed loss instead of the count;
            positive and finite (a tensor: one element, on ``pred``'s device or 0-d on CPU).

    Returns:
        Tensor: ``"none"``: ``target``'s shape in ``pred``'s dtype; otherwise a scalar in the
        compute dtype.

    Raises:
        TypeError: Non-floating ``pred``, ``target`` or ``weight``.
        ValueError: ``pred`` with fewer than 2 bins, a ``target`` shape other than
            ``pred.shape[:-1]``, a ``weight`` that does not broadcast, tensors on different
            devices, an unknown ``reduction``, a ``normalizer`` that is not positive and
            finite, or (value check) a ``target`` outside ``[0, reg_max]``.

    Examples:
        >>> import torch
        >>> pred = torch.tensor([[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])  # reg_max = 3
        >>> distribution_focal_loss(pred, torch.tensor([1.0, 3.0]), reduction="none")
        tensor([0.3408, 0.0200])
        >>> distribution_focal_loss(pred, torch.tensor([1.5, 2.5]), reduction="sum")
        tensor(3.8608)

    References:
        Li et al., "Generalized Focal Loss: Learning Qualified and Distributed Bounding Boxes
        for Dense Object Detection", NeurIPS 2020. https://arxiv.org/abs/2006.04388
    """
    check_floating("pred", pred)
    check_floating("target", target)
    if pred.ndim == 0 or pred.shape[-1] < 2:
        raise ValueError(
            f"pred must have shape (..., reg_max + 1) with at least 2 bins, got {tuple(pred.shape)}"
        )
    if target.shape != pred.shape[:-1]:
        raise ValueError(
            f"target must have shape pred.shape[:-1] = {tuple(pred.shape[:-1])}, "
            f"got {tuple(target.shape)}"
        )
    normalizer = check_loss_options(pred, target, weight, reduction, normalizer)
    reg_max = pred.shape[-1] - 1
    check_target_range(
        "target", target, 0, reg_max, hint=f" (distances in bins, reg_max={reg_max})"
    )
    cdt = compute_dtype(pred.dtype)
    x = pred if pred.dtype == cdt else pred.to(cdt)
    t = target if target.dtype == cdt else target.to(cdt)
    # Outside [0, reg_max] (value checks off) the end bins extrapolate: no out-of-range gather.
    left = t.detach().floor().clamp_(0, reg_max - 1)
    # both bins in one gather (one scatter backward): indices (..., 2) = (l, l + 1)
    idx = left.unsqueeze(-1).long() + torch.arange(2, device=pred.device)
    log_left, log_right = F.log_softmax(x, -1).gather(-1, idx).unbind(-1)
    # (1 - w) log p[l] + w log p[l + 1], w = t - l exact (Sterbenz); lerp is exact at w = 0, 1
    loss = torch.lerp(log_left, log_right, t - left).neg_()
    if weight is not None:
        loss = loss * weight.to(cdt)
    return reduce_loss(loss, reduction, pred.dtype, None, normalizer)


@LOSSES.register(name="distribution_focal", aliases=("dfl",))
class DistributionFocalLoss(nn.Module):
    """Module form of `distribution_focal_loss`; registered in ``LOSSES`` as
    ``"distribution_focal"`` (alias ``"dfl"``).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.

    ``weight`` and ``normalizer`` vary per batch: they are arguments of ``forward``.

    Examples:
        >>> import torch
        >>> loss_fn = DistributionFocalLoss(reduction="sum")
        >>> loss_fn
        DistributionFocalLoss(reduction='sum')
        >>> pred, target = torch.zeros(2, 4, 17), torch.full((2, 4), 7.5)
        >>> loss_fn(pred, target, normalizer=8.0)  # uniform bins: log(17) per distance
        tensor(2.8332)
    """

    def __init__(self, reduction: Reduction = "mean") -> None:
        super().__init__()
        check_reduction(reduction)
        self.reduction = reduction

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Tensor | None = None,
        normalizer: float | Tensor | None = None,
    ) -> Tensor:
        """Apply `distribution_focal_loss` with this module's ``reduction``."""
        return distribution_focal_loss(
            pred, target, weight=weight, reduction=self.reduction, normalizer=normalizer
        )

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
