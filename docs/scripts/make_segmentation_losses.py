"""The figure and the table of ``docs/learn/segmentation-losses.md``.

``plot`` draws ``docs/assets/segmentation-loss-gradients.png``: for each segmentation loss,
how hard it pushes a pixel of an object as the prediction improves. The image has 64 pixels:
an object of 16 (class 1) on a background (class 0) that is predicted right with probability
0.9. Every object pixel gives its class the same probability ``p``; the curve is the
gradient of the loss with respect to ``p``, shared by the object pixels, divided by their
count and multiplied by the pixel count: the mean gradient of one object pixel, on the scale
where cross-entropy gives ``-1 / p``, so that losses averaged over pixels (CE, focal) and
losses over the whole image (Dice, Jaccard, Tversky, Lovász) compare. (With the object
pixels tied, a per-pixel gradient of Lovász would depend on how the sort breaks the tie;
their mean does not.) Every loss is the library's, in ``"multiclass"`` mode, fed
``log(probabilities)`` as logits (their softmax is the probabilities again).

``compare`` trains the segmentation demo's model (`visionblocks.cli._demo_seg`: ``vb_tiny``,
`FPN`, `FPNSegHead`, 64 x 64 synthetic images, batches of 16, AdamW) with each loss for
``--steps`` steps from the same initial weights and batches, and prints the val mIoU and per-class IoU as a Markdown table::

    python docs/scripts/make_segmentation_losses.py plot [OUTPUT_PNG]
    python docs/scripts/make_segmentation_losses.py compare [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

DEFAULT_PNG = Path(__file__).resolve().parents[1] / "assets" / "segmentation-loss-gradients.png"
PIXELS, OBJECT, BACKGROUND = 64, 16, 0.9


def gradients(p: torch.Tensor) -> dict[str, torch.Tensor]:
    """The mean gradient of one object pixel (times `PIXELS`) for each loss, at each ``p``."""
    from visionblocks.losses import (
        cross_entropy,
        dice_loss,
        jaccard_loss,
        lovasz_loss,
        softmax_focal_loss,
        tversky_loss,
    )

    losses = {
        "cross-entropy": lambda x, t: cross_entropy(x, t),
        "focal (gamma 2)": lambda x, t: softmax_focal_loss(x, t, gamma=2.0),
        "Dice": lambda x, t: dice_loss(x, t, "multiclass"),
        "Jaccard": lambda x, t: jaccard_loss(x, t, "multiclass"),
        "Tversky (alpha 0.3, beta 0.7)": lambda x, t: tversky_loss(
            x, t, "multiclass", alpha=0.3, beta=0.7
        ),
        "Lovász-softmax": lambda x, t: lovasz_loss(x, t, "multiclass"),
    }
    target = (torch.arange(PIXELS) < OBJECT).long().view(1, 1, PIXELS)  # (N, H, W)
    out = {}
    for name, loss in losses.items():
        values = []
        for value in p.tolist():
            shared = torch.tensor(value, dtype=torch.float64, requires_grad=True)
            background = torch.tensor(BACKGROUND, dtype=torch.float64)
            # the probability of class 1 at each pixel
            one = torch.where(target.view(-1) == 1, shared, 1 - background)
            probs = torch.stack([1 - one, one]).view(1, 2, 1, PIXELS)
            (grad,) = torch.autograd.grad(loss(probs.log(), target), shared)
            values.append(grad.item() * PIXELS / OBJECT)
        out[name] = torch.tensor(values)
    return out


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name, grad in gradients(p).items():
        ax.plot(p.numpy(), (-grad).numpy(), lw=1.8, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("p: the probability every object pixel gives its class (background: 0.9)")
    ax.set_ylabel("-(d loss / d p) per object pixel, x pixels")
    ax.set_title("How hard each loss pushes a pixel of the object, as the prediction improves")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


LOSSES = {"CE": "ce", "Dice": "dice", "CE + Dice": ("ce", "dice"), "Lovász": "lovasz"}


def compare(steps: int, out: Path) -> None:
    from visionblocks.cli import _demo_seg as demo
    from visionblocks.cli._demo_data import demo_data
    from visionblocks.metrics import SegmentationMetrics
    from visionblocks.registry import MODELS
    from visionblocks.training import seed_everything

    train_ann, val_ann = demo_data(out, 0, demo.TRAIN_IMAGES)
    images, labels, _ = demo._split(train_ann)
    val_images, val_labels, classes = demo._split(val_ann)
    rows = []
    for title, loss in LOSSES.items():
        seed_everything(0)  # the same start; threads tuned as the demo: not bitwise repeatable
        config = copy.deepcopy(demo.SEG_MODEL)
        config["head"]["loss"] = loss
        model = MODELS.build(config)
        start = time.perf_counter()
        demo._train(model, images, labels, steps, torch.device("cpu"), False, None)
        seconds = time.perf_counter() - start
        metric = SegmentationMetrics(len(classes), ignore_index=255)
        with torch.no_grad():
            metric.update(model.eval().predict(val_images), val_labels)
        result = metric.compute()
        iou = " | ".join(f"{v:.3f}" for v in result["iou"].tolist())
        rows.append(f"| {title} | {result['miou']:.3f} | {iou} |")
        print(f"{title}: mIoU {result['miou']:.3f} ({seconds:.0f} s)", file=sys.stderr)
    print(f"| loss | mIoU after {steps} steps | " + " | ".join(f"IoU {c}" for c in classes) + " |")
    print("|---" * (len(classes) + 2) + "|")
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_plot = sub.add_parser("plot")
    p_plot.add_argument("png", nargs="?", type=Path, default=DEFAULT_PNG)
    p_compare = sub.add_parser("compare")
    p_compare.add_argument("--steps", type=int, default=400)
    p_compare.add_argument("--out", type=Path, default=Path("demo-seg-out"))
    args = parser.parse_args()
    if args.what == "plot":
        print(f"wrote {plot(args.png)}")
    else:
        compare(args.steps, args.out)


if __name__ == "__main__":
    main()
