"""load_partial's automatic key prefix and its guard against loading nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.weights.fixtures import TinyNet
from visionblocks.weights import LoadError, load_partial
from visionblocks.weights._prefix import find_prefix_change


def _state(prefix: str = "") -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return {prefix + k: v.clone() for k, v in TinyNet().state_dict().items()}


@pytest.mark.parametrize(
    "prefix", ["model.", "module.", "backbone.", "encoder.", "net.", "student.backbone."]
)
def test_a_common_prefix_is_removed_and_reported(prefix):
    model = TinyNet()
    report = load_partial(model, _state(prefix), strip_prefixes=(), strict=True)
    assert report.prefix_change == (prefix, "")
    assert report.renamed[f"{prefix}fc.bias"] == "fc.bias" and len(report.renamed) == 8
    assert torch.equal(model.fc.weight, _state()["fc.weight"])
    assert str(report).splitlines()[1] == (
        f"prefix: removed {prefix!r} (found automatically; auto_prefix=False turns it off)"
    )


class _Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = TinyNet()
        self.head = nn.Conv2d(8, 4, 1)


def test_a_prefix_is_added_for_a_bare_backbone_checkpoint():
    model = _Detector()
    report = load_partial(model, _state())
    assert report.prefix_change == ("", "backbone.")
    assert report.missing == ["head.weight", "head.bias"] and report.unexpected == []
    assert "prefix: added 'backbone.'" in str(report)
    assert torch.equal(model.backbone.conv1.weight, _state()["conv1.weight"])


def test_only_keys_that_are_not_model_keys_change():
    """Part of the checkpoint already fits; the prefix is found for the rest."""
    state = _state()
    mixed = {("model." + k if k.startswith("fc.") else k): v for k, v in state.items()}
    report = load_partial(TinyNet(), mixed, strict=True)
    assert report.prefix_change == ("model.", "")
    assert report.renamed == {"model.fc.weight": "fc.weight", "model.fc.bias": "fc.bias"}


def test_explicit_rules_win_and_no_change_is_made_when_nothing_improves():
    state = _state("body.")
    report = load_partial(TinyNet(), state, rename=[(r"^body\.", "")], strict=True)
    assert report.prefix_change is None
    other_shapes = {"x." + k: torch.zeros(1) for k in _state()}  # names fit, shapes do not
    report = load_partial(TinyNet(), other_shapes, min_loaded=0, dry_run=True)
    assert report.prefix_change is None and report.num_loaded == 0


def test_ties_are_broken_deterministically():
    model = {"w": torch.zeros(2), "q.p.w": torch.zeros(2)}
    state = {"p.w": torch.ones(2)}  # removing 'p.' or adding 'q.' both load one key
    assert find_prefix_change({"p.w": "p.w"}, state, model)[0] == ("p.", "")
    model = {"q.w": torch.zeros(2), "w": torch.zeros(2)}
    state = {"p.q.w": torch.ones(2)}  # removing 'p.' or 'p.q.': the shorter wins
    assert find_prefix_change({"p.q.w": "p.q.w"}, state, model)[0] == ("p.", "")


def test_a_change_that_would_merge_two_keys_is_not_made():
    model = {"a": torch.zeros(1)}
    state = {"m.a": torch.ones(1), "m.b": torch.ones(1), "b": torch.ones(1)}
    assert find_prefix_change({k: k for k in state}, state, model) is None


# ---------------------------------------------------------------------------- zero loaded
def test_loading_nothing_is_an_error_by_default():
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrong = {"decoder.layer.weight": torch.zeros(3, 3)}
    with pytest.raises(LoadError, match=r"nothing loaded: none of the model's 8 keys") as info:
        load_partial(model, wrong)
    message = str(info.value)
    assert "'decoder.layer.weight'" in message and "min_loaded=0" in message
    assert info.value.report.unexpected == ["decoder.layer.weight"]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(LoadError, match="nothing loaded"):
        load_partial(model, wrong, dry_run=True)  # a dry run tells the same


@pytest.mark.parametrize("lowered", [0, 0.0])
def test_min_loaded_zero_accepts_loading_nothing(lowered):
    report = load_partial(TinyNet(), {"other.weight": torch.zeros(1)}, min_loaded=lowered)
    assert report.num_loaded == 0 and report.unexpected == ["other.weight"]


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({}, "the checkpoint holds no tensors"),
        ({"fc.weight": torch.zeros(3, 3)}, "1 matched a name but not the shape"),
    ],
)
def test_the_message_says_why_nothing_loaded(source, match):
    with pytest.raises(LoadError, match=match):
        load_partial(TinyNet(), source)


def test_a_model_without_tensors_needs_nothing():
    assert load_partial(nn.ReLU(), {"x": torch.zeros(1)}).unexpected == ["x"]


# -------------------------------------------------------------------------- strip_prefixes
def test_a_bare_string_is_one_prefix_to_strip():
    report = load_partial(TinyNet(), _state("net."), strip_prefixes="net.", auto_prefix=False)
    assert report.ok and report.renamed["net.fc.bias"] == "fc.bias"
    # Not its characters: stripping 'n', 'e', 't', '.' in turn would turn 'n.fc.bias' into
    # 'fc.bias'; the prefix 'net.' leaves it alone.
    report = load_partial(
        TinyNet(), _state("n."), strip_prefixes="net.", auto_prefix=False, min_loaded=0
    )
    assert report.num_loaded == 0 and "n.fc.bias" in report.unexpected


@pytest.mark.parametrize(
    ("strip_prefixes", "message"),
    [
        (["module.", 3], r"strip_prefixes\[1\] must be str, got int"),
        (("model.", None), r"strip_prefixes\[1\] must be str, got NoneType"),
        (7, "strip_prefixes must be str or list or tuple, got int"),
        ({"module."}, "strip_prefixes must be str or list or tuple, got set"),
    ],
)
def test_strip_prefixes_of_another_type_is_a_type_error_naming_it(strip_prefixes, message):
    with pytest.raises(TypeError, match=message):
        load_partial(TinyNet(), _state(), strip_prefixes=strip_prefixes)
