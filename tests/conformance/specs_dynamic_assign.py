"""Conformance specs: dynamic-k assignment (`visionblocks.ops.simota`,
`visionblocks.ops.dynamic_soft_label`).

Coordinates, scores and logits are small integers and halves, exact in float16 and bfloat16,
so the half-precision equivalences test the code rather than the rounding of the inputs.
"""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec
from visionblocks import ops

_HALF = ("noncontiguous", "half", "bfloat16")


def _priors() -> torch.Tensor:
    x = torch.tensor([4.0, 12.0, 20.0, 28.0])
    return torch.stack([x, x * 0 + 4, x * 0 + 8, x * 0 + 8], 1)


def _boxes() -> torch.Tensor:
    return torch.tensor([[0.0, 0, 8, 8], [6, 0, 14, 8], [10, 0, 18, 8], [24, 0, 32, 8]])


def _gt_boxes() -> torch.Tensor:
    return torch.tensor([[2.0, 0, 22, 8], [20, 0, 32, 8]])


def _build(fn, scores, **options):
    def build():
        return fn, {
            "priors": _priors(),
            "boxes": _boxes(),
            **scores(),
            "gt_boxes": _gt_boxes(),
            "gt_labels": torch.tensor([1, 0]),
            **options,
        }

    return build


_INPUTS = [
    Arg("priors", "tensor"),
    Arg("boxes", "tensor"),
    Arg("gt_boxes", "tensor"),
    Arg("gt_labels", "int_tensor"),
]

SPECS = [
    Spec(
        ops.simota_assign,
        _build(
            ops.simota_assign,
            lambda: {"scores": torch.tensor([[0.5, 0.25], [0.75, 0.5], [0.5, 1.0], [0.0, 0.5]])},
            center_radius=2.5,
            candidate_topk=10,
            iou_weight=3.0,
            cls_weight=1.0,
            block_bytes=None,
        ),
        args=[
            *_INPUTS,
            Arg("scores", "tensor"),
            Arg("center_radius", "float"),
            Arg("candidate_topk", "int"),
            Arg("iou_weight", "float"),
            Arg("cls_weight", "float"),
            Arg("block_bytes", "int", optional=True),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.dynamic_soft_label_assign,
        _build(
            ops.dynamic_soft_label_assign,
            lambda: {"logits": torch.tensor([[0.5, -2.0], [1.0, 0.0], [-1.5, 2.0], [0.0, 0.5]])},
            soft_center_radius=3.0,
            topk=13,
            iou_weight=3.0,
            block_bytes=None,
        ),
        args=[
            *_INPUTS,
            Arg("logits", "tensor"),
            Arg("soft_center_radius", "float"),
            Arg("topk", "int"),
            Arg("iou_weight", "float"),
            Arg("block_bytes", "int", optional=True),
        ],
        equivalences=_HALF,
    ),
]

EXEMPT: dict[object, str] = {
    ops.DynamicKAssignment: "a NamedTuple of simota_assign's and dynamic_soft_label_assign's "
    "results; both are spec'd",
}
