"""Random affine augmentation of a detection sample: one matrix for image, boxes and masks.

Builds random rotation / scale / shear / translation matrices with `affine_matrix` (pixel
coordinates, OpenCV's convention), applies each to a synthetic COCO sample with
`warp_sample` (image, `BoundingBoxes`, instance `Mask`s; boxes that leave the image are
dropped with their labels), and writes ``warp_augment.png``: the original and its warped
copies with their boxes and mask outlines.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from _args import example_parser, positive_int

if TYPE_CHECKING:
    import torch

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"

EPILOG = """\
environment:
  VISIONBLOCKS_QUICK=1  draw fewer warped copies (3 instead of 5): a smoke test, what
                        tests/docs/test_examples.py runs

outputs (under --out):
  data/              a synthetic COCO dataset of 4 images (~0.1 MB)
  warp_augment.png   the original sample and its warped copies
"""


def parse_args() -> argparse.Namespace:
    parser = example_parser(__doc__, EPILOG)
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="examples-out/warp",
        help="folder for the data and the figure",
    )
    parser.add_argument(
        "--samples",
        metavar="N",
        type=positive_int,
        default=3 if QUICK else 5,
        help="warped copies to draw",
    )
    return parser.parse_args()


def random_matrix(generator: torch.Generator, size: tuple[int, int]) -> torch.Tensor:
    """Rotation, scale, shear and translation about the image centre."""
    import torch

    from visionblocks.ops.warp import affine_matrix

    h, w = size

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * torch.rand((), generator=generator).item()

    return affine_matrix(
        angle=uniform(-30, 30),
        scale=uniform(0.7, 1.2),
        shear=(uniform(-10, 10), uniform(-5, 5)),
        translate=(uniform(-0.1, 0.1) * w, uniform(-0.1, 0.1) * h),
        center=((w - 1) / 2, (h - 1) / 2),
    )


def draw(ax, image, target, classes, title: str) -> None:
    import matplotlib.pyplot as plt

    ax.imshow(image.permute(1, 2, 0).numpy())
    for mask in target["masks"]:
        ax.contour(mask.numpy(), levels=[0.5], colors="white", linewidths=0.8)
    for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
        ax.add_patch(plt.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, ec="#ffd60a", lw=1.5))
        ax.text(
            x1,
            y1 - 2,
            classes[label],
            color="black",
            fontsize=7,
            bbox={"fc": "#ffd60a", "pad": 1, "lw": 0},
        )
    ax.set_title(title, fontsize=9)
    ax.axis("off")


def main() -> None:
    args = parse_args()  # before the imports below, which take seconds: --help answers at once
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from visionblocks.data import CocoInstances, make_synthetic_coco
    from visionblocks.transforms import warp_sample

    out = Path(args.out)
    ann = make_synthetic_coco(out / "data", num_images=4, image_size=(160, 200), seed=2)
    dataset = CocoInstances(out / "data" / "images", ann, with_masks=True)
    image, target = dataset[0]
    generator = torch.Generator().manual_seed(0)

    fig, axes = plt.subplots(1, args.samples + 1, figsize=(3.2 * (args.samples + 1), 3.2))
    draw(axes[0], image, target, dataset.classes, "original")
    for i, ax in enumerate(axes[1:], start=1):
        matrix = random_matrix(generator, tuple(image.shape[-2:]))
        warped, warped_target = warp_sample(image, target, matrix, fill=128)
        kept = len(warped_target["boxes"])
        draw(
            ax,
            warped,
            warped_target,
            dataset.classes,
            f"warp {i}: {kept}/{len(target['boxes'])} objects",
        )
    fig.tight_layout()
    path = out / "warp_augment.png"
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
