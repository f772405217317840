"""The figures of ``visionblocks demo`` (private): predictions over ground truth, loss curve."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["plot_losses", "plot_predictions"]

_GT_COLOUR = "#2ca02c"
_PRED_COLOUR = "#d62728"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_predictions(
    images: Sequence[Tensor],
    predictions: Sequence[Mapping[str, Tensor]],
    targets: Sequence[Mapping[str, Tensor]],
    classes: Sequence[str],
    path: Path,
    *,
    score_thresh: float = 0.3,
) -> Path:
    """A grid of images with ground-truth boxes (green) and predictions (red, with scores)."""
    plt = _pyplot()
    cols = min(4, len(images))
    rows = math.ceil(len(images) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, pred, target in zip(axes.flat, images, predictions, targets):
        ax.imshow(image.permute(1, 2, 0).cpu().numpy())
        for box in target["boxes"].tolist():
            x1, y1, x2, y2 = box
            ax.add_patch(plt.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, lw=2, ec=_GT_COLOUR))
        keep = pred["scores"] >= score_thresh
        for box, label, score in zip(
            pred["boxes"][keep].tolist(),
            pred["labels"][keep].tolist(),
            pred["scores"][keep].tolist(),
        ):
            x1, y1, x2, y2 = box
            ax.add_patch(
                plt.Rectangle(
                    (x1, y1), x2 - x1, y2 - y1, fill=False, lw=1.5, ec=_PRED_COLOUR, ls="--"
                )
            )
            ax.text(x1, y1 - 2, f"{classes[label]} {score:.2f}", color="white", fontsize=7,
                    bbox={"facecolor": _PRED_COLOUR, "pad": 1, "lw": 0})  # fmt: skip
    fig.suptitle("validation images: ground truth (green), predictions (red, score >= "
                 f"{score_thresh:g})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_losses(history: Mapping[str, Sequence[float]], path: Path) -> Path:
    """Each loss per step (faint) and its moving average over 25 steps, on a log scale."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in history.items():
        steps = range(1, len(values) + 1)
        short = len(values) < 2  # nothing to smooth: the raw points carry the label
        line = ax.plot(steps, values, alpha=1.0 if short else 0.25, lw=0.8, marker="o" if short else None,
                       label=name if short else None)[0]  # fmt: skip
        if len(values) >= 2:
            series = torch.tensor(values, dtype=torch.float64)
            window = min(25, len(values))
            kernel = torch.ones(1, 1, window, dtype=torch.float64) / window
            padded = torch.cat([series[:1].repeat(window - 1), series])
            smooth = torch.nn.functional.conv1d(padded[None, None], kernel)[0, 0]
            ax.plot(steps, smooth.tolist(), color=line.get_color(), lw=1.8, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training losses (moving average over 25 steps)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
