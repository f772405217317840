"""Conformance specs: the NMS family (`nms`, `batched_nms`, `soft_nms`, `batched_soft_nms`,
`matrix_nms`). Coordinates and scores are exact in float16 and bfloat16."""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import ops

_HALF = ("noncontiguous", "half", "bfloat16")


def _boxes() -> torch.Tensor:
    return torch.tensor(
        [[0.0, 0.0, 8.0, 8.0], [1.0, 0.0, 9.0, 8.0], [0.0, 1.0, 8.0, 7.0], [16.0, 16.0, 20.0, 24.0]]
    )


def _scores() -> torch.Tensor:
    return torch.tensor([0.5, 0.75, 0.25, 0.625])


def _idxs() -> torch.Tensor:
    return torch.tensor([0, 1, 0, 0])


def _masks() -> torch.Tensor:
    masks = torch.zeros(4, 6, 6, dtype=torch.bool)
    masks[0, :4, :4] = masks[1, 1:5, :4] = masks[2, :3, :3] = masks[3, 4:, 4:] = True
    return masks


_BOXES = Arg("boxes", "tensor", accept={"dtype"})  # integer boxes are boxes
_THRESHOLD = Arg("iou_threshold", "float")
_SOFT = [
    Arg("sigma", "float"),
    Arg("score_threshold", "float"),
    Arg("method", "choice"),
]

SPECS: list[Spec] = [
    Spec(
        ops.nms,
        call(ops.nms, boxes=_boxes, scores=_scores, iou_threshold=0.3),
        args=[_BOXES, Arg("scores", "tensor"), _THRESHOLD],
        equivalences=_HALF,
    ),
    Spec(
        ops.batched_nms,
        call(ops.batched_nms, boxes=_boxes, scores=_scores, idxs=_idxs, iou_threshold=0.3),
        args=[_BOXES, Arg("scores", "tensor"), Arg("idxs", "int_tensor"), _THRESHOLD],
        equivalences=_HALF,
    ),
    Spec(
        ops.soft_nms,
        call(
            ops.soft_nms,
            boxes=_boxes,
            scores=_scores,
            iou_threshold=0.3,
            sigma=0.5,
            score_threshold=0.001,
            method="linear",
        ),
        args=[_BOXES, Arg("scores", "tensor"), _THRESHOLD, *_SOFT],
        equivalences=_HALF,
        tolerance=(1e-5, 1e-6),  # exact inputs: the same float32 arithmetic
    ),
    Spec(
        ops.batched_soft_nms,
        call(
            ops.batched_soft_nms,
            boxes=_boxes,
            scores=_scores,
            idxs=_idxs,
            iou_threshold=0.3,
            sigma=0.5,
            score_threshold=0.001,
            method="gaussian",
        ),
        args=[_BOXES, Arg("scores", "tensor"), Arg("idxs", "int_tensor"), _THRESHOLD, *_SOFT],
        equivalences=_HALF,
    ),
    # A negative score_threshold is legitimate (scores need not be probabilities).
    Spec(
        ops.matrix_nms,
        call(
            ops.matrix_nms,
            scores=_scores,
            boxes=_boxes,
            labels=_idxs,
            kernel="gaussian",
            sigma=2.0,
            score_threshold=0.1,
        ),
        args=[
            Arg("scores", "tensor"),
            _BOXES,
            Arg("labels", "int_tensor", optional=True),
            Arg("kernel", "choice"),
            Arg("sigma", "float"),
            Arg("score_threshold", "float", optional=True, accept={"negative"}),
        ],
        equivalences=_HALF,
    ),
    # Masks of any real dtype or bool (the dtype mutation gives float masks: the same masks).
    Spec(
        ops.matrix_nms,
        call(ops.matrix_nms, scores=_scores, masks=_masks, kernel="linear"),
        args=[Arg("scores", "tensor"), Arg("masks", "tensor", accept={"dtype"})],
        equivalences=_HALF,
        label="masks",
    ),
]
