"""IntermediateLayerGetter against torchvision's (``torchvision.models._utils``), issue 16.

Top-level names of chain-like models (a ResNet, an ``nn.Sequential``) behave as torchvision's:
constructor, outputs, children, parameters, state dicts (loadable both ways), truncation,
the missing-layer error, ``return_layers``, and read access as a ``ModuleDict``. The
documented differences ("Differences from torchvision's" in the class docstring) are checked
at the end.
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter as TVGetter

from visionblocks.features import IntermediateLayerGetter


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def _sequential() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    ).eval()


CASES = {
    "resnet18": (_resnet, {"layer1": "c2", "layer3": "c4"}),
    "resnet18_last": (_resnet, {"layer2": "0", "layer4": "1"}),
    "resnet18_stem": (_resnet, {"maxpool": "stem"}),
    "sequential": (_sequential, {"1": "bn", "4": "mid"}),
    "sequential_head": (_sequential, {"3": "a", "8": "logits"}),
}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def pair(request):
    make, return_layers = CASES[request.param]
    model = make()
    # Positional (model, return_layers), as torchvision's.
    ours = IntermediateLayerGetter(model, return_layers)
    theirs = TVGetter(model, return_layers)
    return model, return_layers, ours, theirs


def test_outputs(pair):
    _, return_layers, ours, theirs = pair
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        a, b = ours(x), theirs(x)
    assert type(a) is type(b)
    assert list(a) == list(b) == list(return_layers.values())
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_children_parameters_buffers_and_truncation(pair):
    _, _, ours, theirs = pair
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    for (_, a), (_, b) in zip(ours.named_children(), theirs.named_children(), strict=True):
        assert a is b  # the model's own modules, shared


def test_state_dict_round_trip(pair):
    _, _, ours, theirs = pair
    assert list(ours.state_dict()) == list(theirs.state_dict())
    source = {k: torch.randn_like(v) if v.is_floating_point() else v
              for k, v in theirs.state_dict().items()}  # fmt: skip
    assert not ours.load_state_dict(source).missing_keys  # torchvision's keys load into ours
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(value, source[key])
    assert not theirs.load_state_dict(ours.state_dict()).unexpected_keys  # and back


def test_return_layers_attribute(pair):
    _, return_layers, ours, theirs = pair
    assert ours.return_layers == theirs.return_layers == return_layers


def test_module_dict_read_access(pair):
    _, _, ours, theirs = pair
    assert len(ours) == len(theirs)
    assert list(ours) == list(theirs)
    assert list(ours.keys()) == list(theirs.keys())
    assert [m for _, m in ours.items()] == [m for _, m in theirs.items()]
    assert list(ours.values()) == list(theirs.values())
    for name in theirs:
        assert name in ours and ours[name] is theirs[name]
    assert "nope" not in ours


@pytest.mark.parametrize("make", [_resnet, _sequential], ids=["resnet18", "sequential"])
def test_missing_layer_error(make):
    model = make()
    with pytest.raises(ValueError, match="return_layers are not present in model"):
        TVGetter(model, {"nope": "x"})
    with pytest.raises(ValueError, match="^return_layers are not present in model") as info:
        IntermediateLayerGetter(model, {"nope": "x"})
    assert "'nope'" in str(info.value)  # and names the culprit


# ------------------------------------------------------------------- documented differences
def test_not_a_module_dict():
    ours = IntermediateLayerGetter(_sequential(), {"1": "a"})
    assert isinstance(TVGetter(_sequential(), {"1": "a"}), nn.ModuleDict)
    assert not isinstance(ours, nn.ModuleDict)
    assert not hasattr(ours, "update") and not hasattr(ours, "pop")


def test_outputs_in_return_layers_order():
    model = _resnet()
    x = torch.rand(1, 3, 64, 64)
    reversed_layers = {"layer3": "c4", "layer1": "c2"}
    assert list(TVGetter(model, reversed_layers)(x)) == ["c2", "c4"]  # model order
    assert list(IntermediateLayerGetter(model, reversed_layers)(x)) == ["c4", "c2"]


def test_runs_the_models_forward():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.unused, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.ReLU()

        def forward(self, x):
            return self.b(self.a(x) * 2)  # functional op between children; `unused` never runs

    model = Scaled()
    x = torch.rand(1, 3, 8, 8)
    ours = IntermediateLayerGetter(model, {"b": "out"}, input_size=(3, 8, 8))
    theirs = TVGetter(model, {"b": "out"})
    torch.testing.assert_close(ours(x)["out"], model(x))
    assert [n for n, _ in ours.named_children()] == ["a", "b"]
    assert [n for n, _ in theirs.named_children()] == ["a", "unused", "b"]


def test_extensions_and_empty_return_layers():
    model = _resnet()
    out = IntermediateLayerGetter(model, ["layer1", "layer4.1.conv2"])(torch.rand(1, 3, 64, 64))
    assert list(out) == ["layer1", "layer4.1.conv2"]
    assert TVGetter(model, {})(torch.rand(1, 3, 64, 64)) == {}
    with pytest.raises(ValueError, match="return_layers is empty"):
        IntermediateLayerGetter(model, {})


def test_training_flag_follows_the_model():
    model = _resnet()  # eval mode
    assert TVGetter(model, {"layer1": "a"}).training
    assert not IntermediateLayerGetter(model, {"layer1": "a"}).training
    assert not model.layer1.training  # the shared children keep their flags in both
