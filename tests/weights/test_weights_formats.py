"""Checkpoints as other frameworks write them (tests/weights/fixtures) read and load."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from tests.weights.fixtures import FIXTURES, TinyNet, trained, write_detectron2, write_timm
from visionblocks.weights import load_partial, read_state_dict
from visionblocks.weights._io import read_checkpoint


def _expected_state() -> dict[str, torch.Tensor]:
    return trained()[0].state_dict()


@pytest.mark.parametrize("name", FIXTURES)
def test_each_layout_reads_with_its_report(tmp_path, name):
    fixture = FIXTURES[name]
    path = fixture.write(tmp_path)
    # The stand-in framework packages are gone: nothing could import them now.
    assert importlib.util.find_spec("mmengine") is None
    assert importlib.util.find_spec("lightning") is None
    state, info = read_checkpoint(path)
    assert (info.format, info.layout) == (fixture.format, fixture.layout)
    assert tuple(info.containers) == fixture.containers
    assert info.placeholders == fixture.placeholders
    assert info.mmap == fixture.format.startswith("torch (zip")
    expected = _expected_state()
    prefix = fixture.prefix[0] if fixture.prefix else ""
    if name == "ddp":
        prefix = "module."
    assert state.keys() == {prefix + k for k in expected}
    for key, value in expected.items():
        assert torch.equal(state[prefix + key], value), key
    assert not any(m.split(".")[0] in ("mmengine", "lightning") for m in sys.modules)


@pytest.mark.parametrize("name", FIXTURES)
def test_each_layout_loads_strictly_into_the_model(tmp_path, name):
    fixture = FIXTURES[name]
    path = fixture.write(tmp_path)
    model = TinyNet()
    report = load_partial(model, path, strict=True)
    assert report.ok and report.num_loaded == 8
    assert report.prefix_change == fixture.prefix
    for key, value in _expected_state().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_timm_ema_weights_only_when_asked(tmp_path):
    path = write_timm(tmp_path)
    plain, ema = read_state_dict(path), read_state_dict(path, key="state_dict_ema")
    assert torch.equal(ema["fc.weight"], plain["fc.weight"] + 1)
    assert torch.equal(ema["bn1.num_batches_tracked"], plain["bn1.num_batches_tracked"])
    model = TinyNet()
    load_partial(model, ema, strict=True)
    assert torch.equal(model.fc.weight, ema["fc.weight"])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_detectron2_pickles_of_any_protocol(tmp_path, protocol):
    path = write_detectron2(tmp_path, protocol=protocol)
    state, info = read_checkpoint(path)
    assert info.layout == "detectron2 model zoo" and info.other_keys == [
        "__author__",
        "matching_heuristics",
    ]
    assert state["conv1.weight"].dtype == torch.float32
    state["conv1.weight"].add_(1)  # writable (NumPy's buffer copied where it was read-only)
    assert load_partial(TinyNet(), path, strict=True).ok


def test_the_lightning_prefix_can_be_turned_off(tmp_path):
    path = FIXTURES["lightning"].write(tmp_path)
    report = load_partial(TinyNet(), path, auto_prefix=False, min_loaded=0, dry_run=True)
    assert report.num_loaded == 0 and report.unexpected[0].startswith("model.")
    explicit = load_partial(TinyNet(), path, strip_prefixes=["model."], strict=True)
    assert explicit.prefix_change is None and explicit.ok  # the explicit stripping did it
