"""The parts shared by the COCO dataset wrappers (private; see `visionblocks.data.coco`)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from visionblocks._core.checks import check_choice, check_type
from visionblocks.data._coco_checks import INVALID_REASONS
from visionblocks.data._coco_index import (
    CleanStats,
    ImageEntry,
    InvalidPolicy,
    build_index,
    check_min_box_size,
    clean_annotations,
    listing,
    load_coco,
    read_annotation_file,
)
from visionblocks.data._coco_io import decode_rgb, size_mismatch

__all__ = ["CocoBase"]


class CocoBase(Dataset):
    """The parts shared by `CocoInstances` and `visionblocks.data.CocoSegmentation`: the
    checked file, the per-image index, label maps, image decoding. Not used on its own."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        ann_file: str | os.PathLike[str],
        *,
        transforms: Callable[..., Any] | None = None,
        contiguous_labels: bool = True,
        invalid: InvalidPolicy = "drop",
        min_box_size: float = 0.0,
    ) -> None:
        check_type("root", root, (str, os.PathLike))
        check_type("ann_file", ann_file, (str, os.PathLike))
        check_type("contiguous_labels", contiguous_labels, bool)
        check_choice("invalid", invalid, ("drop", "raise", "keep"))
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable or None, got {type(transforms).__name__}")
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"root: image root is not a directory: '{self.root}'")
        self.ann_file = Path(ann_file)
        self.transforms = transforms
        self.contiguous_labels = contiguous_labels
        self.invalid = invalid
        self.min_box_size = check_min_box_size(min_box_size)
        data, stats = self._read()
        self._coco = load_coco(data)
        self.dropped: dict[str, list[Any]] = stats.dropped
        self.kept_invalid: dict[str, list[Any]] = stats.kept_invalid
        if stats.dropped or stats.kept_invalid:
            warnings.warn(self._drop_message(stats), stacklevel=3)
        categories = sorted(data["categories"], key=lambda c: c["id"])
        self.classes: list[str] = [str(c["name"]) for c in categories]
        ids = [c["id"] for c in categories]
        if contiguous_labels:
            self.category_id_to_label = {cid: i for i, cid in enumerate(ids)}
        else:
            self.category_id_to_label = {cid: cid for cid in ids}
        self.label_to_category_id = {v: k for k, v in self.category_id_to_label.items()}
        self._entries: list[ImageEntry] = self._select(
            build_index(data, keypoint_counts=self._keypoint_counts())
        )
        self._label_lookup = self._lookup_table()

    def _read(self) -> tuple[dict[str, Any], CleanStats]:
        """The checked file with the ``invalid`` policy applied (what ``coco`` holds)."""
        data = read_annotation_file(self.ann_file)
        self._prepare(data)
        stats = clean_annotations(
            self.ann_file,
            data,
            invalid=self.invalid,
            min_box_size=self.min_box_size,
            need_segmentation=self._needs_segmentation(),
            keypoint_counts=self._keypoint_counts(),
        )
        return data, stats

    def _drop_message(self, stats: CleanStats) -> str:
        def parts(counts: dict[str, list[Any]]) -> str:
            return "; ".join(
                f"{len(ids)} {INVALID_REASONS[reason]} ({reason}: id {listing(ids, 3)})"
                for reason, ids in sorted(counts.items(), key=lambda kv: -len(kv[1]))
            )

        n_dropped = sum(map(len, stats.dropped.values()))
        n_kept = sum(map(len, stats.kept_invalid.values()))
        said = []
        if n_dropped:
            said.append(
                f"dropped {n_dropped} of {stats.total} annotation(s): {parts(stats.dropped)}"
            )
        if n_kept:
            said.append(
                f"kept {n_kept} invalid annotation(s) without what is invalid in them "
                "(segmentation, area or key points): "
                f"{parts(stats.kept_invalid)}"
            )
        return (
            f"{type(self).__name__} of '{self.ann_file}': {'. '.join(said)}. The ids are in "
            f"dataset.dropped / dataset.kept_invalid; `visionblocks check-coco` explains each "
            "and writes a cleaned copy (--fix)"
        )

    # ----------------------------------------------------------------------- subclass hooks
    def _select(self, entries: list[ImageEntry]) -> list[ImageEntry]:
        return entries

    def _needs_segmentation(self) -> bool:
        """Whether an annotation without a segmentation is invalid (masks are asked for)."""
        return False

    def _prepare(self, data: dict[str, Any]) -> None:
        """Adjust the parsed file (in place) before its annotations are checked."""

    def _keypoint_counts(self) -> dict[Any, int] | None:
        """Category id -> K of the categories whose key points are served, or None."""
        return None

    # --------------------------------------------------------------------------- metadata
    @property
    def coco(self) -> Any:
        """The ``pycocotools.coco.COCO`` of the annotations the dataset serves (the
        ``invalid`` policy applied, missing fields filled in)."""
        if self._coco is None:
            self._coco = load_coco(self._read()[0])
        return self._coco

    @property
    def num_degenerate(self) -> int:
        """Annotations dropped for a box of zero size inside the image."""
        return sum(len(self.dropped.get(r, ())) for r in ("degenerate_box", "box_outside_image"))

    @property
    def ids(self) -> list[int]:
        """The image id of each index: image-id order, as torchvision's ``CocoDetection``."""
        return [e.image_id for e in self._entries]

    def get_height_and_width(self, index: int) -> tuple[int, int]:
        """``(H, W)`` of image ``index`` from the annotation file (nothing is decoded).

        Examples:
            >>> import tempfile
            >>> from visionblocks.data import CocoInstances, make_synthetic_coco
            >>> folder = tempfile.TemporaryDirectory()
            >>> ann = make_synthetic_coco(folder.name, num_images=2, image_size=(48, 64))
            >>> CocoInstances(f"{folder.name}/images", ann).get_height_and_width(0)
            (48, 64)
            >>> folder.cleanup()
        """
        entry = self._entries[self._index(index)]
        return entry.height, entry.width

    def __len__(self) -> int:
        return len(self._entries)

    def _index(self, index: Any) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset index must be an int, got {type(index).__name__}")
        n = len(self._entries)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} images")
        return int(index) % n

    def _lookup_table(self) -> np.ndarray | None:
        """A dense category id -> label array when the ids are small non-negative ints."""
        ids = list(self.category_id_to_label)
        if not ids or not all(isinstance(i, int) and 0 <= i < 1_000_000 for i in ids):
            return None
        table = np.full(max(ids) + 1, -1, dtype=np.int64)
        for cid, label in self.category_id_to_label.items():
            table[cid] = label
        return table

    def _labels(self, category_ids: np.ndarray) -> Tensor:
        if self._label_lookup is not None:
            return torch.from_numpy(self._label_lookup[category_ids])
        return torch.tensor(
            [self.category_id_to_label[int(c)] for c in category_ids], dtype=torch.int64
        )

    def _image(self, entry: ImageEntry) -> Tensor:
        path = os.path.join(self.root, entry.file_name)
        image = decode_rgb(path, entry.image_id)
        size = (int(image.shape[-2]), int(image.shape[-1]))
        if size != (entry.height, entry.width):
            path = Path(path)
            raise ValueError(size_mismatch(path, entry.image_id, size, entry.height, entry.width))
        return image

    def _transformed(self, image: Any, target: Any, what: str) -> tuple[Any, Any]:
        """``transforms(image, target)``, which must give back an ``(image, target)`` pair."""
        out = self.transforms(image, target)  # type: ignore[misc]
        kind = dict if what == "target dict" else Tensor
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], kind)):
            got = (
                f"a {type(out).__name__} of {len(out)}"
                if isinstance(out, (tuple, list))
                else f"a {type(out).__name__}"
            )
            raise TypeError(
                f"transforms must return (image, {what}) when called as transforms(image, "
                f"{what.split()[0]}), got {got}: a transform that takes only the image (e.g. a "
                "v1 torchvision transform) needs wrapping, or use torchvision.transforms.v2, "
                "whose transforms handle both"
            )
        return out[0], out[1]

    # --------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_coco"] = None  # large; rebuilt from ann_file on first use of .coco
        return state
