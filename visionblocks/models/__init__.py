"""Reference models composed only from visionblocks blocks.

- `FPN`: feature pyramid neck (``NECKS``: ``fpn``).
- `FCOSHead`: anchor-free detection head (``HEADS``: ``fcos``); `YOLOv8Head`: YOLOv8's DFL
  and task-aligned head (``HEADS``: ``yolov8``); `Detector` and
  `build_detector` (``MODELS``: ``detector``) put backbone, neck and head together.
- `postprocess_detections`, `decode_ltrb`: box decoding and NMS.
- `FPNSegHead` (``HEADS``: ``fpn_seg``), `Segmenter` and `build_segmenter` (``MODELS``:
  ``segmenter``): semantic segmentation.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.models.detector import Detector, build_detector
from visionblocks.models.fcos import FCOSHead
from visionblocks.models.fpn import FPN
from visionblocks.models.postprocess import decode_ltrb, postprocess_detections
from visionblocks.models.segmenter import FPNSegHead, Segmenter, build_segmenter
from visionblocks.models.yolov8_head import YOLOv8Head

__all__ = [
    "FPN",
    "Detector",
    "FCOSHead",
    "FPNSegHead",
    "Segmenter",
    "YOLOv8Head",
    "build_detector",
    "build_segmenter",
    "decode_ltrb",
    "postprocess_detections",
]
__dir__ = public_dir(__name__, __all__)
