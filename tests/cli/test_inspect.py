"""`visionblocks inspect CHECKPOINT [--model NAME]` through the CLI entry function."""

from __future__ import annotations

import argparse
from collections import OrderedDict

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from tests.helpers import MaliciousPickle
from tests.weights.fixtures import FIXTURES
from visionblocks.cli import main
from visionblocks.registry import BACKBONES


class _TinyBackbone(nn.Module):
    """Follows the BACKBONES contract: a feature dict and ``feature_info``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Conv2d(4, 8, 3, stride=2)
        self.feature_info = [{"name": "layer1", "channels": 8, "stride": 2}]

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        return OrderedDict(layer1=self.layer1(self.bn1(self.conv1(x)).relu()))


def _classifier_state() -> dict[str, torch.Tensor]:
    """The backbone's weights plus a classifier head (``fc``), as a pretrained file holds them."""
    state = dict(_TinyBackbone().state_dict())
    state["fc.weight"] = torch.zeros(10, 8)
    state["fc.bias"] = torch.zeros(10)
    return state


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "tiny.pth"
    torch.save({"state_dict": _classifier_state(), "epoch": 12}, path)
    return path


@pytest.fixture
def tiny_backbone():
    """A registered builder that keeps no load report (inspect falls back to a dry run)."""
    name = "_test_inspect_tiny_backbone"
    BACKBONES.register(lambda **options: _TinyBackbone(), name=name)
    yield name
    BACKBONES._remove(name)


def test_inspect_prints_summary(checkpoint, capsys):
    assert main(["inspect", str(checkpoint)]) == 0
    out = capsys.readouterr().out.splitlines()
    # conv1 108 + bn1 4 * 4 + 1 + layer1 288 + 8 + fc 80 + 10 = 511 elements
    assert f"file:      {checkpoint} ({checkpoint.stat().st_size / 2**20:.2f} MiB on disk)" in out
    assert "format:    torch (zip, mmap)" in out
    assert "unwrapped: 'state_dict'" in out
    assert "dropped:   epoch (not tensors)" in out
    assert "tensors:   10 (511 elements, 0.00 MiB)" in out
    assert "dtypes:    float32 9, int64 1" in out
    assert "prefixes:  4" in out
    groups = [line.split() for line in out if line.startswith("  ")]
    assert [g[:3] for g in groups] == [
        ["conv1.", "1", "tensor"],
        ["bn1.", "5", "tensors"],
        ["layer1.", "2", "tensors"],
        ["fc.", "2", "tensors"],
    ]


def test_inspect_shows_a_common_prefix_and_megabytes(tmp_path, capsys):
    path = tmp_path / "det.safetensors"
    state = {"backbone.body.a.weight": torch.zeros(2**18), "backbone.body.b.weight": torch.zeros(4)}
    save_file(state, str(path))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format:    safetensors" in out
    assert "common:    every key starts with 'backbone.body.'" in out
    assert "backbone.body.a.  1 tensor   1.00 MiB" in out


def test_inspect_expands_named_parts_but_not_numbered_blocks(tmp_path, capsys):
    names = [
        "backbone.body.conv1.weight",
        "backbone.body.layer1.0.weight",
        "backbone.fpn.inner.weight",
        "head.0.weight",
        "head.1.weight",
        "scale",
    ]
    path = tmp_path / "det.pt"
    torch.save({name: torch.zeros(2) for name in names}, path)
    assert main(["inspect", str(path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert [row.split()[:2] for row in rows] == [
        ["backbone.", "3"],
        ["backbone.body.", "2"],
        ["backbone.fpn.", "1"],
        ["head.", "2"],
        ["scale", "1"],
    ]
    assert rows[1].startswith("    backbone.body.")


def test_inspect_with_a_torchvision_backbone(tmp_path, capsys):
    path = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), path)
    assert main(["inspect", str(path), "--model", "resnet18"]) == 0
    out = capsys.readouterr().out
    report = out.split("build_backbone('resnet18', pretrained=FILE) loads:\n")
    assert report[1].splitlines() == [
        "loaded 120/120 model keys (100.0%): 0 missing, 0 mismatched, 2 unexpected, 0 adapted, "
        "0 renamed",
        "unexpected (2):",
        "  fc.weight",
        "  fc.bias",
    ]


def test_inspect_with_a_builder_without_report_does_a_dry_run(checkpoint, tiny_backbone, capsys):
    assert main(["inspect", str(checkpoint), "--model", tiny_backbone]) == 0
    out = capsys.readouterr().out
    assert out.split(f"build_backbone({tiny_backbone!r}, pretrained=FILE) loads:")[1].splitlines()[
        1:
    ] == [
        "loaded 8/8 model keys (100.0%): 0 missing, 0 mismatched, 2 unexpected, 0 adapted, "
        "0 renamed (dry run: nothing copied)",
        "unexpected (2):",
        "  fc.weight",
        "  fc.bias",
    ]


def test_inspect_a_checkpoint_of_another_architecture(tmp_path, capsys):
    """The report is printed (not a traceback) with a verdict: build_backbone would refuse it."""
    path = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    assert main(["inspect", str(path), "--model", "resnet34"]) == 0
    out = capsys.readouterr().out
    assert "build_backbone('resnet34', pretrained=FILE) does NOT load" in out
    assert (
        "loaded 120/216 model keys" in out
        and "missing (96)" in out
        and "(dry run: nothing copied)" in out
    )
    # Names do not load it, so matching by structure is tried: it pairs nothing more.
    assert out.rstrip().endswith(
        "load_partial(backbone, FILE, match='structure') loads no more: 120/216 model keys "
        "(the order and shapes pair nothing that the names leave)"
    )


def _detectron2_resnet18(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A torchvision ResNet-18 state dict under detectron2's names, in its order: the
    ``shortcut`` before ``conv1``, each conv's norm inside it, no num_batches_tracked, no fc."""
    out: dict[str, torch.Tensor] = {}

    def conv(source_conv: str, source_bn: str, name: str) -> None:
        out[f"{name}.weight"] = state[f"{source_conv}.weight"]
        for stat in ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.norm.{stat}"] = state[f"{source_bn}.{stat}"]

    conv("conv1", "bn1", "stem.conv1")
    for stage in range(4):
        for block in range(2):
            source, name = f"layer{stage + 1}.{block}", f"res{stage + 2}.{block}"
            if f"{source}.downsample.0.weight" in state:
                conv(f"{source}.downsample.0", f"{source}.downsample.1", f"{name}.shortcut")
            for i in (1, 2):
                conv(f"{source}.conv{i}", f"{source}.bn{i}", f"{name}.conv{i}")
    return out


def test_inspect_shows_the_pairing_matched_by_structure_when_names_do_not_load(tmp_path, capsys):
    path = tmp_path / "model_final.pth"
    state = _detectron2_resnet18(torchvision.models.resnet18().state_dict())
    torch.save({"model": state, "iteration": 90000}, path)
    assert main(["inspect", str(path), "--model", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "build_backbone('resnet18', pretrained=FILE) does NOT load" in out
    structure = out.split(
        "load_partial(backbone, FILE, match='structure') would load (every pairing, "
        "checkpoint -> backbone):\n"
    )[1].splitlines()
    assert structure[0] == (
        "loaded 100/120 model keys (83.3%): 20 missing, 0 mismatched, 0 unexpected, 0 adapted, "
        "100 renamed (dry run: nothing copied)"
    )
    assert structure[2:4] == ["missing (20):", "  bn1.num_batches_tracked"]
    renamed = structure[structure.index("renamed (100):") + 1 :]
    assert len(renamed) == 100 and "  ... and" not in "\n".join(renamed)  # every pairing
    assert renamed[0] == "  stem.conv1.weight -> conv1.weight"
    assert "  res3.0.shortcut.weight -> layer2.0.downsample.0.weight" in renamed
    assert "  res3.0.conv1.norm.running_var -> layer2.0.bn1.running_var" in renamed


def test_inspect_shows_why_matching_by_structure_refuses(tmp_path, capsys, tiny_backbone):
    path = tmp_path / "two.pt"
    torch.save({"a.weight": torch.zeros(8, 4, 3, 3), "b.weight": torch.ones(8, 4, 3, 3)}, path)
    assert main(["inspect", str(path), "--model", tiny_backbone]) == 0
    out = capsys.readouterr().out
    refusal = out.split("load_partial(backbone, FILE, match='structure') refuses:\n")[1]
    assert refusal.startswith("match='structure' is ambiguous")
    assert "model 'layer1.weight' (8, 4, 3, 3) could be checkpoint 'a.weight'" in refusal


def test_inspect_does_not_match_a_safetensors_file_by_structure(tmp_path, capsys):
    path = tmp_path / "renamed.safetensors"
    state = torchvision.models.resnet18().state_dict()
    save_file({f"p{i:03d}": v for i, v in enumerate(state.values())}, str(path))
    assert main(["inspect", str(path), "--model", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(
        "load_partial(backbone, FILE, match='structure') not tried: a .safetensors file stores "
        "its keys sorted by name, so their order says nothing about the module tree"
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("timm", "timm backbones are named 'timm/<model>'"),
        ("timm/no_such_net", "'no_such_net' is not a timm model"),
        ("timm/resnet_18", "Did you mean: 'timm/resnet18'"),
        ("timm/hf-hub:timm/resnet18.a1_in1k", "looks like a hub name"),
        ("convnext_atto", "Did you mean: 'timm/convnext_atto'"),  # a timm model without timm/
    ],
)
def test_inspect_bad_timm_names_exit_2_before_reading(checkpoint, capsys, name, message):
    assert main(["inspect", str(checkpoint), "--model", name]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err


def test_inspect_with_a_timm_backbone(tmp_path, capsys):
    """``--model timm/<name>``: the full timm checkpoint loads into that feature model."""
    import timm

    path = tmp_path / "resnet10t.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), path)
    assert main(["inspect", str(path), "--model", "timm/resnet10t"]) == 0
    out = capsys.readouterr().out
    report = out.split("build_backbone('timm/resnet10t', pretrained=FILE) loads:\n")[1]
    assert report.splitlines()[0].startswith("loaded ")
    assert "0 missing, 0 mismatched, 2 unexpected" in report and "  fc.weight" in report


def test_inspect_unknown_model_exits_2_before_reading(checkpoint, capsys):
    assert main(["inspect", str(checkpoint), "--model", "resnet_18"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("visionblocks inspect: 'resnet_18' is not in the backbones")
    assert "Did you mean: 'resnet18'" in captured.err


def test_inspect_missing_file_exits_1(tmp_path, capsys):
    missing = tmp_path / "missing.pt"
    assert main(["inspect", str(missing)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"visionblocks inspect: checkpoint file not found: '{missing}'"


@pytest.mark.parametrize(
    ("argument", "hint"),
    [
        ("resnet18", "'resnet18' is not a file; to inspect how a checkpoint loads into the "
         "backbone named 'resnet18', use `visionblocks inspect CHECKPOINT --model resnet18`"),
        ("timm/resnet10t", "'timm/resnet10t' is not a file; to inspect how a checkpoint loads "
         "into the backbone named 'timm/resnet10t', use `visionblocks inspect CHECKPOINT "
         "--model timm/resnet10t`"),
        ("resnt18", "checkpoint file not found: 'resnt18'; for a backbone (did you mean "
         "'resnet18'?), use `visionblocks inspect CHECKPOINT --model resnet18`"),
        ("convnext_atto", "checkpoint file not found: 'convnext_atto'; for a backbone (did you "
         "mean 'timm/convnext_atto'?), use `visionblocks inspect CHECKPOINT --model "
         "timm/convnext_atto`"),
        ("timm/resnet_18", "(did you mean 'timm/resnet18'"),
        ("resnet18.pth", "checkpoint file not found: 'resnet18.pth'"),  # a file name: no hint
        ("no_such_thing", "checkpoint file not found: 'no_such_thing'"),  # nothing close
    ],
)  # fmt: skip
def test_inspect_a_backbone_name_instead_of_a_file_says_to_use_model(
    tmp_path, monkeypatch, capsys, argument, hint
):
    monkeypatch.chdir(tmp_path)  # no file of that name
    assert main(["inspect", argument]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("visionblocks inspect: ") and hint in captured.err
    assert ("--model" in captured.err) == (not argument.startswith(("resnet18.", "no_such")))


def test_inspect_unsafe_file_exits_1_without_running_it(tmp_path, capsys):
    marker = tmp_path / "marker"
    path = tmp_path / "unsafe.pt"
    torch.save({"w": torch.ones(1), "x": MaliciousPickle(str(marker))}, path)
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert "refusing to load" in err and "weights_only" in err and "unsafe.pt" in err
    assert not marker.exists()


def test_help_lists_inspect(capsys):
    assert main([]) == 0
    assert "inspect" in capsys.readouterr().out


@pytest.mark.parametrize("name", FIXTURES)
def test_inspect_names_the_format_layout_and_replaced_objects(tmp_path, capsys, name):
    fixture = FIXTURES[name]
    path = fixture.write(tmp_path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"format:    {fixture.format}" in out
    assert f"layout:    {fixture.layout}" in out
    if fixture.containers:
        assert f"unwrapped: {' -> '.join(repr(c) for c in fixture.containers)}" in out
    replaced = [line for line in out if line.startswith("replaced:")]
    if fixture.placeholders:
        listed = ", ".join(f"{k} {n}" for k, n in fixture.placeholders.items())
        assert replaced == [f"replaced:  {listed} (placeholders: never imported or run)"]
    else:
        assert replaced == []
    if fixture.prefix or name == "ddp":
        prefix = fixture.prefix[0] if fixture.prefix else "module."
        assert f"common:    every key starts with {prefix!r}" in out


def test_inspect_a_lightning_checkpoint_against_a_backbone(tmp_path, capsys):
    """The report shows the prefix load_partial found (Lightning's ``model.``)."""
    path = tmp_path / "last.ckpt"
    weights = torchvision.models.resnet18().state_dict()
    torch.save(
        {
            "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in weights.items()},
            "hyper_parameters": argparse.Namespace(lr=0.1),
        },
        path,
    )
    assert main(["inspect", str(path), "--model", "resnet18"]) == 0
    out = capsys.readouterr().out
    assert "layout:    Lightning checkpoint" in out
    assert "replaced:  argparse.Namespace 1" in out
    report = out.split("build_backbone('resnet18', pretrained=FILE) loads:\n")[1].splitlines()
    assert report[0].startswith("loaded 120/120 model keys (100.0%)")
    assert report[1] == (
        "prefix: removed 'model.' (found automatically; auto_prefix=False turns it off)"
    )


def test_inspect_a_file_that_matches_nothing_reports_it(tmp_path, capsys, tiny_backbone):
    """A builder without a report gets a dry run that may load nothing: printed, not raised."""
    path = tmp_path / "other.pt"
    torch.save({"decoder.weight": torch.zeros(2)}, path)
    assert main(["inspect", str(path), "--model", tiny_backbone]) == 0
    assert "loaded 0/8 model keys" in capsys.readouterr().out


def test_inspect_key_reads_a_whole_model_under_that_entry(tmp_path, capsys):
    # ultralytics' final files: the weights only under "ema", as a whole pickled model
    path = tmp_path / "best.pt"
    ema = _TinyBackbone().half()
    torch.save({"model": None, "ema": ema, "epoch": -1}, path)
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert "whole models are pickled under 'ema'" in err and "--key ema" in err
    assert main(["inspect", str(path), "--key", "ema"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "unwrapped: 'ema'" in out
    assert f"modules:   {__name__}._TinyBackbone 1, " in "\n".join(out)
    elements = sum(t.numel() for t in ema.state_dict().values())
    assert f"tensors:   8 ({elements} elements, 0.00 MiB)" in out  # 8: as ema.state_dict()
    assert "dtypes:    float16 7, int64 1" in out
    assert main(["inspect", str(path), "--key", "nope"]) == 1
    assert "no mapping under key 'nope'" in capsys.readouterr().err
