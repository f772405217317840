"""Tests for visionblocks.nn.fuse (Conv + BatchNorm folding)."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval
from torchvision.models.resnet import BasicBlock
from torchvision.ops.misc import FrozenBatchNorm2d

from tests.helpers import assert_close
from visionblocks.nn.conv import ConvNormAct, DepthwiseConv2d, DepthwiseSeparableConv2d
from visionblocks.nn.fuse import find_conv_bn_pairs, fuse_conv_bn, fuse_modules


def _randomize(model: nn.Module) -> nn.Module:
    """Non-trivial BN statistics and affine parameters, so that folding is really tested."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                n = m.running_mean.numel()
                m.running_mean.copy_(torch.rand(n, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                    m.bias.copy_(torch.rand(n, generator=gen) - 0.5)
    return model


def _count(model: nn.Module, cls: type = nn.BatchNorm2d) -> int:
    return sum(isinstance(m, cls) for m in model.modules())


# ---------------------------------------------------------------------------- fuse_conv_bn
@pytest.mark.parametrize(
    "conv_kwargs",
    [
        {"bias": False},
        {"bias": True},
        {"groups": 2, "bias": True},
        {"groups": 8, "stride": 2, "dilation": 2, "padding": 2},
        {"padding": 1, "padding_mode": "reflect"},
        {"kernel_size": (1, 3), "padding": (0, 1)},
        {"kernel_size": 2, "padding": "same"},
    ],
)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")
def test_fuse_conv_bn_matches_eval_and_torch(conv_kwargs, affine):
    kwargs = {"kernel_size": 3, **conv_kwargs}
    conv = nn.Conv2d(8, 16, **kwargs).double()
    bn = _randomize(nn.BatchNorm2d(16, affine=affine).double()).eval()
    fused = fuse_conv_bn(conv, bn)
    assert type(fused) is nn.Conv2d and fused.bias is not None
    assert fused.padding_mode == conv.padding_mode and fused.groups == conv.groups
    x = torch.randn(2, 8, 11, 10, dtype=torch.float64)
    expected = bn(conv(x))
    assert_close(fused(x), expected)
    if affine:  # torch's helper requires affine BN
        assert_close(fused(x), fuse_conv_bn_eval(conv.eval(), bn)(x))


def test_fuse_conv_bn_float32_and_inputs_untouched():
    conv = nn.Conv2d(4, 6, 3, padding=1)
    bn = _randomize(nn.BatchNorm2d(6)).eval()
    before = {k: v.clone() for k, v in [*conv.state_dict().items(), *bn.state_dict().items()]}
    fused = fuse_conv_bn(conv, bn)
    x = torch.randn(2, 4, 9, 9)
    assert fused.weight.dtype == torch.float32
    assert_close(fused(x), bn(conv(x)), scale=2.0)
    after = {k: v for k, v in [*conv.state_dict().items(), *bn.state_dict().items()]}
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert fused.weight.requires_grad


def test_fuse_conv_bn_depthwise_subclass_and_frozen_bn():
    conv = DepthwiseConv2d(6, 5, multiplier=2).double()
    bn = FrozenBatchNorm2d(12)
    _randomize(bn).double()
    assert bn.training  # FrozenBatchNorm2d ignores the mode: always running statistics
    fused = fuse_conv_bn(conv, bn)
    assert type(fused) is nn.Conv2d
    x = torch.randn(1, 6, 8, 8, dtype=torch.float64)
    assert_close(fused(x), bn(conv(x)))


def test_fuse_conv_bn_errors():
    conv, bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
    with pytest.raises(ValueError, match="training mode.*call .eval"):
        fuse_conv_bn(conv, bn)
    with pytest.raises(ValueError, match="track_running_stats=False"):
        fuse_conv_bn(conv, nn.BatchNorm2d(4, track_running_stats=False).eval())
    with pytest.raises(ValueError, match="bn has 5 features but conv has 4 output channels"):
        fuse_conv_bn(conv, nn.BatchNorm2d(5).eval())
    with pytest.raises(TypeError, match="conv must be Conv2d"):
        fuse_conv_bn(nn.Linear(3, 4), bn.eval())
    with pytest.raises(TypeError, match="bn must be"):
        fuse_conv_bn(conv, nn.GroupNorm(2, 4))

    class ScaledConv(nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(TypeError, match="overrides nn.Conv2d's forward"):
        fuse_conv_bn(ScaledConv(3, 4, 3), bn.eval())


# ---------------------------------------------------------------------------- fuse_modules
@pytest.mark.parametrize(
    ("builder", "num_pairs"),
    [
        (torchvision.models.resnet18, 20),
        (torchvision.models.resnet50, 53),
        pytest.param(torchvision.models.mobilenet_v2, 52, marks=pytest.mark.slow),
    ],
)
def test_fuse_modules_torchvision_float64(builder, num_pairs):
    model = _randomize(builder(weights=None)).double().eval()
    assert len(find_conv_bn_pairs(model)) == num_pairs == _count(model)
    fused = fuse_modules(model)
    assert _count(fused) == 0
    assert _count(model) == num_pairs  # the default works on a copy
    assert type(fused) is type(model)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = model(x), fused(x)
    assert expected.abs().amax() > 1e-3  # the statistics did not wash the signal out
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-7)


def test_fuse_modules_resnet18_float32():
    model = _randomize(torchvision.models.resnet18(weights=None)).eval()
    fused = fuse_modules(model)
    assert isinstance(fused.bn1, nn.Identity) and isinstance(
        fused.layer2[0].downsample[1], nn.Identity
    )
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(
            fused(x), expected, rtol=1e-5, atol=1e-5 * expected.abs().amax().item()
        )


def test_fuse_modules_inplace_returns_same_object():
    model = _randomize(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())).eval()
    x = torch.randn(1, 3, 8, 8)
    expected = model(x)
    out = fuse_modules(model, inplace=True)
    assert out is model and isinstance(model[1], nn.Identity)
    assert_close(model(x), expected)


class _Untraceable(nn.Module):
    """Data-dependent control flow at the root; fusable pieces of every kind inside."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = ConvNormAct(8, 8)
        self.dws = DepthwiseSeparableConv2d(8, 8)
        self.res = BasicBlock(8, 8)  # conv1/bn1 pairs, found by tracing the child alone
        self.conv = nn.Conv2d(8, 8, 1)  # attribute pair of the untraceable root: unknown wiring
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        x = self.block(self.stem(x))
        if x.sum() > 0:
            x = self.dws(x)
        else:
            x = -x
        return self.bn(self.conv(self.res(x)))


def test_fuse_modules_untraceable_model_falls_back_to_structure():
    model = _randomize(_Untraceable()).double().eval()
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(model)
    pairs = find_conv_bn_pairs(model)
    assert set(pairs) == {
        ("stem.0", "stem.1"),
        ("block.conv", "block.norm"),
        ("dws.depthwise.conv", "dws.depthwise.norm"),
        ("dws.pointwise.conv", "dws.pointwise.norm"),
        ("res.conv1", "res.bn1"),
        ("res.conv2", "res.bn2"),
    }
    fused = fuse_modules(model)
    assert _count(fused) == 1 and isinstance(fused.bn, nn.BatchNorm2d)
    for sign in (1.0, -1.0):  # both branches of the data-dependent `if`
        x = sign * torch.rand(2, 3, 10, 10, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-9)


def test_fuse_modules_conv_norm_act_blocks():
    model = nn.Sequential(
        ConvNormAct(3, 8, act="silu"),
        ConvNormAct(8, 8, norm="gn"),  # not a BatchNorm: untouched
        DepthwiseSeparableConv2d(8, 16, stride=2),
    )
    model = _randomize(model).double().eval()
    fused = fuse_modules(model)
    assert _count(fused) == 0 and _count(fused, nn.GroupNorm) == 1
    assert fused[0].conv.bias is not None and isinstance(fused[0].norm, nn.Identity)
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    assert_close(fused(x), model(x))


class _ConvTwoUsers(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class _SharedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(3)
        self.bn2 = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn2(self.conv(self.bn1(self.conv(x))))


class _WeightRead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) * self.conv.weight.mean()


class _Aliased(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)
        self.bn_alias = self.bn

    def forward(self, x):
        return self.bn_alias(self.conv(x))


@pytest.mark.parametrize("cls", [_ConvTwoUsers, _SharedConv, _WeightRead, _Aliased])
def test_fuse_modules_leaves_unsafe_pairs(cls):
    model = _randomize(cls()).eval()
    assert find_conv_bn_pairs(model) == []
    fused = fuse_modules(model)
    x = torch.randn(1, 3, 8, 8)
    assert_close(fused(x), model(x))
    assert _count(fused) == _count(model)


def test_fuse_modules_skips_hooks_and_batch_stat_norms():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        nn.BatchNorm2d(4, track_running_stats=False),
        nn.Conv2d(4, 4, 1),
        nn.BatchNorm2d(4),
        nn.Conv2d(4, 4, 1),
        nn.BatchNorm2d(4),
    ).eval()
    seen = []
    model[3].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    assert find_conv_bn_pairs(model) == [("4", "5")]
    fused = fuse_modules(model)
    x = torch.randn(2, 3, 5, 5)
    assert_close(fused(x), model(x))
    assert len(seen) == 2  # the hooked BN still runs in the fused copy


def test_fuse_modules_training_mode_raises_without_changes():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match=r"training mode \(first: '1'\).*model.eval\(\)"):
        fuse_modules(model, inplace=True)
    assert isinstance(model[1], nn.BatchNorm2d)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_fuse_modules_errors():
    with pytest.raises(TypeError, match="ScriptModule"):
        fuse_modules(torch.jit.script(nn.Sequential(nn.Conv2d(1, 1, 1)).eval()))


def test_fuse_modules_frozen_batchnorm_resnet():
    # torchvision's detection backbones use FrozenBatchNorm2d, which ignores train/eval.
    model = _randomize(torchvision.models.resnet18(norm_layer=FrozenBatchNorm2d))
    fused = fuse_modules(model)
    assert _count(fused, FrozenBatchNorm2d) == 0
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        scale = expected.abs().amax().item()
        torch.testing.assert_close(fused(x), expected, rtol=1e-5, atol=1e-5 * scale)


class _BatchNormReLU(nn.BatchNorm2d):
    """A norm subclass that also activates (as timm's BatchNormAct2d): not foldable."""

    def forward(self, x):
        return torch.relu(super().forward(x))


class _BatchNormChecked(nn.BatchNorm2d):
    """Overrides a helper, not forward: still a plain BatchNorm, so it folds."""

    def _check_input_dim(self, input):
        super()._check_input_dim(input)


def test_fuse_modules_leaves_norm_subclasses_that_do_more():
    model = _randomize(
        nn.Sequential(
            nn.Conv2d(3, 4, 3), _BatchNormReLU(4), nn.Conv2d(4, 4, 1), _BatchNormChecked(4)
        )
    ).eval()
    assert find_conv_bn_pairs(model) == [("2", "3")]
    fused = fuse_modules(model)
    assert isinstance(fused[1], _BatchNormReLU) and isinstance(fused[3], nn.Identity)
    x = torch.randn(2, 3, 9, 9)
    assert_close(fused(x), model(x))
    with pytest.raises(TypeError, match="cannot fold _BatchNormReLU: it overrides the forward"):
        fuse_conv_bn(model[0], model[1])


def test_fuse_modules_untraceable_sequential_leaves_norm_subclasses():
    class Untraceable(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3), _BatchNormReLU(4))

        def forward(self, x):
            return self.body(x) if x.sum() > -1e9 else x  # data-dependent: fx cannot trace

    model = _randomize(Untraceable()).eval()
    assert find_conv_bn_pairs(model) == []
    x = torch.randn(1, 3, 8, 8)
    assert_close(fuse_modules(model)(x), model(x))


@pytest.mark.parametrize("name", ["efficientnet_b0", "resnet18d"])
def test_fuse_modules_timm_models(name):
    """timm's BatchNormAct2d (norm + activation in one module) must not lose its activation."""
    timm = pytest.importorskip("timm")
    model = _randomize(timm.create_model(name, pretrained=False, num_classes=10)).eval()
    fused = fuse_modules(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected, actual = model(x), fused(x)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    if name == "resnet18d":  # plain BatchNorm2d everywhere: every pair folds
        assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
