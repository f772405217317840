"""Conformance specs: task-aligned assignment (`visionblocks.ops.task_aligned`).

Coordinates and scores are small integers and binary fractions, exact in float16 and
bfloat16, so the half-precision equivalences test the code rather than the rounding of the
inputs.
"""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec
from visionblocks import ops

_HALF = ("noncontiguous", "half", "bfloat16")


def _inputs() -> dict[str, torch.Tensor]:
    x = torch.tensor([2.0, 6.0, 10.0, 14.0])
    return {
        "scores": torch.tensor([[[0.75, 0.125], [0.5, 0.25], [0.25, 0.75], [0.125, 0.5]]]),
        "pred_boxes": torch.stack([x - 2, x * 0, x + 3, x * 0 + 4], 1)[None],
        "anchor_points": torch.stack([x, x * 0 + 2], 1),
        "gt_labels": torch.tensor([[[0.0], [1.0]]]),
        "gt_boxes": torch.tensor([[[0.0, 0.0, 8.0, 4.0], [8.0, 0.0, 16.0, 4.0]]]),
        "gt_mask": torch.ones(1, 2, 1),
    }


def _build(fn, **options):
    def build():
        return fn, {**_inputs(), **options}

    return build


_INPUTS = [
    Arg("scores", "tensor"),
    Arg("pred_boxes", "tensor"),
    # integer points, boxes, labels and masks are fine (ultralytics' labels and mask are float)
    Arg("anchor_points", "tensor", accept={"dtype"}),
    # NaN or infinite labels index no class: rejecting them would read values on the host
    Arg("gt_labels", "tensor", accept={"dtype"}, skip={"nan", "inf"}),
    Arg("gt_boxes", "tensor", accept={"dtype"}),
    Arg("gt_mask", "tensor", accept={"dtype"}),
]
_OPTIONS = [
    Arg("topk", "int"),
    Arg("alpha", "float"),
    Arg("beta", "float"),
    Arg("eps", "float"),
    Arg("topk2", "int", optional=True),
    Arg("min_side", "float", optional=True),
    Arg("block_bytes", "int", optional=True),
]
_VALUES = {
    "topk": 2,
    "alpha": 0.5,
    "beta": 6.0,
    "eps": 1e-9,
    "topk2": 1,
    "min_side": 16.0,
    "block_bytes": None,
}

SPECS = [
    Spec(
        ops.task_aligned_assign,
        _build(ops.task_aligned_assign, **_VALUES),
        args=[*_INPUTS, *_OPTIONS],
        equivalences=_HALF,
    ),
    Spec(
        ops.TaskAlignedAssigner,
        lambda: (ops.TaskAlignedAssigner, dict(_VALUES)),
        args=_OPTIONS,
        label="init",
    ),
    Spec(
        ops.TaskAlignedAssigner,
        lambda: (ops.TaskAlignedAssigner(topk=2).forward, _inputs()),
        args=_INPUTS,
        forward=True,
        equivalences=_HALF,
    ),
]

EXEMPT: dict[object, str] = {
    ops.TaskAlignedTargets: "the NamedTuple task_aligned_assign returns; users unpack it",
}
