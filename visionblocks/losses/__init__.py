"""Losses for detection and segmentation: focal, BCE, cross-entropy (OHEM), the IoU family and
the dense-detector losses (distribution, varifocal and quality focal).

Every loss is a function plus a thin ``nn.Module`` of the same stem
(``sigmoid_focal_loss`` / `SigmoidFocalLoss`, ``generalized_box_iou_loss`` /
`GeneralizedBoxIoULoss`, ...), registered in `visionblocks.registry.LOSSES` (``focal``,
``softmax_focal``, ``bce``, ``ce``, ``giou``, ``diou``, ``ciou``, ``rotated_iou``,
``distribution_focal``, ``varifocal``, ``quality_focal``, ``dice``, ``jaccard``, ``tversky``,
``lovasz``). The box-loss
functions are served by `visionblocks.ops` too, where torchvision users look for them. Dtype
policy: half inputs are
computed in float32; ``reduction="none"`` returns the input dtype, ``"sum"``/``"mean"`` the
compute dtype; except `cross_entropy` and `binary_cross_entropy_with_logits`, which return
the dtypes of the PyTorch functions they stand in for (float32 under ``torch.autocast``).
``torch.autocast`` changes no other loss's result.

Deprecated names (removed in 0.3; same objects, warn once): ``FocalLoss`` (use
`SigmoidFocalLoss`), ``GIoULoss`` / ``DIoULoss`` / ``CIoULoss`` (use `GeneralizedBoxIoULoss`
/ `DistanceBoxIoULoss` / `CompleteBoxIoULoss`).
"""

from typing import Any

from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.namespace import public_dir
from visionblocks.losses.bce import BCEWithLogitsLoss, binary_cross_entropy_with_logits
from visionblocks.losses.ce import CrossEntropyLoss, cross_entropy
from visionblocks.losses.distribution_focal import DistributionFocalLoss, distribution_focal_loss
from visionblocks.losses.focal import SigmoidFocalLoss, sigmoid_focal_loss
from visionblocks.losses.iou import (
    CompleteBoxIoULoss,
    DistanceBoxIoULoss,
    GeneralizedBoxIoULoss,
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)
from visionblocks.losses.lovasz import LovaszLoss, lovasz_loss
from visionblocks.losses.overlap import (
    DiceLoss,
    JaccardLoss,
    TverskyLoss,
    dice_loss,
    jaccard_loss,
    tversky_loss,
)
from visionblocks.losses.quality_focal import QualityFocalLoss, quality_focal_loss
from visionblocks.losses.rotated_iou import RotatedBoxIoULoss, rotated_box_iou_loss
from visionblocks.losses.softmax_focal import SoftmaxFocalLoss, softmax_focal_loss
from visionblocks.losses.varifocal import VarifocalLoss, varifocal_loss

__all__ = [
    "BCEWithLogitsLoss",
    "CompleteBoxIoULoss",
    "CrossEntropyLoss",
    "DiceLoss",
    "DistanceBoxIoULoss",
    "DistributionFocalLoss",
    "GeneralizedBoxIoULoss",
    "JaccardLoss",
    "LovaszLoss",
    "QualityFocalLoss",
    "RotatedBoxIoULoss",
    "SigmoidFocalLoss",
    "SoftmaxFocalLoss",
    "TverskyLoss",
    "VarifocalLoss",
    "binary_cross_entropy_with_logits",
    "complete_box_iou_loss",
    "cross_entropy",
    "dice_loss",
    "distance_box_iou_loss",
    "distribution_focal_loss",
    "generalized_box_iou_loss",
    "jaccard_loss",
    "lovasz_loss",
    "quality_focal_loss",
    "rotated_box_iou_loss",
    "sigmoid_focal_loss",
    "softmax_focal_loss",
    "tversky_loss",
    "varifocal_loss",
]
__dir__ = public_dir(__name__, __all__)

_DEPRECATED = {
    "FocalLoss": ("SigmoidFocalLoss", "0.3"),
    "GIoULoss": ("GeneralizedBoxIoULoss", "0.3"),
    "DIoULoss": ("DistanceBoxIoULoss", "0.3"),
    "CIoULoss": ("CompleteBoxIoULoss", "0.3"),
}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
