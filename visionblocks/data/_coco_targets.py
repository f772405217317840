"""Per-instance rows of a `CocoInstances` target through transforms (private; see
`visionblocks.data.coco`): the ``SanitizeBoundingBoxes`` getter, the alignment checks, and
moving crowd rows to ``ignore_boxes``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "INSTANCE_KEYS",
    "KEYPOINT_KEYS",
    "check_instances",
    "check_polygons_followed",
    "instance_fields",
    "split_crowd",
]

INSTANCE_KEYS = ("labels", "iscrowd", "area")
"""Per-instance tensors of a `CocoInstances` target besides ``boxes`` and ``masks``."""

KEYPOINT_KEYS = ("keypoints", "keypoints_visibility")
"""Per-instance tensors of a `visionblocks.data.CocoKeypoints` target besides those."""


def instance_fields(*inputs: Any) -> tuple[Tensor, ...]:
    """``labels_getter`` for ``torchvision.transforms.v2.SanitizeBoundingBoxes``: every
    per-instance tensor of a `CocoInstances` or `visionblocks.data.CocoKeypoints` target
    (``labels``, ``iscrowd``, ``area``, ``keypoints``, ``keypoints_visibility``: those
    present), where torchvision's default getter filters only ``labels``.

    ``keypoints`` come back from ``SanitizeBoundingBoxes`` as a plain tensor (re-wrapped by
    `visionblocks.data.CocoKeypoints`), so put it last; ``polygons`` cannot be filtered here.

    Examples:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> sanitize = v2.SanitizeBoundingBoxes(labels_getter=instance_fields)
        >>> target = {"labels": torch.tensor([1]), "iscrowd": torch.tensor([0]), "area": torch.tensor([4.0])}
        >>> [t.tolist() for t in instance_fields(torch.zeros(3, 2, 2), target)]
        [[1], [0], [4.0]]
        >>> target["keypoints_visibility"] = torch.tensor([[2, 0]])
        >>> [t.tolist() for t in instance_fields(torch.zeros(3, 2, 2), target)][-1]
        [[2, 0]]
    """
    target = next((x for x in inputs if isinstance(x, dict)), None)
    if target is None and len(inputs) == 1 and isinstance(inputs[0], (tuple, list)):
        target = next((x for x in inputs[0] if isinstance(x, dict)), None)
    if target is None:
        raise ValueError("instance_fields: no target dict among the transform's inputs")
    keys = (*INSTANCE_KEYS, *KEYPOINT_KEYS)
    return tuple(target[k] for k in keys if isinstance(target.get(k), Tensor))


def check_instances(target: dict[str, Any], image_id: Any) -> None:
    """Raise if transforms left per-instance tensors (or the ``polygons`` list) with another
    length than ``boxes``."""
    boxes = target.get("boxes")
    if not isinstance(boxes, Tensor):
        return
    n = boxes.shape[0]
    wrong = {
        k: int(v.shape[0])
        for k in (*INSTANCE_KEYS, *KEYPOINT_KEYS, "masks")
        if isinstance(v := target.get(k), Tensor) and v.dim() > 0 and v.shape[0] != n
    }
    polygons = target.get("polygons")
    if isinstance(polygons, (list, tuple)) and len(polygons) != n:
        raise ValueError(
            f"after the transforms, image id {image_id!r} has {n} boxes but {len(polygons)} "
            "entries in 'polygons': a transform removed boxes without their polygons "
            "(torchvision's SanitizeBoundingBoxes cannot filter a list). Warp with "
            "visionblocks.transforms (RandomAffine, warp_sample), which filters them, or leave "
            "with_polygons=False"
        )
    if wrong:
        raise ValueError(
            f"after the transforms, image id {image_id!r} has {n} boxes but {wrong}: a transform "
            "removed boxes without these rows (torchvision's SanitizeBoundingBoxes filters only "
            "'labels' by default). Use v2.SanitizeBoundingBoxes("
            "labels_getter=visionblocks.data.instance_fields)"
        )


def check_polygons_followed(
    boxes: Tensor, polygons: list[list[Tensor]], target: dict[str, Any], image_id: Any
) -> None:
    """Raise if the transforms moved the boxes (``boxes``: before them) but left every
    polygon tensor as it was (v2 transforms pass plain tensors through)."""
    before = [p for instance in polygons for p in instance]
    after = target.get("polygons")
    if not before or not isinstance(after, (list, tuple)):
        return
    now = target.get("boxes")
    if not isinstance(now, Tensor) or (
        now.shape == boxes.shape and torch.equal(now.as_subclass(Tensor), boxes.as_subclass(Tensor))
    ):
        return  # the boxes did not move (a photometric transform): neither need the polygons
    kept = {id(p) for instance in after if isinstance(instance, (list, tuple)) for p in instance}
    if all(id(p) in kept for p in before):
        raise ValueError(
            f"after the transforms, the boxes of image id {image_id!r} moved but "
            "target['polygons'] did not: torchvision's v2 transforms leave plain tensors as "
            "they are, so the polygons would describe the image before them. Warp with "
            "visionblocks.transforms (RandomAffine, warp_sample), which moves the polygons with the "
            "boxes, or leave "
            "with_polygons=False"
        )


def split_crowd(target: dict[str, Any]) -> dict[str, Any]:
    """Move the ``iscrowd == 1`` rows of a target into ``ignore_boxes`` (the other
    per-instance rows of the crowd instances, ``polygons`` included, are dropped)."""
    from torchvision import tv_tensors

    crowd = target["iscrowd"].bool()
    out = dict(target)
    for key in ("boxes", "masks", *INSTANCE_KEYS, *KEYPOINT_KEYS):
        value = target.get(key)
        if isinstance(value, Tensor):
            kept = value.as_subclass(Tensor)[~crowd]
            out[key] = (
                tv_tensors.wrap(kept, like=value)
                if isinstance(value, tv_tensors.TVTensor)
                else kept
            )
    polygons = target.get("polygons")
    if isinstance(polygons, (list, tuple)):
        out["polygons"] = [p for p, c in zip(polygons, crowd.tolist()) if not c]
    boxes = target["boxes"]
    out["ignore_boxes"] = tv_tensors.wrap(boxes.as_subclass(Tensor)[crowd], like=boxes)
    return out
