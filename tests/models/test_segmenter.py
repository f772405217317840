"""Segmenter and FPNSegHead: shapes, the three losses against F.cross_entropy, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from visionblocks.models import FPNSegHead, Segmenter, build_segmenter
from visionblocks.registry import HEADS, MODELS

CFG = {
    "backbone": {"type": "vb_tiny", "widths": [8, 16, 32, 64]},
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {"type": "fpn_seg", "num_classes": 3, "channels": 16},
}


def scene() -> tuple[torch.Tensor, torch.Tensor]:
    image = torch.full((3, 64, 64), 30, dtype=torch.uint8)
    labels = torch.zeros(64, 64, dtype=torch.long)
    image[0, 10:30, 8:40] = 220
    labels[10:30, 8:40] = 1
    image[1, 36:60, 30:60] = 220
    labels[36:60, 30:60] = 2
    labels[0:4, 0:4] = 255  # ignored
    return image, labels


def test_shapes_and_registry():
    model = MODELS.build({"type": "segmenter", **CFG})
    assert isinstance(model, Segmenter) and model.head.strides == [4, 8, 16, 32]
    image, _ = scene()
    assert model.eval()(image[None]).shape == (1, 3, 64, 64)
    assert model.predict(torch.zeros(2, 3, 48, 80, dtype=torch.uint8)).shape == (2, 48, 80)
    assert HEADS.get("fpn_seg") is FPNSegHead


def test_a_timm_backbone_by_name_in_the_config():
    """``{"type": "timm/<model>"}`` in a config, as ``build_backbone`` takes it (issue 16)."""
    model = MODELS.build({"type": "segmenter", **CFG, "backbone": {"type": "timm/resnet10t"}})
    assert isinstance(model, Segmenter) and model.head.strides == [4, 8, 16, 32]
    image, labels = scene()
    with torch.no_grad():
        assert model.eval()(image[None]).shape == (1, 3, 64, 64)
    assert model.train()(image[None], labels[None])["loss"].isfinite()


@pytest.mark.parametrize("size", [(64, 64), (50, 70)])
def test_head_output_size_follows_the_input(size):
    head = FPNSegHead(8, 4, [4, 8, 16], channels=8)
    h, w = size
    feats = [torch.randn(1, 8, -(-h // s), -(-w // s)) for s in (4, 8, 16)]
    assert head(feats, size=size).shape == (1, 4, h, w)


def test_losses_against_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 16, 16)
    labels = torch.randint(0, 3, (2, 16, 16))
    labels[:, :2] = 255
    ce = FPNSegHead(8, 3, [4], loss="ce")
    expected = F.cross_entropy(logits, labels, ignore_index=255)
    torch.testing.assert_close(ce.loss(logits, labels)["loss_seg"], expected)
    focal = FPNSegHead(8, 3, [4], loss="softmax_focal", gamma=0.0)  # gamma 0: plain CE
    torch.testing.assert_close(focal.loss(logits, labels)["loss_seg"], expected)
    ohem = FPNSegHead(8, 3, [4], loss="ce", top_k=0.25)
    per_pixel = F.cross_entropy(logits, labels, ignore_index=255, reduction="none")
    valid = per_pixel[labels != 255]
    hardest = valid.topk(int(0.25 * valid.numel())).values.mean()
    torch.testing.assert_close(ohem.loss(logits, labels)["loss_seg"], hardest, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # trains
def test_learns_one_scene():
    torch.manual_seed(0)
    model = build_segmenter(CFG)
    image, labels = scene()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(100):
        loss = model(image[None], labels[None])["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    predicted = model.eval().predict(image[None])[0]
    valid = labels != 255
    assert (predicted[valid] == labels[valid]).float().mean() > 0.95


def test_errors():
    with pytest.raises(ValueError, match="strides must be increasing powers of two"):
        FPNSegHead(8, 3, [4, 12])
    with pytest.raises(ValueError, match="features must hold 2 levels"):
        FPNSegHead(8, 3, [4, 8])([torch.randn(1, 8, 4, 4)], size=(16, 16))
    with pytest.raises(ValueError, match="cfg needs"):
        build_segmenter({"backbone": "vb_tiny"})
    with pytest.raises(ValueError, match="top_k and label_smoothing apply to loss='ce'"):
        FPNSegHead(8, 3, [4], loss="softmax_focal", top_k=0.5)
    model = build_segmenter(CFG)
    with pytest.raises(TypeError, match=r"images must be a \(B, C, H, W\) tensor"):
        model([torch.zeros(3, 32, 32)])
    with pytest.raises(ValueError, match="needs targets for its loss"):
        model(torch.zeros(1, 3, 32, 32))


def test_bad_targets_and_options_are_rejected():
    model = build_segmenter(CFG)
    images = torch.zeros(2, 3, 32, 32)
    labels = torch.zeros(2, 32, 32, dtype=torch.long)
    with pytest.raises(ValueError, match=r"targets must have shape \(B, H, W\) = \(2, 32, 32\)"):
        model(images, labels[:, :16])
    with pytest.raises(
        ValueError, match=r"targets must hold classes in \[0, 3\) or ignore_index=255"
    ):
        model(images, labels + 7)
    assert torch.isfinite(model(images, labels.index_fill(1, torch.tensor([0]), 255))["loss"])
    with pytest.raises(ValueError, match="pixel_std"):
        build_segmenter(CFG, pixel_std=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"channels must be in \[1, 65536\]"):
        FPNSegHead(8, 3, [4, 8], channels=10**9)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        FPNSegHead(8, 3, [4]).loss(torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, 4))


def test_levels_that_disagree_with_the_strides_are_rejected():
    head = FPNSegHead(8, 3, [4, 8], channels=8)
    assert head([torch.randn(1, 8, 8, 8), torch.randn(1, 8, 4, 4)], size=(32, 32)).shape[-1] == 32
    with pytest.raises(ValueError, match=r"features\[0\] of size \(8, 8\) and features\[1\] of "
                       r"size \(2, 2\) are 4 x 4 apart"):  # fmt: skip
        head([torch.randn(1, 8, 8, 8), torch.randn(1, 8, 2, 2)], size=(32, 32))
