"""Train the reference FCOS detector on synthetic COCO data and evaluate it.

    python examples/train_detector.py [--steps N] [--out DIR]

Everything a detection training script needs, in the open: data with torchvision v2
augmentations, aspect-ratio grouped batches, a detector built from a config dict through the
registries, AdamW with warm-up and cosine decay, and COCO evaluation of the val split. With
``VISIONBLOCKS_QUICK=1`` it runs a few steps on a few images (a smoke test, used by CI).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler
from torchvision.transforms import v2

from visionblocks.data import (
    CocoInstances,
    GroupedBatchSampler,
    aspect_ratio_groups,
    coco_evaluate,
    collate_detection,
    instance_fields,
    make_synthetic_coco,
)
from visionblocks.models import build_detector

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"

CONFIG = {
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [16, 32, 64, 128]},
    "neck": {"type": "fpn", "out_channels": 64},
    "head": {"type": "fcos", "num_classes": 3, "num_convs": 2,
             "size_ranges": [(0, 32), (32, 64), (64, 1e8)]},
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4 if QUICK else 600)
    parser.add_argument("--out", default="examples-out/detector")
    args = parser.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)

    num_train, num_val = (32, 16) if QUICK else (512, 64)
    data = {"image_size": (128, 128), "max_objects": 4, "object_size": (0.15, 0.45)}
    train_ann = make_synthetic_coco(out / "train", num_images=num_train, seed=0, **data)
    val_ann = make_synthetic_coco(out / "val", num_images=num_val, seed=1, **data)
    augment = v2.Compose(
        [
            v2.RandomHorizontalFlip(),
            v2.RandomPhotometricDistort(p=0.5),
            v2.RandomZoomOut(fill=128, side_range=(1.0, 1.5), p=0.3),
            v2.Resize((128, 128)),
            v2.SanitizeBoundingBoxes(labels_getter=instance_fields),
        ]
    )
    train = CocoInstances(out / "train" / "images", train_ann, transforms=augment)
    val = CocoInstances(out / "val" / "images", val_ann)
    sampler = GroupedBatchSampler(RandomSampler(train), aspect_ratio_groups(train), batch_size=16)
    loader = DataLoader(train, batch_sampler=sampler, collate_fn=collate_detection)

    model = build_detector(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    warmup = min(50, args.steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps)),
    )
    start, step = time.perf_counter(), 0
    model.train()
    while step < args.steps:
        for images, targets, sizes in loader:
            losses = model(images, targets, sizes)
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % 100 == 0 or step == args.steps:
                parts = "  ".join(f"{k} {v.item():.3f}" for k, v in losses.items())
                print(f"step {step:4d}  {parts}  ({time.perf_counter() - start:.0f} s)")
            if step == args.steps:
                break

    model.eval()
    predictions = {}
    with torch.no_grad():
        for images, targets, sizes in DataLoader(val, batch_size=16, collate_fn=collate_detection):
            for target, output in zip(targets, model(images, image_sizes=sizes)):
                predictions[target["image_id"]] = output
    stats = coco_evaluate(predictions, val)
    print("val:", "  ".join(f"{k} {stats[k]:.3f}" for k in ("AP", "AP50", "AP75")))
    torch.save(model.state_dict(), out / "detector.pth")
    print(f"saved {out / 'detector.pth'}")


if __name__ == "__main__":
    main()
