"""Tests for visionblocks.nn.conv and visionblocks.nn.layers."""

from __future__ import annotations

import functools

import pytest
import timm.layers
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchvision.models.shufflenetv2 import channel_shuffle as tv_channel_shuffle
from torchvision.ops.misc import Conv2dNormActivation

from tests.helpers import assert_close
from visionblocks.nn.conv import (
    ChannelShuffle,
    ConvNormAct,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    channel_shuffle,
)
from visionblocks.nn.layers import (
    ACTIVATIONS,
    NORMS,
    LayerNorm2d,
    group_norm_groups,
    make_activation,
    make_norm,
)
from visionblocks.registry import LAYERS

EVEN_SAME = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")


def _randomize_bn(module: nn.Module) -> nn.Module:
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)
    return module


# ---------------------------------------------------------------------------- layers
@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("relu", nn.ReLU),
        ("relu6", nn.ReLU6),
        ("silu", nn.SiLU),
        ("gelu", nn.GELU),
        ("hardswish", nn.Hardswish),
        ("leaky_relu", nn.LeakyReLU),
        ("ReLU", nn.ReLU),
    ],
)
def test_make_activation_names(name, cls):
    act = make_activation(name)
    assert type(act) is cls
    if hasattr(act, "inplace"):
        assert act.inplace is False
        assert make_activation(name, inplace=True).inplace is True
    assert make_activation(name) is not make_activation(name)


def test_make_activation_none_factory_and_errors():
    assert type(make_activation(None)) is nn.Identity
    act = make_activation(functools.partial(nn.LeakyReLU, 0.2))
    assert act.negative_slope == 0.2
    with pytest.raises(TypeError, match="module instance"):
        make_activation(nn.ReLU())
    with pytest.raises(TypeError, match="must return an nn.Module"):
        make_activation(lambda: "relu")
    assert sorted(ACTIVATIONS) == sorted(
        ["relu", "relu6", "silu", "gelu", "hardswish", "leaky_relu"]
    )


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("bn", nn.BatchNorm2d),
        ("syncbn", nn.SyncBatchNorm),
        ("gn", nn.GroupNorm),
        ("ln2d", LayerNorm2d),
    ],
)
def test_make_norm_names(name, cls):
    norm = make_norm(name, 64)
    assert type(norm) is cls
    out = norm.eval()(torch.randn(2, 64, 3, 3))
    assert out.shape == (2, 64, 3, 3)
    assert sorted(NORMS) == ["bn", "gn", "ln2d", "syncbn"]


def test_make_norm_none_factory_and_errors():
    assert type(make_norm(None, 8)) is nn.Identity
    gn = make_norm(functools.partial(nn.GroupNorm, 4), 8)
    assert (gn.num_groups, gn.num_channels) == (4, 8)
    assert type(make_norm(nn.InstanceNorm2d, 8)) is nn.InstanceNorm2d
    with pytest.raises(TypeError, match="module instance"):
        make_norm(nn.BatchNorm2d(8), 8)
    with pytest.raises(ValueError, match=r"num_channels must be in \[1, "):
        make_norm("bn", 0)


@pytest.mark.parametrize(
    ("channels", "expected"),
    [(1, 1), (3, 3), (32, 32), (48, 24), (64, 32), (37, 1), (96, 32), (40, 20)],
)
def test_group_norm_groups(channels, expected):
    groups = group_norm_groups(channels)
    assert groups == expected
    assert channels % groups == 0
    assert all(channels % g for g in range(groups + 1, 33))
    assert make_norm("gn", channels).num_groups == expected


def test_group_norm_groups_errors():
    with pytest.raises(ValueError, match=r"num_channels must be in \[1, "):
        group_norm_groups(0)
    with pytest.raises(TypeError, match="max_groups must be int"):
        group_norm_groups(8, 2.0)


def test_layer_norm_2d_matches_timm_and_reference():
    x = torch.randn(2, 12, 5, 7, dtype=torch.float64)
    ours = LayerNorm2d(12).double()
    nn.init.normal_(ours.weight)
    nn.init.normal_(ours.bias)
    peer = timm.layers.LayerNorm2d(12, eps=1e-6).double()
    peer.load_state_dict(ours.state_dict())
    assert_close(ours(x), peer(x))
    mean = x.mean(1, keepdim=True)
    var = x.var(1, unbiased=False, keepdim=True)
    ref = (x - mean) / torch.sqrt(var + 1e-6) * ours.weight.view(1, -1, 1, 1)
    assert_close(ours(x), ref + ours.bias.view(1, -1, 1, 1))
    with pytest.raises(ValueError, match=r"x must have shape \(B, 12, H, W\)"):
        ours(torch.randn(2, 11, 3, 3, dtype=torch.float64))


# ---------------------------------------------------------------------------- ConvNormAct
@pytest.mark.parametrize("kernel_size", [1, 3, 5, 7])
@pytest.mark.parametrize("dilation", [1, 2, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_norm_act_odd_kernel_sizes(kernel_size, dilation, stride):
    block = ConvNormAct(4, 6, kernel_size, stride=stride, dilation=dilation)
    for h, w in [(9, 9), (10, 13)]:
        out = block(torch.randn(1, 4, h, w))
        assert out.shape == (1, 6, -(-h // stride), -(-w // stride))
    assert block.conv.padding == (dilation * (kernel_size - 1) // 2,) * 2


@EVEN_SAME
@pytest.mark.parametrize("kernel_size", [2, 4, (2, 3)])
@pytest.mark.parametrize("dilation", [1, 2, 3])
def test_conv_norm_act_even_kernel_keeps_size_at_stride_1(kernel_size, dilation):
    block = ConvNormAct(3, 5, kernel_size, dilation=dilation, norm=None)
    x = torch.randn(1, 3, 9, 8)
    assert block(x).shape == (1, 5, 9, 8)
    ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    if any(dilation * (k - 1) % 2 for k in ks):
        assert block.conv.padding == "same"
        # The extra row/column goes to the bottom/right (TensorFlow SAME).
        totals = [dilation * (k - 1) for k in ks]
        padded = F.pad(
            x,
            (
                totals[1] // 2,
                totals[1] - totals[1] // 2,
                totals[0] // 2,
                totals[0] - totals[0] // 2,
            ),
        )
        ref = F.conv2d(padded, block.conv.weight, block.conv.bias, dilation=dilation)
        assert_close(block.conv(x), ref)


@pytest.mark.parametrize(("kernel_size", "stride"), [(2, 2), (4, 2), (4, 4)])
def test_conv_norm_act_even_kernel_strided_halves(kernel_size, stride):
    block = ConvNormAct(3, 5, kernel_size, stride=stride)
    assert block(torch.randn(1, 3, 16, 24)).shape == (1, 5, 16 // stride, 24 // stride)
    assert block.conv.padding == ((kernel_size - 1) // 2,) * 2


def test_conv_norm_act_explicit_padding():
    assert ConvNormAct(3, 4, 3, padding=0)(torch.randn(1, 3, 8, 8)).shape == (1, 4, 6, 6)
    assert ConvNormAct(3, 4, 3, padding=(0, 2)).conv.padding == (0, 2)
    assert ConvNormAct(3, 4, 3, padding="valid").conv.padding == "valid"
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        ConvNormAct(3, 4, 3, stride=2, padding="same")


@pytest.mark.parametrize(
    ("norm", "act", "groups"),
    [("bn", "relu", 1), ("bn", "relu6", 4), (None, "silu", 2), ("bn", None, 8), (None, None, 1)],
)
def test_conv_norm_act_matches_torchvision(norm, act, groups):
    tv_norm = nn.BatchNorm2d if norm == "bn" else None
    tv_act = {"relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, None: None}[act]
    peer = Conv2dNormActivation(
        8, 16, 3, stride=2, groups=groups, norm_layer=tv_norm, activation_layer=tv_act, dilation=2
    )
    ours = ConvNormAct(8, 16, 3, stride=2, dilation=2, groups=groups, norm=norm, act=act)
    _randomize_bn(peer)
    mapped = {}
    for key, value in peer.state_dict().items():
        index, _, rest = key.partition(".")
        mapped[f"{['conv', 'norm', 'act'][int(index)]}.{rest}"] = value
    ours.load_state_dict(mapped)  # strict: same parameters (bias present iff no norm)
    x = torch.randn(2, 8, 11, 12)
    for mode in ("train", "eval"):
        getattr(peer, mode)()
        getattr(ours, mode)()
        assert_close(ours(x), peer(x))
        assert ours(x).shape == peer(x).shape


def test_conv_norm_act_attributes_and_bias_rule():
    block = ConvNormAct(3, 4, act="gelu", norm="gn")
    assert isinstance(block.conv, nn.Conv2d)
    assert isinstance(block.norm, nn.GroupNorm)
    assert isinstance(block.act, nn.GELU)
    assert block.conv.bias is None
    assert ConvNormAct(3, 4, norm=None).conv.bias is not None
    assert ConvNormAct(3, 4, norm=None, act=None).act.__class__ is nn.Identity
    assert ConvNormAct(3, 4, norm="bn", bias=True).conv.bias is not None
    assert ConvNormAct(3, 4, norm=None, bias=False).conv.bias is None
    assert [n for n, _ in block.named_children()] == ["conv", "norm", "act"]
    assert ConvNormAct(3, 4).act.inplace is True
    assert ConvNormAct(3, 4, inplace=False).act.inplace is False


def test_conv_norm_act_factories():
    block = ConvNormAct(
        4, 8, norm=functools.partial(nn.GroupNorm, 2), act=functools.partial(nn.LeakyReLU, 0.3)
    )
    assert block.norm.num_groups == 2
    assert block.act.negative_slope == 0.3
    assert block.conv.bias is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"groups": 3}, ValueError, "groups=3 must divide in_channels=64"),
        ({"groups": 16, "out_channels": 24}, ValueError, "groups=16 must divide out_channels=24"),
        ({"groups": 0}, ValueError, r"groups must be in \[1, "),
        ({"kernel_size": 0}, ValueError, r"kernel_size must be in \[1, "),
        ({"kernel_size": (3, 3, 3)}, ValueError, "kernel_size must be an int or a pair"),
        ({"stride": 1.0}, TypeError, "stride must be int"),
        ({"in_channels": 0}, ValueError, r"in_channels must be in \[1, "),
    ],
)
def test_conv_norm_act_errors(kwargs, error, match):
    args = {"in_channels": 64, "out_channels": 64, **kwargs}
    with pytest.raises(error, match=match):
        ConvNormAct(**args)


# ---------------------------------------------------------------------------- depthwise
@pytest.mark.parametrize("multiplier", [1, 3])
@pytest.mark.parametrize(("stride", "dilation"), [(1, 1), (2, 1), (1, 2)])
def test_depthwise_conv_equals_grouped_conv(multiplier, stride, dilation):
    dw = DepthwiseConv2d(6, 3, stride=stride, dilation=dilation, multiplier=multiplier, bias=True)
    assert isinstance(dw, nn.Conv2d)
    ref = nn.Conv2d(6, 6 * multiplier, 3, stride, dilation, dilation, groups=6)
    ref.load_state_dict(dw.state_dict())
    x = torch.randn(2, 6, 10, 9)
    assert_close(dw(x), ref(x))
    assert dw(x).shape == (2, 6 * multiplier, -(-10 // stride), -(-9 // stride))
    # Output channel c * multiplier + m depends on input channel c only.
    x2 = x.clone()
    x2[:, 1] += 1.0
    changed = (dw(x2) - dw(x)).abs().amax(dim=(0, 2, 3)) > 0
    assert changed.nonzero().flatten().tolist() == list(range(multiplier, 2 * multiplier))


def test_depthwise_conv_defaults_and_errors():
    dw = DepthwiseConv2d(4)
    assert dw.bias is None and dw.padding == (1, 1) and dw.groups == 4
    with pytest.raises(ValueError, match=r"multiplier must be in \[1, "):
        DepthwiseConv2d(4, multiplier=0)
    with pytest.raises(TypeError, match="channels must be int"):
        DepthwiseConv2d(4.0)


@pytest.mark.parametrize(("norm", "act"), [("bn", "relu"), ("gn", "hardswish"), (None, None)])
def test_depthwise_separable_matches_composition(norm, act):
    block = DepthwiseSeparableConv2d(8, 12, 5, stride=2, dilation=1, norm=norm, act=act)
    _randomize_bn(block).eval()
    x = torch.randn(2, 8, 13, 10)
    dw, pw = block.depthwise, block.pointwise
    assert dw.conv.groups == 8 and dw.conv.kernel_size == (5, 5) and dw.conv.stride == (2, 2)
    assert pw.conv.kernel_size == (1, 1) and pw.conv.out_channels == 12
    y = F.conv2d(x, dw.conv.weight, dw.conv.bias, 2, 2, groups=8)
    y = dw.act(dw.norm(y))
    y = pw.act(pw.norm(F.conv2d(y, pw.conv.weight, pw.conv.bias)))
    assert_close(block(x), y)
    assert block(x).shape == (2, 12, 7, 5)


# ---------------------------------------------------------------------------- shuffle
@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 6),
    per_group=st.integers(1, 5),
    batch=st.integers(0, 2),
    h=st.integers(1, 4),
    w=st.integers(1, 4),
)
def test_channel_shuffle_matches_torchvision(groups, per_group, batch, h, w):
    x = torch.randn(batch, groups * per_group, h, w)
    assert torch.equal(channel_shuffle(x, groups), tv_channel_shuffle(x, groups))
    # Shuffling with C // groups undoes it.
    assert torch.equal(channel_shuffle(channel_shuffle(x, groups), per_group), x)


def test_channel_shuffle_layouts_and_dims():
    x = torch.randn(2, 5, 4, 12).permute(0, 3, 1, 2)  # (2, 12, 5, 4), channels-last-like
    assert not x.is_contiguous()
    assert torch.equal(channel_shuffle(x, 3), tv_channel_shuffle(x.contiguous(), 3))
    x3 = torch.arange(12.0).view(1, 12, 1)
    perm = [g * 4 + j for j in range(4) for g in range(3)]
    assert channel_shuffle(x3, 3).flatten().tolist() == [float(p) for p in perm]
    assert channel_shuffle(torch.arange(6).view(1, 6), 2).tolist() == [[0, 3, 1, 4, 2, 5]]
    x5 = torch.randn(1, 6, 2, 2, 2)
    assert_close(channel_shuffle(x5, 2), x5[:, [0, 3, 1, 4, 2, 5]])
    xi = torch.randint(0, 9, (1, 4, 2, 2), dtype=torch.uint8)
    assert channel_shuffle(xi, 2).dtype == torch.uint8


def test_channel_shuffle_gradient_is_permutation():
    x = torch.randn(1, 6, 2, 2, requires_grad=True)
    weight = torch.arange(6.0).view(1, 6, 1, 1)
    (channel_shuffle(x, 3) * weight).sum().backward()
    expected = channel_shuffle(weight.expand(1, 6, 2, 2), 2)  # the inverse permutation
    assert_close(x.grad, expected)


def test_channel_shuffle_errors():
    with pytest.raises(ValueError, match="groups=4 must divide the channels of x"):
        channel_shuffle(torch.zeros(1, 6, 2, 2), 4)
    with pytest.raises(ValueError, match=r"groups must be in \[1, "):
        channel_shuffle(torch.zeros(1, 6, 2, 2), 0)
    with pytest.raises(TypeError, match="groups must be int"):
        channel_shuffle(torch.zeros(1, 6, 2, 2), 2.0)
    with pytest.raises(ValueError, match=r"groups must be in \[1, "):
        ChannelShuffle(0)


def test_channel_shuffle_module_matches_function():
    x = torch.randn(2, 8, 3, 3)
    assert torch.equal(ChannelShuffle(4)(x), channel_shuffle(x, 4))
    assert repr(ChannelShuffle(4)) == "ChannelShuffle(groups=4)"
    assert list(ChannelShuffle(4).parameters()) == []


# ---------------------------------------------------------------------------- registry
@pytest.mark.parametrize(
    ("name", "cls", "args"),
    [
        ("conv_norm_act", ConvNormAct, {"in_channels": 4, "out_channels": 8}),
        ("depthwise_conv", DepthwiseConv2d, {"channels": 4}),
        (
            "depthwise_separable_conv",
            DepthwiseSeparableConv2d,
            {"in_channels": 4, "out_channels": 8},
        ),
        ("channel_shuffle", ChannelShuffle, {"groups": 2}),
    ],
)
def test_registered_in_layers(name, cls, args):
    assert LAYERS.get(name) is cls
    block = LAYERS.build({"type": name, **args})
    assert isinstance(block, cls)
    assert block(torch.randn(1, 4, 6, 6)).shape[0] == 1
