"""Checks of single COCO annotations, run once when a dataset is built (private).

A malformed annotation must fail at construction with its id in the message, not deep in
pycocotools in a ``DataLoader`` worker (a NaN polygon coordinate can even crash the
process there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["check_annotation", "is_int", "is_number"]

_COORD_MARGIN = 2.0  # polygon coordinates may reach this many image sizes outside the image


def is_number(value: Any) -> bool:
    """A real, finite or not, that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(values: Any) -> bool:
    return all(is_number(v) and math.isfinite(v) for v in values)


def check_annotation(path: Path, ann: Mapping[str, Any], height: int, width: int) -> None:
    """Raise ``ValueError`` naming the file and annotation for anything malformed.

    Checks: ``bbox`` four finite numbers; ``iscrowd`` 0/1 when present; ``area`` a finite,
    non-negative number when present; ``segmentation`` (when present and not empty) a list
    of polygons of at least 3 points with finite coordinates near the image (pycocotools
    crashes, or reads garbage, otherwise), or an RLE of the image's size whose counts are
    valid.
    """
    where = f"COCO annotation file '{path}': annotation {ann['id']!r}"
    box = ann["bbox"]
    if not (isinstance(box, list) and len(box) == 4 and _finite(box)):
        raise ValueError(f"{where} has bbox {box!r}, expected [x, y, width, height] (finite)")
    crowd = ann.get("iscrowd", 0)
    if crowd not in (0, 1) or not is_number(crowd):
        raise ValueError(f"{where} has iscrowd {crowd!r}, expected 0 or 1")
    area = ann.get("area")
    if area is not None and not (is_number(area) and math.isfinite(area) and area >= 0):
        raise ValueError(f"{where} has area {area!r}, expected a finite number >= 0")
    seg = ann.get("segmentation")
    if not seg:
        return
    if isinstance(seg, list):
        _check_polygons(where, seg, height, width)
    elif isinstance(seg, dict):
        _check_rle(where, seg, height, width)
    else:
        raise ValueError(
            f"{where} has a segmentation of type {type(seg).__name__}; expected a list of "
            "polygons or an RLE dict"
        )


def _check_polygons(where: str, polygons: list[Any], height: int, width: int) -> None:
    low = -_COORD_MARGIN * max(height, width)
    high = (1 + _COORD_MARGIN) * max(height, width)
    for i, polygon in enumerate(polygons):
        ok = isinstance(polygon, list) and len(polygon) >= 6 and len(polygon) % 2 == 0
        if not ok or not _finite(polygon):
            raise ValueError(
                f"{where}: segmentation polygon {i} must be a flat list [x1, y1, x2, y2, ...] "
                f"of at least 3 points (finite numbers), got {str(polygon)[:80]}"
            )
        if min(polygon) < low or max(polygon) > high:
            raise ValueError(
                f"{where}: segmentation polygon {i} has coordinates in "
                f"[{min(polygon):g}, {max(polygon):g}], far outside the {height} x {width} image"
            )


def _check_rle(where: str, rle: Mapping[str, Any], height: int, width: int) -> None:
    size, counts = rle.get("size"), rle.get("counts")
    if not isinstance(size, list) or [v for v in size] != [height, width]:
        raise ValueError(
            f"{where}: RLE segmentation has size {size!r}, but the image is {height} x {width}"
        )
    if isinstance(counts, list):
        if not all(is_int(c) and c >= 0 for c in counts) or sum(counts) != height * width:
            raise ValueError(
                f"{where}: uncompressed RLE counts must be non-negative ints summing to "
                f"height * width = {height * width}, got {len(counts)} counts summing to "
                f"{sum(c for c in counts if is_number(c))}"
            )
        return
    if not isinstance(counts, (str, bytes)):
        raise ValueError(f"{where}: RLE counts must be a list of ints or a string, got {counts!r}")
    runs = _compressed_counts(counts)
    if runs is None or any(c < 0 for c in runs) or sum(runs) != height * width:
        raise ValueError(
            f"{where}: compressed RLE counts do not decode to {height} x {width} pixels "
            f"(pycocotools would decode garbage): {str(counts)[:40]}"
        )


def _compressed_counts(counts: str | bytes) -> list[int] | None:
    """The run lengths of COCO's compressed RLE string (LEB128-like, 5 bits a character,
    runs from the third on stored as differences), or None if the string is malformed."""
    data = counts.encode("latin-1") if isinstance(counts, str) else counts
    runs: list[int] = []
    p = 0
    while p < len(data):
        value, shift, more = 0, 0, True
        while more:
            if p >= len(data):
                return None
            c = data[p] - 48
            if not 0 <= c < 64:
                return None
            value |= (c & 0x1F) << shift
            more = bool(c & 0x20)
            p += 1
            shift += 5
            if not more and c & 0x10:
                value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        runs.append(value)
    return runs
