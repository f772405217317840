"""Conformance specs: `visionblocks.models.YOLOv8Head` (its constructor and forward) and the
detector's training call through it (targets checked before the task-aligned assignment)."""

from __future__ import annotations

from typing import Any

import torch

from tests.conformance.framework import Arg, Spec
from tests.conformance.specs_models_nn import (
    ALL,
    LEVELS,
    TINY,
    _images,
    _Levels,
    _target,
    _x,
)
from visionblocks.models import YOLOv8Head, build_detector


def _head() -> YOLOv8Head:
    torch.manual_seed(0)
    return YOLOv8Head(8, 3, [8, 16], reg_max=4).eval()  # eval: BatchNorm of a tiny batch


def _train_on_targets() -> tuple[Any, dict[str, Any]]:
    """A detector with the YOLOv8 head in training mode, ``targets[0]``'s fields as arguments."""
    torch.manual_seed(0)
    model = build_detector(
        backbone={"type": "vb_tiny", "out_indices": [2, 3], **TINY},
        neck={"type": "fpn", "out_channels": 8},
        head={"type": "yolov8", "num_classes": 3, "reg_max": 4},
    )
    images = _images()

    def call(boxes: Any, labels: Any, iscrowd: Any) -> Any:
        return model(images, [{"boxes": boxes, "labels": labels, "iscrowd": iscrowd}, _target(1)])

    return call, _target()


# fmt: off
SPECS = [
    # an absurd number of candidates, detections or anchors per object means "keep them all";
    # huge gains and exponents are legitimate numbers
    Spec(YOLOv8Head, lambda: (YOLOv8Head, {
            "in_channels": 8, "num_classes": 3, "strides": [8, 16], "reg_max": 4,
            "depthwise_cls": False, "norm": "bn",
            "act": "silu", "tal_topk": 10, "tal_alpha": 0.5, "tal_beta": 6.0, "tal_min_side": 16.0,
            "box_gain": 7.5, "cls_gain": 0.5, "dfl_gain": 1.5, "score_thresh": 0.05,
            "nms_thresh": 0.7, "topk_candidates": 100, "max_detections": 10}),
         args=[*(Arg(n, "int") for n in ("in_channels", "num_classes")), Arg("strides", "sequence"),
               Arg("reg_max", "int"), Arg("depthwise_cls", "bool"),
               Arg("norm", "choice", optional=True),
               Arg("act", "choice", optional=True), Arg("tal_topk", "int", accept={"huge"}),
               *(Arg(n, "float") for n in ("tal_alpha", "tal_beta")),
               Arg("tal_min_side", "float", optional=True),
               *(Arg(n, "float") for n in ("box_gain", "cls_gain", "dfl_gain", "score_thresh",
                                           "nms_thresh")),
               *(Arg(n, "int") for n in ("topk_candidates", "max_detections"))]),
    Spec(YOLOv8Head, lambda: (_head(), {"features": [_x(8, 8), _x(8, 4)]}),
         args=[Arg("features", "sequence")], forward=True),
    Spec(YOLOv8Head, lambda: (_Levels(_head()), {"x0": _x(8, 8), "x1": _x(8, 4)}),
         args=LEVELS, forward=True, equivalences=ALL, label="levels"),
    Spec(YOLOv8Head, _train_on_targets, forward=True, label="targets",
         args=[Arg("boxes", "tensor", aliases=('targets[0]["boxes"]',)),
               Arg("labels", "int_tensor", aliases=('targets[0]["labels"]',)),
               Arg("iscrowd", "int_tensor", optional=True, aliases=('targets[0]["iscrowd"]',))]),
]
# fmt: on
