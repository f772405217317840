"""Load partial pretrained weights: a head swap, a backbone out of a detector's checkpoint,
a grey-scale stem, and a wrong checkpoint that fails loudly.

    python examples/partial_loading.py [--out DIR]

Runs offline: randomly initialised torchvision models stand in for downloaded checkpoints
(they have the same keys and shapes). Every step prints the `LoadReport`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torchvision

from visionblocks.backbones import build_backbone
from visionblocks.cli._inspect import describe_state_dict
from visionblocks.weights import LoadError, load_partial, read_state_dict


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples-out/partial-loading")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    classifier = out / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), classifier)
    detector = out / "fasterrcnn_r50.pth"
    torch.save(
        {"model": torchvision.models.detection.fasterrcnn_resnet50_fpn(
            weights=None, weights_backbone=None).state_dict(), "epoch": 12},
        detector,
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
