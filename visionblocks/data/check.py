"""A linter for COCO annotation files from the field: `check_coco` and `CocoCheck` (what
``visionblocks check-coco ANN_FILE [--images DIR] [--fix OUT.json]`` prints)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.data._coco_checks import (
    INVALID_REASONS,
    REPAIRABLE,
    annotation_problem,
    keypoint_schema,
)
from visionblocks.data._coco_index import (
    check_min_box_size,
    clean_annotations,
    file_problems,
    image_file_name,
    listing,
    orphan_annotations,
    parse_annotation_file,
    safe_relative,
    valid_ids,
)
from visionblocks.data._coco_io import size_mismatch

__all__ = ["IMAGE_PROBLEMS", "NOTES", "CocoCheck", "check_coco"]
__dir__ = public_dir(__name__, __all__)

IMAGE_PROBLEMS: dict[str, str] = {
    "missing_file": "image file not found under the images folder",
    "unreadable_file": "image file that cannot be read",
    "size_mismatch": "image whose pixels are not the file's height x width",
}
"""Problems of image files (checked with ``images=``): key -> description."""

NOTES: dict[str, str] = {
    "clipped_box": "box partly outside the image (clipped on load)",
    "missing_area": "no area (filled on load: the segmentation's, else the box's)",
    "missing_iscrowd": "no iscrowd (0 on load)",
    "missing_keypoints": "no keypoints in a keypoint category (all unlabelled on load)",
    "missing_num_keypoints": "no num_keypoints (counted from the flags on load)",
}
"""What the dataset repairs silently on load (not problems): key -> description."""

_EXAMPLES = 3  # messages shown per reason


@dataclass
class CocoCheck:
    """What `check_coco` found in one annotation file.

    Attributes:
        ann_file: The file checked.
        counts: ``{"images", "annotations", "categories"}`` as found in the file.
        file_problems: Problems of the file itself; the dataset refuses such a file.
        invalid: ``{reason: [annotation ids]}`` (`visionblocks.data.INVALID_REASONS`).
        image_problems: ``{problem: [image ids]}`` (`IMAGE_PROBLEMS`), with ``images=``.
        notes: ``{note: [ids]}`` (`NOTES`): what the dataset repairs on load.
        examples: Up to three full messages per reason or problem.
        keypoint_counts: Category id -> K of the keypoint categories checked.
        data: The parsed file (None when it is not a JSON object).
    """

    ann_file: Path
    counts: dict[str, int] = field(default_factory=dict)
    file_problems: list[str] = field(default_factory=list)
    invalid: dict[str, list[Any]] = field(default_factory=dict)
    image_problems: dict[str, list[Any]] = field(default_factory=dict)
    notes: dict[str, list[Any]] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    keypoint_counts: dict[Any, int] = field(default_factory=dict)
    data: dict[str, Any] | None = field(default=None, repr=False)
    _options: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_problems(self) -> int:
        """File problems, invalid annotations and image problems, counted one each."""
        return (
            len(self.file_problems)
            + sum(map(len, self.invalid.values()))
            + sum(map(len, self.image_problems.values()))
        )

    @property
    def ok(self) -> bool:
        """True when the dataset would load the file without dropping or refusing anything."""
        return self.num_problems == 0

    @property
    def fixable(self) -> bool:
        """True when `fixed` can write a cleaned copy: the file parsed and its only file
        problem, if any, is annotations pointing at images that do not exist (dropped)."""
        if self.data is None:
            return False
        orphans = orphan_annotations(self.data, valid_ids(self.data, "images"))
        return len(self.file_problems) == (1 if orphans else 0)

    def fixed(self) -> dict[str, Any]:
        """A cleaned copy of the file (the file itself is never modified).

        Left out: what the dataset would drop (repaired instead with ``keep_repairable``),
        annotations of images that do not exist and, when images were checked, the images
        with a bad file. Boxes are clipped; missing fields are filled in.

        Raises:
            ValueError: The file has problems no cleaning can settle (see ``file_problems``).
        """
        if not self.fixable or self.data is None:
            raise ValueError(
                f"cannot write a cleaned copy of '{self.ann_file}': "
                + ("; ".join(self.file_problems) or "it is not a COCO file")
            )
        data = copy.deepcopy(self.data)
        bad_images = {i for ids in self.image_problems.values() for i in ids}
        data["images"] = [i for i in data["images"] if i["id"] not in bad_images]
        kept = valid_ids(data, "images")
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] in kept]
        policy = "keep" if self._options.get("keep_repairable") else "drop"
        clean_annotations(
            self.ann_file,
            data,
            invalid=policy,
            min_box_size=self._options.get("min_box_size", 0.0),
            need_segmentation=self._options.get("masks", False),
            keypoint_counts=self.keypoint_counts or None,
        )
        sizes = {i["id"]: (i["height"], i["width"]) for i in data["images"]}
        for ann in data["annotations"]:
            height, width = sizes[ann["image_id"]]
            x, y, w, h = ann["bbox"]
            x1, y1 = max(x, 0), max(y, 0)
            x2, y2 = min(x + w, width), min(y + h, height)
            if (x1, y1, x2, y2) != (x, y, x + w, y + h):
                ann["bbox"] = [x1, y1, x2 - x1, y2 - y1]
        return data

    def write_fixed(self, out: str | os.PathLike[str]) -> Path:
        """Write `fixed` to ``out`` as JSON (what ``check-coco --fix`` does); returns the path.

        Raises:
            ValueError: ``out`` is the checked file, or the file cannot be fixed.
        """
        target = Path(out)
        if target.resolve() == self.ann_file.resolve():
            raise ValueError(
                f"--fix would overwrite the checked file '{self.ann_file}'; name another file"
            )
        data = self.fixed()
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w") as f:
            json.dump(data, f)
        return target

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        lines = [f"{self.ann_file}: {counts or 'not read'}"]
        if self.keypoint_counts:
            k = next(iter(self.keypoint_counts.values()))
            lines.append(
                f"key points checked as CocoKeypoints: {k} per instance of category id(s) "
                f"{listing(list(self.keypoint_counts))}"
            )
        if self.file_problems:
            lines.append(
                f"file problems ({len(self.file_problems)}; the dataset refuses the file):"
            )
            lines.extend(f"  - {p}" for p in self.file_problems)
        total = self.counts.get("annotations", 0)
        sections = [
            ("invalid annotations", f" of {total}: the dataset drops them", self.invalid,
             INVALID_REASONS),
            ("image files", f" of {self.counts.get('images', 0)}", self.image_problems,
             IMAGE_PROBLEMS),
            ("repaired on load", ": no action needed", self.notes, NOTES),
        ]  # fmt: skip
        for title, note, found, descriptions in sections:
            if not found:
                continue
            lines.append(f"{title} ({sum(map(len, found.values()))}{note}):")
            width = max(map(len, found))
            for key, ids in sorted(found.items(), key=lambda kv: -len(kv[1])):
                lines.append(
                    f"  {key:<{width}} {len(ids):>6}  {descriptions[key]}: ids {listing(ids)}"
                )
                lines.extend(f"  {'':<{width}}         {m}" for m in self.examples.get(key, []))
        if self.ok:
            lines.append("ok: the dataset loads every annotation of this file")
        else:
            fix = (
                "`--fix OUT.json` writes a cleaned copy"
                if self.fixable
                else "fix the file problems first"
            )
            lines.append(f"{self.num_problems} problem(s): {fix}")
        return "\n".join(lines)


def check_coco(
    ann_file: str | os.PathLike[str],
    *,
    images: str | os.PathLike[str] | None = None,
    masks: bool = False,
    min_box_size: float = 0.0,
    keep_repairable: bool = False,
    keypoints: bool | None = None,
    progress: bool | None = None,
) -> CocoCheck:
    """Every problem of a COCO annotation file, as `visionblocks.data.CocoInstances` sees them
    (as `visionblocks.data.CocoKeypoints` for a keypoint file).

    Nothing is raised for a bad file: everything goes into the returned `CocoCheck`, whose
    ``str()`` is the report ``visionblocks check-coco`` prints and ``fixed()`` a cleaned copy.

    Args:
        ann_file: The COCO annotation JSON.
        images: The images folder: check that each image exists, can be read and has the
            file's size.
        masks: Check as ``CocoInstances(with_masks=True)``.
        min_box_size: As the dataset's ``min_box_size``.
        keep_repairable: ``fixed()`` repairs what ``invalid="keep"`` would keep.
        keypoints: Check the key points as `visionblocks.data.CocoKeypoints` does: None
            (default) when the file has a category with ``keypoints``, True always (a file
            without one is then a file problem), False never.
        progress: Show progress bars (default: when writing to a terminal).

    Returns:
        CocoCheck: The findings; ``.ok`` is True when nothing would be dropped or refused.

    Raises:
        FileNotFoundError: ``ann_file`` (or ``images``) does not exist.
        TypeError: Arguments of the wrong type.

    Examples:
        >>> import json, tempfile
        >>> folder = tempfile.TemporaryDirectory()
        >>> path = f"{folder.name}/ann.json"
        >>> with open(path, "w") as f:
        ...     json.dump({"images": [{"id": 1, "file_name": "a.jpg", "height": 40, "width": 60}],
        ...                "categories": [{"id": 1, "name": "cat"}],
        ...                "annotations": [
        ...                    {"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 1, 9, 9]},
        ...                    {"id": 8, "image_id": 1, "category_id": 1, "bbox": [5, 5, 4, 0]},
        ...                    {"id": 9, "image_id": 1, "category_id": 1, "bbox": [5, 5, 9, 9],
        ...                     "segmentation": [[5, 5, 14, 14]]}]}, f)
        >>> report = check_coco(path)
        >>> report.ok, report.invalid
        (False, {'degenerate_box': [8], 'short_polygon': [9]})
        >>> [a["id"] for a in report.fixed()["annotations"]]
        [7]
        >>> folder.cleanup()
    """
    check_type("ann_file", ann_file, (str, os.PathLike))
    if images is not None:
        check_type("images", images, (str, os.PathLike))
        if not Path(images).is_dir():
            raise FileNotFoundError(f"images: images folder not found: '{images}'")
    for name, flag in (("masks", masks), ("keep_repairable", keep_repairable)):
        check_type(name, flag, bool)
    if keypoints is not None:
        check_type("keypoints", keypoints, bool)
    if progress is not None:
        check_type("progress", progress, bool)
    min_box_size = check_min_box_size(min_box_size)
    path = Path(ann_file)
    report = CocoCheck(
        path,
        _options={"masks": masks, "min_box_size": min_box_size,
                  "keep_repairable": keep_repairable},
    )  # fmt: skip
    try:
        data = parse_annotation_file(path)
    except ValueError as exc:
        report.file_problems.append(str(exc))
        return report
    report.data = data
    report.file_problems = file_problems(path, data)
    if not all(isinstance(data.get(k), list) for k in ("images", "annotations", "categories")):
        return report
    report.counts = {k: len(data[k]) for k in ("images", "annotations", "categories")}
    if keypoints is not False:
        _check_keypoint_categories(report, data, required=bool(keypoints))
    _check_annotations(report, data, progress)
    if images is not None:
        _check_images(report, data, Path(images), progress)
    return report


def _check_keypoint_categories(report: CocoCheck, data: Mapping[str, Any], required: bool) -> None:
    """Set ``report.keypoint_counts`` from the keypoint categories; their problems (and,
    when ``required``, having none) are file problems."""
    where = f"COCO annotation file '{report.ann_file}'"
    schema, problems = keypoint_schema(where, data["categories"])
    report.file_problems.extend(problems)
    if schema is not None:
        report.keypoint_counts = schema.counts
    elif required and not problems:
        report.file_problems.append(
            f"{where} has no keypoint category (a category with a 'keypoints' list of key "
            "point names, as in person_keypoints_*.json)"
        )


def _bar(items: list[Any], what: str, progress: bool | None) -> Any:
    from tqdm.auto import tqdm

    disable = None if progress is None else not progress
    return tqdm(items, desc=what, unit=what.split()[-1], disable=disable, leave=False)


def _add(found: dict[str, list[Any]], key: str, ident: Any) -> None:
    found.setdefault(key, []).append(ident)


def _check_annotations(report: CocoCheck, data: Mapping[str, Any], progress: bool | None) -> None:
    sizes = {
        i["id"]: (i.get("height"), i.get("width"))
        for i in data["images"]
        if isinstance(i, dict) and "id" in i
    }
    categories = frozenset(valid_ids(data, "categories"))
    options = report._options
    keypoint_counts = report.keypoint_counts or None
    for ann in _bar(data["annotations"], "checking annotations", progress):
        if not isinstance(ann, dict) or not {"id", "image_id", "category_id"} <= set(ann):
            continue  # a file problem already
        height, width = sizes.get(ann["image_id"], (None, None))
        if not (isinstance(height, int) and isinstance(width, int)):
            continue  # an orphan, or an image of bad size: a file problem already
        where = f"annotation {ann['id']!r}"
        problem = annotation_problem(
            where, ann, height, width, categories,
            min_box_size=options["min_box_size"], need_segmentation=options["masks"],
            keypoint_counts=keypoint_counts,
        )  # fmt: skip
        if problem is not None:
            _add(report.invalid, problem.reason, ann["id"])
            _example(report, problem.reason, problem.message)
            if problem.reason not in REPAIRABLE or not options["keep_repairable"]:
                continue  # dropped: nothing to repair
        x, y, w, h = ann["bbox"]
        if x < 0 or y < 0 or x + w > width or y + h > height:
            _add(report.notes, "clipped_box", ann["id"])
        if "area" not in ann:
            _add(report.notes, "missing_area", ann["id"])
        if "iscrowd" not in ann:
            _add(report.notes, "missing_iscrowd", ann["id"])
        if keypoint_counts is not None and ann["category_id"] in keypoint_counts:
            if "keypoints" not in ann:
                _add(report.notes, "missing_keypoints", ann["id"])
            elif "num_keypoints" not in ann:
                _add(report.notes, "missing_num_keypoints", ann["id"])


def _check_images(
    report: CocoCheck, data: Mapping[str, Any], root: Path, progress: bool | None
) -> None:
    from PIL import Image

    for info in _bar(data["images"], "checking image files", progress):
        if not isinstance(info, dict) or "id" not in info:
            continue
        name = safe_relative(image_file_name(info))
        if name is None:
            continue  # a file problem already
        path = root / name
        if not path.is_file():
            _image_problem(report, "missing_file", info, f"'{path}' not found")
            continue
        try:
            with Image.open(path) as pil:
                size = (pil.height, pil.width)
        except Exception as exc:  # any decoder error: Pillow raises many kinds
            _image_problem(report, "unreadable_file", info, f"'{path}': {exc}")
            continue
        if size != (info.get("height"), info.get("width")):
            message = size_mismatch(path, info["id"], size, info.get("height"), info.get("width"))
            _image_problem(report, "size_mismatch", info, message, prefix=False)


def _image_problem(
    report: CocoCheck, key: str, info: Mapping[str, Any], message: str, prefix: bool = True
) -> None:
    _add(report.image_problems, key, info["id"])
    _example(report, key, f"image {info['id']!r}: {message}" if prefix else message)


def _example(report: CocoCheck, key: str, message: str) -> None:
    shown = report.examples.setdefault(key, [])
    if len(shown) < _EXAMPLES:
        shown.append(message)
