"""Conformance specs: the soft set-overlap losses (Dice, Jaccard, Tversky) and their modules.

Logits are halves and quarters (exact in float16 and bfloat16), so the half-precision
equivalences test the code rather than the rounding of the inputs.
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


def _labels(c: int = 3) -> Callable[[], torch.Tensor]:  # (2, c, 3, 4) of 0 and 1
    return lambda: (torch.arange(2 * c * 12).view(2, c, 3, 4) % 3 == 0).float()


def _binary() -> torch.Tensor:  # (2, 3, 4) of 0 and 1
    return (torch.arange(24).view(2, 3, 4) % 4 == 1).long()


_OPTIONS = [
    Arg("mode", "choice"),
    Arg("classes", "sequence", optional=True),
    Arg("log_loss", "bool"),
    Arg("from_logits", "bool"),
    Arg("smooth", "float"),
    # Any int is a valid ignore_index (-100, 255, 0...).
    Arg("ignore_index", "int", optional=True, accept={"negative", "zero", "huge"}),
    Arg("eps", "float"),
    Arg("class_weights", "sequence", optional=True),
    Arg("per_image", "bool"),
]
# The constructors cannot know C: a longer class_weights fails at the first call.
_CTOR_OPTIONS = [
    a if a.name != "class_weights" else Arg(a.name, a.kind, optional=True, accept={"longer"})
    for a in _OPTIONS
]
_TVERSKY = [Arg("alpha", "float"), Arg("beta", "float"), Arg("gamma", "float")]
_MULTICLASS = {
    "mode": "multiclass",
    "classes": [0, 2],
    "log_loss": False,
    "from_logits": True,
    "smooth": 0.5,
    "ignore_index": 255,
    "eps": 1e-7,
    "class_weights": [1.0, 2.0, 0.5],
    "per_image": False,
}
_INPUTS = [Arg("pred", "tensor"), Arg("target", "int_tensor")]

SPECS = [
    Spec(
        losses.dice_loss,
        call(losses.dice_loss, pred=_logits(), target=_indices, **_MULTICLASS),
        args=[*_INPUTS, *_OPTIONS],
        equivalences=_HALF,
    ),
    Spec(
        losses.jaccard_loss,
        call(
            losses.jaccard_loss,
            pred=_logits(),
            target=_labels(),
            **{**_MULTICLASS, "mode": "multilabel", "log_loss": True, "per_image": True},
        ),
        # Labels of any real dtype are valid: integer ones too.
        args=[Arg("pred", "tensor"), Arg("target", "tensor", accept={"dtype"}), *_OPTIONS],
        equivalences=_HALF,
    ),
    Spec(
        losses.tversky_loss,
        call(
            losses.tversky_loss,
            pred=_logits(),
            target=_indices,
            alpha=0.3,
            beta=0.7,
            gamma=0.75,
            **_MULTICLASS,
        ),
        args=[*_INPUTS, *_OPTIONS, *_TVERSKY],
        equivalences=_HALF,
    ),
    Spec(
        losses.tversky_loss,
        call(losses.tversky_loss, pred=_logits(1), target=_binary, mode="binary", gamma=2.0),
        args=[
            Arg("pred", "tensor"),
            Arg("target", "int_tensor", accept={"dtype"}),  # float 0/1 labels are valid too
            Arg("gamma", "float"),
        ],
        equivalences=_HALF,
        label="binary",
    ),
    # ----------------------------------------------------------------------- modules
    *(
        Spec(cls, call(cls, **_MULTICLASS), args=_CTOR_OPTIONS)
        for cls in (losses.DiceLoss, losses.JaccardLoss)
    ),
    Spec(
        losses.TverskyLoss,
        call(losses.TverskyLoss, alpha=0.3, beta=0.7, gamma=0.75, **_MULTICLASS),
        args=[*_CTOR_OPTIONS, *_TVERSKY],
    ),
    *(
        Spec(
            cls,
            forward(
                cls, {"mode": "multiclass", "ignore_index": 255}, pred=_logits(), target=_indices
            ),
            args=_INPUTS,
            forward=True,
            equivalences=_HALF,
        )
        for cls in (losses.DiceLoss, losses.JaccardLoss, losses.TverskyLoss)
    ),
]
