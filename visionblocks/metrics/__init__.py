"""Evaluation metrics: streaming semantic-segmentation metrics (`SegmentationMetrics`: IoU,
mIoU, F1/Dice, pixel accuracy from one confusion matrix), panoptic quality
(`panoptic_quality`) and a plain-text table of any of them, or of `coco_evaluate`'s result
(`format_metrics`).

Convention: a metric's state stays on the device of its inputs and is updated without
reading it on the host; values are read only when the metric is computed (`compute`,
`panoptic_quality`) or printed. Results are dicts of tensors keyed by metric name, with
per-class values as 1-d tensors in class order and torchmetrics' handling of classes that
do not occur (0 per class, left out of the means).
"""

from __future__ import annotations

from visionblocks._core.namespace import public_dir
from visionblocks.metrics.panoptic import panoptic_quality
from visionblocks.metrics.segmentation import SegmentationMetrics
from visionblocks.metrics.table import format_metrics

__all__ = ["SegmentationMetrics", "format_metrics", "panoptic_quality"]
__dir__ = public_dir(__name__, __all__)
