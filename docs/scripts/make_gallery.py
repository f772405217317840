"""Draw the pictures of ``docs/gallery.md`` into ``docs/assets/gallery/``, offline and seeded.

The reference detector demo (`visionblocks.cli.demo.run_demo`: its predictions and losses,
and its trained model's feature maps through `visionblocks.features.IntermediateLayerGetter`),
warps of a sample with its targets (``make_warp_figure.py``), per-pixel filters and local
attention (`visionblocks.ops.local_filter2d`, `visionblocks.ops.local_attention2d`) and the
``check-coco`` report of a broken synthetic export::

    python docs/scripts/make_gallery.py [--out DIR] [--demo-out DIR] [--quick]

``--demo-out DIR`` reuses a ``visionblocks demo --out DIR`` folder (or trains the demo there
when it holds none); without it the demo trains in a temporary folder: 850 steps (minutes on
a laptop CPU), ``--quick`` a few (for tests). PNGs above 250 KB get a reduced palette.

The pictures are drawn by the modules beside this script: ``_gallery_ops.py`` (the figure
helpers, the warps, filters and attention) and ``_gallery_model.py`` (the demo, its feature
maps and the ``check-coco`` report).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this script
from _gallery_model import (
    QUICK_STEPS,
    check_coco_picture,
    demo_folder,
    demo_pictures,
    features_picture,
)
from _gallery_ops import (
    MAX_BYTES,  # noqa: F401 (the size budget, read by tests/docs/test_gallery.py)
    SEED,
    local_attention_picture,
    local_filter_picture,
    shapes_image,
    warp_picture,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "assets" / "gallery"
PICTURES = ("demo-predictions.png", "demo-loss.png", "warp.png", "local-filter.png",
            "local-attention.png", "features.png", "check-coco.png")  # fmt: skip
"""Every file the script writes, in the order it draws them."""


# Command line --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Draw every picture of `PICTURES` into ``--out``; the exit status (0)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--demo-out", type=Path, help="a visionblocks demo folder to reuse")
    parser.add_argument("--quick", action="store_true", help=f"a {QUICK_STEPS}-step demo")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        demo = demo_folder(args.demo_out, args.quick, scratch)
        image = shapes_image(scratch)
        jobs = {
            "demo predictions and losses": lambda: demo_pictures(demo, args.out),
            "warp": lambda: warp_picture(args.out),
            "local filter": lambda: local_filter_picture(image, args.out),
            "local attention": lambda: local_attention_picture(image, args.out),
            "feature maps": lambda: features_picture(demo, args.out),
            "check-coco": lambda: check_coco_picture(scratch, args.out),
        }
        for n, (name, job) in enumerate(jobs.items(), start=1):
            began = time.perf_counter()
            job()
            print(f"[{n}/{len(jobs)}] {name}: {time.perf_counter() - began:.1f} s", flush=True)
    for name in PICTURES:
        print(f"{args.out / name}: {(args.out / name).stat().st_size / 1000:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
