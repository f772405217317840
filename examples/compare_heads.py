"""Train the FCOS and the YOLOv8 head on the same time budget and compare their COCO AP.

Both detectors share the recipe of examples/train_detector.py: the synthetic COCO data with
its augmentations, the vb_tiny backbone and a 64-channel FPN, AdamW at 2e-3 with a warm-up
and a cosine decay. Only the head differs: FCOSHead ("fcos") or YOLOv8Head ("yolov8"). The
two train in turns on the same batches, each for --seconds of its own training time (the
clock runs only during its steps, so a busy machine slows both alike), with the learning rate
decaying over that time. Then each is evaluated on the val split, and a markdown table gives
the steps each one did and its AP and AP50.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

from _args import example_parser, positive_int

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"

BACKBONE = {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [16, 32, 64, 128]}
HEADS = {
    "fcos": {"type": "fcos", "num_classes": 3, "num_convs": 2,
             "size_ranges": [(0, 32), (32, 64), (64, 1e8)]},
    "yolov8": {"type": "yolov8", "num_classes": 3},
}  # fmt: skip

EPILOG = """\
environment:
  VISIONBLOCKS_QUICK=1  a smoke test: 2 s per head on 32 + 16 images (what
                        tests/docs/test_examples.py runs)

outputs (under --out):
  train/, val/     the synthetic COCO data (images and annotations; 512 + 64 images, ~7 MB)
"""


def parse_args() -> argparse.Namespace:
    parser = example_parser(__doc__, EPILOG)
    parser.add_argument(
        "--seconds",
        metavar="S",
        type=positive_int,
        default=2 if QUICK else 120,
        help="training time of each head, in seconds (its own steps only)",
    )
    parser.add_argument(
        "--threads",
        metavar="N",
        type=positive_int,
        default=1,
        help="torch threads (1 keeps the two heads' clocks comparable on a shared machine)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="examples-out/compare_heads",
        help="data folder",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()  # before the imports below, which take seconds: --help answers at once
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

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    num_train, num_val = (32, 16) if QUICK else (512, 64)
    print(f"writing synthetic COCO data: {num_train} train and {num_val} val images in {out}")
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
    torch.manual_seed(0)
    sampler = GroupedBatchSampler(RandomSampler(train), aspect_ratio_groups(train), batch_size=16)
    loader = DataLoader(train, batch_sampler=sampler, collate_fn=collate_detection)

    runs = {}
    for name, head in HEADS.items():
        torch.manual_seed(0)  # the same backbone and neck weights for both
        model = build_detector({"backbone": BACKBONE, "neck": {"type": "fpn", "out_channels": 64},
                                "head": head}).train()  # fmt: skip
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
        runs[name] = {"model": model, "optimizer": optimizer, "steps": 0, "seconds": 0.0}

    def train_step(run: dict, images: torch.Tensor, targets: list, sizes: list) -> None:
        start = time.perf_counter()
        # warm-up over 50 steps, then a cosine over the run's own training time
        done = min(1.0, run["seconds"] / args.seconds)
        scale = min(1.0, (run["steps"] + 1) / 50) * 0.5 * (1 + math.cos(math.pi * done))
        for group in run["optimizer"].param_groups:
            group["lr"] = 2e-3 * scale
        loss = run["model"](images, targets, sizes)["loss"]
        run["optimizer"].zero_grad(set_to_none=True)
        loss.backward()
        run["optimizer"].step()
        run["steps"] += 1
        run["seconds"] += time.perf_counter() - start

    load_before = os.getloadavg()
    print(f"training each head for {args.seconds} s on {args.threads} thread(s), in turns")
    while any(run["seconds"] < args.seconds for run in runs.values()):
        for images, targets, sizes in loader:
            for run in runs.values():
                if run["seconds"] < args.seconds:
                    train_step(run, images, targets, sizes)
            if all(run["seconds"] >= args.seconds for run in runs.values()):
                break
    load_after = os.getloadavg()

    print(f"evaluating on the {len(val)} val images")
    rows = []
    for name, run in runs.items():
        model = run["model"].eval()
        predictions = {}
        with torch.no_grad():
            for images, targets, sizes in DataLoader(
                val, batch_size=16, collate_fn=collate_detection
            ):
                for target, output in zip(targets, model(images, image_sizes=sizes)):
                    predictions[target["image_id"]] = output
        stats = coco_evaluate(predictions, val)
        rows.append(f"| {name} | {run['steps']} | {stats['AP']:.3f} | {stats['AP50']:.3f} | "
                    f"{run['seconds']:.0f} s |")  # fmt: skip
    print()
    print("| head | steps | AP | AP50 | training time |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print(f"load average (1 min) {load_before[0]:.1f} before training, {load_after[0]:.1f} after")


if __name__ == "__main__":
    main()
