"""Draw ``docs/assets/warp.png``: a synthetic sample with its boxes, before and after one warp.

The picture is drawn with torch (no downloads): a shaded background with a rectangle, a disc
and a triangle, each with an instance mask, a box and a key point (its centre). One matrix
(rotation, scale, shear, translation) warps all of it through
`visionblocks.transforms.warp_sample`. On the right, solid boxes are the corner method
(the box enclosing each warped rectangle: what a sample with boxes only gets) and dashed
boxes the tight boxes `warp_sample` computes from the warped masks::

    python docs/scripts/make_warp_figure.py [OUTPUT_PNG]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle
from torchvision import tv_tensors

from visionblocks.ops.warp import affine_matrix
from visionblocks.transforms import warp_sample

DEFAULT_PNG = Path(__file__).resolve().parents[1] / "assets" / "warp.png"
H, W = 192, 256
COLOURS = ([0.90, 0.30, 0.20], [0.20, 0.55, 0.90], [0.95, 0.75, 0.15])
NAMES = ("rectangle", "disc", "triangle")


def synthetic_sample() -> tuple[tv_tensors.Image, dict]:
    """A uint8 image with three shapes, and its target (boxes, labels, masks, key points)."""
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    rectangle = (xs > 30) & (xs < 110) & (ys > 28) & (ys < 88)
    disc = (xs - 180) ** 2 + (ys - 60) ** 2 < 36**2
    # triangle with apex (110, 105) and base from (70, 170) to (150, 170)
    triangle = (ys < 170) & ((xs - 110).abs() < (ys - 105) * 40 / 65)
    masks = torch.stack((rectangle, disc, triangle))
    shade = 0.80 + 0.15 * (xs / W) - 0.10 * (ys / H)
    image = shade.expand(3, H, W).clone()
    for mask, colour in zip(masks, COLOURS):
        image[:, mask] = torch.tensor(colour)[:, None]
    image = (image.clamp(0, 1) * 255).round().to(torch.uint8)

    boxes = []
    for mask in masks:
        rows, cols = mask.nonzero(as_tuple=True)
        boxes.append([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1])
    xyxy = torch.tensor(boxes, dtype=torch.float32)
    centres = ((xyxy[:, :2] + xyxy[:, 2:]) / 2 - 0.5).view(3, 1, 2)  # pixel-centre coordinates
    target = {
        "boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(H, W)),
        "labels": torch.tensor([0, 1, 2]),
        "masks": tv_tensors.Mask(masks.to(torch.uint8)),
        "centres": tv_tensors.KeyPoints(centres, canvas_size=(H, W)),
    }
    return tv_tensors.Image(image), target


def draw(ax, image, target, title: str, tight: list[list[float]] | None = None) -> None:
    ax.imshow(image.permute(1, 2, 0).numpy(), extent=(0, image.shape[-1], image.shape[-2], 0))
    for k, (x1, y1, x2, y2) in enumerate(target["boxes"].tolist()):
        label = int(target["labels"][k])
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, lw=2, ec="black"))
        ax.text(x1 + 2, y1 - 3, NAMES[label], fontsize=8, va="bottom")
    for x1, y1, x2, y2 in tight or []:
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, lw=1.2, ec="white", ls="--"))
    # key points are pixel-centre coordinates; the image extent puts pixel j's centre at j + 0.5
    points = target["centres"].reshape(-1, 2) + 0.5
    ax.plot(points[:, 0], points[:, 1], "x", color="black", ms=7, mew=2)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def main(output: Path = DEFAULT_PNG) -> Path:
    image, target = synthetic_sample()
    matrix = affine_matrix(
        angle=25.0, scale=0.85, shear=(12.0, 0.0), translate=(10.0, 4.0), center=(W / 2, H / 2)
    )
    out_size = (H, W)
    warped, warped_target = warp_sample(image, target, matrix, out_size, fill=(235, 235, 235))
    corners_only = {key: target[key] for key in ("boxes", "labels", "centres")}
    _, corner_target = warp_sample(image, corners_only, matrix, out_size)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    draw(axes[0], image, target, "source: boxes and key points (box centres)")
    draw(
        axes[1],
        warped,
        corner_target,
        "warp_sample: corner method (solid), tight boxes (dashed)",
        warped_target["boxes"].tolist(),
    )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return output


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PNG))
