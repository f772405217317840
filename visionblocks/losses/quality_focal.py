"""Quality focal loss (GFL): BCE against IoU-aware scores, scaled by the distance to them.

Convention: ``pred`` holds logits and ``target`` the IoU-aware classification scores of the
same shape (``(N, C)`` or any other), in ``[0, 1]``: the IoU of the matched box at its class
for positives, 0 everywhere else.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.losses._reduce import check_reduction, check_target_range, reduce_loss
from visionblocks.losses.distribution_focal import check_loss_options, check_non_negative
from visionblocks.losses.varifocal import check_soft_targets

__all__ = ["QualityFocalLoss", "quality_focal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def quality_focal_loss(
    pred: Tensor,
    target: Tensor,
    beta: float = 2.0,
    *,
    weight: Tensor | None = None,
    reduction: Reduction = "mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Quality focal loss: BCE against the soft target, scaled by ``|target - sigmoid(pred)|
    ** beta``.

    With ``q = target`` and ``p = sigmoid(pred)``, for every element:

        loss = BCEWithLogits(pred, q) * |q - p| ** beta

    Equal to mmdet's ``quality_focal_loss_tensor_target`` (which sums over the classes: its
    per-sample loss is this ``"none"`` result's ``.sum(1)``, its ``"mean"`` is
    ``reduction="sum", normalizer=N`` here) and, for one positive class per row, to its
    ``quality_focal_loss`` with ``(label, score)`` targets. Computed in float32, ``q - p`` as
    ``q sigmoid(-pred) - (1 - q) sigmoid(pred)`` (exact at ``q = 0`` and ``q = 1``), the BCE as
    ``softplus(pred) - q pred`` (the negatives' ``softplus(pred)`` keeps its relative accuracy
    at any logit, unlike ``F.binary_cross_entropy_with_logits``): finite values and gradients for
    logits of any size, under AMP too (``beta < 1`` too: ``0 ** beta`` gets gradient 0). ``"mean"`` divides by the number of elements (``weight`` does not change it);
    ``normalizer`` (e.g. the number of positives) replaces it and divides ``"sum"`` and
    ``"none"`` too.

    Value check (`visionblocks.set_value_checks`): ``target`` in ``[0, 1]``. Dtype policy:
    half inputs are computed in float32; ``"none"`` returns ``pred``'s dtype, ``"sum"`` and
    ``"mean"`` the compute dtype; the same under ``torch.autocast``. Gradients flow to
    ``pred``, ``target`` and ``weight``; compiles with ``torch.compile(fullgraph=True)``.

    Args:
        pred (Tensor[N, C]): Logits, any shape (floating).
        target (Tensor[N, C]): IoU-aware scores in ``[0, 1]``, ``pred``'s shape; 0 for negatives.
        beta: Exponent of the scale factor, ``>= 0`` (0 gives BCE).
        weight (Tensor, optional): Element-wise weight broadcastable to ``pred``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        normalizer (float or Tensor, optional): Divides the summed loss instead of the count;
            positive and finite (a tensor: one element, on ``pred``'s device or 0-d on CPU).

    Returns:
        Tensor: ``"none"``: ``pred``'s shape and dtype; otherwise a scalar in the compute dtype.

    Raises:
        TypeError: Non-floating tensors, ``beta`` of the wrong type.
        ValueError: ``target`` not of ``pred``'s shape, a negative or non-finite ``beta``, a
            ``weight`` that does not broadcast, tensors on different devices, an unknown
            ``reduction``, a ``normalizer`` that is not positive and finite, or (value check)
            a ``target`` outside ``[0, 1]``.

    Examples:
        >>> import torch
        >>> pred = torch.tensor([[2.0, -1.0], [0.0, 1.0]])
        >>> target = torch.tensor([[0.8, 0.0], [0.0, 0.0]])
        >>> quality_focal_loss(pred, target, reduction="none")
        tensor([[0.0034, 0.0227],
                [0.1733, 0.7019]])
        >>> quality_focal_loss(pred, target, reduction="sum", normalizer=1.0)  # one positive
        tensor(0.9013)

    References:
        Li et al., "Generalized Focal Loss: Learning Qualified and Distributed Bounding Boxes
        for Dense Object Detection", NeurIPS 2020. https://arxiv.org/abs/2006.04388
    """
    check_soft_targets(pred, target)
    normalizer = check_loss_options(pred, target, weight, reduction, normalizer)
    check_non_negative("beta", beta)
    check_target_range("target", target, 0, 1, hint=" (IoU-aware scores, 0 for negatives)")
    cdt = compute_dtype(pred.dtype)
    x, q = pred.to(cdt), target.to(cdt)
    loss = F.softplus(x) - q * x  # BCE; at q = 0 (negatives) exactly softplus(x)
    if beta != 0:
        # q - p = q (1 - p) - (1 - q) p; lerp gives either end exactly at q = 0 and q = 1.
        distance = torch.lerp(torch.sigmoid(x).neg(), torch.sigmoid(-x), q).abs()
        if beta < 1:  # 0 ** beta: value 0, gradient 0 (not inf)
            tiny = torch.finfo(cdt).tiny
            scale = torch.where(distance > 0, distance.clamp_min(tiny).pow(beta), 0.0)
        else:
            scale = distance.pow(beta)
        loss = loss * scale
    if weight is not None:
        loss = loss * weight.to(cdt)
    return reduce_loss(loss, reduction, pred.dtype, None, normalizer)


@LOSSES.register(name="quality_focal", aliases=("qfl",))
class QualityFocalLoss(nn.Module):
    """Module form of `quality_focal_loss`; registered in ``LOSSES`` as ``"quality_focal"``
    (alias ``"qfl"``).

    Args:
        beta: Exponent of the scale factor, ``>= 0``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.

    ``weight`` and ``normalizer`` vary per batch: they are arguments of ``forward``.

    Examples:
        >>> import torch
        >>> loss_fn = QualityFocalLoss(reduction="sum")
        >>> loss_fn
        QualityFocalLoss(beta=2.0, reduction='sum')
        >>> loss_fn(torch.zeros(2, 3), torch.tensor([[0.5, 0, 0], [0, 0, 0]]), normalizer=1.0)
        tensor(0.8664)
    """

    def __init__(self, beta: float = 2.0, reduction: Reduction = "mean") -> None:
        super().__init__()
        check_non_negative("beta", beta)
        check_reduction(reduction)
        self.beta = beta
        self.reduction = reduction

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Tensor | None = None,
        normalizer: float | Tensor | None = None,
    ) -> Tensor:
        """Apply `quality_focal_loss` with this module's options."""
        return quality_focal_loss(
            pred, target, self.beta, weight=weight, reduction=self.reduction, normalizer=normalizer
        )

    def extra_repr(self) -> str:
        return f"beta={self.beta}, reduction={self.reduction!r}"
