"""Checks and preparation of detection training targets (private; the contract is
`visionblocks.models.detector.training_targets`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.tensor_checks import check_device

__all__ = ["CheckedTargets", "prepare_targets"]

_XYXY_HINT = (
    "boxes must be XYXY (x1, y1, x2, y2) in pixels with x2 > x1 and y2 > y1. COCO-style "
    '[x, y, w, h] boxes must be converted first (torchvision.ops.box_convert(boxes, "xywh", '
    '"xyxy")); zero-size boxes cover no location, so they are rejected rather than silently '
    "ignored: drop them beforehand (visionblocks.data.CocoInstances does by default; after transforms that crop, "
    "use torchvision.transforms.v2.SanitizeBoundingBoxes)"
)


class CheckedTargets(list):
    """What `prepare_targets` returns: passed on (detector to head), it is not checked twice."""

    num_classes: int | None = None


def _path(i: int, key: str) -> str:
    return f'targets[{i}]["{key}"]'


def _check_list(targets: Any, batch_size: int | None) -> None:
    if isinstance(targets, (str, bytes, Mapping)) or not isinstance(targets, Sequence):
        raise TypeError(
            f"targets must be a list of dicts (one per image), got {type(targets).__name__}"
        )
    if batch_size is not None and len(targets) != batch_size:
        raise ValueError(
            f"targets must hold one dict per image: images has {batch_size} images but "
            f"targets has {len(targets)} entries"
        )
    for i, target in enumerate(targets):
        if not isinstance(target, Mapping):
            raise TypeError(
                f'targets[{i}] must be a dict with "boxes" and "labels", got '
                f"{type(target).__name__}"
            )
        missing = [key for key in ("boxes", "labels") if key not in target]
        if missing:
            raise ValueError(
                f"targets[{i}] has no {' or '.join(repr(k) for k in missing)}: a target needs "
                '"boxes" (Tensor[N, 4], XYXY) and "labels" (Tensor[N], integer classes)'
            )


def _check_boxes(name: str, boxes: Any, device: torch.device | None) -> Tensor:
    if not isinstance(boxes, Tensor):
        raise TypeError(
            f"{name} must be a floating-point Tensor[N, 4] (x1, y1, x2, y2), got "
            f"{type(boxes).__name__}"
        )
    if not boxes.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (pixel coordinates), got {boxes.dtype}"
        )
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(
            f"{name} must have shape (N, 4) (x1, y1, x2, y2), got {tuple(boxes.shape)}"
        )
    if device is not None:
        check_device(name, boxes, device, "the images")
    return boxes


def _check_per_box(name: str, value: Any, boxes_name: str, n: int, device: torch.device,
                   what: str, allow_bool: bool) -> Tensor:  # fmt: skip
    """``labels`` / ``iscrowd``: an integer (or bool) 1-D tensor with one entry per box."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor[N] of {what}, got {type(value).__name__}")
    bad_dtype = value.is_floating_point() or value.is_complex()
    if bad_dtype or (value.dtype == torch.bool and not allow_bool):
        raise TypeError(
            f"{name} must be an integer tensor of {what}, got {value.dtype} (floats would be "
            "truncated)"
        )
    if value.dim() != 1:
        raise ValueError(
            f"{name} must have shape (N,), one entry per box, got {tuple(value.shape)}"
        )
    if value.shape[0] != n:
        raise ValueError(
            f"{name} has {value.shape[0]} entries but {boxes_name} has {n} rows (one per box)"
        )
    check_device(name, value, device, "the images")
    return value


def _to_xyxy(boxes: Tensor) -> Tensor:
    """Plain XYXY boxes (``tv_tensors.BoundingBoxes`` in another format converted)."""
    fmt = getattr(boxes, "format", None)
    boxes = boxes.as_subclass(Tensor)
    if fmt is not None and getattr(fmt, "name", fmt) != "XYXY":
        from torchvision.ops import box_convert

        boxes = box_convert(boxes, getattr(fmt, "name", str(fmt)).lower(), "xyxy")
    return boxes


def _bad_boxes(boxes: Tensor) -> Tensor:
    finite = torch.isfinite(boxes).all(dim=1)
    return ~(finite & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]))


def _bad_labels(labels: Tensor, num_classes: int | None) -> Tensor:
    bad = labels < 0
    return bad if num_classes is None else bad | (labels >= num_classes)


def _bad_crowd(crowd: Tensor) -> Tensor:
    return (crowd != 0) & (crowd != 1)


def _allowed(num_classes: int | None) -> str:
    return "[0, inf)" if num_classes is None else f"[0, {num_classes})"


def _check_values(
    items: list[tuple[Tensor, Tensor, Tensor | None]], num_classes: int | None
) -> None:
    """One reduction over the batch; on CPU, the culprit is then found and named."""
    boxes = [b for b, _, _ in items if b.numel()]
    on_host = bool(boxes) and reads_values(*boxes)
    if not boxes or not (on_host or asserts_on_device(*boxes)):
        return
    flags = [
        _bad_boxes(torch.cat(boxes)).any(),
        _bad_labels(torch.cat([label for _, label, _ in items]), num_classes).any(),
    ]
    crowds = [c for _, _, c in items if c is not None]
    if crowds:
        flags.append(_bad_crowd(torch.cat(crowds)).any())
    bad = torch.stack(flags).any()
    if not on_host:  # CUDA: no host sync, so the message cannot name the row
        rule = f"targets: labels in {_allowed(num_classes)}, iscrowd 0 or 1; {_XYXY_HINT}"
        assert_on_device(~bad, rule)
        return
    if not bool(bad):
        return
    for i, (b, label, crowd) in enumerate(items):
        rows = torch.nonzero(_bad_boxes(b)).flatten().tolist()
        if rows:
            j = rows[0]
            raise ValueError(
                f"{_path(i, 'boxes')}[{j}] = {b[j].tolist()} ({len(rows)} bad rows in this "
                f"image): {_XYXY_HINT}"
            )
        wrong = torch.nonzero(_bad_labels(label, num_classes)).flatten().tolist()
        if wrong:
            raise ValueError(
                f"{_path(i, 'labels')} must lie in {_allowed(num_classes)} (class indices, no "
                f"background class), got {label[wrong[0]].item()} at index {wrong[0]}"
            )
        if crowd is not None and bool(_bad_crowd(crowd).any()):
            raise ValueError(f"{_path(i, 'iscrowd')} must hold 0 or 1, got {crowd.tolist()}")


def prepare_targets(
    targets: Any,
    *,
    batch_size: int | None = None,
    num_classes: int | None = None,
    device: torch.device | None = None,
) -> list[dict[str, Tensor]]:
    """`visionblocks.models.detector.training_targets`, every tensor on ``device`` (default:
    the first target's boxes' device)."""
    if isinstance(targets, CheckedTargets) and (
        num_classes is None or targets.num_classes == num_classes
    ):
        _check_list(targets, batch_size)
        for i, target in enumerate(targets):
            if device is not None:
                check_device(_path(i, "boxes"), target["boxes"], device, "the images")
        return targets
    _check_list(targets, batch_size)
    items: list[tuple[Tensor, Tensor, Tensor | None]] = []
    for i, target in enumerate(targets):
        boxes = _check_boxes(_path(i, "boxes"), target["boxes"], device)
        device = boxes.device if device is None else device
        n = boxes.shape[0]
        labels = _check_per_box(_path(i, "labels"), target["labels"], _path(i, "boxes"), n,
                                device, "class indices", allow_bool=False)  # fmt: skip
        crowd = target.get("iscrowd")
        if crowd is not None:
            crowd = _check_per_box(_path(i, "iscrowd"), crowd, _path(i, "boxes"), n, device,
                                   "crowd flags (0 or 1)", allow_bool=True)  # fmt: skip
        items.append((_to_xyxy(boxes), labels.as_subclass(Tensor), crowd))
    _check_values(items, num_classes)
    out = CheckedTargets()
    out.num_classes = num_classes
    for boxes, labels, crowd in items:
        if crowd is not None and bool(crowd.any()):
            keep = crowd == 0
            boxes, labels = boxes[keep], labels[keep]
        out.append({"boxes": boxes, "labels": labels})
    return out
