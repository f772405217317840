"""Semantic segmentation targets from COCO instance annotations: `CocoSegmentation`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import DATASETS
from visionblocks.data._coco_index import InvalidPolicy
from visionblocks.data._coco_io import segmentation_masks
from visionblocks.data.coco import CocoBase

__all__ = ["CocoSegmentation"]
__dir__ = public_dir(__name__, __all__)


@DATASETS.register(name="coco_segmentation")
class CocoSegmentation(CocoBase):
    """COCO instance annotations painted into semantic masks: ``(tv_tensors.Image, Mask)``.

    The mask is a ``tv_tensors.Mask`` ``(H, W)`` int64 (what ``F.cross_entropy`` takes):

    - ``0`` is background, the categories are ``1..K`` in category-id order;
    - instances are painted from the largest to the smallest;
    - ``ignore_index`` (255) marks crowd regions and the boxes of instances without a
      (valid) segmentation, painted last.

    Invalid annotations, decoding and pickling are as in `visionblocks.data.CocoInstances`.

    Args:
        root: Folder the ``file_name`` entries are relative to.
        ann_file: COCO annotation JSON.
        transforms: ``transforms(image, mask) -> (image, mask)``, e.g. a
            ``torchvision.transforms.v2.Compose``.
        remove_empty: Drop images without (non-crowd) annotations.
        ignore_index: Label of crowd and unknown pixels; must not be in ``0..K``.
        invalid: ``"drop"``, ``"raise"`` or ``"keep"``: what to do with invalid annotations.
        min_box_size: Smallest width and height, in pixels inside the image, of a kept box.

    Attributes:
        classes (list[str]): ``"background"``, then the category names.
        num_classes (int): ``K + 1`` (background included).
        category_id_to_label (dict[int, int]): Category id -> label in ``1..K``.
        label_to_category_id (dict[int, int]): Label -> category id.

    Raises:
        FileNotFoundError, ValueError, TypeError: As `visionblocks.data.CocoInstances`;
            also a ValueError for an ``ignore_index`` inside ``0..K``.

    Examples:
        >>> import tempfile
        >>> from visionblocks.data import make_synthetic_coco
        >>> folder = tempfile.TemporaryDirectory()
        >>> ann = make_synthetic_coco(folder.name, num_images=2, image_size=(64, 80), seed=3)
        >>> dataset = CocoSegmentation(f"{folder.name}/images", ann)
        >>> image, mask = dataset[0]
        >>> mask.shape, mask.dtype, dataset.num_classes
        (torch.Size([64, 80]), torch.int64, 4)
        >>> sorted(set(mask.unique().tolist()) - {0}) <= [1, 2, 3]
        True
        >>> folder.cleanup()
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        ann_file: str | os.PathLike[str],
        *,
        transforms: Callable[..., Any] | None = None,
        remove_empty: bool = False,
        ignore_index: int = 255,
        invalid: InvalidPolicy = "drop",
        min_box_size: float = 0.0,
    ) -> None:
        check_type("remove_empty", remove_empty, bool)
        check_type("ignore_index", ignore_index, int)
        self.remove_empty = remove_empty
        self.ignore_index = ignore_index
        super().__init__(
            root,
            ann_file,
            transforms=transforms,
            contiguous_labels=True,
            invalid=invalid,
            min_box_size=min_box_size,
        )
        # Labels 1..K: 0 is background.
        self.category_id_to_label = {k: v + 1 for k, v in self.category_id_to_label.items()}
        self.label_to_category_id = {v: k for k, v in self.category_id_to_label.items()}
        self.classes = ["background", *self.classes]
        self._label_lookup = self._lookup_table()
        if 0 <= ignore_index < self.num_classes:
            raise ValueError(
                f"ignore_index={ignore_index} collides with a label (0..{self.num_classes - 1})"
            )

    @property
    def num_classes(self) -> int:
        """Number of labels, background included."""
        return len(self.classes)

    def _select(self, entries: list[Any]) -> list[Any]:
        if not self.remove_empty:
            return entries
        return [e for e in entries if (~e.iscrowd).any()]

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from torchvision import tv_tensors

        entry = self._entries[self._index(index)]
        image = tv_tensors.Image(self._image(entry))
        height, width = entry.height, entry.width
        semantic = torch.zeros(height, width, dtype=torch.int64)
        if len(entry.iscrowd):
            instance = np.flatnonzero(~entry.iscrowd)
            order = instance[np.argsort(-entry.area[instance], kind="stable")]
            segmentations = [entry.segmentations[i] for i in order]
            masks = segmentation_masks(segmentations, height, width).bool()
            labels = self._labels(entry.category_ids[order])
            for mask, label in zip(masks, labels):
                semantic[mask] = label
            ignored = [i for i, seg in zip(order, segmentations) if not seg]
            crowd = np.flatnonzero(entry.iscrowd)
            crowd_masks = segmentation_masks([entry.segmentations[i] for i in crowd], height, width)
            for mask in crowd_masks.bool():
                semantic[mask] = self.ignore_index
            for i in [*ignored, *(c for c, seg in zip(crowd, crowd_masks) if not seg.any())]:
                x1, y1 = (math.floor(float(v)) for v in entry.boxes[i][:2])
                x2, y2 = (math.ceil(float(v)) for v in entry.boxes[i][2:])
                semantic[y1:y2, x1:x2] = self.ignore_index
        mask = tv_tensors.Mask(semantic)
        if self.transforms is not None:
            image, mask = self._transformed(image, mask, "mask")
        return image, mask

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(images={len(self)}, classes={self.num_classes}, "
            f"root='{self.root}', ann_file='{self.ann_file}', ignore_index={self.ignore_index})"
        )
