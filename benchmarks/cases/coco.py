"""Benchmark case: loading COCO items with masks against torchvision's wrapped CocoDetection.

The data is synthetic (`visionblocks.data.make_synthetic_coco`): 64 JPEG images of
320 x 416 with 1 to 6 shapes each, written once to ``coco-320x416`` in the benchmark cache
(`benchmarks.cases._cache`).
One call reads every item (image, boxes, labels, masks) in order, single-threaded:

- ours: ``CocoInstances(..., with_masks=True)[i]``: ``tv_tensors.Image``, XYXY
  ``BoundingBoxes``, contiguous labels, ``Mask`` ``(N, H, W)``;
- peer: ``wrap_dataset_for_transforms_v2(torchvision.datasets.CocoDetection(...),
  target_keys={"boxes", "labels", "masks", "image_id"})[i]`` with the PIL image turned into
  a tensor (``pil_to_tensor``), so both sides hand a model the same things.

Target: 1.5x the peer. The output check reads the first 16 items on both sides and
compares images, boxes, labels (ours mapped back to category ids) and masks exactly.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

from benchmarks.cases._cache import cache_dir
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["COCO_BUILD_INDEX", "COCO_LOAD_MASKS"]

_NUM_IMAGES = 64
_SIZE = (320, 416)


def _data() -> tuple[str, str]:
    """Write the synthetic dataset once; a marker holding the generator's version says it is
    complete and current (another visionblocks version writes it again)."""
    import visionblocks
    from visionblocks.data.synthetic import make_synthetic_coco

    root = cache_dir("coco-320x416")
    ann = os.path.join(root, "annotations.json")
    done = os.path.join(root, ".complete")
    stamp = f"{visionblocks.__version__} {_NUM_IMAGES} {_SIZE}"
    current = os.path.exists(done) and Path(done).read_text() == stamp
    if not current:
        make_synthetic_coco(root, num_images=_NUM_IMAGES, image_size=_SIZE, seed=0)
        Path(done).write_text(stamp)
    return os.path.join(root, "images"), ann


def _setup() -> dict[str, Any]:
    import torchvision

    from visionblocks.data.coco import CocoInstances

    images, ann = _data()
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints while indexing
        peer = torchvision.datasets.CocoDetection(images, ann)
    peer = torchvision.datasets.wrap_dataset_for_transforms_v2(
        peer, target_keys={"boxes", "labels", "masks", "image_id"}
    )
    return {"ours": CocoInstances(images, ann, with_masks=True), "peer": peer}


def _ours(state: dict[str, Any]) -> int:
    dataset = state["ours"]
    return sum(len(dataset[i][1]["masks"]) for i in range(len(dataset)))


def _torchvision(state: dict[str, Any]) -> int:
    from torchvision.transforms.v2.functional import pil_to_tensor

    dataset, total = state["peer"], 0
    for i in range(len(dataset)):
        image, target = dataset[i]
        pil_to_tensor(image)
        total += len(target["masks"])
    return total


_CHECKED_ITEMS = 16


def _items(state: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``outputs`` hook: the first items of each side, as plain tensors to compare."""
    import torch
    from torchvision.transforms.v2.functional import pil_to_tensor

    ours, peer = state["ours"], state["peer"]
    to_category = torch.tensor([ours.label_to_category_id[i] for i in range(len(ours.classes))])
    ours_items, peer_items = [], []
    for i in range(_CHECKED_ITEMS):
        image, target = ours[i]
        ours_items.append({
            "image": image.as_subclass(torch.Tensor),
            "boxes": target["boxes"].as_subclass(torch.Tensor),
            "labels": to_category[target["labels"]],
            "masks": target["masks"].as_subclass(torch.Tensor).bool(),
        })  # fmt: skip
        image, target = peer[i]
        peer_items.append({
            "image": pil_to_tensor(image),
            "boxes": target["boxes"].as_subclass(torch.Tensor),
            "labels": target["labels"],
            "masks": target["masks"].as_subclass(torch.Tensor).bool(),
        })  # fmt: skip
    return ours_items, peer_items


COCO_LOAD_MASKS = register_case(
    BenchCase(
        name="coco_load_masks_320x416",
        setup=_setup,
        ours=_ours,
        peer=_torchvision,
        peer_name="torchvision CocoDetection + v2 wrapper",
        description=(
            f"read {_NUM_IMAGES} synthetic COCO items ({_SIZE[0]}x{_SIZE[1]} JPEG, 1-6 objects) "
            "with boxes, labels and masks, single process"
        ),
        min_speedup=1.5,
        threads=1,
        check=same_outputs(rtol=0.0, atol=1e-4),
        outputs=_items,
    )
)


# ------------------------------------------------------------------ building the index
_INDEX_IMAGES, _INDEX_ANNS = 5000, 40000


def _index_data() -> tuple[str, str]:
    """A clean COCO file of 5,000 images (not written: construction never opens them) and
    40,000 polygon annotations, written once."""
    import json

    import numpy as np

    root = cache_dir("coco-index-40k")
    ann = os.path.join(root, "annotations.json")
    images = os.path.join(root, "images")
    if os.path.exists(ann):
        return images, ann
    os.makedirs(images, exist_ok=True)
    rng = np.random.default_rng(0)
    annotations = []
    for i in range(_INDEX_ANNS):
        x, y = rng.uniform(0, 500, 2)
        w, h = rng.uniform(4, 120, 2)
        n = int(rng.integers(4, 16))
        angles = np.sort(rng.uniform(0, 2 * np.pi, n))
        xs = x + w / 2 * (1 + np.cos(angles))
        ys = y + h / 2 * (1 + np.sin(angles))
        polygon = np.round(np.stack([xs, ys], 1).ravel(), 2).tolist()
        annotations.append({
            "id": i + 1, "image_id": i % _INDEX_IMAGES + 1, "category_id": i % 80 + 1,
            "bbox": [round(float(x), 2), round(float(y), 2), round(float(w), 2),
                     round(float(h), 2)],
            "area": round(float(w * h * 0.7), 2), "iscrowd": 0, "segmentation": [polygon],
        })  # fmt: skip
    data = {
        "images": [
            {"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "height": 640, "width": 640}
            for i in range(_INDEX_IMAGES)
        ],
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": f"class {i + 1}"} for i in range(80)],
    }
    partial = ann + ".partial"
    with open(partial, "w") as f:
        json.dump(data, f)
    os.replace(partial, ann)
    return images, ann


def _build_ours(state: tuple[str, str]) -> int:
    from visionblocks.data.coco import CocoInstances

    return len(CocoInstances(*state))


def _build_torchvision(state: tuple[str, str]) -> int:
    import torchvision

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints while indexing
        return len(torchvision.datasets.CocoDetection(*state))


COCO_BUILD_INDEX = register_case(
    BenchCase(
        name="coco_build_index_40k",
        setup=_index_data,
        ours=_build_ours,
        peer=_build_torchvision,
        peer_name="torchvision CocoDetection",
        description=(
            f"construct the dataset on a clean file of {_INDEX_IMAGES} images and "
            f"{_INDEX_ANNS} polygon annotations (JSON, checks, index); no speed target, "
            "quiet or busy: ours checks every annotation, box and polygon (and the peer "
            "none), so the ratio shows the price of those checks"
        ),
        min_speedup=None,
        min_busy_speedup=None,  # not a collapse: the busy ratio stays the quiet one
        threads=1,
        check=same_outputs(rtol=0.0, atol=0.0),
    )
)
