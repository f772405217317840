"""FCOS head: target assignment against a naive loop, centerness, losses, prediction."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import visionblocks.models._fcos_targets as fcos_targets
from visionblocks.models import FCOSHead
from visionblocks.models._fcos_targets import (
    centerness_target,
    grid_locations,
    match_batch,
    match_locations,
)

STRIDES = [8, 16]


def naive_match(points, strides, ranges, boxes, labels, num_classes, radius):
    """One location at a time, straight from the FCOS paper's rules (box areas in the same
    float32 arithmetic as the implementation, so that near-ties break the same way)."""
    areas = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).tolist()
    cls, matched = [], []
    for (x, y), s, (lo, hi) in zip(points.tolist(), strides.tolist(), ranges.tolist()):
        best, best_area = None, math.inf
        for j, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
            sides = (x - x1, y - y1, x2 - x, y2 - y)
            if min(sides) <= 0:
                continue
            if radius > 0:
                cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
                left, top = max(cx - radius * s, x1), max(cy - radius * s, y1)
                right, bottom = min(cx + radius * s, x2), min(cy + radius * s, y2)
                if not (left < x < right and top < y < bottom):
                    continue
            if not (lo < max(sides) <= hi):
                continue
            area = areas[j]
            if area < best_area:
                best, best_area = j, area
        cls.append(num_classes if best is None else int(labels[best]))
        matched.append([0.0] * 4 if best is None else boxes[best].tolist())
    return torch.tensor(cls), torch.tensor(matched)


def test_grid_locations():
    points, levels = grid_locations([(2, 3), (1, 2)], [8, 16], torch.device("cpu"))
    assert points.tolist()[:4] == [[4.0, 4.0], [12.0, 4.0], [20.0, 4.0], [4.0, 12.0]]
    assert points.tolist()[-2:] == [[8.0, 8.0], [24.0, 8.0]]
    assert levels.tolist() == [0] * 6 + [1] * 2


@example(
    boxes=[(0.0, 0.0, 7.0, 4.8624784251074615), (0.0, 1.00001, 4.8624784251074615, 7.0)], radius=0.0
)
@settings(max_examples=60, deadline=None)
@given(
    boxes=st.lists(
        st.tuples(st.floats(0, 60), st.floats(0, 60), st.floats(2, 50), st.floats(2, 50)),
        min_size=0, max_size=5,
    ),
    radius=st.sampled_from([0.0, 1.0, 1.5]),
)  # fmt: skip
def test_matching_equals_the_naive_rules(boxes, radius):
    points, levels = grid_locations([(8, 8), (4, 4)], STRIDES, torch.device("cpu"))
    strides = torch.tensor(STRIDES)[levels]
    ranges = torch.tensor([[0.0, 24.0], [24.0, 1e8]])[levels]
    xyxy = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in boxes]).reshape(-1, 4)
    labels = torch.arange(len(boxes)) % 3
    cls, matched = match_locations(points, strides, ranges, xyxy, labels, 3, radius)
    expected_cls, expected_boxes = naive_match(points, strides, ranges, xyxy, labels, 3, radius)
    assert torch.equal(cls, expected_cls)
    positive = cls < 3
    assert torch.allclose(matched[positive], expected_boxes[positive])


def test_matching_prefers_the_smaller_box_and_respects_ranges():
    points = torch.tensor([[20.0, 20.0], [20.0, 20.0]])
    strides = torch.tensor([8, 16])
    ranges = torch.tensor([[0.0, 16.0], [16.0, 1e8]])
    boxes = torch.tensor([[0.0, 0.0, 40.0, 40.0], [10.0, 10.0, 30.0, 30.0]])
    cls, matched = match_locations(points, strides, ranges, boxes, torch.tensor([1, 2]), 3, 0.0)
    assert cls.tolist() == [2, 1]  # stride 8 takes the small box (extent 10), 16 the big one (20)
    assert matched.tolist() == boxes.flip(0).tolist()


@pytest.mark.parametrize("chunk", [1 << 22, 50])  # one pass, and one image at a time
@pytest.mark.parametrize("radius", [0.0, 1.5])
def test_batched_matching_equals_matching_each_image(monkeypatch, chunk, radius):
    monkeypatch.setattr(fcos_targets, "_CHUNK", chunk)
    generator = torch.Generator().manual_seed(0)
    points, levels = grid_locations([(12, 10), (6, 5), (3, 3)], [8, 16, 32], torch.device("cpu"))
    strides = torch.tensor([8, 16, 32])[levels]
    ranges = torch.tensor([[0.0, 32.0], [32.0, 64.0], [64.0, 1e8]])[levels]
    boxes, labels = [], []
    for count in (3, 0, 5, 1, 2):  # an image without boxes among them
        xy = torch.rand(count, 2, generator=generator) * 80
        xyxy = torch.cat([xy, xy + 1 + torch.rand(count, 2, generator=generator) * 60], 1)
        if count > 1:
            xyxy[1] = xyxy[0]  # a tie: the first of equal boxes wins, as image by image
        boxes.append(xyxy)
        labels.append(torch.randint(0, 3, (count,), generator=generator))
    classes, matched = match_batch(points, strides, ranges, boxes, labels, 3, radius)
    assert classes.shape == (5, len(points)) and matched.shape == (5, len(points), 4)
    for i, (b, c) in enumerate(zip(boxes, labels)):
        expected_classes, expected_boxes = match_locations(points, strides, ranges, b, c, 3, radius)
        assert torch.equal(classes[i], expected_classes)
        assert torch.equal(matched[i], expected_boxes)
    assert (classes < 3).any()


def test_centerness_target():
    points = torch.tensor([[5.0, 5.0], [2.0, 5.0]])
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]] * 2)
    expected = torch.tensor([1.0, math.sqrt(2 / 8 * 5 / 5)])
    torch.testing.assert_close(centerness_target(points, boxes), expected)


def head_and_features(num_classes=3):
    torch.manual_seed(0)
    head = FCOSHead(8, num_classes, STRIDES, num_convs=1, norm="gn")
    feats = [torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4)]
    return head, feats


def test_losses_are_finite_and_reach_every_parameter():
    head, feats = head_and_features()
    targets = [
        {
            "boxes": torch.tensor([[4.0, 4.0, 40.0, 30.0], [30.0, 30.0, 60.0, 60.0]]),
            "labels": torch.tensor([0, 2]),
        },
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)},
    ]
    losses = head.loss(head(feats), targets)
    assert set(losses) == {"loss_cls", "loss_box", "loss_centerness"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in losses.values())
    sum(losses.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())


def test_images_without_boxes_have_only_a_classification_loss():
    head, feats = head_and_features()
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}
    losses = head.loss(head(feats), [empty, empty])
    assert losses["loss_box"] == 0 and losses["loss_centerness"] == 0 and losses["loss_cls"] > 0


def test_class_bias_starts_at_the_prior():
    head, _ = head_and_features()
    assert torch.allclose(torch.sigmoid(head.cls_logits.bias), torch.tensor(0.01))


def test_predict_decodes_a_confident_location():
    head, feats = head_and_features()
    outputs = head(feats)
    outputs["cls_logits"] = [torch.full_like(t, -20.0) for t in outputs["cls_logits"]]
    outputs["centerness"] = [torch.full_like(t, 20.0) for t in outputs["centerness"]]
    # location 9 of level 0 is (12, 12): a box from (2, 4) to (30, 20) as class 1
    outputs["cls_logits"][0][0, 9, 1] = 20.0
    outputs["boxes"][0] = outputs["boxes"][0].detach().clone()
    outputs["boxes"][0][0, 9] = torch.tensor([10.0, 8.0, 18.0, 8.0])
    result = head.predict(outputs, [(64, 64), (64, 64)])
    assert result[0]["labels"].tolist() == [1]
    torch.testing.assert_close(result[0]["boxes"], torch.tensor([[2.0, 4.0, 30.0, 20.0]]))
    assert result[0]["scores"].item() == pytest.approx(1.0, abs=1e-6)
    assert len(result[1]["boxes"]) == 0


def test_bad_arguments_and_targets():
    with pytest.raises(ValueError, match="size_ranges must hold one"):
        FCOSHead(8, 3, STRIDES, size_ranges=[(0, 1)])
    with pytest.raises(ValueError, match="num_classes must be in"):
        FCOSHead(8, 0, STRIDES)
    head, feats = head_and_features()
    bad = {"boxes": torch.tensor([[0.0, 0.0, 5.0, 5.0]]), "labels": torch.tensor([3])}
    with pytest.raises(ValueError, match=r"targets\[0\]\[\"labels\"\] must lie in \[0, 3\)"):
        head.loss(head(feats), [bad, bad])
    with pytest.raises(ValueError, match="images has 2 images but targets has 1 entries"):
        head.loss(head(feats), [bad])
    with pytest.raises(ValueError, match="features must hold 2 levels"):
        head(feats[:1])


def test_default_size_ranges_are_fcos_ones():
    head = FCOSHead(16, 3, [8, 16, 32, 64, 128], num_convs=0)
    assert head.size_ranges.tolist() == [
        [0, 64],
        [64, 128],
        [128, 256],
        [256, 512],
        [512, math.inf],
    ]


def test_losses_equal_torchvision_fcos():
    """Peer oracle: torchvision's FCOS.compute_loss on the same outputs and targets.

    torchvision describes locations by anchors of the stride's size centred on our cell
    centres and regresses in strides; its box loss is the plain GIoU mean over positives,
    ours weights each positive by its centerness target (as AdelaiDet), so that one is
    compared unweighted.
    """
    import types

    from torchvision.models.detection.fcos import FCOS
    from torchvision.models.detection.fcos import FCOSHead as TorchvisionHead
    from torchvision.ops import generalized_box_iou_loss

    from visionblocks.models import decode_ltrb

    torch.manual_seed(0)
    strides = [8, 16, 32]
    head = FCOSHead(16, 3, strides, num_convs=1, size_ranges=[(0, 64), (64, 128), (128, math.inf)])
    out = head([torch.randn(2, 16, 128 // s, 128 // s) for s in strides])
    out["boxes"] = [b.detach() + torch.rand_like(b) * 20 for b in out["boxes"]]
    out["centerness"] = [c.detach() + torch.randn_like(c) for c in out["centerness"]]
    out["cls_logits"] = [c.detach() + torch.randn_like(c) for c in out["cls_logits"]]
    targets = [
        {"boxes": torch.tensor([[10.0, 12, 50, 70], [60, 30, 120, 110], [5, 80, 30, 100]]), "labels": torch.tensor([0, 2, 1])},
        {"boxes": torch.tensor([[20.0, 20, 100, 100], [30, 30, 60, 58]]), "labels": torch.tensor([1, 0])},
    ]  # fmt: skip
    ours = head.loss(out, targets)

    points, levels = grid_locations(out["sizes"], strides, torch.device("cpu"))
    point_strides = torch.tensor(strides)[levels].float()
    anchors = torch.cat(
        [points - point_strides[:, None] / 2, points + point_strides[:, None] / 2], 1
    )
    peer = types.SimpleNamespace(
        center_sampling_radius=1.5, head=TorchvisionHead(32, 1, 3, num_convs=1)
    )
    peer_outputs = {
        "cls_logits": torch.cat(out["cls_logits"], 1),
        "bbox_regression": torch.cat(out["boxes"], 1) / point_strides[None, :, None],
        "bbox_ctrness": torch.cat(out["centerness"], 1)[..., None],
    }
    theirs = FCOS.compute_loss(
        peer, targets, peer_outputs, [anchors, anchors], [h * w for h, w in out["sizes"]]
    )
    torch.testing.assert_close(ours["loss_cls"], theirs["classification"])
    torch.testing.assert_close(ours["loss_centerness"], theirs["bbox_ctrness"])

    ranges = head.size_ranges[levels]
    matched = [
        match_locations(points, point_strides, ranges, t["boxes"], t["labels"], 3, 1.5)
        for t in targets
    ]
    positive = torch.stack([c for c, _ in matched]) < 3
    boxes = decode_ltrb(points.expand(2, -1, -1)[positive], torch.cat(out["boxes"], 1)[positive])
    unweighted = generalized_box_iou_loss(
        boxes, torch.stack([m for _, m in matched])[positive], reduction="mean"
    )
    torch.testing.assert_close(unweighted, theirs["bbox_regression"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"size_ranges": [1, 2]}, ValueError, "size_ranges must hold one"),
        ({"size_ranges": [(64, 0), (0, 64)]}, ValueError, "0 <= low < high"),
        ({"strides": [8.7, 16]}, TypeError, r"strides\[0\] must be int"),
        ({"score_thresh": 1.5}, ValueError, "score_thresh must be in"),
        ({"max_detections": 0}, ValueError, "max_detections must be in"),
    ],
)
def test_options_are_checked_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        FCOSHead(**{"in_channels": 8, "num_classes": 3, "strides": STRIDES, **kwargs})


def test_absurd_sizes_and_untyped_options_are_rejected():
    # num_convs=10**9 used to build towers until memory ran out
    with pytest.raises(ValueError, match=r"num_convs must be in \[0, 64\], got 1000000000"):
        FCOSHead(8, 3, STRIDES, num_convs=10**9)
    with pytest.raises(ValueError, match=r"num_classes must be in \[1, 65536\]"):
        FCOSHead(8, 10**9, STRIDES)
    with pytest.raises(ValueError, match="strides must increase"):
        FCOSHead(8, 3, [16, 8])
    head, feats = head_and_features()
    with pytest.raises(ValueError, match=r"image_sizes must hold 2"):
        head.predict(head(feats), [(64, 64)])


def test_levels_that_disagree_with_the_strides_are_rejected():
    head = FCOSHead(8, 3, [8, 16, 32], num_convs=0)
    p3, p4, p5 = (torch.randn(1, 8, n, n) for n in (16, 8, 4))
    assert len(head([p3, p4, p5])["sizes"]) == 3
    # P3 and P5 given as strides 8 and 16: 4x apart where the strides say 2x
    with pytest.raises(ValueError, match=r"features\[0\] of size \(16, 16\) and features\[1\] of "
                       r"size \(4, 4\) are 4 x 4 apart .* say 2"):  # fmt: skip
        head([p3, p5, torch.randn(1, 8, 2, 2)])
    # odd sizes round either way (a stride-2 conv with or without padding)
    head([torch.randn(1, 8, 15, 15), torch.randn(1, 8, 7, 8), torch.randn(1, 8, 4, 4)])
