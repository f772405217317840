"""A small hand-made COCO dataset that exercises every annotation form.

Images (all 40 x 60, H x W, unless noted):

1. ``rgb.jpg``: a polygon (category 3), a two-part polygon (category 7), a compressed RLE
   (category 1), and a crowd annotation as uncompressed RLE (category 3).
2. ``grey.png``: one polygon (category 1); a grey-scale file.
3. ``rgba.png``: no annotations; an RGBA file.
4. ``cmyk.jpg``: a degenerate box (zero width; dropped) and a box whose part outside the
   image is clipped, without a segmentation (category 7).
5. ``crowd_only.png``: only a crowd annotation (polygon with ``iscrowd=1``).
6. ``sub/nested.png``: a file in a subfolder, 30 x 20, one polygon (category 7).

Category ids are 1, 3 and 7 (names "cat", "dog", "emu"): not contiguous, so the label
maps are exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

H, W = 40, 60
CATEGORIES = [
    {"id": 7, "name": "emu", "supercategory": "bird"},
    {"id": 1, "name": "cat", "supercategory": "animal"},
    {"id": 3, "name": "dog", "supercategory": "animal"},
]


def _rle_box(x0: int, y0: int, x1: int, y1: int, h: int = H, w: int = W) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    m[y0:y1, x0:x1] = 1
    return m


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's crowd format: column-major run lengths starting with zeros."""
    flat = mask.flatten(order="F")
    counts, value, run = [], 0, 0
    for v in flat:
        if v == value:
            run += 1
        else:
            counts.append(run)
            value, run = v, 1
    counts.append(run)
    return {"counts": [int(c) for c in counts], "size": list(mask.shape)}


def _image(path: Path, mode: str, size: tuple[int, int] = (H, W), seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"quality": 95} if path.suffix == ".jpg" else {}
    Image.fromarray(rgb).convert(mode).save(path, **options)


def write_dataset(root: Path) -> Path:
    """Write the images under ``root/images`` and return the annotation file's path."""
    images_dir = root / "images"
    _image(images_dir / "rgb.jpg", "RGB", seed=1)
    _image(images_dir / "grey.png", "L", seed=2)
    _image(images_dir / "rgba.png", "RGBA", seed=3)
    _image(images_dir / "cmyk.jpg", "CMYK", seed=4)
    _image(images_dir / "crowd_only.png", "RGB", seed=5)
    _image(images_dir / "sub" / "nested.png", "RGB", size=(30, 20), seed=6)

    compressed = mask_utils.encode(np.asfortranarray(_rle_box(40, 5, 55, 20)))
    compressed["counts"] = compressed["counts"].decode("ascii")
    crowd = _uncompressed_rle(_rle_box(2, 25, 30, 38))
    images = [
        {"id": 1, "file_name": "rgb.jpg", "height": H, "width": W},
        {"id": 2, "file_name": "grey.png", "height": H, "width": W},
        {"id": 3, "file_name": "rgba.png", "height": H, "width": W},
        {"id": 4, "file_name": "cmyk.jpg", "height": H, "width": W},
        {"id": 5, "file_name": "crowd_only.png", "height": H, "width": W},
        {"id": 6, "file_name": "sub/nested.png", "height": 30, "width": 20},
    ]
    annotations = [
        _poly(10, 1, 3, [[2.0, 2.0, 20.0, 2.0, 20.0, 14.0, 2.0, 14.0]]),
        _poly(11, 1, 7, [[25.0, 3.0, 35.0, 3.0, 30.0, 12.0], [25.0, 14.0, 35.0, 14.0, 30.0, 22.0]]),
        {
            "id": 12, "image_id": 1, "category_id": 1, "segmentation": compressed,
            "bbox": [40.0, 5.0, 15.0, 15.0], "area": 225.0, "iscrowd": 0,
        },
        {
            "id": 13, "image_id": 1, "category_id": 3, "segmentation": crowd,
            "bbox": [2.0, 25.0, 28.0, 13.0], "area": 364.0, "iscrowd": 1,
        },
        _poly(20, 2, 1, [[5.0, 5.0, 30.0, 8.0, 12.0, 30.0]]),
        {
            "id": 40, "image_id": 4, "category_id": 1, "segmentation": [],
            "bbox": [10.0, 10.0, 0.0, 5.0], "area": 0.0, "iscrowd": 0,
        },
        {
            "id": 41, "image_id": 4, "category_id": 7,
            "bbox": [50.0, 30.0, 20.0, 20.0], "area": 100.0, "iscrowd": 0,
        },
        {**_poly(50, 5, 3, [[1.0, 1.0, 20.0, 1.0, 20.0, 20.0]]), "iscrowd": 1},
        _poly(60, 6, 7, [[2.0, 3.0, 15.0, 3.0, 15.0, 25.0, 2.0, 25.0]], size=(30, 20)),
    ]  # fmt: skip
    path = root / "annotations.json"
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": CATEGORIES})
    )
    return path


def _poly(
    ann_id: int, image_id: int, category_id: int, polygons: list[list[float]], size=(H, W)
) -> dict[str, Any]:
    rle = mask_utils.merge(mask_utils.frPyObjects(polygons, *size))
    xs = [v for p in polygons for v in p[0::2]]
    ys = [v for p in polygons for v in p[1::2]]
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "segmentation": polygons,
        "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)],
        "area": float(mask_utils.area(rle)),
        "iscrowd": 0,
    }
