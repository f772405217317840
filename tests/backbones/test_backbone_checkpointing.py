"""``grad_checkpointing`` of the backbone builders and `Backbone.set_grad_checkpointing`:
identical gradients and statistics (``torch.equal``, CPU float32) for our, torchvision's
and timm's backbones, stage lists, frozen stages, configs, export and bad options.
The mechanism itself: tests/training/test_checkpointing.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn

from tests.helpers import same_buffers, same_tensors
from visionblocks._core.checkpointing import checkpointed_modules
from visionblocks.backbones import Backbone, backbone_from_model, build_backbone
from visionblocks.backbones.tiny import TinyNet
from visionblocks.features import IntermediateLayerGetter
from visionblocks.registry import MODELS


def _x(size: int = 64) -> torch.Tensor:
    return torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(5))


def _build(name: str, **kwargs) -> Backbone:
    torch.manual_seed(0)
    return build_backbone(name, **kwargs).train()


def _step(backbone: nn.Module, x: torch.Tensor, seed: int = 0) -> list[torch.Tensor | None]:
    backbone.zero_grad()
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    sum(out.sum() for out in backbone(x).values()).backward()
    return [x.grad] + [p.grad for p in backbone.parameters()]


CASES = {
    "vb_tiny": ({}, [["stage1.0"], ["stage2.0", "stage2.1"]]),
    "resnet18": ({}, [["layer1.0", "layer1.1"], ["layer2.0", "layer2.1"]]),
    "mobilenet_v3_small": ({}, [["features.0", "features.1"], ["features.2", "features.3"]]),
    "timm/resnet18": ({}, [["layer1.0", "layer1.1"], ["layer2.0", "layer2.1"]]),
    "timm/convnext_atto": ({}, [["stages_0"], ["stages_1"]]),
    # stochastic depth: the recomputation must draw the same drops
    "timm/efficientnet_b0": ({"drop_path_rate": 0.3}, [["blocks.1.0", "blocks.1.1"]]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_and_statistics_are_identical(name):
    kwargs, first_blocks = CASES[name]
    plain = _build(name, **kwargs)
    checkpointed = _build(name, grad_checkpointing=True, **kwargs)
    assert checkpointed.grad_checkpointing == tuple(range(len(checkpointed._stage_blocks)))
    assert [list(b) for b in checkpointed._stage_blocks[: len(first_blocks)]] == first_blocks
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    assert repr(checkpointed) == repr(plain)
    for _ in range(2):
        assert same_tensors(_step(plain, _x()), _step(checkpointed, _x()))
        assert same_buffers(plain, checkpointed)


def test_stochastic_depth_draws_differ_between_seeds():
    # The timm/efficientnet_b0 case above can fail: its gradients depend on the drops.
    backbone = _build("timm/efficientnet_b0", drop_path_rate=0.3)
    assert not same_tensors(_step(backbone, _x(), seed=0), _step(backbone, _x(), seed=1))


def test_a_stage_list_checkpoints_only_those_stages():
    backbone = _build("resnet18", grad_checkpointing=[1, -1])
    assert backbone.grad_checkpointing == (1, 3)
    assert checkpointed_modules(backbone) == ["layer2.0", "layer2.1", "layer4.0", "layer4.1"]
    calls = {"layer1": [0], "layer2": [0]}
    for stage, count in calls.items():
        conv = backbone.get_submodule(f"{stage}.0.conv1")
        conv.register_forward_hook(lambda *_, c=count: c.__setitem__(0, c[0] + 1))
    assert same_tensors(_step(_build("resnet18"), _x()), _step(backbone, _x()))
    assert calls == {"layer1": [1], "layer2": [2]}  # only layer2 is recomputed
    # A new selection replaces the old one; False turns everything off.
    assert backbone.set_grad_checkpointing([0]).grad_checkpointing == (0,)
    assert checkpointed_modules(backbone) == ["layer1.0", "layer1.1"]
    assert backbone.set_grad_checkpointing(False).grad_checkpointing == ()
    assert checkpointed_modules(backbone) == []


def test_frozen_stages_are_skipped():
    backbone = _build("resnet18", frozen_stages=2, grad_checkpointing=True)
    assert backbone.grad_checkpointing == (2, 3)
    assert backbone.set_grad_checkpointing([0, 3]).grad_checkpointing == (3,)


def test_stages_after_the_last_output_do_not_run():
    backbone = _build("resnet18", out_indices=(0, 1), grad_checkpointing=True)
    assert backbone.grad_checkpointing == (0, 1)
    with pytest.raises(ValueError, match="stage 3 does not run in this backbone"):
        backbone.set_grad_checkpointing([3])
    timm = _build("timm/resnet18", out_indices=(1,), grad_checkpointing=[-3])
    assert timm.grad_checkpointing == (1,)


def test_checkpointed_blocks_recompute_only_in_training():
    backbone = _build("vb_tiny", grad_checkpointing=True)
    calls = [0]
    backbone.stage2[1].register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    _step(backbone, _x())
    assert calls[0] == 1  # hooks of a checkpointed block itself run once
    inner = [0]
    # (the recomputation stops once it has what the backward needs: inside ``pointwise``)
    backbone.stage2[1].depthwise.register_forward_hook(
        lambda *_: inner.__setitem__(0, inner[0] + 1)
    )
    _step(backbone, _x())
    assert inner[0] == 2
    backbone.eval()
    sum(out.sum() for out in backbone(_x().requires_grad_()).values()).backward()
    assert inner[0] == 3


def test_backbone_from_model_and_a_sequential_stage_container():
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(weights=None)
    backbone = backbone_from_model(
        model, ["features.3", "features.6"], grad_checkpointing=[1], input_size=32
    )
    assert backbone.grad_checkpointing == (1,)
    assert checkpointed_modules(backbone) == ["features.4", "features.5", "features.6"]


def test_a_backbone_built_directly_knows_no_stages():
    torch.manual_seed(0)
    getter = IntermediateLayerGetter(TinyNet(), ["stage2"], input_size=(3, 32, 32))
    backbone = Backbone(getter, ["stage2"], input_size=(3, 32, 32))
    assert backbone.set_grad_checkpointing(False).grad_checkpointing == ()
    with pytest.raises(ValueError, match="does not know its stage modules"):
        backbone.set_grad_checkpointing(True)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (1, TypeError, "grad_checkpointing must be a bool or a list of stage indices"),
        ("all", TypeError, "grad_checkpointing must be a bool"),
        (None, TypeError, "grad_checkpointing must be a bool"),
        ([1.0], TypeError, r"grad_checkpointing\[0\] must be a stage index"),
        ([True], TypeError, r"grad_checkpointing\[0\] must be a stage index"),
        ([4], ValueError, "index 4 is out of range for the backbone, which has 4 stages"),
        ([1, -3], ValueError, "names a stage twice"),
    ],
)
@pytest.mark.parametrize("name", ["vb_tiny", "resnet18", "timm/resnet18"])
def test_bad_options_raise_clearly(name, value, error, match):
    with pytest.raises(error, match=match):
        build_backbone(name, grad_checkpointing=value)
    backbone = _build(name, grad_checkpointing=[0])
    with pytest.raises(error, match=match.replace("grad_checkpointing", "enable")):
        backbone.set_grad_checkpointing(value)
    assert backbone.grad_checkpointing == (0,)  # unchanged


def test_config_and_a_training_step_of_a_detector():
    torch.manual_seed(0)
    model = MODELS.build(
        {
            "type": "detector",
            "backbone": {"type": "resnet18", "out_indices": [1, 2, 3], "grad_checkpointing": True},
            "neck": {"type": "fpn", "out_channels": 16},
            "head": {"type": "fcos", "num_classes": 3, "num_convs": 1, "grad_checkpointing": True},
        }
    )
    assert model.backbone.grad_checkpointing == (0, 1, 2, 3)
    assert checkpointed_modules(model.head) == ["cls_tower", "box_tower"]
    images = torch.rand(2, 3, 64, 64) * 255
    targets = [{"boxes": torch.tensor([[4.0, 4.0, 40.0, 30.0]]), "labels": torch.tensor([1])}] * 2
    losses = model.train()(images, targets)
    sum(losses.values()).backward()
    assert model.backbone.layer1[0].conv1.weight.grad is not None


@pytest.mark.slow  # exports
def test_trace_and_export_in_eval_mode():
    backbone = _build("resnet18", grad_checkpointing=True).eval()
    x = _x()
    expected = backbone(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated in newer torch
        traced = torch.jit.trace(backbone, x, strict=False)
    for out, ref in zip(traced(x).values(), expected.values(), strict=True):
        torch.testing.assert_close(out, ref)
    exported = torch.export.export(backbone, (x,))
    for out, ref in zip(exported.module()(x).values(), expected.values(), strict=True):
        torch.testing.assert_close(out, ref)
