"""A synthetic COCO dataset: coloured shapes (one shape per category) on textured backgrounds.

`make_synthetic_coco` writes real COCO files: the library's built-in default data (the demo,
tests and benchmarks use it). Nothing is downloaded.

Convention:
    - Sizes are ``(H, W)``. Annotations use COCO pixel coordinates: pixel ``(row i, column j)``
      covers ``[j, j + 1) × [i, i + 1)``, and ``bbox`` is ``[x, y, w, h]``.
    - Every object is painted by rasterising the polygon stored in its ``segmentation`` with
      pycocotools, so its painted (and visible: objects never overlap) pixels are exactly
      ``COCO.annToMask(ann)``.
    - Key points are pixel indices, as COCO's: ``(x, y)`` is the centre of pixel ``(row y,
      column x)``; every key point lies on a pixel of its figure's mask.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.version import __version__
from visionblocks.data._synthetic_draw import SYNTHETIC_CLASSES, figure_category, render

__all__ = ["SYNTHETIC_CLASSES", "make_synthetic_coco"]
__dir__ = public_dir(__name__, __all__)

_JPEG_QUALITY = 95
_MIN_SIDE = 16  # smallest image side accepted
_AUTO_PROGRESS = 200  # progress=None shows a bar from this many images on


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be int, got {type(value).__name__} ({value!r})")
    check_range(name, int(value), low, high)
    return int(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    return float(value)


def _pair(name: str, value: Any) -> tuple[Any, Any]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a tuple of 2 values, got {value!r}")
    return value[0], value[1]


def _category_ids(category_ids: Any, num_classes: int, keypoints: bool = False) -> list[int]:
    count = num_classes + (1 if keypoints else 0)
    if category_ids is None:
        return list(range(1, count + 1))
    if isinstance(category_ids, (str, bytes)) or not isinstance(category_ids, Sequence):
        raise TypeError(f"category_ids must be a sequence of int, got {category_ids!r}")
    ids = [_int("category_ids[]", v, 1) for v in category_ids]
    if len(ids) != count:
        expected = (
            f"num_classes + 1 = {count} ids (the figure's last, keypoints=True)"
            if keypoints
            else f"num_classes={num_classes} ids"
        )
        raise ValueError(f"category_ids must hold {expected}, got {len(ids)}: {ids}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"category_ids must be distinct, got {ids}")
    return ids


def make_synthetic_coco(
    root: str | os.PathLike[str],
    num_images: int = 64,
    image_size: tuple[int, int] = (256, 256),
    num_classes: int = 3,
    seed: int = 0,
    *,
    min_objects: int = 1,
    max_objects: int = 6,
    object_size: tuple[float, float] = (0.1, 0.35),
    image_format: Literal["jpg", "png"] = "jpg",
    crowd_prob: float = 0.0,
    empty_prob: float = 0.0,
    category_ids: Sequence[int] | None = None,
    keypoints: bool = False,
    progress: bool | None = None,
) -> Path:
    """Write a synthetic COCO dataset of shapes to ``root`` and return its annotation file.

    Writes ``root/images/000001.jpg`` ... (``.png`` with ``image_format="png"``) and
    ``root/annotations.json`` in the full COCO format (``images``, ``annotations``,
    ``categories`` with ``supercategory="shape"``, ``info`` with every argument under
    ``info["parameters"]``, empty ``licenses``).

    Category ``k`` is the shape ``SYNTHETIC_CLASSES[k]``, drawn at random size, stretch,
    rotation and colour on a textured background; an object's ``segmentation`` is one
    polygon (see the Convention), ``area`` its mask's pixel count, ``bbox`` its tight box.
    Objects do not overlap (one that finds no room is dropped). A crowd annotation covers 3
    to 8 small shapes of one class, as an uncompressed RLE.

    With ``keypoints=True`` the file is a COCO keypoint file with one more category,
    ``"figure"``: a gingerbread figure facing the viewer with 9 key points (``head``, then
    ``left_``/``right_`` ``shoulder``, ``hand``, ``hip``, ``foot``; its left on the image's
    right, as COCO's persons), a 1-based ``skeleton`` and OKS ``sigmas``. Half the objects
    are figures (all with ``num_classes=0``); points are visible (``v = 2``), labelled but
    not visible (1) or not labelled (0, written ``0, 0, 0``).

    The same arguments give byte-identical files, and image ``k`` does not depend on
    ``num_images``. JPEGs are written at quality 95; use ``"png"`` for exact pixels.

    Args:
        root: Output directory.
        num_images: Number of images N (0 writes an annotation file without images).
        image_size: ``(H, W)`` of every image, each side at least 16.
        num_classes: Number of shape categories K, 1 to ``len(SYNTHETIC_CLASSES)`` (10); 0
            too with ``keypoints=True`` (figures only).
        seed: Non-negative seed; different seeds give different data.
        min_objects: Fewest objects per non-empty image (at least 0).
        max_objects: Most objects per image (the count is uniform in between).
        object_size: ``(low, high)`` range of an object's size as a fraction of
            ``min(H, W)``, ``0 < low <= high <= 1``; never below 10 pixels (or the image).
        image_format: ``"jpg"`` (fast to decode) or ``"png"`` (lossless).
        crowd_prob: Probability that a non-empty image also gets one crowd annotation.
        empty_prob: Probability that an image has no objects (and no crowd).
        category_ids: K distinct positive category ids, in class order (default ``1..K``);
            with ``keypoints=True``, K + 1, the figure's last.
        keypoints: Draw figures with key points and write a keypoint file (see above).
        progress: Show a tqdm progress bar (on stderr); None shows it from 200 images on.

    Returns:
        The path ``root / "annotations.json"``.

    Raises:
        TypeError: When an argument has the wrong type.
        ValueError: When an argument is out of range.

    Examples:
        >>> import json, tempfile
        >>> with tempfile.TemporaryDirectory() as root:
        ...     ann_file = make_synthetic_coco(root, num_images=2, image_size=(64, 96), seed=1)
        ...     data = json.loads(ann_file.read_text())
        ...     files = sorted(p.name for p in (ann_file.parent / "images").iterdir())
        >>> ann_file.name, files
        ('annotations.json', ['000001.jpg', '000002.jpg'])
        >>> [(c["id"], c["name"]) for c in data["categories"]]
        [(1, 'circle'), (2, 'square'), (3, 'triangle')]
        >>> data["images"][0]
        {'id': 1, 'file_name': '000001.jpg', 'height': 64, 'width': 96}
    """
    check_type("root", root, (str, os.PathLike))
    num_images = _int("num_images", num_images, 0)
    h, w = (
        _int(f"image_size[{i}]", v, _MIN_SIDE)
        for i, v in enumerate(_pair("image_size", image_size))
    )
    check_type("keypoints", keypoints, bool)
    num_classes = _int("num_classes", num_classes, 0 if keypoints else 1, len(SYNTHETIC_CLASSES))
    seed = _int("seed", seed, 0)
    min_objects = _int("min_objects", min_objects, 0)
    max_objects = _int("max_objects", max_objects, min_objects)
    low, high = (_number("object_size", v) for v in _pair("object_size", object_size))
    check_range("object_size[0]", low, 0.0, 1.0, low_inclusive=False)
    check_range("object_size[1]", high, low, 1.0)
    check_choice("image_format", image_format, ("jpg", "png"))
    crowd_prob = _number("crowd_prob", crowd_prob)
    empty_prob = _number("empty_prob", empty_prob)
    check_range("crowd_prob", crowd_prob, 0.0, 1.0)
    check_range("empty_prob", empty_prob, 0.0, 1.0)
    ids = _category_ids(category_ids, num_classes, keypoints)
    if progress is not None:
        check_type("progress", progress, bool)

    params = {
        "num_images": num_images,
        "image_size": [h, w],
        "num_classes": num_classes,
        "seed": seed,
        "min_objects": min_objects,
        "max_objects": max_objects,
        "object_size": [low, high],
        "image_format": image_format,
        "crowd_prob": crowd_prob,
        "empty_prob": empty_prob,
        "category_ids": ids,
    }
    if keypoints:  # only then: files written without key points stay as they were
        params["keypoints"] = True
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    show = num_images >= _AUTO_PROGRESS if progress is None else progress
    for index in tqdm(range(num_images), desc="synthetic COCO", unit="img", disable=not show):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
        pixels, anns = render(rng, h, w, params)
        file_name = f"{index + 1:06d}.{image_format}"
        if image_format == "jpg":
            options = {"format": "JPEG", "quality": _JPEG_QUALITY, "subsampling": 0}
        else:
            options = {"format": "PNG", "compress_level": 1}
        Image.fromarray(pixels).save(root / "images" / file_name, **options)
        images.append({"id": index + 1, "file_name": file_name, "height": h, "width": w})
        for ann in anns:
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1, **ann})

    dataset = {
        "info": {
            "description": "visionblocks synthetic shapes (make_synthetic_coco)",
            "version": __version__,
            "parameters": params,
        },
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [
            {"id": cid, "name": SYNTHETIC_CLASSES[k], "supercategory": "shape"}
            for k, cid in enumerate(ids[:num_classes])
        ]
        + ([figure_category(ids[-1])] if keypoints else []),
    }
    ann_file = root / "annotations.json"
    partial = root / "annotations.json.partial"
    partial.write_text(json.dumps(dataset, separators=(",", ":")), encoding="utf-8")
    os.replace(partial, ann_file)
    return ann_file
