"""Conformance specs: the Lovász loss (`lovasz_loss`) and its module (`LovaszLoss`).

Logits are halves and quarters (exact in float16 and bfloat16), so the half-precision
equivalences test the code rather than the rounding of the inputs (tied errors give the same
loss in any order).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tests.conformance.framework import Arg, Spec, call, forward
from visionblocks import losses

_HALF = ("noncontiguous", "half", "bfloat16")


def _logits(c: int = 3) -> Callable[[], torch.Tensor]:  # (2, c, 3, 4)
    return lambda: (torch.arange(2 * c * 12, dtype=torch.float32).view(2, c, 3, 4) % 7 - 3) / 2


def _indices() -> torch.Tensor:  # (2, 3, 4) class indices in [0, 3), 255 ignored
    t = torch.arange(24).view(2, 3, 4) % 3
    t[0, 0, 0] = 255
    return t


def _labels() -> torch.Tensor:  # (2, 3, 3, 4) of 0 and 1
    return (torch.arange(72).view(2, 3, 3, 4) % 3 == 0).float()


def _binary() -> torch.Tensor:  # (2, 3, 4) of 0 and 1
    return (torch.arange(24).view(2, 3, 4) % 4 == 1).long()


_OPTIONS = [
    Arg("mode", "choice"),
    Arg("per_image", "bool"),
    # Any int is a valid ignore_index (-100, 255, 0...).
    Arg("ignore_index", "int", optional=True, accept={"negative", "zero", "huge"}),
    Arg("from_logits", "bool"),
    Arg("classes", "sequence", optional=True),
]
_MULTICLASS = {
    "mode": "multiclass",
    "per_image": True,
    "ignore_index": 255,
    "from_logits": True,
    "classes": [0, 2],
}
_INPUTS = [Arg("pred", "tensor"), Arg("target", "int_tensor")]

SPECS = [
    Spec(
        losses.lovasz_loss,
        call(losses.lovasz_loss, pred=_logits(), target=_indices, **_MULTICLASS),
        args=[*_INPUTS, *_OPTIONS],
        equivalences=_HALF,
    ),
    Spec(
        losses.lovasz_loss,
        call(
            losses.lovasz_loss,
            pred=_logits(),
            target=_labels,
            **{**_MULTICLASS, "mode": "multilabel", "per_image": False, "ignore_index": None},
        ),
        # Labels of any real dtype are valid: integer ones too.
        args=[Arg("pred", "tensor"), Arg("target", "tensor", accept={"dtype"}), *_OPTIONS],
        equivalences=_HALF,
        label="multilabel",
    ),
    Spec(
        losses.lovasz_loss,
        call(losses.lovasz_loss, pred=_logits(1), target=_binary, mode="binary"),
        args=[
            Arg("pred", "tensor"),
            Arg("target", "int_tensor", accept={"dtype"}),  # float 0/1 labels are valid too
        ],
        equivalences=_HALF,
        label="binary",
    ),
    Spec(losses.LovaszLoss, call(losses.LovaszLoss, **_MULTICLASS), args=_OPTIONS),
    Spec(
        losses.LovaszLoss,
        forward(
            losses.LovaszLoss,
            {"mode": "multiclass", "ignore_index": 255},
            pred=_logits(),
            target=_indices,
        ),
        args=_INPUTS,
        forward=True,
        equivalences=_HALF,
    ),
]
