"""The gallery pictures of the reference detector demo, and of a ``check-coco`` report.

For ``make_gallery.py``: the demo's (`visionblocks.cli.demo.run_demo`) predictions and
losses, its trained model's feature maps through `visionblocks.features.IntermediateLayerGetter`,
and the `visionblocks.data.check_coco` report of a broken synthetic export.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from _gallery_ops import SEED, bare, compact, rgb, save
from PIL import Image

QUICK_STEPS = 20
DEMO_FILES = ("metrics.json", "model.pt", "predictions.png", "loss.png")


# The demo: predictions and loss curves -------------------------------------------------------
def demo_folder(demo_out: Path | None, quick: bool, scratch: Path) -> Path:
    """A folder holding a finished demo: ``demo_out`` as it is, or a demo trained now."""
    from visionblocks.cli.demo import DEFAULT_STEPS, run_demo

    folder = demo_out or scratch / "demo"
    if demo_out is not None and all((folder / name).is_file() for name in DEMO_FILES):
        print(f"reusing the demo in {folder}")
    else:
        steps = QUICK_STEPS if quick else DEFAULT_STEPS
        print(f"training the demo detector ({steps} steps) in {folder}")
        run_demo(steps=steps, out=folder, device="cpu", seed=SEED, export=False)
    steps = json.loads((folder / "metrics.json").read_text())["steps"]
    if not quick and steps < DEFAULT_STEPS:
        print(f"warning: the demo in {folder} trained {steps} steps only", file=sys.stderr)
    return folder


def demo_pictures(demo: Path, out: Path) -> None:
    """The demo's own ``predictions.png`` and ``loss.png``."""
    for name in ("predictions", "loss"):
        compact(demo / f"{name}.png", out / f"demo-{name}.png")


# Feature maps of the demo's trained detector -------------------------------------------------
STAGES = ("stem", "stage1", "stage2", "stage3", "stage4")
FEATURE_LAYERS = {f"backbone.{name}": name for name in STAGES} | {"head": "head"}


def class_scores(head: dict, index: int, size: tuple[int, int]) -> np.ndarray:
    """The YOLOv8 head's class scores ``sigmoid(logit)`` of one image: the maximum over the
    levels at image resolution, as ``(H, W, classes)``."""
    levels = []
    for logits, (h, w) in zip(head["cls_logits"], head["sizes"]):
        score = logits[index].sigmoid().T.reshape(1, -1, int(h), int(w))
        levels.append(torch.nn.functional.interpolate(score, size=size, mode="nearest")[0])
    return torch.stack(levels).amax(0).permute(1, 2, 0).numpy()


def features_picture(demo: Path, out: Path) -> None:
    """Channel means of the backbone stages and the class scores of three val images."""
    from visionblocks.data import CocoInstances
    from visionblocks.features import IntermediateLayerGetter
    from visionblocks.registry import MODELS

    saved = torch.load(demo / "model.pt", map_location="cpu", weights_only=True)
    model = MODELS.build(saved["config"])
    model.load_state_dict(saved["model"])
    model.eval()
    metrics = json.loads((demo / "metrics.json").read_text())
    val = CocoInstances(demo / "data/val/images", demo / "data/val/annotations.json")
    images = [val[i][0].as_subclass(torch.Tensor) for i in (0, 2, 6)]
    getter = IntermediateLayerGetter(model, FEATURE_LAYERS, example_input=([images[0]],))
    with torch.no_grad():
        features = getter(images)
    head = features.pop("head")
    fig, axes = plt.subplots(len(images), 2 + len(features), figsize=(10.5, 5.65))
    for row, image in enumerate(images):
        h, w = image.shape[-2:]
        axes[row, 0].imshow(rgb(image))
        bare(axes[row, 0], "input" if row == 0 else None)
        for col, (name, maps) in enumerate(features.items(), start=1):
            mean = maps[row].mean(0)
            shown = ((mean - mean.min()) / (mean.max() - mean.min() + 1e-8)).numpy()
            axes[row, col].imshow(shown, extent=(0, w, h, 0), interpolation="nearest")
            title = f"{name}\n{maps.shape[1]} ch, stride {h // maps.shape[-2]}"
            bare(axes[row, col], title if row == 0 else None)
        scores = class_scores(head, row, (h, w))
        axes[row, -1].imshow(scores / scores.max(), interpolation="nearest")
        bare(axes[row, -1], "class scores\n(head, all levels)" if row == 0 else None)
    fig.suptitle(f"IntermediateLayerGetter on the demo's detector ({metrics['steps']} steps, "
                 f"AP50 {metrics['AP50']:.2f}): channel means; class scores as RGB = circle, "
                 "square, triangle", fontsize=10)  # fmt: skip
    save(fig, out / "features.png")


# The check-coco report of a broken export ----------------------------------------------------
def broken_export(scratch: Path) -> Path:
    """The synthetic export of ``docs/learn/your-data.md``, with its four defects."""
    from visionblocks.data import make_synthetic_coco

    ann = make_synthetic_coco(scratch / "export", num_images=48, image_size=(128, 128), seed=0,
                              progress=False)  # fmt: skip
    data = json.loads(ann.read_text())
    data["annotations"][0]["segmentation"] = [[50, 50, 60, 50]]  # a 2-point polygon
    data["annotations"][1]["bbox"][3] = 0  # a zero-height box
    data["annotations"][2]["category_id"] = 99  # a class deleted in the tool
    data["annotations"][3]["bbox"][0] = -500.0  # a box dragged off the image
    for a in data["annotations"]:
        del a["area"]
    ann.write_text(json.dumps(data))
    return ann


def _flagged(ax: plt.Axes, ann: dict, reason: str, size: tuple[int, int]) -> str:
    """Draw one invalid annotation in red, tagged with its id; what is wrong with it."""
    (x, y, w, h), (height, width) = ann["bbox"], size
    tag = {"color": "red", "fontsize": 9, "fontweight": "bold", "clip_on": True,
           "bbox": {"facecolor": "white", "alpha": 0.9, "pad": 1, "lw": 0}}  # fmt: skip
    if reason == "short_polygon":
        polygon = np.array(ann["segmentation"][0], dtype=float).reshape(-1, 2)
        ax.plot(*polygon.T, "-o", color="red", lw=2.5, ms=5)
        ax.add_patch(plt.Rectangle((x, y), w, h, fill=False, ec="red", lw=1.5, ls="--"))
        ax.text(polygon[-1, 0] + 3, polygon[-1, 1], str(ann["id"]), va="center", **tag)
        return f"polygon of {len(polygon)} points (dashed: its valid box)"
    if x + w <= 0 or x >= width or y + h <= 0 or y >= height:  # off the image: an arrow
        row = min(max(y + h / 2, 8), height - 8)
        arrow = {"arrowstyle": "->", "color": "red", "lw": 2.5}
        ax.annotate("", (1, row), (20, row), arrowprops=arrow)
        ax.text(21, row, str(ann["id"]), va="center", **tag)
        return f"box at x = {x:g}, off the image"
    ax.add_patch(plt.Rectangle((x, y), w, max(h, 0.3), fill=False, ec="red", lw=2.5))
    ax.text(x + 1, y - 1, str(ann["id"]), va="bottom", **tag)
    if reason == "unknown_category":
        return f"category_id {ann['category_id']}"
    return f"box of width {w:g} and height {h:g}"


def check_coco_picture(scratch: Path, out: Path) -> None:
    """The flagged annotations on their images, above the report ``check-coco`` prints."""
    from visionblocks.data import check_coco

    ann = broken_export(scratch)
    report = check_coco(ann, images=ann.parent / "images", progress=False)
    lines = [part for line in str(report).replace(f"{scratch}/", "").splitlines()
             for part in textwrap.wrap(line, 100, subsequent_indent=" " * 28) or [""]]  # fmt: skip
    data = report.data or {}
    by_id = {a["id"]: a for a in data["annotations"]}
    flagged: dict[int, list[tuple[str, dict]]] = {}
    for reason, ids in report.invalid.items():
        for i in ids:
            flagged.setdefault(by_id[i]["image_id"], []).append((reason, by_id[i]))
    fig = plt.figure(figsize=(10, 5.0 + 0.15 * len(lines)))
    grid = fig.add_gridspec(2, 2 * len(flagged), height_ratios=(4.4, 0.15 * len(lines)))
    for n, (image_id, found) in enumerate(flagged.items()):
        ax = fig.add_subplot(grid[0, 2 * n : 2 * n + 2])
        info = next(i for i in data["images"] if i["id"] == image_id)
        ax.imshow(Image.open(ann.parent / "images" / info["file_name"]))
        for other in data["annotations"]:
            if other["image_id"] == image_id and other["id"] not in {a["id"] for _, a in found}:
                bx, by, bw, bh = other["bbox"]
                ax.add_patch(plt.Rectangle((bx, by), bw, bh, fill=False, ec="#2ca02c", lw=1.5))
        notes = [f"{a['id']}: {reason}, {_flagged(ax, a, reason, (info['height'], info['width']))}"
                 for reason, a in found]  # fmt: skip
        bare(ax, info["file_name"])
        ax.set_xlabel("\n".join(notes), color="red", fontsize=9, loc="left")
    ax = fig.add_subplot(grid[1, :])
    ax.axis("off")
    ax.text(0, 1, "$ visionblocks check-coco export/annotations.json --images export/images\n"
            + "\n".join(lines), family="monospace", fontsize=8.5, va="top")  # fmt: skip
    fig.suptitle("check-coco on a broken export: invalid annotations in red (valid boxes in "
                 "green), and the report", fontsize=11)  # fmt: skip
    save(fig, out / "check-coco.png")
