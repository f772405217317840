"""The figures of ``visionblocks demo`` (private): predictions over ground truth, loss curve."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["plot_losses", "plot_predictions", "prediction_figure"]

_GT_COLOUR = "#2ca02c"
_PRED_COLOUR = "#d62728"
_PAD = 1.0  # label padding, points
MAX_DRAWN = 10
"""Predictions drawn per image at most (the highest scores)."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def prediction_figure(
    images: Sequence[Tensor],
    predictions: Sequence[Mapping[str, Tensor]],
    targets: Sequence[Mapping[str, Tensor]],
    classes: Sequence[str],
    *,
    score_thresh: float,
    title: str = "",
) -> Any:
    """A grid of images: ground truth (green, class name) and the predictions given (red,
    dashed, class and score; at most `MAX_DRAWN` per image), each label placed where it
    overlaps no other; a legend."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    cols = min(4, len(images))
    rows = math.ceil(len(images) / cols)
    height = 3.2 * rows + 0.9  # inches: the images, a title above and a legend below
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, height), squeeze=False, dpi=90)
    # apart, so that a label at an image's edge is not covered by the next image
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.55 / height, top=1 - 0.4 / height,
                        wspace=0.04, hspace=0.04)  # fmt: skip
    for ax in axes.flat:
        ax.axis("off")
    labels, capped = [], False
    for ax, image, pred, target in zip(axes.flat, images, predictions, targets):
        top = pred["scores"].argsort(descending=True, stable=True)[:MAX_DRAWN]
        capped |= len(pred["scores"]) > MAX_DRAWN
        pred = {k: pred[k][top] for k in ("boxes", "labels", "scores")}
        ax.imshow(image.permute(1, 2, 0).cpu().numpy())
        mine = []
        for box, label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            mine.append((ax, box, classes[label], _GT_COLOUR, "gt"))
            _rectangle(ax, box, _GT_COLOUR, "-", 2.0)
        for box, label, score in zip(
            pred["boxes"].tolist(), pred["labels"].tolist(), pred["scores"].tolist()
        ):
            mine.append((ax, box, f"{classes[label]} {score:.2f}", _PRED_COLOUR, "pred"))
            _rectangle(ax, box, _PRED_COLOUR, "--", 1.5)
        labels.append(mine)
    handles = [
        Line2D([], [], color=_GT_COLOUR, lw=2, label="ground truth: class"),
        Line2D([], [], color=_PRED_COLOUR, lw=1.5, ls="--",
               label=f"prediction: class score (score >= {score_thresh:.2f}"
               f"{f'; the {MAX_DRAWN} best' if capped else ''})"),
    ]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False)
    if title:
        fig.suptitle(title)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for mine in labels:
        placed: list[Any] = []
        for ax, box, text, colour, kind in mine:
            placed.append(_place(ax, box, text, colour, kind, placed, renderer))
    return fig


def _rectangle(ax: Any, box: list[float], colour: str, style: str, width: float) -> None:
    plt = _pyplot()
    x1, y1, x2, y2 = box
    ax.add_patch(
        plt.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, lw=width, ec=colour, ls=style)
    )


def _place(ax: Any, box: list[float], text: str, colour: str, kind: str, placed: list[Any],
           renderer: Any) -> Any:  # fmt: skip
    """Draw ``text`` at the first spot beside ``box`` that stays in the axes and overlaps no
    label in ``placed``; the label's extent (display pixels, padding included)."""
    label = ax.text(0, 0, text, color="white", fontsize=7,
                    bbox={"facecolor": colour, "pad": _PAD, "lw": 0})  # fmt: skip
    pad = _PAD * ax.figure.dpi / 72 + 0.5
    x1, y1, x2, y2 = box
    corners = [((x1, y1), "left", "bottom"), ((x1, y2), "left", "top"),
               ((x1, y1), "left", "top"), ((x1, y2), "left", "bottom"),
               ((x2, y1), "right", "bottom"), ((x2, y2), "right", "top"),
               ((x2, y1), "left", "top"), ((x1, y1), "right", "top"),
               ((x2, y2), "left", "bottom"), ((x1, y2), "right", "bottom")]  # fmt: skip
    if kind == "gt":  # ground truth first below, predictions first above
        corners[:6] = [corners[i] for i in (1, 0, 3, 2, 5, 4)]
    frame = ax.get_window_extent(renderer)
    height = label.get_window_extent(renderer).height + 2 * pad
    best = None
    for shift in range(24):  # then the same spots, moved out by whole label heights
        for (x, y), ha, va in corners:
            dy = shift * height * (1 if va == "bottom" else -1)
            sx, sy = ax.transData.transform((x, y))
            label.set_position(ax.transData.inverted().transform((sx, sy + dy)))
            label.set_ha(ha)
            label.set_va(va)
            extent = label.get_window_extent(renderer).padded(pad)
            inside = (extent.x0 >= frame.x0 and extent.x1 <= frame.x1
                      and extent.y0 >= frame.y0 and extent.y1 <= frame.y1)  # fmt: skip
            clashes = sum(extent.overlaps(other) for other in placed)
            if inside and not clashes:
                return extent
            cost = clashes + (0 if inside else 100)
            if best is None or cost < best[0]:
                best = (cost, label.get_position(), ha, va, extent)
    assert best is not None
    label.set_position(best[1])
    label.set_ha(best[2])
    label.set_va(best[3])
    return best[4]


def plot_predictions(
    images: Sequence[Tensor],
    predictions: Sequence[Mapping[str, Tensor]],
    targets: Sequence[Mapping[str, Tensor]],
    classes: Sequence[str],
    path: Path,
    *,
    score_thresh: float,
    title: str = "",
) -> Path:
    """`prediction_figure`, saved to ``path``."""
    fig = prediction_figure(images, predictions, targets, classes, score_thresh=score_thresh,
                            title=title)  # fmt: skip
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)
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
