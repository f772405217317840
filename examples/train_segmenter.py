"""Train the semantic FPN segmenter on synthetic COCO data and report mean IoU.

`CocoSegmentation` paints the instance annotations into label maps (0 background, 1..K
objects, 255 ignored); the segmenter (``vb_tiny`` + `FPN` + `FPNSegHead`) is built through
the registries and trained with cross-entropy, OHEM cross-entropy (the hardest 25% of the
pixels) or the softmax focal loss. A progress bar (on stderr) shows the steps, the loss and
the speed; every 100 steps and at the end a line gives the loss. On two CPU cores the 800
steps take about two and a half minutes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _args import example_parser, positive_int

if TYPE_CHECKING:
    import torch

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"
LOSSES = {"ce": {"loss": "ce"}, "ohem": {"loss": "ce", "top_k": 0.25},
          "focal": {"loss": "softmax_focal", "gamma": 2.0}}  # fmt: skip

EPILOG = """\
environment:
  VISIONBLOCKS_QUICK=1  run a few steps on a few images (3 steps, 16 + 8 images): a smoke
                        test, what tests/docs/test_examples.py runs

outputs (under --out):
  train/, val/     the synthetic COCO data (images and annotations; 256 + 32 images, ~3 MB)

The model is not saved; the last line gives the val mean IoU and the IoU of each class.
"""


def parse_args() -> argparse.Namespace:
    parser = example_parser(__doc__, EPILOG)
    parser.add_argument(
        "--steps",
        metavar="N",
        type=positive_int,
        default=3 if QUICK else 800,
        help="training steps (batches of 8)",
    )
    parser.add_argument(
        "--loss",
        choices=sorted(LOSSES),
        default="ohem",
        help="ce: cross-entropy; ohem: cross-entropy of the hardest 25%% of the pixels; "
        "focal: softmax focal loss (gamma 2)",
    )
    parser.add_argument(
        "--out", metavar="DIR", default="examples-out/segmenter", help="folder for the data"
    )
    return parser.parse_args()


def collate(batch):
    import torch

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
    args = parse_args()  # before the imports below, which take seconds: --help answers at once
    import torch
    from torch.utils.data import DataLoader
    from torchvision.transforms import v2
    from tqdm import tqdm

    from visionblocks.data import CocoSegmentation, make_synthetic_coco
    from visionblocks.models import build_segmenter

    out = Path(args.out)
    torch.manual_seed(0)

    num_train, num_val = (16, 8) if QUICK else (256, 32)
    print(f"writing synthetic COCO data: {num_train} train and {num_val} val images in {out}")
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
    with tqdm(total=args.steps, desc=f"training ({args.loss})", unit="step") as bar:
        while step < args.steps:
            for images, masks in loader:
                loss = model(images, masks)["loss"]
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                step += 1
                if step % 10 == 0 or step == args.steps:  # a host read: only when shown
                    bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
                bar.update()
                if step % 100 == 0 or step == args.steps:
                    elapsed = time.perf_counter() - start
                    bar.write(f"step {step:4d}  loss {loss.item():.3f}  ({elapsed:.0f} s)")
                if step == args.steps:
                    break

    print(f"evaluating on the {len(val)} val images")
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
