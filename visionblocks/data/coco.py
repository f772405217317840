"""COCO instance annotations as model-ready ``tv_tensors``: `CocoInstances`.

Built on pycocotools and torchvision: an item is a ``tv_tensors.Image`` and a dict of typed
tensors, so a ``torchvision.transforms.v2`` pipeline transforms image, boxes and masks together.

``CocoDetection`` is a deprecated alias of `CocoInstances` (removed in 0.3): torchvision's
class of that name returns a PIL image and the raw annotation dicts.

Convention:
    Boxes and polygon vertices are in COCO's continuous coordinates: pixel ``(row i, column
    j)`` covers ``[j, j + 1) x [i, i + 1)``, so ``(0, 0, 2, 2)`` covers 2 x 2 pixels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import DATASETS
from visionblocks.data._coco_base import CocoBase
from visionblocks.data._coco_index import (
    ImageEntry,
    InvalidPolicy,
)
from visionblocks.data._coco_io import segmentation_masks
from visionblocks.data._coco_targets import (
    INSTANCE_KEYS,
    check_instances,
    check_polygons_followed,
    instance_fields,
    split_crowd,
)

__all__ = ["INSTANCE_KEYS", "CocoBase", "CocoInstances", "instance_fields"]
__dir__ = public_dir(__name__, __all__)

CrowdPolicy = Literal["keep", "drop", "ignore"]


@DATASETS.register(name="coco_detection", aliases=("coco", "coco_instances"))
class CocoInstances(CocoBase):
    """COCO instance annotations as ``(tv_tensors.Image, target)`` pairs.

    Registered in ``DATASETS`` as ``"coco_detection"`` (aliases ``"coco"``,
    ``"coco_instances"``). ``target`` holds:

    - ``boxes``: ``tv_tensors.BoundingBoxes`` ``(N, 4)`` float32, XYXY, clipped to the image
      (``canvas_size=(H, W)``);
    - ``labels``: int64 ``(N,)``: contiguous ``0..K-1`` in category-id order (see
      ``classes``, ``category_id_to_label``, ``label_to_category_id``), or the category ids
      themselves with ``contiguous_labels=False``;
    - ``masks``: ``tv_tensors.Mask`` ``(N, H, W)`` uint8, with ``with_masks=True``, decoded
      per item from polygons or RLE;
    - ``polygons``: with ``with_polygons=True``, per box a list of float32 ``(P, 2)`` vertex
      tensors;
    - ``iscrowd``: int64 ``(N,)``; ``area``: float32 ``(N,)`` (the file's, else the
      segmentation's, else the box's); ``image_id``: int;
    - ``ignore_boxes``: ``tv_tensors.BoundingBoxes`` ``(M, 4)``, with ``crowd="ignore"``.

    An image without annotations gives ``boxes (0, 4)``, ``labels (0,)``, ``masks
    (0, H, W)`` and ``polygons []``.

    Every annotation is checked once, at construction; an invalid one (reasons:
    ``visionblocks.data.INVALID_REASONS``) follows ``invalid``: ``"drop"`` (default; one
    warning, ids in ``dropped``), ``"raise"``, or ``"keep"`` (a sound box stays without its
    invalid segmentation or area, ids in ``kept_invalid``). Boxes are clipped to the image;
    ``min_box_size`` drops smaller ones. ``visionblocks check-coco`` lists every problem of
    a file and writes a cleaned copy.

    Crowd annotations: ``crowd="keep"``, ``"drop"``, or ``"ignore"`` (their boxes move to
    ``ignore_boxes`` after the transforms).

    Transforms: one that removes boxes must remove the same rows of ``labels``, ``iscrowd``
    and ``area``: use ``v2.SanitizeBoundingBoxes(labels_getter=instance_fields)``.
    ``polygons`` are plain tensors, which v2 transforms leave as they are: use
    `visionblocks.transforms` (``RandomAffine``, ``warp_sample``), which moves and filters
    them with the boxes. Misaligned rows, or polygons left behind, raise a ``ValueError``.

    Images are decoded to 3-channel ``uint8`` RGB (EXIF orientation not applied: COCO
    refers to the pixels as stored). LVIS files load too. The dataset pickles (for
    ``DataLoader`` workers) without its ``coco`` object, reloaded on first use.

    Args:
        root: Folder the ``file_name`` entries are relative to.
        ann_file: COCO annotation JSON.
        transforms: ``transforms(image, target) -> (image, target)``, e.g. a
            ``torchvision.transforms.v2.Compose``.
        with_masks: Decode instance masks.
        with_polygons: Serve the polygons of each instance (``polygons``).
        remove_empty: Drop images without annotations.
        contiguous_labels: Labels ``0..K-1`` (True) or raw category ids (False).
        crowd: ``"keep"``, ``"drop"`` or ``"ignore"``.
        remove_crowd_only: Drop images whose only annotations are crowd.
        invalid: ``"drop"``, ``"raise"`` or ``"keep"``: what to do with invalid annotations.
        min_box_size: Smallest width and height, in pixels inside the image, of a kept box.

    Attributes:
        coco: ``pycocotools.coco.COCO`` of the annotations the dataset serves.
        dropped (dict[str, list[int]]): Reason -> ids of the annotations left out.
        kept_invalid (dict[str, list[int]]): With ``invalid="keep"``, reason -> ids of the
            invalid annotations kept without their segmentation.
        ids (list[int]): Image id of each index.
        classes (list[str]): Category names in label order.
        category_id_to_label (dict[int, int]): Category id -> label.
        label_to_category_id (dict[int, int]): Label -> category id.
        num_degenerate (int): Annotations dropped for a box of zero size inside the image.

    Raises:
        FileNotFoundError: ``root`` or ``ann_file`` does not exist; at item time, a missing
            image (the message names the file and the image id).
        ValueError: A malformed annotation file, naming it and the field (not JSON, missing
            lists or fields, non-integer or duplicate ids, annotations of unknown images,
            image sizes that are not positive integers, a ``file_name`` out of ``root``);
            with ``invalid="raise"``, the first invalid annotation; a bad ``crowd``,
            ``invalid`` or ``min_box_size``. At item time, an image of another size than the
            file's, or transforms that left per-instance rows misaligned.
        TypeError: Arguments of the wrong type.

    Examples:
        >>> import tempfile
        >>> from visionblocks.data import make_synthetic_coco
        >>> folder = tempfile.TemporaryDirectory()
        >>> ann = make_synthetic_coco(folder.name, num_images=4, image_size=(64, 96), seed=1)
        >>> dataset = CocoInstances(f"{folder.name}/images", ann, with_masks=True)
        >>> image, target = dataset[0]
        >>> image.shape, image.dtype, dataset.classes
        (torch.Size([3, 64, 96]), torch.uint8, ['circle', 'square', 'triangle'])
        >>> folder.cleanup()
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        ann_file: str | os.PathLike[str],
        *,
        transforms: Callable[..., Any] | None = None,
        with_masks: bool = False,
        with_polygons: bool = False,
        remove_empty: bool = False,
        contiguous_labels: bool = True,
        crowd: CrowdPolicy = "keep",
        remove_crowd_only: bool = False,
        invalid: InvalidPolicy = "drop",
        min_box_size: float = 0.0,
    ) -> None:
        check_type("with_masks", with_masks, bool)
        check_type("with_polygons", with_polygons, bool)
        check_type("remove_empty", remove_empty, bool)
        check_type("remove_crowd_only", remove_crowd_only, bool)
        check_choice("crowd", crowd, ("keep", "drop", "ignore"))
        self.with_masks = with_masks
        self.with_polygons = with_polygons
        self.remove_empty = remove_empty
        self.crowd = crowd
        self.remove_crowd_only = remove_crowd_only
        super().__init__(
            root,
            ann_file,
            transforms=transforms,
            contiguous_labels=contiguous_labels,
            invalid=invalid,
            min_box_size=min_box_size,
        )

    def _needs_segmentation(self) -> bool:
        return self.with_masks

    def _select(self, entries: list[ImageEntry]) -> list[ImageEntry]:
        kept = []
        for entry in entries:
            crowd = entry.iscrowd
            if self.remove_crowd_only and crowd.size and crowd.all():
                continue
            if self.remove_empty and not (crowd.size if self.crowd == "keep" else (~crowd).sum()):
                continue
            kept.append(entry)
        return kept

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Any]]:
        from torchvision import tv_tensors

        entry = self._entries[self._index(index)]
        image = tv_tensors.Image(self._image(entry))
        crowd = entry.iscrowd
        # With crowd="ignore", crowd rows travel with the others (iscrowd=1) through the
        # transforms, which know one BoundingBoxes per sample, and are split off afterwards.
        rows = np.flatnonzero(~crowd) if self.crowd == "drop" else np.arange(len(crowd))
        if self.crowd == "ignore" and self.transforms is None:
            rows = np.flatnonzero(~crowd)
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(entry.boxes[rows]).reshape(-1, 4),
                format=tv_tensors.BoundingBoxFormat.XYXY,
                canvas_size=(entry.height, entry.width),
            ),
            "labels": self._labels(entry.category_ids[rows]),
        }
        if self.with_masks:
            segmentations = [entry.segmentations[i] for i in rows]
            masks = segmentation_masks(segmentations, entry.height, entry.width)
            target["masks"] = tv_tensors.Mask(masks)
        self._add_fields(entry, rows, target)
        if self.with_polygons:
            target["polygons"] = [_polygons(entry.segmentations[i]) for i in rows]
        target["iscrowd"] = torch.from_numpy(crowd[rows].astype(np.int64))
        target["area"] = torch.from_numpy(entry.area[rows])
        target["image_id"] = entry.image_id
        if self.crowd == "ignore" and self.transforms is None:
            ignore = np.flatnonzero(crowd)
            target["ignore_boxes"] = tv_tensors.wrap(
                torch.from_numpy(entry.boxes[ignore]).reshape(-1, 4), like=target["boxes"]
            )
        if self.transforms is not None:
            boxes, polygons = target["boxes"], target.get("polygons", [])
            image, target = self._transformed(image, target, "target dict")
            target = self._after_transforms(target)
            check_instances(target, entry.image_id)
            if self.with_polygons:
                check_polygons_followed(boxes, polygons, target, entry.image_id)
            if self.crowd == "ignore":
                target = split_crowd(target)
        return image, target

    def _add_fields(self, entry: ImageEntry, rows: np.ndarray, target: dict[str, Any]) -> None:
        """Add a subclass's per-instance fields (of ``entry``'s ``rows``) to ``target``."""

    def _after_transforms(self, target: dict[str, Any]) -> dict[str, Any]:
        """A subclass's repairs of a transformed target (before the alignment checks)."""
        return target

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(images={len(self)}, classes={len(self.classes)}, "
            f"root='{self.root}', ann_file='{self.ann_file}', with_masks={self.with_masks}, "
            f"crowd={self.crowd!r}, remove_empty={self.remove_empty})"
        )


def _polygons(segmentation: Any) -> list[torch.Tensor]:
    """The polygons of one (checked) segmentation as float32 ``(P, 2)`` tensors; ``[]`` for
    an RLE or none."""
    if not isinstance(segmentation, list):
        return []
    return [torch.from_numpy(np.asarray(p, dtype=np.float32).reshape(-1, 2)) for p in segmentation]


_DEPRECATED = {"CocoDetection": ("CocoInstances", "0.3")}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
