"""Varifocal loss (VarifocalNet, RT-DETR): BCE against IoU-aware scores, negatives focal-scaled.

Convention: ``pred`` holds logits and ``target`` the IoU-aware classification scores of the
same shape (``(N, C)`` or any other), in ``[0, 1]``: the IoU of the matched box at its class
for positives, 0 everywhere else. An element is positive where its target is above 0.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import check_floating, compute_dtype
from visionblocks.losses._reduce import check_reduction, check_target_range, reduce_loss
from visionblocks.losses.distribution_focal import check_loss_options, check_non_negative

__all__ = ["VarifocalLoss", "varifocal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def check_soft_targets(pred: Tensor, target: Tensor) -> None:
    """Raise unless ``pred`` and ``target`` are floating tensors of one shape."""
    check_floating("pred", pred)
    check_floating("target", target)
    if target.shape != pred.shape:
        raise ValueError(
            f"target must have the shape of pred {tuple(pred.shape)}, got {tuple(target.shape)}"
        )


def varifocal_loss(
    pred: Tensor,
    target: Tensor,
    alpha: float = 0.75,
    gamma: float = 2.0,
    *,
    iou_weighted: bool = True,
    weight: Tensor | None = None,
    reduction: Reduction = "mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Varifocal loss: BCE weighted by the target score on positives, by
    ``alpha * sigmoid(pred) ** gamma`` on negatives.

    With ``q = target`` and ``p = sigmoid(pred)``:

        loss = BCEWithLogits(pred, q) * (q if q > 0 else alpha * p ** gamma)

    (``1`` instead of ``q`` on positives with ``iou_weighted=False``). Equal to mmdet's
    ``varifocal_loss`` (``"mean"`` without ``avg_factor``; with it, pass it as
    ``normalizer``) and to ultralytics' ``VarifocalLoss(pred, q, label)`` for
    ``label = q > 0``, which is ``reduction="sum", normalizer=pred.shape[1]`` here. Computed
    in float32, the BCE as ``softplus(pred) - q pred`` (the negatives' ``softplus(pred)`` keeps its
    relative accuracy at any logit, unlike ``F.binary_cross_entropy_with_logits``), ``p **
    gamma`` for ``gamma < 1`` as ``exp(gamma * logsigmoid(pred))``: finite values and gradients
    for logits of any size and any ``gamma >= 0``, under AMP too.
    ``"mean"`` divides by the number of elements (``weight`` does not change it);
    ``normalizer`` (e.g. the number of positives) replaces it and divides ``"sum"`` and
    ``"none"`` too.

    Value check (`visionblocks.set_value_checks`): ``target`` in ``[0, 1]``. Dtype policy:
    half inputs are computed in float32; ``"none"`` returns ``pred``'s dtype, ``"sum"`` and
    ``"mean"`` the compute dtype; the same under ``torch.autocast``. Gradients flow to
    ``pred``, ``target`` and ``weight``; compiles with ``torch.compile(fullgraph=True)``.

    Args:
        pred (Tensor[N, C]): Logits, any shape (floating).
        target (Tensor[N, C]): IoU-aware scores in ``[0, 1]``, ``pred``'s shape; 0 for negatives.
        alpha: Weight of the negatives, ``>= 0``.
        gamma: Focusing exponent of the negatives, ``>= 0``.
        iou_weighted: Weight positives by their score (``True``) or by 1.
        weight (Tensor, optional): Element-wise weight broadcastable to ``pred``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        normalizer (float or Tensor, optional): Divides the summed loss instead of the count;
            positive and finite (a tensor: one element, on ``pred``'s device or 0-d on CPU).

    Returns:
        Tensor: ``"none"``: ``pred``'s shape and dtype; otherwise a scalar in the compute dtype.

    Raises:
        TypeError: Non-floating tensors, options of the wrong type.
        ValueError: ``target`` not of ``pred``'s shape, a negative or non-finite ``alpha`` or
            ``gamma``, a ``weight`` that does not broadcast, tensors on different devices, an
            unknown ``reduction``, a ``normalizer`` that is not positive and finite, or (value
            check) a ``target`` outside ``[0, 1]``.

    Examples:
        >>> import torch
        >>> pred = torch.tensor([[2.0, -1.0], [0.0, 1.0]])
        >>> target = torch.tensor([[0.8, 0.0], [0.0, 0.0]])
        >>> varifocal_loss(pred, target, reduction="none")
        tensor([[0.4215, 0.0170],
                [0.1300, 0.5264]])
        >>> varifocal_loss(pred, target, reduction="sum", normalizer=1.0)  # one positive
        tensor(1.0949)

    References:
        Zhang et al., "VarifocalNet: An IoU-aware Dense Object Detector", CVPR 2021.
        https://arxiv.org/abs/2008.13367
    """
    check_soft_targets(pred, target)
    normalizer = check_loss_options(pred, target, weight, reduction, normalizer)
    check_non_negative("alpha", alpha)
    check_non_negative("gamma", gamma)
    check_type("iou_weighted", iou_weighted, bool)
    check_target_range("target", target, 0, 1, hint=" (IoU-aware scores, 0 for negatives)")
    cdt = compute_dtype(pred.dtype)
    x, q = pred.to(cdt), target.to(cdt)
    # alpha p ** gamma; below gamma = 1 through logsigmoid: 0 ** gamma has no finite gradient
    p_gamma = torch.sigmoid(x).pow(gamma) if gamma >= 1 else torch.exp(F.logsigmoid(x) * gamma)
    negative = p_gamma * alpha
    focal = torch.where(q > 0, q, negative) if iou_weighted else torch.where(q > 0, 1.0, negative)
    loss = (F.softplus(x) - q * x) * focal  # BCE; at q = 0 (negatives) exactly softplus(x)
    if weight is not None:
        loss = loss * weight.to(cdt)
    return reduce_loss(loss, reduction, pred.dtype, None, normalizer)


@LOSSES.register(name="varifocal", aliases=("vfl",))
class VarifocalLoss(nn.Module):
    """Module form of `varifocal_loss`; registered in ``LOSSES`` as ``"varifocal"`` (alias
    ``"vfl"``).

    Args:
        alpha: Weight of the negatives, ``>= 0``.
        gamma: Focusing exponent of the negatives, ``>= 0``.
        iou_weighted: Weight positives by their score (``True``) or by 1.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.

    ``weight`` and ``normalizer`` vary per batch: they are arguments of ``forward``.

    Examples:
        >>> import torch
        >>> loss_fn = VarifocalLoss(reduction="sum")
        >>> loss_fn
        VarifocalLoss(alpha=0.75, gamma=2.0, iou_weighted=True, reduction='sum')
        >>> loss_fn(torch.zeros(2, 3), torch.tensor([[0.5, 0, 0], [0, 0, 0]]), normalizer=1.0)
        tensor(0.9964)
    """

    def __init__(
        self,
        alpha: float = 0.75,
        gamma: float = 2.0,
        iou_weighted: bool = True,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        check_non_negative("alpha", alpha)
        check_non_negative("gamma", gamma)
        check_type("iou_weighted", iou_weighted, bool)
        check_reduction(reduction)
        self.alpha, self.gamma, self.iou_weighted = alpha, gamma, iou_weighted
        self.reduction = reduction

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Tensor | None = None,
        normalizer: float | Tensor | None = None,
    ) -> Tensor:
        """Apply `varifocal_loss` with this module's options."""
        return varifocal_loss(
            pred,
            target,
            self.alpha,
            self.gamma,
            iou_weighted=self.iou_weighted,
            weight=weight,
            reduction=self.reduction,
            normalizer=normalizer,
        )

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, gamma={self.gamma}, iou_weighted={self.iou_weighted}, "
            f"reduction={self.reduction!r}"
        )
