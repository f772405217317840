"""Segmenter and FPNSegHead: shapes, the losses against the loss functions (alone and summed),
ignored pixels, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from visionblocks.losses import (
    cross_entropy,
    dice_loss,
    jaccard_loss,
    lovasz_loss,
    softmax_focal_loss,
    tversky_loss,
)
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


# ------------------------------------------------------------- the losses of issue 43
REGION = {
    "dice": lambda x, y, i: dice_loss(x, y, "multiclass", ignore_index=i),
    "jaccard": lambda x, y, i: jaccard_loss(x, y, "multiclass", ignore_index=i),
    "tversky": lambda x, y, i: tversky_loss(x, y, "multiclass", ignore_index=i),
    "lovasz": lambda x, y, i: lovasz_loss(x, y, "multiclass", ignore_index=i),
    "ce": lambda x, y, i: F.cross_entropy(x, y, ignore_index=i),
    "softmax_focal": lambda x, y, i: softmax_focal_loss(x, y, ignore_index=i),
}


def _logits_labels(ignore: int = 255) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 16, 16)
    labels = torch.randint(0, 3, (2, 16, 16))
    labels[:, :3] = ignore
    return logits, labels


@pytest.mark.parametrize("name", sorted(REGION))
def test_each_loss_equals_the_loss_function(name):
    logits, labels = _logits_labels()
    got = FPNSegHead(8, 3, [4], loss=name).loss(logits, labels)
    assert list(got) == ["loss_seg"]
    torch.testing.assert_close(got["loss_seg"], REGION[name](logits, labels, 255))


def test_a_sequence_of_losses_is_their_sum_with_one_entry_each():
    logits, labels = _logits_labels(ignore=-1)
    head = FPNSegHead(8, 3, [4], loss=("ce", "dice", "lovasz"), ignore_index=-1)
    got = head.loss(logits, labels)
    assert list(got) == ["loss_ce", "loss_dice", "loss_lovasz"]
    for name in ("ce", "dice", "lovasz"):
        torch.testing.assert_close(got[f"loss_{name}"], REGION[name](logits, labels, -1))
    assert head.loss_type == ("ce", "dice", "lovasz") and "'dice'" in repr(head)
    # top_k and label_smoothing go to the cross-entropy term only
    ohem = FPNSegHead(8, 3, [4], loss=["dice", "ce"], ignore_index=-1, top_k=0.5,
                      label_smoothing=0.1).loss(logits, labels)  # fmt: skip
    expected = cross_entropy(logits, labels, ignore_index=-1, top_k=0.5, label_smoothing=0.1)
    torch.testing.assert_close(ohem["loss_ce"], expected)
    torch.testing.assert_close(ohem["loss_dice"], got["loss_dice"])
    model = build_segmenter(CFG, head={**CFG["head"], "loss": ["ce", "dice"]})
    image, scene_labels = scene()
    losses = model(image[None], scene_labels[None])
    assert set(losses) == {"loss_ce", "loss_dice", "loss"}
    torch.testing.assert_close(losses["loss"], losses["loss_ce"] + losses["loss_dice"])


@pytest.mark.parametrize("loss", [*sorted(REGION), ("ce", "dice"), ("ce", "lovasz")])
def test_ignored_pixels_take_no_part(loss):
    logits, labels = _logits_labels()
    logits.requires_grad_(True)
    head = FPNSegHead(8, 3, [4], loss=loss)
    total = sum(head.loss(logits, labels).values())
    (grad,) = torch.autograd.grad(total, logits)
    ignored = (labels == 255)[:, None].expand_as(grad)
    assert grad[ignored].abs().max() == 0 and grad[~ignored].abs().max() > 0
    changed = logits.detach().masked_fill(ignored, 50.0)
    torch.testing.assert_close(sum(head.loss(changed, labels).values()), total.detach())


@pytest.mark.parametrize("loss", [*sorted(REGION), ("ce", "dice")])
def test_each_loss_trains(loss):
    torch.manual_seed(0)
    model = build_segmenter(CFG, head={**CFG["head"], "loss": loss})
    image, labels = scene()
    images, labels = image[:, ::2, ::2], labels[::2, ::2]  # two 32 x 32 scenes
    images, labels = torch.stack([images, images.flip(-1)]), torch.stack([labels, labels.flip(-1)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    values = []
    for _ in range(8):
        value = model(images, labels)["loss"]
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        values.append(value.item())
    assert values[-1] < 0.9 * values[0], values


def test_bad_loss_names_are_refused_naming_the_choices():
    choices = "'ce', 'softmax_focal', 'dice', 'jaccard', 'tversky', 'lovasz'"
    with pytest.raises(ValueError, match=f"loss must be one of {choices}; got 'dic'"):
        FPNSegHead(8, 3, [4], loss="dic")
    with pytest.raises(ValueError, match=rf"loss\[1\] must be one of {choices}; got 'focal'"):
        FPNSegHead(8, 3, [4], loss=("ce", "focal"))
    with pytest.raises(ValueError, match="loss must be one of"):
        FPNSegHead(8, 3, [4], loss=None)
    with pytest.raises(ValueError, match="non-empty sequence"):
        FPNSegHead(8, 3, [4], loss=[])
    with pytest.raises(ValueError, match=r"each loss once, got \('ce', 'ce'\)"):
        FPNSegHead(8, 3, [4], loss=["ce", "ce"])
    with pytest.raises(ValueError, match=r"apply to loss='ce', not \('dice', 'lovasz'\)"):
        FPNSegHead(8, 3, [4], loss=("dice", "lovasz"), label_smoothing=0.1)
