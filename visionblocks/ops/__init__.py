"""Functional tensor ops: boxes and IoUs, NMS (greedy, soft, matrix), detection priors and
box coders, affine warping (with key points and their left/right pairs), key point
similarity (OKS), instance masks (paste, crop, IoU, boxes), deformable convolution and
unfold-based local ops.

The box losses live in `visionblocks.losses`; ``generalized_box_iou_loss``,
``distance_box_iou_loss``, ``complete_box_iou_loss`` and ``rotated_box_iou_loss`` are served
here too, where torchvision users look for them (imported on first use).

Ops know nothing of ``nn``: tensors in, tensors out (`AnchorGenerator`, the drop-in for
torchvision's module in its detection models, is the one module). Box convention: ``"xyxy"`` corners unless
a ``fmt`` says otherwise (see `visionblocks.ops.boxes`); rotated boxes (IoU, loss, NMS:
`visionblocks.ops.rotated`) are torchvision's ``"cxcywhr"`` unless a ``fmt`` says otherwise.

``local_filter`` is a deprecated alias of `local_filter2d`, ``warp_sample`` of
`visionblocks.transforms.warp_sample` (both removed in 0.3).
"""

import importlib
from typing import Any

from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.namespace import public_dir
from visionblocks.ops.assign import (
    BELOW_LOW_THRESHOLD,
    BETWEEN_THRESHOLDS,
    BestIoU,
    atss_assign,
    best_box_iou,
    match_anchors,
)
from visionblocks.ops.box_coders import (
    decode_deltas,
    decode_distances,
    encode_deltas,
    encode_distances,
)
from visionblocks.ops.boxes import (
    BOX_FORMATS,
    box_area,
    box_convert,
    box_iou,
    clip_boxes_to_image,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
    remove_small_boxes,
)
from visionblocks.ops.deform_conv import deform_conv2d
from visionblocks.ops.dynamic_soft_label import dynamic_soft_label_assign
from visionblocks.ops.hungarian import HungarianMatcher, hungarian_match
from visionblocks.ops.keypoints import flip_permutation, keypoint_flip_pairs
from visionblocks.ops.local import local_filter2d, sliding_windows
from visionblocks.ops.local_attention import local_attention2d
from visionblocks.ops.masks import crop_masks, mask_iou, masks_to_boxes, paste_masks
from visionblocks.ops.matrix_nms import matrix_nms
from visionblocks.ops.ms_deform_attn import ms_deform_attn
from visionblocks.ops.multiscale_roi_align import MultiScaleRoIAlign
from visionblocks.ops.nms import batched_nms, nms
from visionblocks.ops.oks import COCO_PERSON_SIGMAS, keypoint_oks
from visionblocks.ops.priors import AnchorGenerator, make_anchor_boxes, make_anchor_points
from visionblocks.ops.roi_align import (
    PSRoIAlign,
    PSRoIPool,
    RoIAlign,
    RoIPool,
    ps_roi_align,
    ps_roi_pool,
    roi_align,
    roi_pool,
)
from visionblocks.ops.rotated import batched_nms_rotated, nms_rotated, rotated_box_iou
from visionblocks.ops.rotated_roi_align import RotatedRoIAlign, rotated_roi_align
from visionblocks.ops.simota import DynamicKAssignment, simota_assign
from visionblocks.ops.soft_nms import batched_soft_nms, soft_nms
from visionblocks.ops.task_aligned import (
    TaskAlignedAssigner,
    TaskAlignedTargets,
    task_aligned_assign,
)
from visionblocks.ops.warp import (
    affine_matrix,
    compose_affine,
    invert_affine,
    matrix_to_theta,
    theta_to_matrix,
    warp_affine,
)
from visionblocks.ops.warp_targets import (
    warp_boxes,
    warp_keypoints,
    warp_masks,
    warp_points,
)

__all__ = [
    "BELOW_LOW_THRESHOLD",
    "BETWEEN_THRESHOLDS",
    "BOX_FORMATS",
    "COCO_PERSON_SIGMAS",
    "AnchorGenerator",
    "BestIoU",
    "DynamicKAssignment",
    "HungarianMatcher",
    "MultiScaleRoIAlign",
    "PSRoIAlign",
    "PSRoIPool",
    "RoIAlign",
    "RoIPool",
    "RotatedRoIAlign",
    "TaskAlignedAssigner",
    "TaskAlignedTargets",
    "affine_matrix",
    "atss_assign",
    "batched_nms",
    "batched_nms_rotated",
    "batched_soft_nms",
    "best_box_iou",
    "box_area",
    "box_convert",
    "box_iou",
    "clip_boxes_to_image",
    "complete_box_iou",
    "complete_box_iou_loss",
    "compose_affine",
    "crop_masks",
    "decode_deltas",
    "decode_distances",
    "deform_conv2d",
    "distance_box_iou",
    "distance_box_iou_loss",
    "dynamic_soft_label_assign",
    "encode_deltas",
    "encode_distances",
    "flip_permutation",
    "generalized_box_iou",
    "generalized_box_iou_loss",
    "hungarian_match",
    "invert_affine",
    "keypoint_flip_pairs",
    "keypoint_oks",
    "local_attention2d",
    "local_filter2d",
    "make_anchor_boxes",
    "make_anchor_points",
    "mask_iou",
    "masks_to_boxes",
    "match_anchors",
    "matrix_nms",
    "matrix_to_theta",
    "ms_deform_attn",
    "nms",
    "nms_rotated",
    "paste_masks",
    "ps_roi_align",
    "ps_roi_pool",
    "remove_small_boxes",
    "roi_align",
    "roi_pool",
    "rotated_box_iou",
    "rotated_box_iou_loss",
    "rotated_roi_align",
    "simota_assign",
    "sliding_windows",
    "soft_nms",
    "task_aligned_assign",
    "theta_to_matrix",
    "warp_affine",
    "warp_boxes",
    "warp_keypoints",
    "warp_masks",
    "warp_points",
]
__dir__ = public_dir(__name__, __all__)

_DEPRECATED = {
    "local_filter": ("local_filter2d", "0.3"),
    "warp_sample": ("visionblocks.transforms.warp_sample", "0.3"),
}
_SERVED = {
    "complete_box_iou_loss": "visionblocks.losses.iou",
    "distance_box_iou_loss": "visionblocks.losses.iou",
    "generalized_box_iou_loss": "visionblocks.losses.iou",
    "rotated_box_iou_loss": "visionblocks.losses.rotated_iou",
}
"""Names of this module's API defined a layer above (where torchvision has them in
``torchvision.ops``) → their module, imported by name on first use, as the registries do."""


def __getattr__(name: str) -> Any:
    if name in _SERVED:
        value = getattr(importlib.import_module(_SERVED[name]), name)
        globals()[name] = value
        return value
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
