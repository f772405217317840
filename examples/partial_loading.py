"""Load partial pretrained weights: a head swap, a backbone out of a detector's checkpoint,
a grey-scale stem, and a wrong checkpoint that fails loudly.

Runs offline: randomly initialised torchvision models stand in for downloaded checkpoints
(they have the same keys and shapes). The example first writes two checkpoint files, a
ResNet-18 classifier (``resnet18.pth``, 45 MiB) and a Faster R-CNN ResNet-50 FPN detector
wrapped in a training checkpoint (``fasterrcnn_r50.pth``, 160 MiB), then loads parts of
them. Every step prints the `LoadReport`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _args import example_parser

EPILOG = """\
environment:
  VISIONBLOCKS_QUICK=1  makes the other examples run a few steps on a few images (what
                        tests/docs/test_examples.py sets); this one has no steps or images to
                        cut and runs the same

disk use:
  The two checkpoint files take 204 MiB. Without --out they go to a temporary folder that
  is removed at the end; with --out DIR they are written to DIR and kept, e.g. for
  `visionblocks inspect DIR/fasterrcnn_r50.pth` (delete DIR when done: the weights are
  random).
"""


def parse_args() -> argparse.Namespace:
    parser = example_parser(__doc__, EPILOG)
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="keep the checkpoint files in this folder (204 MiB); default: a temporary "
        "folder, removed at the end",
    )
    return parser.parse_args()


def section(title: str) -> None:
    print(f"\n== {title}")


def save(obj: object, path: Path) -> Path:
    """``torch.save`` that says what it wrote and how big it is."""
    import torch

    torch.save(obj, path)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return path


def main() -> None:
    args = parse_args()  # before the imports below, which take seconds: --help answers at once
    if args.out is None:
        with tempfile.TemporaryDirectory(
            prefix="partial-loading-", ignore_cleanup_errors=True
        ) as folder:
            run(Path(folder))
        print(f"\nremoved the temporary folder {folder} (pass --out DIR to keep the files)")
    else:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        run(out)
        print(f"\nkept the checkpoint files in {out}; delete them when done (random weights)")


def run(out: Path) -> None:
    import torch
    import torchvision

    from visionblocks.backbones import build_backbone
    from visionblocks.cli._inspect import describe_state_dict
    from visionblocks.weights import LoadError, load_partial, read_state_dict

    section("the stand-in checkpoints")
    torch.manual_seed(0)
    classifier = save(torchvision.models.resnet18().state_dict(), out / "resnet18.pth")
    detector = save(
        {"model": torchvision.models.detection.fasterrcnn_resnet50_fpn(
            weights=None, weights_backbone=None).state_dict(), "epoch": 12},
        out / "fasterrcnn_r50.pth",
    )  # fmt: skip

    section("what the detector checkpoint holds")
    print(describe_state_dict(read_state_dict(detector)))

    section("1. a new head: 1000 classes to 10")
    model = torchvision.models.resnet18(num_classes=10)
    report = load_partial(model, classifier, require=["layer*", "conv1.*", "bn1.*"])
    print(report)

    section("2. a ResNet-50 out of the detector (renamed keys, dry run first)")
    resnet50 = torchvision.models.resnet50()
    rename = [(r"^backbone\.body\.", "")]
    print(load_partial(resnet50, detector, rename=rename, dry_run=True))
    report = load_partial(resnet50, detector, rename=rename, require="layer*")
    print(f"-> copied: {report.num_loaded} tensors; missing (the classifier): {report.missing}")

    section("3. grey-scale input: the RGB stem is summed over its channels")
    grey = build_backbone("resnet18", in_channels=1, pretrained=classifier)
    print(grey.load_report)
    rgb = build_backbone("resnet18", pretrained=classifier).eval()
    image = torch.rand(1, 1, 64, 64)
    same = torch.allclose(
        grey.eval()(image)["stage3"], rgb(image.expand(-1, 3, -1, -1))["stage3"], atol=1e-5
    )
    print(f"grey image through the grey stem == its RGB copy through the RGB stem: {same}")

    section("4. the wrong checkpoint fails loudly")
    try:
        build_backbone("resnet34", pretrained=classifier)
    except LoadError as error:
        print(f"LoadError: {str(error).splitlines()[0][:160]}...")
    try:
        load_partial(torchvision.models.resnet34(), classifier, min_loaded=0.9)
    except LoadError as error:
        print(f"LoadError: {str(error).splitlines()[0]}")


if __name__ == "__main__":
    main()
