"""Checks of single COCO annotations, run once when a dataset is built (private): each gets
at most one verdict, an `Invalid` naming the first thing wrong with it, which the dataset's
``invalid`` policy then handles. Nothing malformed reaches pycocotools."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from visionblocks.data._coco_rle import rle_runs

__all__ = [
    "INVALID_REASONS",
    "KEYPOINT_REASONS",
    "REPAIRABLE",
    "Invalid",
    "KeypointSchema",
    "annotation_problem",
    "is_int",
    "is_number",
    "keypoint_schema",
    "repair",
]

INVALID_REASONS: dict[str, str] = {
    "bad_bbox": "bbox missing or not [x, y, width, height]",
    "nonfinite": "NaN or infinite coordinates",
    "unknown_category": "category_id not in 'categories'",
    "bad_iscrowd": "iscrowd other than 0 or 1",
    "degenerate_box": "box with zero or negative width or height",
    "box_outside_image": "box entirely outside the image",
    "small_box": "box narrower or lower than min_box_size",
    "bad_area": "area negative or not a number",
    "empty_segmentation": "no segmentation although masks are asked for",
    "short_polygon": "polygon with fewer than 3 points",
    "odd_polygon": "polygon with an odd number of coordinates",
    "bad_polygon": "polygon that is not a flat list of numbers",
    "polygon_outside_image": "polygon far outside the image",
    "bad_segmentation": "segmentation neither polygons nor an RLE dict",
    "rle_size": "RLE size disagrees with the image",
    "bad_rle": "RLE counts that do not decode to the image",
    "bad_keypoints": "keypoints not a flat list [x1, y1, v1, ...] of numbers",
    "keypoints_length": "keypoints list whose length is not 3 x the category's key points",
    "nonfinite_keypoints": "NaN or infinite key point coordinates",
    "bad_visibility": "key point visibility other than 0, 1 or 2",
    "num_keypoints_mismatch": "num_keypoints disagreeing with the labelled key points (v > 0)",
}
"""Why an annotation is invalid: reason -> description (the keys of ``dataset.dropped``)."""

KEYPOINT_REASONS = (
    "bad_keypoints",
    "keypoints_length",
    "nonfinite_keypoints",
    "bad_visibility",
    "num_keypoints_mismatch",
)
"""The reasons of `INVALID_REASONS` about key points (checked for keypoint categories only)."""

REPAIRABLE = frozenset({
    "bad_area", "empty_segmentation", "short_polygon", "odd_polygon", "bad_polygon",
    "polygon_outside_image", "bad_segmentation", "rle_size", "bad_rle", *KEYPOINT_REASONS,
})  # fmt: skip
"""Reasons under which ``invalid="keep"`` keeps the annotation (its box, label and crowd flag
are sound) without what is invalid (see `repair`); any other reason drops it."""

_FLAGS = frozenset({0, 1, 2})  # COCO's key point visibility flags
_COORD_MARGIN = 2.0  # polygon coordinates may reach this many image sizes outside the image


@dataclass(frozen=True)
class Invalid:
    """The first thing wrong with one annotation: a key of `INVALID_REASONS`, and the
    message ``invalid="raise"`` raises."""

    reason: str
    message: str


def is_number(value: Any) -> bool:
    """A real, finite or not, that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(values: Any) -> bool:
    return all(is_number(v) and math.isfinite(v) for v in values)


_NUMBER_TYPES = frozenset({int, float})


def _numbers(values: Any) -> bool:
    """``values`` is a list or tuple of real numbers, bools excluded."""
    if not isinstance(values, (list, tuple)):
        return False
    # set(map(type, ...)) runs at C speed; JSON gives exact ints and floats.
    return set(map(type, values)) <= _NUMBER_TYPES or all(map(is_number, values))


def _all_finite(values: list[Any] | tuple[Any, ...]) -> bool:
    """Every number of ``values`` is finite (their sum at C speed, exactly when that overflows)."""
    try:
        if math.isfinite(sum(values)):
            return True
    except OverflowError:
        pass
    return _finite(values)


def annotation_problem(
    where: str,
    ann: Mapping[str, Any],
    height: int,
    width: int,
    category_ids: set[Any] | frozenset[Any],
    *,
    min_box_size: float = 0.0,
    need_segmentation: bool = False,
    keypoint_counts: Mapping[Any, int] | None = None,
) -> Invalid | None:
    """The first problem of ``ann`` on an image of ``height`` x ``width``, or None.

    Problems of the box, category or crowd flag come before the `REPAIRABLE` ones, so
    ``invalid="keep"`` never keeps a wrong box. ``where`` starts every message.
    ``keypoint_counts`` (category id -> K) turns on the key point checks for those
    categories (an annotation without ``keypoints`` is not invalid).
    """
    box = ann.get("bbox")
    if not (isinstance(box, (list, tuple)) and len(box) == 4 and _numbers(box)):
        return Invalid("bad_bbox", f"{where} has bbox {box!r}, expected [x, y, width, height]")
    if not _all_finite(box):
        return Invalid("nonfinite", f"{where} has bbox {box!r}, expected finite numbers")
    category_id = ann["category_id"]
    if not is_int(category_id) or category_id not in category_ids:
        return Invalid(
            "unknown_category",
            f"{where} has category_id {category_id!r}, which is not in 'categories'",
        )
    crowd = ann.get("iscrowd", 0)
    if crowd not in (0, 1) or not isinstance(crowd, (int, float)):
        return Invalid("bad_iscrowd", f"{where} has iscrowd {crowd!r}, expected 0 or 1")
    x, y, w, h = box
    if w <= 0 or h <= 0:
        return Invalid(
            "degenerate_box", f"{where} has bbox {box!r} with zero or negative width or height"
        )
    clipped_w = min(x + w, width) - max(x, 0)
    clipped_h = min(y + h, height) - max(y, 0)
    if clipped_w <= 0 or clipped_h <= 0:
        return Invalid(
            "box_outside_image",
            f"{where} has bbox {box!r}, entirely outside the {height} x {width} image",
        )
    if clipped_w < min_box_size or clipped_h < min_box_size:
        return Invalid(
            "small_box",
            f"{where} has a box of {clipped_w:g} x {clipped_h:g} inside the image, smaller "
            f"than min_box_size={min_box_size:g}",
        )
    area = ann.get("area")
    if area is not None and not (is_number(area) and math.isfinite(area) and area >= 0):
        return Invalid("bad_area", f"{where} has area {area!r}, expected a finite number >= 0")
    if keypoint_counts is not None and category_id in keypoint_counts:
        problem = _keypoint_problem(where, ann, keypoint_counts[category_id])
        if problem is not None:
            return problem
    seg = ann.get("segmentation")
    if not seg:
        if need_segmentation:
            return Invalid(
                "empty_segmentation",
                f"{where} has segmentation {seg!r}, but masks are asked for (with_masks=True)",
            )
        return None
    if isinstance(seg, list):
        return _polygon_problem(where, seg, height, width)
    if isinstance(seg, dict):
        return _rle_problem(where, seg, height, width)
    return Invalid(
        "bad_segmentation",
        f"{where} has a segmentation of type {type(seg).__name__}; expected a list of polygons "
        "or an RLE dict",
    )


def _keypoint_problem(where: str, ann: Mapping[str, Any], k: int) -> Invalid | None:
    """The first problem of ``ann``'s key points (``k`` of them), or None."""
    if "keypoints" not in ann:
        return None
    points = ann["keypoints"]
    if not _numbers(points):
        return Invalid(
            "bad_keypoints",
            f"{where} has keypoints {str(points)[:80]}, expected a flat list "
            "[x1, y1, v1, x2, y2, v2, ...] of numbers",
        )
    if len(points) != 3 * k:
        return Invalid(
            "keypoints_length",
            f"{where} has {len(points)} keypoints values, expected 3 x {k} = {3 * k} (x, y "
            f"and v for each of its category's {k} key points)",
        )
    coordinates = [*points[0::3], *points[1::3]]
    if not _all_finite(coordinates):
        return Invalid(
            "nonfinite_keypoints", f"{where} has NaN or inf key points: {str(points)[:80]}"
        )
    flags = points[2::3]
    if not set(flags) <= _FLAGS:  # at C speed; 2.0 is 2; NaN, 1.5 and 3 are not flags
        i, v = next((i, v) for i, v in enumerate(flags) if v not in _FLAGS)
        return Invalid(
            "bad_visibility",
            f"{where} has visibility {v!r} for key point {i}, expected 0 (not labelled), "
            "1 (labelled, not visible) or 2 (labelled, visible)",
        )
    count = ann.get("num_keypoints")
    labelled = len(flags) - flags.count(0)
    if count is not None and not (is_number(count) and count == labelled):
        return Invalid(
            "num_keypoints_mismatch",
            f"{where} has num_keypoints {count!r}, but {labelled} of its key points are "
            "labelled (v > 0)",
        )
    return None


def repair(ann: dict[str, Any], reason: str, keypoint_counts: Mapping[Any, int] | None) -> None:
    """Leave out, in place, what a `REPAIRABLE` ``reason`` says is invalid in ``ann``: the
    area, the segmentation, or the key points (all unlabelled; ``num_keypoints_mismatch``:
    ``num_keypoints`` recounted from the flags)."""
    if reason == "bad_area":
        ann.pop("area", None)
    elif reason == "num_keypoints_mismatch":
        ann["num_keypoints"] = sum(v > 0 for v in ann["keypoints"][2::3])
    elif reason in KEYPOINT_REASONS:
        k = keypoint_counts[ann["category_id"]] if keypoint_counts else 0
        ann["keypoints"] = [0] * (3 * k)
        ann["num_keypoints"] = 0
    else:
        ann.pop("segmentation", None)


@dataclass(frozen=True)
class KeypointSchema:
    """The key points of a file's keypoint categories: names, 0-based ``skeleton`` pairs,
    ``sigmas`` (or None) and the categories' sorted ids."""

    names: tuple[str, ...]
    skeleton: tuple[tuple[int, int], ...]
    sigmas: tuple[float, ...] | None
    category_ids: tuple[Any, ...]

    @property
    def counts(self) -> dict[Any, int]:
        """Category id -> K, what `annotation_problem` takes as ``keypoint_counts``."""
        return {cid: len(self.names) for cid in self.category_ids}


def keypoint_schema(where: str, categories: list[Any]) -> tuple[KeypointSchema | None, list[str]]:
    """The `KeypointSchema` of ``categories`` (None when no category has a non-empty
    ``keypoints`` list), and the problems of their keypoint fields; several keypoint
    categories must agree on names, skeleton and sigmas."""
    found: list[tuple[Any, tuple[str, ...], tuple[tuple[int, int], ...], Any]] = []
    problems: list[str] = []
    for i, cat in enumerate(categories):
        if not isinstance(cat, dict) or "keypoints" not in cat:
            continue
        label = f"{where}: categories[{i}] (id {cat.get('id')!r})"
        names = cat["keypoints"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            problems.append(
                f"{label} has keypoints {str(names)[:80]}, expected a list of key point names"
            )
            continue
        if not names:
            continue  # no key points: an ordinary category
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            problems.append(f"{label} names the key points {twice} twice")
            continue
        k = len(names)
        bones = cat.get("skeleton", [])
        ok = isinstance(bones, list) and all(
            isinstance(b, (list, tuple))
            and len(b) == 2
            and all(is_int(j) and 1 <= j <= k for j in b)
            for b in bones
        )
        if not ok:
            problems.append(
                f"{label} has skeleton {str(bones)[:80]}, expected a list of [i, j] pairs of "
                f"key point numbers in 1..{k} (COCO's skeleton is 1-based)"
            )
            continue
        sigmas = cat.get("sigmas")
        if sigmas is not None and not (
            isinstance(sigmas, list)
            and len(sigmas) == k
            and all(is_number(v) and math.isfinite(v) and v > 0 for v in sigmas)
        ):
            problems.append(
                f"{label} has sigmas {str(sigmas)[:80]}, expected {k} positive numbers (one per "
                "key point)"
            )
            continue
        skeleton = tuple((int(a) - 1, int(b) - 1) for a, b in bones)
        found.append((cat.get("id"), tuple(names), skeleton, sigmas))
    if problems or not found:
        return None, problems
    _, names, skeleton, sigmas = found[0]
    for cid, other_names, other_skeleton, other_sigmas in found[1:]:
        if (other_names, other_skeleton, other_sigmas) != (names, skeleton, sigmas):
            problems.append(
                f"{where}: keypoint categories {found[0][0]!r} and {cid!r} differ in their key "
                f"points ({len(names)}: {_names(names)} / {len(other_names)}: "
                f"{_names(other_names)}), skeleton or sigmas; a dataset serves one kind "
                "of key points (one K, one left/right rule)"
            )
            return None, problems
    ids = tuple(
        sorted(
            (cid for cid, *_ in found), key=lambda c: (0, c, "") if is_int(c) else (1, 0, repr(c))
        )
    )
    values = tuple(float(v) for v in sigmas) if sigmas is not None else None
    return KeypointSchema(names, skeleton, values, ids), problems


def _names(names: tuple[str, ...], show: int = 4) -> str:
    """``nose, left_eye, ... (17)``-style short listing of key point names."""
    return ", ".join(names[:show]) + (", ..." if len(names) > show else "")


def _polygon_problem(where: str, polygons: list[Any], height: int, width: int) -> Invalid | None:
    low = -_COORD_MARGIN * max(height, width)
    high = (1 + _COORD_MARGIN) * max(height, width)
    for i, polygon in enumerate(polygons):
        if not _numbers(polygon) or isinstance(polygon, tuple):
            return Invalid(
                "bad_polygon",
                f"{where}: segmentation polygon {i} must be a flat list [x1, y1, x2, y2, ...] "
                f"of numbers, got {str(polygon)[:80]}",
            )
        if not _all_finite(polygon):
            return Invalid(
                "nonfinite",
                f"{where}: segmentation polygon {i} has NaN or inf: {str(polygon)[:80]}",
            )
        if len(polygon) % 2:
            return Invalid(
                "odd_polygon",
                f"{where}: segmentation polygon {i} has an odd number of coordinates "
                f"({len(polygon)}), expected x, y pairs: {str(polygon)[:80]}",
            )
        if len(polygon) < 6:
            return Invalid(
                "short_polygon",
                f"{where}: segmentation polygon {i} has {len(polygon) // 2} point(s), "
                f"at least 3 points are needed: {str(polygon)[:80]}",
            )
        if min(polygon) < low or max(polygon) > high:
            return Invalid(
                "polygon_outside_image",
                f"{where}: segmentation polygon {i} has coordinates in "
                f"[{min(polygon):g}, {max(polygon):g}], far outside the {height} x {width} image",
            )
    return None


def _rle_problem(where: str, rle: Mapping[str, Any], height: int, width: int) -> Invalid | None:
    size, counts = rle.get("size"), rle.get("counts")
    if not isinstance(size, list) or list(size) != [height, width]:
        return Invalid(
            "rle_size",
            f"{where}: RLE segmentation has size {size!r}, but the image is {height} x {width}",
        )
    if isinstance(counts, list):
        if not all(is_int(c) and c >= 0 for c in counts) or sum(counts) != height * width:
            return Invalid(
                "bad_rle",
                f"{where}: uncompressed RLE counts must be non-negative ints summing to "
                f"height * width = {height * width}, got {len(counts)} counts summing to "
                f"{sum(c for c in counts if is_number(c))}",
            )
        return None
    if not isinstance(counts, (str, bytes)):
        return Invalid(
            "bad_rle", f"{where}: RLE counts must be a list of ints or a string, got {counts!r}"
        )
    parsed = rle_runs([counts])
    runs = parsed[0] if parsed else None
    if runs is None or any(c < 0 for c in runs) or sum(runs) != height * width:
        return Invalid(
            "bad_rle",
            f"{where}: compressed RLE counts do not decode to {height} x {width} pixels "
            f"(pycocotools would decode garbage): {str(counts)[:40]}",
        )
    return None
