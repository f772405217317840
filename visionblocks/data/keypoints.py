"""COCO person-keypoint annotations as model-ready ``tv_tensors``: `CocoKeypoints`.

A COCO keypoint file (``person_keypoints_*.json``) is an instances file whose category
names its ``K`` key points (``keypoints``) and bones (``skeleton``), and whose annotations
carry ``keypoints: [x1, y1, v1, ..., xK, yK, vK]`` and ``num_keypoints``.

Convention:
    Key points are pixel indices, as COCO's and torchvision's ``KeyPoints`` (whose horizontal
    flip maps ``x`` to ``W - 1 - x``): the point ``(j, i)`` is the centre of pixel ``(row i,
    column j)``. Boxes and polygons use COCO's continuous coordinates, where that centre is
    ``(j + 0.5, i + 0.5)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from visionblocks._core.checks import check_choice
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import DATASETS
from visionblocks.data._coco_checks import KeypointSchema, is_int, keypoint_schema
from visionblocks.data._coco_index import ImageEntry, InvalidPolicy, valid_ids
from visionblocks.data.coco import CocoInstances, CrowdPolicy
from visionblocks.ops.keypoints import flip_permutation, keypoint_flip_pairs

__all__ = ["COCO_KEYPOINT_NAMES", "CocoKeypoints"]
__dir__ = public_dir(__name__, __all__)

COCO_KEYPOINT_NAMES: tuple[str, ...] = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)
"""The 17 key points of COCO's ``person`` category, in the file's order."""

OtherCategories = Literal["drop", "keep"]


@DATASETS.register(name="coco_keypoints")
class CocoKeypoints(CocoInstances):
    """COCO keypoint annotations as ``(tv_tensors.Image, target)`` pairs.

    For any file with a category that has ``keypoints`` (its key point names) and,
    optionally, ``skeleton``; registered in ``DATASETS`` as ``"coco_keypoints"``. ``target``
    holds everything `visionblocks.data.CocoInstances` gives, plus:

    - ``keypoints``: ``tv_tensors.KeyPoints`` ``(N, K, 2)`` float32, ``(x, y)`` as in the
      file, ``canvas_size=(H, W)``;
    - ``keypoints_visibility``: int64 ``(N, K)``, COCO's flags: 0 not labelled, 1 labelled
      but not visible, 2 labelled and visible. A point with ``v = 0`` has the coordinates
      the file gives it (COCO writes ``0, 0``): mask with the visibility.

    torchvision's Keypoint R-CNN takes ``(N, K, 3)``, the flag as third column (the example).

    A category with a non-empty ``keypoints`` list is a keypoint category; a file needs at
    least one, and several must agree on names, skeleton and sigmas. Other categories'
    annotations are left out with ``other_categories="drop"`` (default, as pycocotools'
    keypoint evaluation; ``classes`` lists only keypoint categories) or kept unlabelled.

    Invalid annotations follow ``invalid`` as in `visionblocks.data.CocoInstances`, with five
    key point reasons; ``invalid="keep"`` keeps such an annotation with its key points
    unlabelled. An annotation without ``keypoints`` is not invalid (none labelled).

    Transforms: torchvision's v2 transforms move the ``KeyPoints`` with the image but leave
    the visibility alone and do not swap left and right points on a flip (a model trained so
    learns a mirrored skeleton); `visionblocks.transforms` (``RandomAffine``, ``warp_sample``)
    does both (``flip_pairs=dataset.flip_pairs``). ``v2.SanitizeBoundingBoxes(labels_getter=
    visionblocks.data.instance_fields)`` filters the key points and their visibility too
    (put it last: the dataset wraps the plain tensor it hands back as ``KeyPoints`` again).

    Args:
        root: Folder the ``file_name`` entries are relative to.
        ann_file: COCO keypoint annotation JSON.
        transforms: ``transforms(image, target) -> (image, target)``, e.g. a
            ``torchvision.transforms.v2.Compose``.
        with_masks: Decode instance masks.
        with_polygons: Serve the polygons of each instance (``polygons``).
        remove_empty: Drop images without annotations.
        contiguous_labels: Labels ``0..C-1`` (True) or raw category ids (False).
        crowd: ``"keep"``, ``"drop"`` or ``"ignore"``.
        remove_crowd_only: Drop images whose only annotations are crowd.
        other_categories: ``"drop"`` or ``"keep"`` other categories' annotations.
        flip_pairs: ``(left, right)`` key point index pairs a horizontal flip swaps; default
            from the names (`visionblocks.ops.keypoints.keypoint_flip_pairs`); ``[]``: none.
        invalid: ``"drop"``, ``"raise"`` or ``"keep"``: what to do with invalid annotations.
        min_box_size: Smallest width and height, in pixels inside the image, of a kept box.

    Attributes:
        keypoint_names (list[str]): The ``K`` key point names, in order.
        num_keypoints (int): ``K``.
        skeleton (list[tuple[int, int]]): Bones as 0-based index pairs (COCO's are 1-based).
        flip_pairs (list[tuple[int, int]]): ``(left, right)`` index pairs.
        sigmas (Tensor | None): float32 ``(K,)`` OKS sigmas: the category's ``sigmas`` (not
            a COCO field) when given, else COCO's 17 person sigmas when the names are
            `COCO_KEYPOINT_NAMES`, else None.
        num_other (int): Annotations of other categories left out (``"drop"``).
        coco: As `visionblocks.data.CocoInstances` (so are its other attributes).

    Raises:
        FileNotFoundError: As `visionblocks.data.CocoInstances`.
        ValueError: As `visionblocks.data.CocoInstances`; also no keypoint category, keypoint
            categories that differ or are malformed, bad ``flip_pairs``, or names with a
            ``left_`` but no ``right_`` partner (pass ``flip_pairs``).
        TypeError: Arguments of the wrong type.

    Examples:
        >>> import tempfile
        >>> from visionblocks.data import make_synthetic_coco
        >>> folder = tempfile.TemporaryDirectory()
        >>> ann = make_synthetic_coco(folder.name, num_images=4, image_size=(64, 96), seed=1,
        ...                           keypoints=True)
        >>> dataset = CocoKeypoints(f"{folder.name}/images", ann)
        >>> dataset.classes, dataset.num_keypoints, dataset.keypoint_names[:3]
        (['figure'], 9, ['head', 'left_shoulder', 'right_shoulder'])
        >>> dataset.flip_pairs
        [(1, 2), (3, 4), (5, 6), (7, 8)]
        >>> image, target = dataset[0]
        >>> n = len(target["boxes"])
        >>> target["keypoints"].shape == (n, 9, 2), target["keypoints"].canvas_size
        (True, (64, 96))
        >>> rcnn = torch.cat([target["keypoints"], target["keypoints_visibility"][..., None]], -1)
        >>> rcnn.shape == (n, 9, 3), rcnn.dtype
        (True, torch.float32)
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
        other_categories: OtherCategories = "drop",
        flip_pairs: Sequence[tuple[int, int]] | None = None,
        invalid: InvalidPolicy = "drop",
        min_box_size: float = 0.0,
    ) -> None:
        check_choice("other_categories", other_categories, ("drop", "keep"))
        if flip_pairs is not None and (
            isinstance(flip_pairs, (str, bytes)) or not isinstance(flip_pairs, Sequence)
        ):
            raise TypeError(
                "flip_pairs must be a sequence of (left, right) index pairs or None, got "
                f"{type(flip_pairs).__name__}"
            )
        self.other_categories = other_categories
        self._schema: KeypointSchema | None = None
        self.num_other = 0
        super().__init__(
            root,
            ann_file,
            transforms=transforms,
            with_masks=with_masks,
            with_polygons=with_polygons,
            remove_empty=remove_empty,
            contiguous_labels=contiguous_labels,
            crowd=crowd,
            remove_crowd_only=remove_crowd_only,
            invalid=invalid,
            min_box_size=min_box_size,
        )
        schema = self._schema
        assert schema is not None  # set by _prepare, or construction raised
        self.keypoint_names: list[str] = list(schema.names)
        self.num_keypoints: int = len(schema.names)
        self.skeleton: list[tuple[int, int]] = list(schema.skeleton)
        self.flip_pairs: list[tuple[int, int]] = self._flip_pairs(flip_pairs)
        self.sigmas: Tensor | None = _sigmas(schema)

    # ----------------------------------------------------------------- CocoBase hooks
    def _prepare(self, data: dict[str, Any]) -> None:
        where = f"COCO annotation file '{self.ann_file}'"
        schema, problems = keypoint_schema(where, data["categories"])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)
        if schema is None:
            raise ValueError(
                f"{where} has no keypoint category (a category with a 'keypoints' list of key "
                "point names, as in person_keypoints_*.json); load it with CocoInstances"
            )
        self._schema = schema
        if self.other_categories == "drop":
            ours = set(schema.category_ids)
            others = valid_ids(data, "categories") - ours
            anns = data["annotations"]
            # Only annotations of a known other category go: an unknown category_id stays,
            # to be reported as invalid (unknown_category).
            kept = [
                a for a in anns if not (is_int(a["category_id"]) and a["category_id"] in others)
            ]
            self.num_other = len(anns) - len(kept)
            data["annotations"] = kept
            data["categories"] = [c for c in data["categories"] if c["id"] in ours]

    def _keypoint_counts(self) -> dict[Any, int] | None:
        return self._schema.counts if self._schema is not None else None

    def _add_fields(self, entry: ImageEntry, rows: np.ndarray, target: dict[str, Any]) -> None:
        from torchvision import tv_tensors

        k = len(self._schema.names) if self._schema is not None else 0
        assert entry.keypoints is not None and entry.visibility is not None
        target["keypoints"] = tv_tensors.KeyPoints(
            torch.from_numpy(entry.keypoints[rows]).reshape(-1, k, 2),
            canvas_size=(entry.height, entry.width),
        )
        target["keypoints_visibility"] = torch.from_numpy(entry.visibility[rows]).reshape(-1, k)

    def _after_transforms(self, target: dict[str, Any]) -> dict[str, Any]:
        """Wrap key points that ``SanitizeBoundingBoxes`` gave back as a plain tensor."""
        from torchvision import tv_tensors

        points, boxes = target.get("keypoints"), target.get("boxes")
        if (
            isinstance(points, Tensor)
            and not isinstance(points, tv_tensors.KeyPoints)
            and points.dim() >= 2
            and points.shape[-1] == 2
            and isinstance(boxes, tv_tensors.BoundingBoxes)
        ):
            target = dict(target)
            target["keypoints"] = tv_tensors.KeyPoints(points, canvas_size=boxes.canvas_size)
        return target

    # --------------------------------------------------------------------------- helpers
    def _flip_pairs(self, flip_pairs: Sequence[tuple[int, int]] | None) -> list[tuple[int, int]]:
        if flip_pairs is None:
            try:
                return keypoint_flip_pairs(self.keypoint_names)
            except ValueError as exc:
                raise ValueError(
                    f"flip_pairs: cannot read the left/right pairs from the key point names of "
                    f"'{self.ann_file}': {exc} (as flip_pairs=[(left, right), ...], or [] for "
                    "none)"
                ) from None
        try:
            flip_permutation(self.num_keypoints, flip_pairs)
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"flip_pairs must be (left, right) pairs of key point indices in "
                f"[0, {self.num_keypoints}), each index in one pair at most: {exc}"
            ) from None
        return [(int(i), int(j)) for i, j in flip_pairs]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(images={len(self)}, classes={len(self.classes)}, "
            f"keypoints={self.num_keypoints}, root='{self.root}', ann_file='{self.ann_file}', "
            f"with_masks={self.with_masks}, crowd={self.crowd!r}, "
            f"remove_empty={self.remove_empty})"
        )


def _sigmas(schema: KeypointSchema) -> Tensor | None:
    """The file's sigmas; else COCO's person sigmas (pycocotools') for COCO's 17 names."""
    if schema.sigmas is not None:
        return torch.tensor(schema.sigmas, dtype=torch.float32)
    if schema.names == COCO_KEYPOINT_NAMES:
        from pycocotools.cocoeval import Params

        return torch.as_tensor(Params(iouType="keypoints").kpt_oks_sigmas, dtype=torch.float32)
    return None
