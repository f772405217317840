"""build_backbone options: out_indices, in_channels, pretrained (+ report), frozen_stages,
norm_eval, and the errors for downloads and unknown names."""

from __future__ import annotations

import copy
import functools

import pytest
import timm
import torch
import torchvision
from torch import nn

from visionblocks.backbones import build_backbone
from visionblocks.backbones.base import backbone_from_model
from visionblocks.backbones.tiny import TinyNet
from visionblocks.weights import LoadError


@functools.cache
def _tv_resnet18_state() -> dict[str, torch.Tensor]:
    """A torchvision resnet18 checkpoint with non-trivial BatchNorm statistics."""
    torch.manual_seed(3)
    model = torchvision.models.resnet18(weights=None)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture
def tv_resnet18_file(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(_tv_resnet18_state(), path)
    return path


def _x(channels: int = 3, size: int = 64) -> torch.Tensor:
    return torch.rand(2, channels, size, size, generator=torch.Generator().manual_seed(5))


# ------------------------------------------------------------------------------ out_indices
@pytest.mark.parametrize(
    ("out_indices", "names"),
    [
        ((-1,), ["stage3"]),
        ((0, -1), ["stage0", "stage3"]),
        ([-3, 3], ["stage1", "stage3"]),
        ((2, 0), ["stage0", "stage2"]),  # returned in stage order
    ],
)
def test_out_indices_python_style(out_indices, names):
    backbone = build_backbone("vb_tiny", out_indices=out_indices)
    assert [f["name"] for f in backbone.feature_info] == names
    assert list(backbone(_x())) == names


@pytest.mark.parametrize(
    ("out_indices", "error", "match"),
    [
        (
            (4,),
            ValueError,
            r"index 4 is out of range for vb_tiny, which has 4 stages \(valid indices: -4 to 3",
        ),
        ((-5,), ValueError, "index -5 is out of range"),
        ((1, -3), ValueError, "names a stage twice"),
        ((), ValueError, "empty"),
        (("1",), TypeError, "out_indices entries must be int"),
    ],
)
def test_out_indices_errors(out_indices, error, match):
    with pytest.raises(error, match=match):
        build_backbone("vb_tiny", out_indices=out_indices)


def test_out_indices_drop_the_unused_tail():
    backbone = build_backbone("resnet18", out_indices=(0, 1))
    keys = backbone.state_dict().keys()
    assert any(k.startswith("layer2.") for k in keys)
    assert not any(k.startswith(("layer3.", "layer4.", "fc.")) for k in keys)
    timm_backbone = build_backbone("timm/resnet18", out_indices=(-4, -3))
    assert timm_backbone.feature_info == [
        {"name": "stage0", "channels": 64, "stride": 4},
        {"name": "stage1", "channels": 128, "stride": 8},
    ]
    assert not any(k.startswith("layer3.") for k in timm_backbone.state_dict())


# ------------------------------------------------------------------- pretrained and reports
def test_pretrained_torchvision_checkpoint_loads_with_report(tv_resnet18_file):
    backbone = build_backbone("resnet18", pretrained=tv_resnet18_file)
    report = backbone.load_report
    assert report.unexpected == ["fc.weight", "fc.bias"]
    assert report.missing == [] and report.mismatched == {} and report.adapted == []
    state = _tv_resnet18_state()
    assert all(torch.equal(v, state[k]) for k, v in backbone.state_dict().items())
    # the same outputs as torchvision's own model with those weights
    model = torchvision.models.resnet18(weights=None)
    model.load_state_dict(state)
    model.eval()
    backbone.eval()
    x = _x()
    with torch.no_grad():
        expected = model.layer4(
            model.layer3(
                model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x))))))
            )
        )
        torch.testing.assert_close(backbone(x)["stage3"], expected)
    assert build_backbone("vb_tiny").load_report is None


def test_pretrained_state_dict_and_str_path(tv_resnet18_file):
    report = build_backbone("resnet18", pretrained=_tv_resnet18_state()).load_report
    assert report.unexpected == ["fc.weight", "fc.bias"]
    assert build_backbone("resnet18", pretrained=str(tv_resnet18_file)).load_report.missing == []


def test_a_checkpoint_of_another_model_is_refused_loudly(tv_resnet18_file):
    """d2 #5153: a wrong checkpoint must not "load" with most tensors skipped."""
    with pytest.raises(LoadError, match=r"of the 216 tensors of resnet34 would not load") as info:
        build_backbone("resnet34", pretrained=tv_resnet18_file)
    assert "load_partial(backbone, path" in str(info.value)
    assert info.value.report.dry_run and len(info.value.report.missing) == 96


def test_missing_num_batches_tracked_is_allowed():
    state = {k: v for k, v in _tv_resnet18_state().items() if "num_batches_tracked" not in k}
    report = build_backbone("resnet18", pretrained=state).load_report
    assert len(report.missing) == 20 and all("num_batches_tracked" in k for k in report.missing)
    assert report.num_loaded == 100


def _rgb_equivalent(rgb: torch.Tensor, channels: int) -> torch.Tensor:
    """An input whose output, after stem adaptation, equals that of the RGB image ``rgb``.

    One channel: the sum of the RGB weights, so a grey image is its RGB copy. Otherwise the
    weights are R, G, B, R, ... scaled by 3 / channels: RGB in the first three channels scaled
    by channels / 3, zeros in the others.
    """
    if channels == 1:
        return rgb[:, :1]
    extra = rgb.new_zeros(rgb.shape[0], channels - 3, *rgb.shape[2:])
    return torch.cat([rgb, extra], 1) * (channels / 3)


@pytest.mark.parametrize("in_channels", [1, 4])
def test_in_channels_adapts_pretrained_stem(tv_resnet18_file, in_channels):
    rgb = build_backbone("resnet18", pretrained=tv_resnet18_file).eval()
    other = build_backbone("resnet18", pretrained=tv_resnet18_file, in_channels=in_channels).eval()
    assert other.conv1.in_channels == in_channels
    assert other.load_report.adapted == ["conv1.weight"]
    assert other.load_report.mismatched == {}
    image = _x(3)
    if in_channels == 1:  # a grey image gives the output of its RGB copy
        image = image[:, :1].expand(-1, 3, -1, -1)
    with torch.no_grad():
        expected = rgb(image)
        actual = other(_rgb_equivalent(image, in_channels))
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-4)


def test_in_channels_without_pretrained():
    for name in ("mobilenet_v3_small", "vb_tiny", "timm/resnet18"):
        backbone = build_backbone(name, in_channels=1, out_indices=(-1,))
        assert backbone(_x(1))["stage3"].shape[:2] == (2, backbone.channels[0])
    with pytest.raises(ValueError, match=r"in_channels must be in \[1, "):
        build_backbone("vb_tiny", in_channels=0)


def test_timm_pretrained_full_checkpoint_maps_to_feature_model(tmp_path):
    torch.manual_seed(0)
    full = timm.create_model("convnext_atto", pretrained=False)  # features model: stages_0...
    path = tmp_path / "convnext_atto.pth"
    torch.save(full.state_dict(), path)
    backbone = build_backbone("timm/convnext_atto", pretrained=path, in_channels=1)
    report = backbone.load_report
    assert report.missing == [] and report.mismatched == {}
    assert report.unexpected and all(k.startswith("head.") for k in report.unexpected)
    assert report.adapted == ["stem_0.weight"]
    assert report.renamed["stages.0.blocks.0.conv_dw.weight"] == "stages_0.blocks.0.conv_dw.weight"
    full.eval()
    backbone.eval()
    grey = _x(1)
    with torch.no_grad():
        expected = full.forward_intermediates(grey.expand(-1, 3, -1, -1), intermediates_only=True)
        actual = backbone(grey)
    for got, want in zip(actual.values(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------ no downloads
@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


@pytest.mark.parametrize(
    "pretrained",
    [
        "https://download.pytorch.org/models/resnet18-f37072fd.pth",
        "http://example.com/r18.pth",
        "hf-hub:timm/resnet18.a1_in1k",
        "torchvision://resnet18",
        True,
    ],
)
def test_urls_hub_names_and_true_are_refused(no_network, pretrained):
    with pytest.raises(ValueError, match="never downloads weights.*pass the local file"):
        build_backbone("resnet18", pretrained=pretrained)


def test_missing_files_and_weight_enums_are_refused(no_network):
    with pytest.raises(FileNotFoundError, match="'IMAGENET1K_V1' is not an existing file"):
        build_backbone("resnet18", pretrained="IMAGENET1K_V1")
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    with pytest.raises(TypeError, match="got ResNet18_Weights.*download.pytorch.org"):
        build_backbone("resnet18", pretrained=weights)
    with pytest.raises(ValueError, match="weights=.*would download"):
        build_backbone("resnet18", weights=weights)
    with pytest.raises(ValueError, match="looks like a hub name"):
        build_backbone("timm/hf-hub:timm/resnet18.a1_in1k")
    with pytest.raises(TypeError, match="sets in_chans"):
        build_backbone("timm/resnet18", in_chans=1)


def test_unknown_names_suggest_close_matches():
    with pytest.raises(KeyError, match="Did you mean: 'resnet50'"):
        build_backbone("resnet_50")
    with pytest.raises(
        KeyError, match="'resnet_18' is not a timm model. Did you mean: 'timm/resnet18'"
    ):
        build_backbone("timm/resnet_18")
    with pytest.raises(KeyError, match="model_name='resnet_18' is not a timm model. .*'resnet18'"):
        build_backbone("timm", model_name="resnet_18")  # named without timm/: suggested so
    with pytest.raises(KeyError, match="Did you mean: 'timm/convnext_atto'"):
        build_backbone("convnext_atto")  # a timm model named without timm/


# ------------------------------------------------------------- frozen_stages and norm_eval
def _bn_stats(module: nn.Module) -> list[torch.Tensor]:
    return [m.running_mean.clone() for m in module.modules() if isinstance(m, nn.BatchNorm2d)]


@pytest.mark.parametrize("name", ["resnet18", "timm/resnet18"])
def test_frozen_stages_freeze_stem_and_first_stages(name):
    backbone = build_backbone(name, frozen_stages=2).train()
    frozen = {n for n, p in backbone.named_parameters() if not p.requires_grad}
    stem_and_two = ("conv1.", "bn1.", "layer1.", "layer2.")
    assert frozen == {n for n, _ in backbone.named_parameters() if n.startswith(stem_and_two)}
    assert not backbone.bn1.training and not backbone.layer2[1].bn2.training
    assert backbone.layer3[0].bn1.training
    before = _bn_stats(backbone.layer2), _bn_stats(backbone.layer3)
    backbone(_x())
    after = _bn_stats(backbone.layer2), _bn_stats(backbone.layer3)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0]))  # frozen: unchanged
    assert not any(torch.equal(a, b) for a, b in zip(before[1], after[1]))  # trained: updated
    backbone.eval().train()  # survives mode switches
    assert not backbone.layer1[0].bn1.training and backbone.layer4[0].bn1.training


def test_frozen_stages_on_features_families_and_bounds():
    backbone = build_backbone("mobilenet_v3_small", frozen_stages=1)  # stem + features.1
    frozen = {n.split(".")[1] for n, p in backbone.named_parameters() if not p.requires_grad}
    assert frozen == {"0", "1"}
    assert all(p.requires_grad for p in build_backbone("vb_tiny").parameters())
    assert not any(p.requires_grad for p in build_backbone("vb_tiny", frozen_stages=4).parameters())
    with pytest.raises(ValueError, match=r"frozen_stages must be in \[0, 4\]"):
        build_backbone("vb_tiny", frozen_stages=5)


def test_norm_eval_keeps_batchnorm_statistics():
    backbone = build_backbone("vb_tiny", norm_eval=True)
    backbone.eval().train()
    norms = [m for m in backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms)
    assert backbone.training and all(p.requires_grad for p in backbone.parameters())
    before = _bn_stats(backbone)
    backbone(_x())
    assert all(torch.equal(a, b) for a, b in zip(before, _bn_stats(backbone)))
    assert any(
        m.training for m in build_backbone("vb_tiny").modules() if isinstance(m, nn.BatchNorm2d)
    )


# -------------------------------------------------------------------- the module itself
def test_dtype_conversion_deepcopy_and_state_dict_keys():
    backbone = build_backbone("resnet18", out_indices=(0, 1))
    twin = copy.deepcopy(backbone).double().eval()
    assert all(p.dtype == torch.float32 for p in backbone.parameters())
    assert all(
        t.dtype == torch.float64 for t in twin.state_dict().values() if t.is_floating_point()
    )
    assert all(t.dtype == torch.float64 for t in twin(_x().double()).values())
    assert list(backbone.state_dict())[:2] == ["conv1.weight", "bn1.weight"]


def test_backbone_from_custom_model():
    net = TinyNet(widths=(4, 8, 12, 16))
    backbone = backbone_from_model(net, ["stage2", "stage4"], in_channels=2)
    assert backbone.feature_info == [
        {"name": "stage0", "channels": 8, "stride": 8},
        {"name": "stage1", "channels": 16, "stride": 32},
    ]
    assert net.stem.conv.in_channels == 2
    with pytest.raises(ValueError, match="names no submodule"):
        backbone_from_model(TinyNet(), ["stage9"])


@pytest.mark.parametrize("name", ["resnet18", "timm/resnet18"])
def test_convert_sync_batchnorm_reaches_the_forward(name):
    """Swapped-in norms (also the stem's, a direct child) run, and frozen ones stay in eval."""
    backbone = build_backbone(name, frozen_stages=1)
    backbone = nn.SyncBatchNorm.convert_sync_batchnorm(backbone).train()
    norms = [m for m in backbone.modules() if isinstance(m, nn.SyncBatchNorm)]
    ran = set()
    for m in norms:
        m.register_forward_hook(lambda module, args, out: ran.add(id(module)))
    backbone(_x())
    assert norms and ran == {id(m) for m in norms}
    assert not backbone.bn1.training and not backbone.layer1[0].bn1.training
    assert backbone.layer2[0].bn1.training


# ---------------------------------------------------------------------------- timm families
def test_timm_channels_last_features_are_returned_as_nchw():
    backbone = build_backbone("timm/swin_tiny_patch4_window7_224", out_indices=(0, -1))
    assert backbone.feature_info == [
        {"name": "stage0", "channels": 96, "stride": 4},
        {"name": "stage3", "channels": 768, "stride": 32},
    ]
    out = backbone.eval()(torch.rand(1, 3, 224, 224))
    assert out["stage0"].shape == (1, 96, 56, 56) and out["stage3"].shape == (1, 768, 7, 7)


def test_timm_fixed_size_model_uses_the_img_size_it_was_built_with():
    backbone = build_backbone("timm/vit_tiny_patch16_224", img_size=64, out_indices=(-1,))
    assert backbone.feature_info == [{"name": "stage2", "channels": 192, "stride": 16}]
    assert backbone(torch.rand(1, 3, 64, 64))["stage2"].shape == (1, 192, 4, 4)


@pytest.mark.parametrize("name", ["timm/efficientnet_b0", "timm/mobilenetv3_small_100"])
def test_timm_blocks_after_the_last_stage_get_no_trainable_parameters(name):
    """EfficientNet-family feature models run every block; what the outputs do not use is
    frozen, so DDP without find_unused_parameters works."""
    backbone = build_backbone(name, out_indices=(0,))
    sum(v.sum() for v in backbone(_x()).values()).backward()
    trainable = [(n, p) for n, p in backbone.named_parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for _, p in trainable)
    assert any(not p.requires_grad for p in backbone.parameters())  # the unused blocks
    full = build_backbone(name)
    assert list(full.state_dict()) == list(backbone.state_dict())  # still in the state dict


def test_the_timm_builder_needs_a_model_name():
    with pytest.raises(ValueError, match=r"timm backbones are named 'timm/<model>'"):
        build_backbone("timm")
    assert build_backbone("timm", model_name="resnet18", out_indices=(-1,)).channels == [512]


def test_data_parallel_is_refused_with_a_clear_error():
    with pytest.raises(RuntimeError, match="do not support nn.DataParallel"):
        build_backbone("vb_tiny")._replicate_for_data_parallel()
