"""FPN against torchvision's FeaturePyramidNetwork (same weights), shapes, names, errors."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torchvision.ops import FeaturePyramidNetwork
from torchvision.ops.feature_pyramid_network import LastLevelP6P7

from tests.helpers import assert_close
from visionblocks.models import FPN
from visionblocks.registry import NECKS

CHANNELS, STRIDES = [16, 32, 64], [8, 16, 32]


def features(batch: int = 2, size: int = 64, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, c, size // s, size // s, generator=gen)
        for c, s in zip(CHANNELS, STRIDES)
    ]


def _copy_into_torchvision(ours: FPN, theirs: FeaturePyramidNetwork) -> None:
    with torch.no_grad():
        for i in range(len(CHANNELS)):
            theirs.inner_blocks[i][0].weight.copy_(ours.lateral[i].conv.weight)
            theirs.inner_blocks[i][0].bias.copy_(ours.lateral[i].conv.bias)
            theirs.layer_blocks[i][0].weight.copy_(ours.output[i].conv.weight)
            theirs.layer_blocks[i][0].bias.copy_(ours.output[i].conv.bias)


@pytest.mark.parametrize("size", [64, 72])  # 72: levels 9, 4 (odd), 2
def test_equals_torchvision_fpn(size):
    ours = FPN(CHANNELS, STRIDES, out_channels=24)
    theirs = FeaturePyramidNetwork(CHANNELS, 24)
    _copy_into_torchvision(ours, theirs)
    x = features(size=size)
    expected = theirs(OrderedDict(zip("abc", x)))
    got = ours(OrderedDict(zip("abc", x)))
    assert list(got) == ["p3", "p4", "p5"]
    for a, b in zip(got.values(), expected.values()):
        assert_close(a, b)


def test_extra_levels_equal_torchvision_p6p7():
    ours = FPN(CHANNELS, STRIDES, out_channels=24, extra_levels=2, extra_from="output")
    theirs = FeaturePyramidNetwork(CHANNELS, 24, extra_blocks=LastLevelP6P7(24, 24))
    _copy_into_torchvision(ours, theirs)
    with torch.no_grad():
        for mine, other in (
            (ours.extra[0], theirs.extra_blocks.p6),
            (ours.extra[1], theirs.extra_blocks.p7),
        ):
            other.weight.copy_(mine.conv.weight)
            other.bias.copy_(mine.conv.bias)
    x = features()
    got, expected = ours(x), theirs(OrderedDict(zip("abc", x)))
    assert list(got) == ["p3", "p4", "p5", "p6", "p7"]
    for a, b in zip(got.values(), expected.values()):
        assert_close(a, b)


def test_extra_from_input_and_feature_info():
    fpn = FPN(CHANNELS, STRIDES, out_channels=8, extra_levels=1, extra_from="input")
    assert fpn.extra[0].conv.in_channels == 64
    out = fpn(features(size=128))
    assert out["p6"].shape == (2, 8, 2, 2)
    assert fpn.feature_info == [
        {"name": f"p{i}", "channels": 8, "stride": 2**i} for i in range(3, 7)
    ]
    info = fpn.feature_info
    info[0]["channels"] = 99  # a copy
    assert fpn.feature_info[0]["channels"] == 8


def test_norm_and_gradients_and_registry():
    fpn = NECKS.build(
        {
            "type": "fpn",
            "in_channels": CHANNELS,
            "strides": STRIDES,
            "out_channels": 16,
            "norm": "gn",
        }
    )
    x = [t.requires_grad_() for t in features()]
    sum(o.sum() for o in fpn(x).values()).backward()
    assert all(t.grad is not None for t in x)
    assert all(p.grad is not None for p in fpn.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"in_channels": [16, 32], "strides": [8, 16, 32]}, ValueError, "same length"),
        ({"strides": [8, 16, 48]}, ValueError, "powers of two doubling"),
        ({"strides": [8, 32, 64]}, ValueError, "powers of two doubling"),
        ({"out_channels": 0}, ValueError, r"out_channels must be in \[1, "),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        FPN(**{"in_channels": CHANNELS, "strides": STRIDES, **kwargs})


def test_wrong_number_of_levels():
    with pytest.raises(ValueError, match="features must hold 3 levels"):
        FPN(CHANNELS, STRIDES)(features()[:2])
    with pytest.raises(ValueError, match=r"one per stride of strides=\[8, 16, 32\], got 2"):
        FPN(CHANNELS, STRIDES)(dict(zip("ab", features())))


def test_levels_that_disagree_with_the_strides_are_rejected():
    fpn = FPN([16, 32], [8, 16], out_channels=8)
    gen = torch.Generator().manual_seed(0)
    c3, c5 = torch.randn(1, 16, 8, 8, generator=gen), torch.randn(1, 32, 2, 2, generator=gen)
    # C3 and C5 (4x apart) given as strides 8 and 16 (2x): named, with both sizes and strides
    message = (
        r"features do not match strides=\[8, 16\]: features\['c3'\] of size \(8, 8\) and "
        r"features\['c5'\] of size \(2, 2\) are 4 x 4 apart \(height x width\), but "
        r"strides\[0\]=8 and strides\[1\]=16 say 2"
    )
    with pytest.raises(ValueError, match=message):
        fpn({"c3": c3, "c5": c5})
    with pytest.raises(ValueError, match=r"features\[0\] of size \(8, 8\) and features\[1\]"):
        fpn([c3, torch.randn(1, 32, 8, 8)])  # the same size: 1 x 1 apart
    with pytest.raises(ValueError, match="are 2 x 4 apart"):
        fpn([c3, torch.randn(1, 32, 4, 2)])  # only the width is off


@pytest.mark.parametrize("size", [(9, 9), (10, 7), (1, 3), (15, 16)])
def test_stride_two_levels_rounded_either_way_are_accepted(size):
    fpn = FPN([16, 32], [8, 16], out_channels=8)
    h, w = size
    fine = torch.randn(1, 16, h, w)
    for coarse in {(h // 2, w // 2), (-(-h // 2), -(-w // 2)), (h // 2, -(-w // 2))}:
        if min(coarse) == 0:
            continue
        out = fpn([fine, torch.randn(1, 32, *coarse)])
        assert tuple(out["p4"].shape[-2:]) == coarse


def test_absurd_sizes_and_bad_levels_are_rejected():
    # extra_levels=10**9 used to loop (and allocate) for hours before failing
    with pytest.raises(ValueError, match=r"extra_levels must be in \[0, 8\], got 1000000000"):
        FPN(CHANNELS, STRIDES, extra_levels=10**9)
    with pytest.raises(ValueError, match=r"out_channels must be in \[1, 65536\]"):
        FPN(CHANNELS, STRIDES, out_channels=10**9)
    fpn = FPN(CHANNELS, STRIDES, out_channels=8)
    feats = features()
    with pytest.raises(
        ValueError, match=r"features\[1\] must have shape \(B, 32, H, W\), got \(2, 31, 4, 4\)"
    ):
        fpn([feats[0], feats[1][:, :31], feats[2]])
    with pytest.raises(ValueError, match="must be ordered finest first"):
        fpn([feats[0][..., :2, :2], *feats[1:]])
    with pytest.raises(ValueError, match="same batch size"):
        fpn([feats[0], feats[1][:1], feats[2]])
