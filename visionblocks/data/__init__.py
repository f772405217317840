"""COCO data: dataset wrappers, batching, sampling, evaluation and a synthetic COCO generator.

- `CocoInstances`, `CocoSegmentation`, `CocoKeypoints`: COCO annotations as ``tv_tensors``
  (``DATASETS``: ``coco_detection`` / ``coco`` / ``coco_instances``, ``coco_segmentation``,
  ``coco_keypoints``); `instance_fields` for ``SanitizeBoundingBoxes``.
- `check_coco` / `CocoCheck`: every problem of an annotation file (``visionblocks check-coco``).
- `collate_detection`, `aspect_ratio_groups`, `GroupedBatchSampler`, `prefetch_to_device`:
  batching, sampling and host-to-device copies.
- `coco_evaluate`: COCO numbers of model outputs, gathered across ranks.
- `make_synthetic_coco`: the built-in default data, written as a real COCO dataset.

``CocoDetection`` is a deprecated alias of `CocoInstances` (removed in 0.3).
"""

from typing import Any

from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.namespace import public_dir
from visionblocks.data._coco_checks import INVALID_REASONS
from visionblocks.data.check import CocoCheck, check_coco
from visionblocks.data.coco import CocoInstances, instance_fields
from visionblocks.data.collate import DetectionBatch, collate_detection
from visionblocks.data.evaluate import COCO_KEYPOINT_STAT_NAMES, COCO_STAT_NAMES, coco_evaluate
from visionblocks.data.keypoints import COCO_KEYPOINT_NAMES, CocoKeypoints
from visionblocks.data.prefetch import DevicePrefetcher, move_to_device, prefetch_to_device
from visionblocks.data.samplers import GroupedBatchSampler, aspect_ratio_groups
from visionblocks.data.segmentation import CocoSegmentation
from visionblocks.data.synthetic import SYNTHETIC_CLASSES, make_synthetic_coco

__all__ = [
    "COCO_KEYPOINT_NAMES",
    "COCO_KEYPOINT_STAT_NAMES",
    "COCO_STAT_NAMES",
    "INVALID_REASONS",
    "SYNTHETIC_CLASSES",
    "CocoCheck",
    "CocoInstances",
    "CocoKeypoints",
    "CocoSegmentation",
    "DetectionBatch",
    "DevicePrefetcher",
    "GroupedBatchSampler",
    "aspect_ratio_groups",
    "check_coco",
    "coco_evaluate",
    "collate_detection",
    "instance_fields",
    "make_synthetic_coco",
    "move_to_device",
    "prefetch_to_device",
]
__dir__ = public_dir(__name__, __all__)

_DEPRECATED = {"CocoDetection": ("CocoInstances", "0.3")}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
