"""Reading and checking a COCO annotation file, and the compact per-image index the dataset
wrappers use (private; see `visionblocks.data.coco`).

The JSON is validated once, at construction: every annotation must point at a known image
and category, ids must be unique, boxes must be four numbers. Errors name the file and the
offending ids. Boxes, labels, crowd flags and areas are then held per image as small NumPy
arrays, so ``__getitem__`` does no dictionary work; segmentations stay in the annotation
dicts and are decoded only when an item asks for masks.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from visionblocks.data._coco_checks import check_annotation, is_int, is_number

__all__ = ["ImageEntry", "build_index", "load_coco", "read_annotation_file"]

_SHOW = 5  # ids listed in an error message


def _listing(values: Sequence[Any]) -> str:
    shown = ", ".join(repr(v) for v in values[:_SHOW])
    return shown + (f" and {len(values) - _SHOW} more" if len(values) > _SHOW else "")


def read_annotation_file(path: Path) -> dict[str, Any]:
    """Parse and check a COCO annotation JSON; errors name the file and what is wrong.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: Not JSON, not a COCO dict, duplicate ids, annotations pointing at unknown
            images or categories, or malformed boxes.
    """
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotation file not found: '{path}'")
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"COCO annotation file '{path}' is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"COCO annotation file '{path}' holds a {type(data).__name__}, expected a dict with "
            "'images', 'annotations' and 'categories'"
        )
    for key in ("images", "categories"):
        if not isinstance(data.get(key), list):
            raise ValueError(f"COCO annotation file '{path}' has no '{key}' list")
    if not isinstance(data.setdefault("annotations", []), list):
        raise ValueError(f"COCO annotation file '{path}': 'annotations' must be a list")
    _check_ids(path, data)
    return data


def _check_ids(path: Path, data: Mapping[str, Any]) -> None:
    def ids(key: str, required: Sequence[str]) -> list[Any]:
        found = []
        for i, item in enumerate(data[key]):
            missing = [r for r in required if not isinstance(item, dict) or r not in item]
            if missing:
                raise ValueError(
                    f"COCO annotation file '{path}': {key}[{i}] lacks {missing} "
                    f"(got {str(item)[:120]})"
                )
            if not is_int(item["id"]):
                raise ValueError(
                    f"COCO annotation file '{path}': {key}[{i}] has id {item['id']!r}; ids must "
                    "be integers"
                )
            found.append(item["id"])
        duplicates = [i for i, n in Counter(found).items() if n > 1]
        if duplicates:
            raise ValueError(
                f"COCO annotation file '{path}': duplicate {key} ids {_listing(duplicates)}"
            )
        return found

    image_ids = set(ids("images", ("id", "file_name", "height", "width")))
    category_ids = set(ids("categories", ("id", "name")))
    ids("annotations", ("id", "image_id", "category_id", "bbox"))
    anns = data["annotations"]
    unknown_images = sorted({a["image_id"] for a in anns} - image_ids, key=repr)
    if unknown_images:
        raise ValueError(
            f"COCO annotation file '{path}': annotations point at image ids "
            f"{_listing(unknown_images)} that are not in 'images'"
        )
    unknown_categories = sorted({a["category_id"] for a in anns} - category_ids, key=repr)
    if unknown_categories:
        raise ValueError(
            f"COCO annotation file '{path}': annotations use category ids "
            f"{_listing(unknown_categories)} that are not in 'categories'"
        )
    sizes = {}
    for info in data["images"]:
        height, width = info["height"], info["width"]
        if not (is_int(height) and is_int(width) and height > 0 and width > 0):
            raise ValueError(
                f"COCO annotation file '{path}': image {info['id']!r} has height/width "
                f"{height!r}/{width!r}, expected positive integers"
            )
        sizes[info["id"]] = (height, width)
    for ann in anns:
        check_annotation(path, ann, *sizes[ann["image_id"]])


def load_coco(data: dict[str, Any]) -> Any:
    """A ``pycocotools.coco.COCO`` over already parsed ``data``, built without printing."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def safe_relative(file_name: Any) -> str | None:
    """``file_name`` normalised, or None when it is absolute or climbs out with ``..``."""
    if not isinstance(file_name, str) or not file_name:
        return None
    name = file_name.replace("\\", "/")
    if posixpath.isabs(name) or os.path.isabs(file_name) or (len(name) > 1 and name[1] == ":"):
        return None
    normal = posixpath.normpath(name)
    if normal == ".." or normal.startswith("../"):
        return None
    return normal


@dataclass
class ImageEntry:
    """One image of the index: its metadata and its annotations as arrays.

    ``boxes`` are XYXY clipped to the image (float32), ``category_ids`` int64, ``iscrowd``
    bool, ``area`` float32; ``ann_ids`` and ``segmentations`` (the annotations' own objects,
    not copies; ``None`` where absent) are lists in the same order.
    """

    image_id: int
    file_name: str
    height: int
    width: int
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    category_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    iscrowd: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    area: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    ann_ids: list[Any] = field(default_factory=list)
    segmentations: list[Any] = field(default_factory=list)


@dataclass
class IndexStats:
    """What building the index dropped, for the one warning the dataset gives."""

    degenerate: list[Any] = field(default_factory=list)  # annotation ids


def build_index(path: Path, data: Mapping[str, Any]) -> tuple[list[ImageEntry], IndexStats]:
    """Per-image entries in image-id order (as torchvision's ``CocoDetection``); degenerate
    boxes are left out.

    A box is degenerate when, clipped to the image, its width or height is not positive.

    Raises:
        ValueError: An image whose ``file_name`` is absolute or leads out of the image root,
            or whose ``height``/``width`` are not positive integers.
    """
    by_image: dict[Any, list[Mapping[str, Any]]] = {}
    for ann in data["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    stats = IndexStats()
    entries = []
    for info in sorted(data["images"], key=lambda i: i["id"]):
        file_name = info["file_name"]
        if not isinstance(file_name, str) or not file_name:
            raise ValueError(
                f"COCO annotation file '{path}': image {info['id']!r} has file_name "
                f"{file_name!r}, expected a non-empty string"
            )
        name = safe_relative(file_name)
        if name is None:
            raise ValueError(
                f"COCO annotation file '{path}': image {info['id']!r} has file_name "
                f"{file_name!r}, which is absolute or leads out of the image root; "
                "file names must be relative to the root"
            )
        entry = ImageEntry(info["id"], name, info["height"], info["width"])
        anns = by_image.get(info["id"], [])
        if anns:
            _fill(entry, anns, stats)
        entries.append(entry)
    return entries, stats


def _fill(entry: ImageEntry, anns: list[Mapping[str, Any]], stats: IndexStats) -> None:
    xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float64)
    boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    np.clip(boxes[:, 0::2], 0, entry.width, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0, entry.height, out=boxes[:, 1::2])
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    if not keep.all():
        stats.degenerate.extend(a["id"] for a, k in zip(anns, keep) if not k)
    kept = [a for a, k in zip(anns, keep) if k]
    entry.boxes = boxes[keep].astype(np.float32)
    entry.category_ids = np.asarray([a["category_id"] for a in kept], dtype=np.int64)
    entry.iscrowd = np.asarray([a.get("iscrowd", 0) == 1 for a in kept], dtype=bool)
    areas = [a.get("area") for a in kept]
    box_areas = (entry.boxes[:, 2] - entry.boxes[:, 0]) * (entry.boxes[:, 3] - entry.boxes[:, 1])
    entry.area = np.asarray(
        [a if is_number(a) else b for a, b in zip(areas, box_areas)], dtype=np.float32
    )
    entry.ann_ids = [a["id"] for a in kept]
    entry.segmentations = [a.get("segmentation") for a in kept]
