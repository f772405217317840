"""The demo's data: synthetic COCO splits (written once) and their loaders (see `visionblocks.cli.demo`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from visionblocks import distributed as dist_utils
from visionblocks._core.version import __version__

__all__ = ["BATCH_SIZE", "IMAGE_SIZE", "NUM_CLASSES", "demo_data", "demo_loaders"]

IMAGE_SIZE = (128, 128)
NUM_CLASSES = 3
# 4096 training images, not 512: 850 steps of 16 see each about 3 times instead of 27; over
# seeds 0-13 the drawn images were perfect more often (11 of 14 runs against 7;
# docs/benchmarks.md#the-demo). Written in about 5 s, 200 MB decoded.
TRAIN_IMAGES, VAL_IMAGES = 4096, 64
BATCH_SIZE = 16  # the global batch: split over the ranks

_DATA = {"image_size": IMAGE_SIZE, "num_classes": NUM_CLASSES, "max_objects": 4,
         "object_size": (0.15, 0.45)}  # fmt: skip


class AugmentedCollate:
    """`visionblocks.data.collate_detection`, then one `visionblocks.transforms.RandomAffine`
    draw (scale, shift, mirror) for the whole batch: one warp call per step, the boxes of
    every image in one target (each tagged with its image, so that those it drops go with
    their labels). The targets come back with ``boxes`` and ``labels`` only."""

    def __init__(self) -> None:
        from visionblocks.transforms import RandomAffine

        self.warp = RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.75, 1.25),
                                 hflip=0.5, min_size=2.0, instance_keys=("labels", "image"))  # fmt: skip

    def __call__(self, samples: list[Any]) -> Any:
        from torchvision import tv_tensors

        from visionblocks.data import DetectionBatch, collate_detection

        images, targets, sizes = collate_detection(samples)
        counts = torch.tensor([len(t["boxes"]) for t in targets])
        merged = {
            "boxes": tv_tensors.BoundingBoxes(torch.cat([t["boxes"] for t in targets]),
                                              format="XYXY", canvas_size=images.shape[-2:]),
            "labels": torch.cat([t["labels"] for t in targets]),
            "image": torch.repeat_interleave(torch.arange(len(targets)), counts),
        }  # fmt: skip
        images, merged = self.warp(tv_tensors.Image(images), merged)
        split = torch.bincount(merged["image"], minlength=len(targets)).tolist()
        boxes, labels = merged["boxes"].split(split), merged["labels"].split(split)
        targets = [{"boxes": b, "labels": c} for b, c in zip(boxes, labels)]
        return DetectionBatch(images.as_subclass(torch.Tensor), targets, sizes)


def _split(root: Path, split: str, num_images: int, seed: int) -> Path:
    """The split's annotation file, written unless the same data is already there."""
    from visionblocks.data import make_synthetic_coco

    ann = root / split / "annotations.json"
    wanted = {"num_images": num_images, "seed": seed, **_DATA}
    if ann.is_file():
        try:
            data = json.loads(ann.read_text())
            found = data["info"]["parameters"]
            same = data["info"].get("version") == __version__ and all(
                found.get(k) == (list(v) if isinstance(v, tuple) else v) for k, v in wanted.items()
            )
            images = (root / split / "images" / i["file_name"] for i in data["images"])
            if same and all(path.is_file() for path in images):
                return ann
        except (KeyError, ValueError, TypeError):
            pass
    return make_synthetic_coco(root / split, seed=seed, num_images=num_images, **_DATA)


def demo_data(out: Path, seed: int, train_images: int | None = None) -> tuple[Path, Path]:
    """Train and val annotation files (rank 0 writes them, the others wait); ``train_images``
    (default `TRAIN_IMAGES`) training images. Each image is drawn from its own seed, so a
    smaller count gives the first images of a larger one."""
    if dist_utils.is_main_process():
        _split(out / "data", "train", TRAIN_IMAGES if train_images is None else train_images, seed)
        _split(out / "data", "val", VAL_IMAGES, seed + 1)
    dist_utils.barrier()
    return out / "data" / "train" / "annotations.json", out / "data" / "val" / "annotations.json"


def demo_loaders(train_ann: Path, val_ann: Path, seed: int) -> tuple[Any, Any, Any]:
    """The training loader (the images decoded once, batches warped by `AugmentedCollate`),
    the val loader and the val dataset."""
    from visionblocks.data import CocoInstances, collate_detection

    coco = CocoInstances(train_ann.parent / "images", train_ann)
    train = [coco[i] for i in range(len(coco))]  # 4096 small images: 200 MB
    val = CocoInstances(val_ann.parent / "images", val_ann)
    world = dist_utils.get_world_size()
    if BATCH_SIZE % world:
        raise ValueError(f"the batch of {BATCH_SIZE} does not split over {world} ranks")
    generator = torch.Generator().manual_seed(seed)
    if world > 1:
        sampler: Any = DistributedSampler(train, shuffle=True, seed=seed, drop_last=True)
        val_sampler: Any = DistributedSampler(val, shuffle=False)
    else:
        sampler, val_sampler = RandomSampler(train, generator=generator), None
    train_loader = DataLoader(train, batch_size=BATCH_SIZE // world, sampler=sampler,
                              collate_fn=AugmentedCollate(), drop_last=True)  # fmt: skip
    val_loader = DataLoader(val, batch_size=16, sampler=val_sampler, collate_fn=collate_detection)
    return train_loader, val_loader, val
