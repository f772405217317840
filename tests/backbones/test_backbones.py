"""Tests generated from the BACKBONES registry: every entry (and a few timm names) gets forward,
backward, feature_info and state-dict round-trip tests on a small input.

A new registered backbone is tested here without writing a test. Each backbone is built once per
module (construction of the large torchvision models dominates the run time).
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from pathlib import Path

import pytest
import timm
import torch
import torchvision
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor

from visionblocks.backbones import build_backbone
from visionblocks.backbones._tv import TORCHVISION_STAGES
from visionblocks.registry import BACKBONES

# Entries that need arguments are tested through names that fill them in.
_NEEDS_ARGS = {"timm"}
TIMM_NAMES = ["timm/resnet18", "timm/mobilenetv3_small_100"]
NAMES = [n for n in BACKBONES.list() if n not in _NEEDS_ARGS] + TIMM_NAMES
BUILTIN = {*TORCHVISION_STAGES, "vb_tiny", *TIMM_NAMES}
SIZE = 64


@contextlib.contextmanager
def skip_init():
    """Build modules without running torch.nn.init (their state is loaded right after)."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    for n in names:
        setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


@pytest.fixture(scope="module", params=NAMES)
def built(request):
    torch.manual_seed(0)
    return request.param, build_backbone(request.param)


def _image(batch: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_registry_lists_the_builtin_backbones():
    assert {*TORCHVISION_STAGES, "vb_tiny", "timm"} <= set(BACKBONES.list())
    assert BACKBONES.get("tiny") is BACKBONES.get("vb_tiny")


def test_forward_and_backward(built):
    """Outputs have the shapes feature_info predicts, and every parameter gets a gradient."""
    name, backbone = built
    backbone.zero_grad(set_to_none=True)
    out = backbone(_image())
    assert isinstance(out, OrderedDict)
    info = backbone.feature_info
    assert list(out) == [f["name"] for f in info]
    for f in info:
        stride = f["stride"]
        assert out[f["name"]].shape == (2, f["channels"], SIZE // stride, SIZE // stride), f
        assert out[f["name"]].dtype == torch.float32
    if name in BUILTIN:  # the documented default: four stages at strides 4..32
        assert [f["name"] for f in info] == ["stage0", "stage1", "stage2", "stage3"]
        assert [f["stride"] for f in info] == [4, 8, 16, 32]

    sum(t.mean() for t in out.values()).backward()
    trainable = [(n, p) for n, p in backbone.named_parameters() if p.requires_grad]
    assert trainable
    no_grad = [n for n, p in trainable if p.grad is None]
    assert not no_grad, f"parameters outside the outputs' graph: {no_grad[:5]}"
    assert all(torch.isfinite(p.grad).all() for _, p in trainable)
    backbone.zero_grad(set_to_none=True)


def test_feature_info_predicts_another_input_size(built):
    _, backbone = built  # measured on 64 x 64; checked on 32 x 32
    backbone.eval()
    with torch.no_grad():
        out = backbone(_image(1, 32))
    backbone.train()
    for f in backbone.feature_info:
        assert out[f["name"]].shape[1:] == (f["channels"], 32 // f["stride"], 32 // f["stride"])


def test_feature_info_format(built):
    _, backbone = built
    info = backbone.feature_info
    assert info and all(set(f) == {"name", "channels", "stride"} for f in info)
    assert all(isinstance(f["channels"], int) and isinstance(f["stride"], int) for f in info)
    assert backbone.channels == [f["channels"] for f in info]
    assert backbone.strides == [f["stride"] for f in info]
    info[0]["channels"] = -1  # a copy: the backbone's own record is unchanged
    assert backbone.feature_info[0]["channels"] != -1
    assert backbone.out_indices == tuple(int(f["name"][5:]) for f in info)


def test_state_dict_round_trip(built):
    name, backbone = built
    with skip_init():
        fresh = build_backbone(name)
    state = backbone.state_dict()
    assert list(fresh.state_dict()) == list(state)
    fresh.load_state_dict(state)
    backbone.eval()
    fresh.eval()
    x = _image(1)
    with torch.no_grad():
        expected, actual = backbone(x), fresh(x)
    backbone.train()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)


def test_builds_through_the_registry():
    backbone = BACKBONES.build("resnet18", out_indices=(1, 2))
    assert [f["stride"] for f in backbone.feature_info] == [8, 16]
    backbone = BACKBONES.build({"type": "timm", "model_name": "resnet18", "out_indices": (-1,)})
    assert backbone.feature_info == [{"name": "stage3", "channels": 512, "stride": 32}]
    # the timm/ namespace: any timm model by name, in configs too, as build_backbone builds it
    assert "timm/resnet18" in BACKBONES and "timm/resnet_18" not in BACKBONES
    for built in (
        BACKBONES.build("timm/resnet18", out_indices=(-1,)),
        BACKBONES.build({"type": "timm/resnet18", "out_indices": (-1,)}),
        build_backbone("timm/resnet18", out_indices=(-1,)),
    ):
        assert built.feature_info == backbone.feature_info
        assert list(built.state_dict()) == list(backbone.state_dict())
    assert BACKBONES.build("tiny").channels == [16, 32, 64, 128]


@pytest.mark.parametrize(
    "arch", ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0"]
)
def test_outputs_equal_torchvision_feature_extractor(arch):
    """Peer oracle: torchvision's FX feature extractor on the same weights and stage modules."""
    backbone = build_backbone(arch).eval()
    model = getattr(torchvision.models, arch)(weights=None).eval()
    report = model.load_state_dict(backbone.state_dict(), strict=False)
    assert not report.unexpected_keys
    assert all(k.startswith(("fc.", "classifier.")) for k in report.missing_keys)
    stages = TORCHVISION_STAGES[arch]
    peer = create_feature_extractor(model, {s: f"stage{i}" for i, s in enumerate(stages)})
    x = _image(1)
    with torch.no_grad():
        ours, theirs = backbone(x), peer(x)
    assert list(ours) == list(theirs)
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)


def _docs_table() -> dict[str, tuple[str, str, str, str]]:
    """Rows of the table in docs/reference/backbones.md: name -> (modules, channels, strides, M)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "backbones.md"
    rows = {}
    for line in page.read_text().splitlines():
        match = re.match(r"\| `([^`]+)`[^|]*\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|$", line)
        if match and match.group(3).strip():
            rows[match.group(1)] = tuple(cell.strip() for cell in match.groups()[1:])
    return rows


def test_docs_table_is_correct(built):
    name, backbone = built
    if name not in BUILTIN:
        pytest.skip("a plugin backbone: not in the docs table")
    modules, channels, strides, millions = _docs_table()[name]
    if name.startswith("timm/"):
        levels = timm.create_model(name[5:], features_only=True).feature_info
        stages = [m for m, r in zip(levels.module_name(), levels.reduction()) if r >= 4]
    else:
        stages = TORCHVISION_STAGES.get(name, ("stage1", "stage2", "stage3", "stage4"))
    assert modules == ", ".join(f"`{s}`" for s in stages)
    assert channels == ", ".join(map(str, backbone.channels))
    assert strides == ", ".join(map(str, backbone.strides))
    assert millions == f"{sum(p.numel() for p in backbone.parameters()) / 1e6:.2f}"


def test_forward_rejects_bad_images():
    backbone = build_backbone("vb_tiny", widths=(8, 8, 8, 8))
    image = _image()
    with pytest.raises(
        ValueError, match=r"x must have shape \(B, 3, H, W\), got \(3, 64, 64\) \(one"
    ):
        backbone(image[0])  # a 3-D image used to fail inside conv2d
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3, H, W\), got \(2, 1, 64, 64\)"):
        backbone(image[:, :1])
    grey = build_backbone("vb_tiny", widths=(8, 8, 8, 8), in_channels=1)
    assert grey.in_channels == 1 and grey(image[:, :1])["stage3"].shape[1] == 8


def test_absurd_backbone_options_are_rejected():
    with pytest.raises(ValueError, match=r"in_channels must be in \[1, 65536\]"):
        build_backbone("vb_tiny", in_channels=10**9)
    with pytest.raises(ValueError, match=r"widths\[3\] must be in \[1, 65536\]"):
        build_backbone("vb_tiny", widths=(8, 8, 8, 10**9))
    with pytest.raises(ValueError, match=r"depths\[3\] must be in \[1, 64\]"):
        build_backbone("vb_tiny", depths=(1, 1, 1, 10**9))
    with pytest.raises(KeyError, match="'timm/resnet_18' is not a backbone: 'resnet_18' is not"):
        build_backbone("timm/resnet_18")
