"""`visionblocks.deploy` and ``visionblocks export``: files written, checked against eager,
dynamic sizes, failures that name the module to change, configs and checkpoints as sources."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from visionblocks.cli import main
from visionblocks.deploy import ExportError, export_model, load_for_export, max_stride
from visionblocks.nn import ConvNormAct

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

DETECTOR = {
    "type": "detector",
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
    "neck": {"type": "fpn", "out_channels": 32},
    "head": {"type": "fcos", "num_classes": 3, "num_convs": 1},
}


def _blocks() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(ConvNormAct(3, 8, 3), ConvNormAct(8, 16, 3, stride=2)).eval()


class _NumpyInside(nn.Module):
    def forward(self, x):
        return x * float(x.sum().numpy())  # host round trip: no export can trace it


def test_pt2_file_matches_eager_at_other_sizes(tmp_path):
    model = _blocks()
    result = export_model(model, torch.rand(2, 3, 64, 64), tmp_path / "m.pt2", "pt2")
    assert result.path.is_file() and result.size_bytes == result.path.stat().st_size
    assert result.max_abs_diff < 1e-5 and result.outputs == 1
    loaded = torch.export.load(str(result.path)).module()
    x = torch.rand(3, 3, 96, 160)  # another batch, height and width (multiples of 32)
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)


def test_onnx_file_matches_eager_at_other_sizes(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = _blocks()
    result = export_model(model, torch.rand(2, 3, 64, 64), tmp_path / "m.onnx", "onnx")
    assert result.max_abs_diff < 1e-4
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 128, 96)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), model(x).detach(), rtol=1e-4, atol=1e-4)


def test_static_export_keeps_the_size_and_the_model_mode(tmp_path):
    model = _blocks().train()
    result = export_model(
        model, torch.rand(2, 3, 50, 70), tmp_path / "s.pt2", "pt2", dynamic_hw=False
    )
    assert result.max_abs_diff < 1e-5 and model.training  # put back in training mode
    with pytest.raises(ValueError, match="multiple of the stride 32"):
        export_model(model, torch.rand(2, 3, 50, 70), tmp_path / "d.pt2", "pt2")
    with pytest.raises(ValueError, match="at least 64"):
        export_model(model, torch.rand(2, 3, 32, 64), tmp_path / "d.pt2", "pt2")
    with pytest.raises(ValueError, match="batch of at least 2"):
        export_model(model, torch.rand(1, 3, 64, 64), tmp_path / "d.pt2", "pt2")


def test_a_failure_names_the_innermost_module(tmp_path):
    model = nn.Sequential(ConvNormAct(3, 8, 3), nn.Sequential(nn.ReLU(), _NumpyInside()))
    with pytest.raises(ExportError, match=r"module '1\.1' \(_NumpyInside\)") as info:
        export_model(model, torch.rand(2, 3, 64, 64), tmp_path / "f.pt2", "pt2")
    assert info.value.module_path == "1.1" and info.value.module_type == "_NumpyInside"
    with pytest.raises(ExportError, match="the forward of _NumpyInside itself"):
        export_model(_NumpyInside(), torch.rand(2, 3, 64, 64), tmp_path / "g.pt2", "pt2")


def test_sources_config_and_checkpoint(tmp_path):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(DETECTOR))
    model = load_for_export(config)
    assert not model.training and max_stride(model) == max(model.head.strides)
    # A checkpoint with its config; and a config naming its weights, relative to itself.
    state = {k: torch.randn_like(v) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}  # fmt: skip
    torch.save({"config": DETECTOR, "model": state}, tmp_path / "ckpt.pt")
    from_ckpt = load_for_export(tmp_path / "ckpt.pt")
    torch.save(state, tmp_path / "w.pt")
    (tmp_path / "run.json").write_text(json.dumps({"model": DETECTOR, "weights": "w.pt"}))
    from_run = load_for_export(tmp_path / "run.json")
    for loaded in (from_ckpt, from_run):
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    torch.save({"model": state}, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="under 'config'"):
        load_for_export(tmp_path / "bare.pt")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_for_export(tmp_path / "list.json")


@pytest.mark.slow  # exports
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_command_exports_a_detector_and_prints_the_check(tmp_path, capsys, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps(DETECTOR))
    out = tmp_path / f"det.{fmt}"
    argv = ["export", str(config), "--format", fmt, "--out", str(out), "--image-size", "128", "128"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert out.is_file() and "max abs difference" in printed and "MiB" in printed
    diff = float(printed.rsplit("max abs difference", 1)[1].split()[0])
    assert diff < 1e-4


def test_command_reports_errors(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope.json"), "--out", str(tmp_path / "x.onnx")]) == 1
    assert "no such config or checkpoint file" in capsys.readouterr().err


def test_tied_detections_in_another_order_compare_equal():
    from visionblocks.deploy._check import detections_diff

    boxes = torch.tensor([[[0.0, 0, 4, 4], [10, 10, 20, 20], [5, 5, 9, 9], [0, 0, 0, 0]]])
    scores = torch.tensor([[0.9, 0.5, 0.5, 0.0]])
    labels = torch.tensor([[1, 2, 2, -1]])
    count = torch.tensor([3])
    eager = [boxes, scores, labels, count]
    swapped = [boxes[:, [0, 2, 1, 3]], scores[:, [0, 2, 1, 3]], labels, count]
    assert detections_diff(swapped, eager) == 0.0  # the tie at 0.5, in the other order
    moved = [boxes + torch.tensor([0.0, 0, 0, 0.5]), scores, labels, count]
    assert detections_diff(moved, eager) == 0.5
    relabelled = [boxes, scores, torch.tensor([[1, 2, 0, -1]]), count]
    assert detections_diff(relabelled, eager) == float("inf")


@pytest.mark.slow  # exports
@pytest.mark.parametrize(
    "head",
    [
        {"type": "fcos", "num_classes": 3, "num_convs": 1, "score_thresh": 0.9},
        {"type": "yolov8", "num_classes": 3},  # untrained: its scores stay below 0.05
    ],
    ids=["fcos", "yolov8"],
)
def test_a_detector_with_fewer_than_two_detections_exports(tmp_path, head):
    # the exported program used to raise "Runtime assertion failed for expression u1 >= 2"
    # (torchvision's fake nms assumes 2 boxes kept or more)
    from visionblocks.models import build_detector

    torch.manual_seed(0)
    model = build_detector(backbone=DETECTOR["backbone"], neck=DETECTOR["neck"], head=head)
    model.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert model(images, padded=True)["num_detections"].sum() < 2
    result = export_model(model, images, tmp_path / "d.pt2", "pt2", kwargs={"padded": True})
    assert result.max_abs_diff == 0.0
