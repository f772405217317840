"""Reading a COCO annotation file, sorting out its invalid annotations, and the compact
per-image index the dataset wrappers use (private; see `visionblocks.data.coco`).

A malformed **file** is never guessed around: `file_problems` lists every problem and
`read_annotation_file` raises the first. An invalid **annotation** follows the dataset's
policy in `clean_annotations`. Boxes, labels, crowd flags and areas are then held per image
as NumPy arrays; segmentations are decoded only when an item asks for masks.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import posixpath
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from visionblocks.data._coco_checks import (
    REPAIRABLE,
    Invalid,
    annotation_problem,
    is_int,
    repair,
)

__all__ = [
    "CleanStats",
    "ImageEntry",
    "build_index",
    "clean_annotations",
    "file_problems",
    "image_file_name",
    "listing",
    "load_coco",
    "orphan_annotations",
    "parse_annotation_file",
    "read_annotation_file",
    "valid_ids",
]

InvalidPolicy = Literal["drop", "raise", "keep"]

_SHOW = 5  # ids listed in a message


def listing(values: Sequence[Any], show: int = _SHOW) -> str:
    """``1, 2, 3 and 4 more``: the first ``show`` values and how many others."""
    shown = ", ".join(repr(v) for v in values[:show])
    return shown + (f" and {len(values) - show} more" if len(values) > show else "")


def parse_annotation_file(path: Path) -> dict[str, Any]:
    """The JSON object of ``path`` (``ValueError`` for anything else)."""
    if not path.is_file():
        raise FileNotFoundError(f"ann_file: COCO annotation file not found: '{path}'")
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
    return data


def read_annotation_file(path: Path) -> dict[str, Any]:
    """Parse ``path`` and raise the first of its `file_problems` (with how many follow)."""
    data = parse_annotation_file(path)
    problems = file_problems(path, data)
    if problems:
        more = (
            f" (and {len(problems) - 1} more problem(s) with the file: "
            f"`visionblocks check-coco '{path}'` lists them all)"
            if len(problems) > 1
            else ""
        )
        raise ValueError(problems[0] + more)
    return data


def check_min_box_size(value: Any) -> float:
    """``min_box_size`` as a float; a clear error unless it is a finite number >= 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"min_box_size must be a number, got {type(value).__name__} ({value!r})")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"min_box_size must be a finite number >= 0, got {value!r}")
    return float(value)


def image_file_name(info: Mapping[str, Any]) -> Any:
    """The image's ``file_name``; for LVIS files, which have only ``coco_url``, its last two
    parts (``train2017/000000391895.jpg``, relative to the COCO images folder)."""
    if "file_name" in info or not isinstance(info.get("coco_url"), str):
        return info.get("file_name")
    return "/".join(info["coco_url"].rstrip("/").split("/")[-2:])


def _key(value: Any) -> Any:
    return value if isinstance(value, Hashable) else repr(value)


def file_problems(path: Path, data: Mapping[str, Any]) -> list[str]:
    """Every structural problem of a parsed COCO file, each naming the file and the field
    (not the annotation-level ones: the ``invalid`` policy handles those)."""
    where = f"COCO annotation file '{path}'"
    missing = [key for key in ("images", "annotations", "categories") if key not in data]
    if missing:
        return [f"{where} has no {' / '.join(repr(k) for k in missing)} list"]
    wrong = [k for k in ("images", "annotations", "categories") if not isinstance(data[k], list)]
    if wrong:
        return [f"{where}: '{k}' must be a list, got {type(data[k]).__name__}" for k in wrong]
    problems: list[str] = []
    image_ids = _ids(where, data, "images", ("id", "height", "width"), problems)
    _ids(where, data, "categories", ("id", "name"), problems)
    _ids(where, data, "annotations", ("id", "image_id", "category_id"), problems)
    orphans = orphan_annotations(data, image_ids)
    if orphans:
        unknown = sorted({_key(a["image_id"]) for a in orphans}, key=repr)
        problems.append(
            f"{where}: {len(orphans)} annotation(s) point at image ids {listing(unknown)} "
            "that are not in 'images'"
        )
    for info in data["images"]:
        if not isinstance(info, dict) or "id" not in info:
            continue
        height, width = info.get("height"), info.get("width")
        sized = "height" in info and "width" in info  # a missing one is reported already
        if sized and not (is_int(height) and is_int(width) and height > 0 and width > 0):
            problems.append(
                f"{where}: image {info['id']!r} has height/width {height!r}/{width!r}, "
                "expected positive integers"
            )
        name = image_file_name(info)
        if name is None:
            continue  # reported as a missing field
        if not isinstance(name, str) or not name:
            problems.append(
                f"{where}: image {info['id']!r} has file_name {name!r}, expected a non-empty string"
            )
        elif safe_relative(name) is None:
            problems.append(
                f"{where}: image {info['id']!r} has file_name {name!r}, which is absolute or "
                "leads out of the image root; file names must be relative to the root"
            )
    return problems


def orphan_annotations(data: Mapping[str, Any], image_ids: set[Any]) -> list[dict[str, Any]]:
    """The annotations whose ``image_id`` is not among ``image_ids``."""
    return [
        a
        for a in data["annotations"]
        if isinstance(a, dict) and "image_id" in a and _key(a["image_id"]) not in image_ids
    ]


def valid_ids(data: Mapping[str, Any], key: str) -> set[Any]:
    """The integer ids of ``data[key]`` (entries without one left out)."""
    return {i["id"] for i in data[key] if isinstance(i, dict) and is_int(i.get("id"))}


def _ids(
    where: str, data: Mapping[str, Any], key: str, required: Sequence[str], problems: list[str]
) -> set[Any]:
    """The ids of ``data[key]``; missing fields, non-integer and duplicate ids are problems."""
    found = []
    for i, item in enumerate(data[key]):
        missing = [r for r in required if not isinstance(item, dict) or r not in item]
        if key == "images" and isinstance(item, dict) and image_file_name(item) is None:
            missing.append("file_name")
        if missing:
            problems.append(f"{where}: {key}[{i}] lacks {missing} (got {str(item)[:120]})")
            if not isinstance(item, dict) or "id" not in item:
                continue
        if not is_int(item["id"]):
            problems.append(f"{where}: {key}[{i}] has id {item['id']!r}; ids must be integers")
            continue
        found.append(item["id"])
    duplicates = [i for i, n in Counter(found).items() if n > 1]
    if duplicates:
        problems.append(f"{where}: duplicate {key} ids {listing(duplicates)}")
    return set(found)


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
class CleanStats:
    """What `clean_annotations` did: ``{reason: [annotation ids]}`` dropped and kept."""

    total: int = 0
    dropped: dict[str, list[Any]] = field(default_factory=dict)
    kept_invalid: dict[str, list[Any]] = field(default_factory=dict)


def clean_annotations(
    path: Path,
    data: dict[str, Any],
    *,
    invalid: InvalidPolicy = "drop",
    min_box_size: float = 0.0,
    need_segmentation: bool = False,
    keypoint_counts: Mapping[Any, int] | None = None,
) -> CleanStats:
    """Apply the ``invalid`` policy to every annotation of ``data`` (in place; ``data`` has
    passed `file_problems`).

    ``data["annotations"]`` becomes what the dataset serves: invalid annotations dropped (or
    repaired, `visionblocks.data._coco_checks.repair`), missing ``iscrowd`` (0), ``area``
    (the segmentation's, else the clipped box's) and, for the ``keypoint_counts``
    categories, ``keypoints`` (none labelled) and ``num_keypoints`` filled in.
    """
    sizes = {info["id"]: (info["height"], info["width"]) for info in data["images"]}
    category_ids = frozenset(c["id"] for c in data["categories"])
    stats = CleanStats(total=len(data["annotations"]))
    kept: list[dict[str, Any]] = []
    missing_area: list[dict[str, Any]] = []

    prefix = f"COCO annotation file '{path}': annotation "

    def problem_of(ann: dict[str, Any], need_segmentation: bool) -> Invalid | None:
        return annotation_problem(
            prefix + repr(ann["id"]),
            ann,
            *sizes[ann["image_id"]],
            category_ids,
            min_box_size=min_box_size,
            need_segmentation=need_segmentation,
            keypoint_counts=keypoint_counts,
        )

    for ann in data["annotations"]:
        problem = problem_of(ann, need_segmentation)
        if problem is not None:
            if invalid == "raise" and problem.reason != "small_box":
                raise ValueError(problem.message)
            if invalid != "keep" or problem.reason not in REPAIRABLE:
                stats.dropped.setdefault(problem.reason, []).append(ann["id"])
                continue
            # keep: leave out what is wrong (the area, the segmentation or the key points),
            # then look again (an annotation can have several wrong); an empty mask is what
            # "keep" asks for.
            while problem is not None:
                stats.kept_invalid.setdefault(problem.reason, []).append(ann["id"])
                repair(ann, problem.reason, keypoint_counts)
                problem = problem_of(ann, False)
        if "iscrowd" not in ann:
            ann["iscrowd"] = 0
        if "area" not in ann:
            missing_area.append(ann)
        if keypoint_counts is not None and ann["category_id"] in keypoint_counts:
            if "keypoints" not in ann:
                ann["keypoints"] = [0] * (3 * keypoint_counts[ann["category_id"]])
            if "num_keypoints" not in ann:
                ann["num_keypoints"] = sum(v > 0 for v in ann["keypoints"][2::3])
        kept.append(ann)
    if missing_area:
        _fill_areas(missing_area, sizes)
    data["annotations"] = kept
    return stats


def _fill_areas(anns: list[dict[str, Any]], sizes: Mapping[Any, tuple[int, int]]) -> None:
    from pycocotools import mask as mask_utils

    from visionblocks.data._coco_io import rles_of

    for ann in anns:
        seg = ann.get("segmentation")
        if seg:
            rle = rles_of([seg], *sizes[ann["image_id"]])[0]
            ann["area"] = float(mask_utils.area(rle))
        else:  # the box as the dataset serves it: clipped to the image
            height, width = sizes[ann["image_id"]]
            x, y, w, h = ann["bbox"]
            ann["area"] = float((min(x + w, width) - max(x, 0)) * (min(y + h, height) - max(y, 0)))


@dataclass
class ImageEntry:
    """One image of the index: its metadata and its annotations as arrays (``boxes`` XYXY
    clipped to the image; with key points, ``keypoints`` ``(n, K, 2)`` and ``visibility``
    ``(n, K)``)."""

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
    keypoints: np.ndarray | None = None
    visibility: np.ndarray | None = None


def build_index(
    data: Mapping[str, Any], keypoint_counts: Mapping[Any, int] | None = None
) -> list[ImageEntry]:
    """Per-image entries in image-id order of a file that passed `file_problems` and
    `clean_annotations` (with the same ``keypoint_counts``)."""
    k = next(iter(keypoint_counts.values()), 0) if keypoint_counts is not None else None
    by_image: dict[Any, list[Mapping[str, Any]]] = {}
    for ann in data["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    entries = []
    for info in sorted(data["images"], key=lambda i: i["id"]):
        name = safe_relative(image_file_name(info))
        entry = ImageEntry(info["id"], name, info["height"], info["width"])
        anns = by_image.get(info["id"])
        if anns:
            _fill(entry, anns)
        if k is not None:
            _fill_keypoints(entry, anns or [], keypoint_counts or {}, k)
        entries.append(entry)
    return entries


def _fill(entry: ImageEntry, anns: list[Mapping[str, Any]]) -> None:
    xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float64)
    boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    np.clip(boxes[:, 0::2], 0, entry.width, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0, entry.height, out=boxes[:, 1::2])
    entry.boxes = boxes.astype(np.float32)
    entry.category_ids = np.asarray([a["category_id"] for a in anns], dtype=np.int64)
    entry.iscrowd = np.asarray([a["iscrowd"] == 1 for a in anns], dtype=bool)
    entry.area = np.asarray([a["area"] for a in anns], dtype=np.float32)
    entry.ann_ids = [a["id"] for a in anns]
    entry.segmentations = [a.get("segmentation") for a in anns]


def _fill_keypoints(
    entry: ImageEntry, anns: list[Mapping[str, Any]], keypoint_counts: Mapping[Any, int], k: int
) -> None:
    unlabelled = [0] * (3 * k)
    values = [a["keypoints"] if a["category_id"] in keypoint_counts else unlabelled for a in anns]
    points = np.asarray(values, dtype=np.float64).reshape(len(anns), k, 3)
    entry.keypoints = np.ascontiguousarray(points[..., :2], dtype=np.float32)
    entry.visibility = points[..., 2].astype(np.int64)
