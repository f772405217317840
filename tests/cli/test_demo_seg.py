"""`visionblocks demo --task segmentation`: outputs, the printed table, errors (on a few
images and steps; the default run is `make demo`-sized and not run here)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from visionblocks.cli import main


@pytest.fixture
def few_images(monkeypatch):
    """The demo's data with 16 train and 8 val images."""
    import visionblocks.cli._demo_data as data
    import visionblocks.cli._demo_seg as seg

    monkeypatch.setattr(seg, "TRAIN_IMAGES", 16)
    monkeypatch.setattr(data, "VAL_IMAGES", 8)


def test_segmentation_demo_writes_metrics_and_the_picture(tmp_path, capsys, few_images):
    out = tmp_path / "seg"
    assert main(["demo", "--task", "segmentation", "--steps", "3", "--out", str(out),
                 "--seed", "1"]) == 0  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    classes = ["background", "circle", "square", "triangle"]
    assert list(metrics["iou"]) == classes and list(metrics["f1"]) == classes
    assert 0.0 < metrics["miou"] <= 1.0 and 0.0 < metrics["accuracy"] <= 1.0
    assert all(0.0 <= v <= 1.0 for v in metrics["iou"].values())
    assert set(metrics["loss"]) == {"loss_ce", "loss_dice", "loss"}
    assert metrics["steps"] == 3 and metrics["seed"] == 1 and metrics["device"] == "cpu"
    with Image.open(out / "predictions.png") as png:
        assert png.size[0] > 500 and png.size[1] > 400
    printed = capsys.readouterr().out
    assert "visionblocks demo --task segmentation: 3 steps on cpu" in printed
    # the table of format_metrics: one row per class, then the summary
    assert "class         iou     f1\n" in printed and "\nmiou      " in printed
    assert f"miou      {metrics['miou']:.3f}" in printed
    assert not (out / "model.pt").exists()  # nothing of the detection demo


def test_segmentation_demo_refuses_detection_only_options(tmp_path, capsys):
    for flag in ("--distributed", "--detect-nonfinite"):
        argv = ["demo", "--task", "segmentation", "--steps", "1", "--out", str(tmp_path), flag]
        assert main(argv) == 1
        assert f"visionblocks demo: {flag} is for --task detection" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--task", "panoptic"])
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["demo", "--task", "segmentation", "--steps", "1", "--out", str(blocker)]) == 1
    assert "visionblocks demo:" in capsys.readouterr().err


def test_the_steps_and_out_defaults_follow_the_task():
    from visionblocks.cli import build_parser
    from visionblocks.cli._demo_seg import DEFAULT_STEPS

    args = build_parser().parse_args(["demo", "--task", "segmentation"])
    assert args.steps is None and args.out is None  # resolved per task
    text = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
    assert f"{DEFAULT_STEPS} for segmentation" in " ".join(text.split())
