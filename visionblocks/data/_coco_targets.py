"""Per-instance rows of a `CocoInstances` target through transforms (private; see
`visionblocks.data.coco`): the ``SanitizeBoundingBoxes`` getter, the alignment check, and
moving crowd rows to ``ignore_boxes``."""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["INSTANCE_KEYS", "check_instances", "instance_fields", "split_crowd"]

INSTANCE_KEYS = ("labels", "iscrowd", "area")
"""Per-instance tensors of a `CocoInstances` target besides ``boxes`` and ``masks``."""


def instance_fields(*inputs: Any) -> tuple[Tensor, ...]:
    """``labels_getter`` for ``torchvision.transforms.v2.SanitizeBoundingBoxes``: every
    per-instance tensor of a `CocoInstances` target (``labels``, ``iscrowd``, ``area``).

    torchvision's default getter filters only ``labels`` when boxes are removed, which
    would leave ``iscrowd`` and ``area`` longer than ``boxes`` (the dataset raises then).

    Examples:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> sanitize = v2.SanitizeBoundingBoxes(labels_getter=instance_fields)
        >>> target = {"labels": torch.tensor([1]), "iscrowd": torch.tensor([0]), "area": torch.tensor([4.0])}
        >>> [t.tolist() for t in instance_fields(torch.zeros(3, 2, 2), target)]
        [[1], [0], [4.0]]
    """
    target = next((x for x in inputs if isinstance(x, dict)), None)
    if target is None and len(inputs) == 1 and isinstance(inputs[0], (tuple, list)):
        target = next((x for x in inputs[0] if isinstance(x, dict)), None)
    if target is None:
        raise ValueError("instance_fields: no target dict among the transform's inputs")
    return tuple(target[k] for k in INSTANCE_KEYS if isinstance(target.get(k), Tensor))


def check_instances(target: dict[str, Any], image_id: Any) -> None:
    """Raise if transforms left per-instance tensors with another length than ``boxes``."""
    boxes = target.get("boxes")
    if not isinstance(boxes, Tensor):
        return
    n = boxes.shape[0]
    wrong = {
        k: int(v.shape[0])
        for k in (*INSTANCE_KEYS, "masks")
        if isinstance(v := target.get(k), Tensor) and v.dim() > 0 and v.shape[0] != n
    }
    if wrong:
        raise ValueError(
            f"after the transforms, image id {image_id!r} has {n} boxes but {wrong}: a transform "
            "removed boxes without these rows (torchvision's SanitizeBoundingBoxes filters only "
            "'labels' by default). Use v2.SanitizeBoundingBoxes("
            "labels_getter=visionblocks.data.instance_fields)"
        )


def split_crowd(target: dict[str, Any]) -> dict[str, Any]:
    """Move the ``iscrowd == 1`` rows of a target into ``ignore_boxes``."""
    from torchvision import tv_tensors

    crowd = target["iscrowd"].bool()
    out = dict(target)
    for key in ("boxes", "masks", *INSTANCE_KEYS):
        value = target.get(key)
        if isinstance(value, Tensor):
            kept = value.as_subclass(Tensor)[~crowd]
            out[key] = (
                tv_tensors.wrap(kept, like=value)
                if isinstance(value, tv_tensors.TVTensor)
                else kept
            )
    boxes = target["boxes"]
    out["ignore_boxes"] = tv_tensors.wrap(boxes.as_subclass(Tensor)[crowd], like=boxes)
    return out
