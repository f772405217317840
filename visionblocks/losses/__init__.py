"""Losses for detection and segmentation: focal, BCE, cross-entropy (OHEM) and the IoU family.

Every loss is a function plus a thin ``nn.Module`` registered in
`visionblocks.registry.LOSSES` (``focal``, ``softmax_focal``, ``bce``, ``ce``, ``giou``,
``diou``, ``ciou``). The box-loss functions live in `visionblocks.ops.iou_loss` and are
re-exported here. Dtype policy (all losses): half inputs are computed in float32;
``reduction="none"`` returns the input dtype, ``"sum"``/``"mean"`` the compute dtype.
"""

from visionblocks.losses.bce import BCEWithLogitsLoss, binary_cross_entropy_with_logits
from visionblocks.losses.ce import CrossEntropyLoss, cross_entropy
from visionblocks.losses.focal import FocalLoss, sigmoid_focal_loss
from visionblocks.losses.iou import CIoULoss, DIoULoss, GIoULoss
from visionblocks.losses.softmax_focal import SoftmaxFocalLoss, softmax_focal_loss
from visionblocks.ops.iou_loss import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

__all__ = [
    "BCEWithLogitsLoss",
    "CIoULoss",
    "CrossEntropyLoss",
    "DIoULoss",
    "FocalLoss",
    "GIoULoss",
    "SoftmaxFocalLoss",
    "binary_cross_entropy_with_logits",
    "complete_box_iou_loss",
    "cross_entropy",
    "distance_box_iou_loss",
    "generalized_box_iou_loss",
    "sigmoid_focal_loss",
    "softmax_focal_loss",
]
