"""Functional tensor ops: box conversion, the IoU family and the IoU losses.

Ops know nothing of ``nn``: tensors in, tensors out. Box convention: ``"xyxy"`` corners unless
a ``fmt`` says otherwise (see `visionblocks.ops.boxes`).
"""

from visionblocks.ops.boxes import (
    BOX_FORMATS,
    box_area,
    box_convert,
    box_iou,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
)
from visionblocks.ops.iou_loss import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

__all__ = [
    "BOX_FORMATS",
    "box_area",
    "box_convert",
    "box_iou",
    "complete_box_iou",
    "complete_box_iou_loss",
    "distance_box_iou",
    "distance_box_iou_loss",
    "generalized_box_iou",
    "generalized_box_iou_loss",
]
