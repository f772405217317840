"""Conformance specs: the dense-detector losses (distribution, varifocal and quality focal).

Values are exactly representable in float16 and bfloat16 (halves and quarters), so the
half-precision equivalences test the code rather than the rounding of the inputs.
"""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec, call, forward
from visionblocks import losses

_HALF = ("noncontiguous", "half", "bfloat16")


def _bins() -> torch.Tensor:  # (2, 3, 5): reg_max = 4
    return torch.arange(30, dtype=torch.float32).view(2, 3, 5) % 7 / 2 - 1.5


def _distances() -> torch.Tensor:  # in [0, 4], both ends included
    return torch.tensor([[0.0, 1.5, 4.0], [2.25, 3.75, 0.5]])


def _logits() -> torch.Tensor:
    return torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.5, 4.0]])


def _scores() -> torch.Tensor:  # IoU-aware scores, 0 for negatives
    return torch.tensor([[0.75, 0.0, 0.0], [0.0, 0.0, 0.5]])


def _per_row() -> torch.Tensor:
    return torch.tensor([[1.0], [0.5]])


_LOSS_ARGS = [
    Arg("weight", "tensor", optional=True),  # (2, 1): its rank changes break the broadcast
    Arg("reduction", "choice"),
    Arg("normalizer", "float", optional=True),
]
_FORWARD_ARGS = [
    Arg("pred", "tensor"),
    Arg("target", "tensor"),
    Arg("weight", "tensor", optional=True),
    Arg("normalizer", "float", optional=True),
]

SPECS = [
    # ---------------------------------------------------------------- distribution focal
    Spec(
        losses.distribution_focal_loss,
        call(
            losses.distribution_focal_loss,
            pred=_bins,
            target=_distances,
            weight=_per_row,
            reduction="none",
            normalizer=2.0,
        ),
        args=[Arg("pred", "tensor"), Arg("target", "tensor"), *_LOSS_ARGS],
        equivalences=_HALF,
    ),
    Spec(
        losses.DistributionFocalLoss,
        call(losses.DistributionFocalLoss, reduction="mean"),
        args=[Arg("reduction", "choice")],
    ),
    Spec(
        losses.DistributionFocalLoss,
        forward(
            losses.DistributionFocalLoss,
            {"reduction": "none"},
            pred=_bins,
            target=_distances,
            weight=_per_row,
            normalizer=2.0,
        ),
        args=_FORWARD_ARGS,
        forward=True,
        equivalences=_HALF,
    ),
    # ----------------------------------------------------------------------- varifocal
    Spec(
        losses.varifocal_loss,
        call(
            losses.varifocal_loss,
            pred=_logits,
            target=_scores,
            alpha=0.75,
            gamma=2.0,
            iou_weighted=True,
            weight=_per_row,
            reduction="none",
            normalizer=2.0,
        ),
        args=[
            Arg("pred", "tensor"),
            Arg("target", "tensor"),
            Arg("alpha", "float"),
            Arg("gamma", "float"),
            Arg("iou_weighted", "bool"),
            *_LOSS_ARGS,
        ],
        equivalences=_HALF,
    ),
    Spec(
        losses.VarifocalLoss,
        call(losses.VarifocalLoss, alpha=0.75, gamma=2.0, iou_weighted=False, reduction="sum"),
        args=[
            Arg("alpha", "float"),
            Arg("gamma", "float"),
            Arg("iou_weighted", "bool"),
            Arg("reduction", "choice"),
        ],
    ),
    Spec(
        losses.VarifocalLoss,
        forward(
            losses.VarifocalLoss,
            {"reduction": "none", "gamma": 0.5},
            pred=_logits,
            target=_scores,
            weight=_per_row,
            normalizer=2.0,
        ),
        args=_FORWARD_ARGS,
        forward=True,
        equivalences=_HALF,
    ),
    # ------------------------------------------------------------------- quality focal
    Spec(
        losses.quality_focal_loss,
        call(
            losses.quality_focal_loss,
            pred=_logits,
            target=_scores,
            beta=2.0,
            weight=_per_row,
            reduction="none",
            normalizer=2.0,
        ),
        args=[Arg("pred", "tensor"), Arg("target", "tensor"), Arg("beta", "float"), *_LOSS_ARGS],
        equivalences=_HALF,
    ),
    Spec(
        losses.QualityFocalLoss,
        call(losses.QualityFocalLoss, beta=2.0, reduction="mean"),
        args=[Arg("beta", "float"), Arg("reduction", "choice")],
    ),
    Spec(
        losses.QualityFocalLoss,
        forward(
            losses.QualityFocalLoss,
            {"reduction": "none", "beta": 0.5},
            pred=_logits,
            target=_scores,
            weight=_per_row,
            normalizer=2.0,
        ),
        args=_FORWARD_ARGS,
        forward=True,
        equivalences=_HALF,
    ),
]
