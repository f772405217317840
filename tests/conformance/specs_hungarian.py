"""Conformance specs: Hungarian matching (`visionblocks.ops.hungarian`).

Two images, four queries and three classes; every query sits on one object or on none, so the
matching is the same in float16 and bfloat16 (the half-precision equivalences compare indices).
The tensors inside the dicts are mutated through a wrapper that takes them as arguments.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.conformance.framework import Arg, Spec
from visionblocks import ops

_HALF = ("noncontiguous", "half", "bfloat16")
_OBJECTS = [[0.25, 0.25, 0.25, 0.25], [0.75, 0.5, 0.25, 0.5], [0.5, 0.75, 0.5, 0.25]]


def _outputs() -> dict[str, torch.Tensor]:
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0]])
    boxes = torch.tensor([*_OBJECTS, [0.5, 0.5, 0.125, 0.125]])
    return {"pred_logits": torch.stack([logits, logits.flip(0)]), "pred_boxes": torch.stack([boxes, boxes.flip(0)])}  # fmt: skip


def _targets() -> list[dict[str, torch.Tensor]]:
    return [
        {"labels": torch.tensor([2, 0]), "boxes": torch.tensor([_OBJECTS[2], _OBJECTS[0]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([_OBJECTS[1]])},
    ]


def _tensors(
    pred_logits: Any, pred_boxes: Any, labels: Any, boxes: Any, **options: Any
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`hungarian_match` with the predictions and the first image's objects as arguments."""
    targets = [{"labels": labels, "boxes": boxes}, _targets()[1]]
    outputs = {"pred_logits": pred_logits, "pred_boxes": pred_boxes}
    return ops.hungarian_match(outputs, targets, **options)


_OPTIONS = {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0, "focal": True, "alpha": 0.25, "gamma": 2.0}  # fmt: skip
_OPTION_ARGS = [
    Arg("cost_class", "float"),
    Arg("cost_bbox", "float"),
    Arg("cost_giou", "float"),
    Arg("focal", "bool"),
    Arg("alpha", "float"),
    Arg("gamma", "float"),
]
_DICTS = [Arg("outputs", "mapping"), Arg("targets", "sequence")]


def _tensor_call() -> tuple[Any, dict[str, Any]]:
    first = _targets()[0]
    return _tensors, {**_outputs(), "labels": first["labels"], "boxes": first["boxes"]}


def _forward() -> tuple[Any, dict[str, Any]]:
    return ops.HungarianMatcher(**_OPTIONS).forward, {"outputs": _outputs(), "targets": _targets()}


# fmt: off
SPECS = [
    Spec(ops.hungarian_match,
         lambda: (ops.hungarian_match, {"outputs": _outputs(), "targets": _targets(), **_OPTIONS}),
         args=[*_DICTS, *_OPTION_ARGS]),
    Spec(ops.hungarian_match, _tensor_call, label="tensors", equivalences=_HALF,
         args=[Arg("pred_logits", "tensor", aliases=("outputs['pred_logits']",)),
               Arg("pred_boxes", "tensor", aliases=("outputs['pred_boxes']",)),
               Arg("labels", "int_tensor", aliases=("targets[0]['labels']",)),
               Arg("boxes", "tensor", aliases=("targets[0]['boxes']",))]),
    Spec(ops.HungarianMatcher, lambda: (ops.HungarianMatcher, dict(_OPTIONS)), args=_OPTION_ARGS),
    Spec(ops.HungarianMatcher, _forward, forward=True, args=_DICTS),
]
# fmt: on
