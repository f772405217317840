"""Train the semantic FPN segmenter on synthetic COCO data and report mean IoU.

    python examples/train_segmenter.py [--steps N] [--loss ce|ohem|focal] [--out DIR]

`CocoSegmentation` paints the instance annotations into label maps (0 background, 1..K
objects, 255 ignored); the segmenter (``vb_tiny`` + `FPN` + `FPNSegHead`) is built through
the registries and trained with cross-entropy, OHEM cross-entropy (the hardest 25% of the
pixels) or the softmax focal loss. With ``VISIONBLOCKS_QUICK=1`` it runs a few steps.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from visionblocks.data import CocoSegmentation, make_synthetic_coco
from visionblocks.models import build_segmenter

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"
LOSSES = {"ce": {"loss": "ce"}, "ohem": {"loss": "ce", "top_k": 0.25},
          "focal": {"loss": "softmax_focal", "gamma": 2.0}}  # fmt: skip


def collate(batch):
    images, masks = zip(*batch)
    return torch.stack(images), torch.stack(masks)


def mean_iou(confusion: torch.Tensor) -> tuple[float, list[float]]:
    """Mean IoU over classes that occur, from a ``(K, K)`` confusion matrix (truth x prediction)."""
    hits = confusion.diag().double()
    union = confusion.sum(0).double() + confusion.sum(1).double() - hits
    iou = hits / union.clamp(min=1)
    present = union > 0
    return float(iou[present].mean()), iou.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3 if QUICK else 800)
    parser.add_argument("--loss", choices=sorted(LOSSES), default="ohem")
    parser.add_argument("--out", default="examples-out/segmenter")
    args = parser.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)

    num_train, num_val = (16, 8) if QUICK else (256, 32)
    data = {"image_size": (128, 128), "max_objects": 4, "object_size": (0.15, 0.45)}
    train_ann = make_synthetic_coco(out / "train", num_images=num_train, seed=0, **data)
    val_ann = make_synthetic_coco(out / "val", num_images=num_val, seed=1, **data)
    train = CocoSegmentation(
        out / "train" / "images", train_ann, transforms=v2.RandomHorizontalFlip()
    )
    val = CocoSegmentation(out / "val" / "images", val_ann)
    loader = DataLoader(train, batch_size=8, shuffle=True, collate_fn=collate, drop_last=True)

    model = build_segmenter(
        backbone={"type": "vb_tiny"},
        neck={"type": "fpn", "out_channels": 48},
        head={
            "type": "fpn_seg",
            "num_classes": train.num_classes,
            "channels": 48,
            **LOSSES[args.loss],
        },
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps)
    start, step = time.perf_counter(), 0
    model.train()
    while step < args.steps:
        for images, masks in loader:
            loss = model(images, masks)["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % 100 == 0 or step == args.steps:
                print(
                    f"step {step:4d}  loss {loss.item():.3f}  ({time.perf_counter() - start:.0f} s)"
                )
            if step == args.steps:
                break

    model.eval()
    k = val.num_classes
    confusion = torch.zeros(k, k, dtype=torch.long)
    with torch.no_grad():
        for images, masks in DataLoader(val, batch_size=8, collate_fn=collate):
            predicted = model.predict(images)
            valid = masks != val.ignore_index
            pairs = masks[valid] * k + predicted[valid]
            confusion += torch.bincount(pairs, minlength=k * k).view(k, k)
    miou, per_class = mean_iou(confusion)
    names = ", ".join(f"{name} {iou:.3f}" for name, iou in zip(val.classes, per_class))
    print(f"val mIoU {miou:.3f} ({names})")


if __name__ == "__main__":
    main()
