"""Benchmark case: loading COCO items with masks against torchvision's wrapped CocoDetection.

The data is synthetic (`visionblocks.data.make_synthetic_coco`): 64 JPEG images of
320 x 416 with 1 to 6 shapes each, written once to ``<tempdir>/visionblocks-bench/coco``.
One call reads every item (image, boxes, labels, masks) in order, single-threaded:

- ours: ``CocoDetection(..., with_masks=True)[i]``: ``tv_tensors.Image``, XYXY
  ``BoundingBoxes``, contiguous labels, ``Mask`` ``(N, H, W)``;
- peer: ``wrap_dataset_for_transforms_v2(torchvision.datasets.CocoDetection(...),
  target_keys={"boxes", "labels", "masks", "image_id"})[i]`` with the PIL image turned into
  a tensor (``pil_to_tensor``), so both sides hand a model the same things.

Target: at least as fast as the peer (the issue aims at 1.5x).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from visionblocks.bench.case import BenchCase, register_case

__all__ = ["COCO_LOAD_MASKS"]

_NUM_IMAGES = 64
_SIZE = (320, 416)


def _data() -> tuple[str, str]:
    """Write the synthetic dataset once; a marker holding the generator's version says it is
    complete and current (another visionblocks version writes it again)."""
    import visionblocks
    from visionblocks.data.synthetic import make_synthetic_coco

    root = os.path.join(tempfile.gettempdir(), "visionblocks-bench", "coco-320x416")
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

    from visionblocks.data.coco import CocoDetection

    images, ann = _data()
    peer = torchvision.datasets.wrap_dataset_for_transforms_v2(
        torchvision.datasets.CocoDetection(images, ann),
        target_keys={"boxes", "labels", "masks", "image_id"},
    )
    return {"ours": CocoDetection(images, ann, with_masks=True), "peer": peer}


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
        min_speedup=1.0,
        threads=1,
    )
)
