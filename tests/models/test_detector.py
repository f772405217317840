"""Detector: built through the registries, inputs, losses vs predictions, learning one image."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_iou

from visionblocks.models import (
    Detector,
    FCOSHead,
    build_detector,
    decode_ltrb,
    postprocess_detections,
)
from visionblocks.registry import MODELS

CFG = {
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [8, 16, 32, 64]},
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {
        "type": "fcos",
        "num_classes": 2,
        "num_convs": 1,
        "size_ranges": [(0, 16), (16, 32), (32, 1e8)],
    },
}


def image_and_target():
    image = torch.full((3, 64, 64), 40, dtype=torch.uint8)
    image[:, 8:30, 6:34] = torch.tensor([230, 40, 40], dtype=torch.uint8)[:, None, None]
    image[:, 36:60, 40:60] = torch.tensor([40, 230, 40], dtype=torch.uint8)[:, None, None]
    target = {
        "boxes": torch.tensor([[6.0, 8.0, 34.0, 30.0], [40.0, 36.0, 60.0, 60.0]]),
        "labels": torch.tensor([0, 1]),
    }
    return image, target


def test_build_wires_channels_and_strides_and_leaves_the_config_alone():
    cfg = {
        **CFG,
        "neck": {**CFG["neck"], "extra_levels": 1},
        "head": {**CFG["head"], "size_ranges": None},
    }
    before = repr(cfg)
    model = build_detector(cfg)
    assert repr(cfg) == before
    assert model.neck.lateral[0].conv.in_channels == 16  # vb_tiny's stage 1
    assert model.head.strides == [8, 16, 32, 64]
    assert isinstance(MODELS.build({"type": "detector", **CFG}), Detector)
    ready = build_detector(CFG, head=FCOSHead(16, 5, [8, 16, 32], num_convs=1))
    assert ready.head.num_classes == 5


@pytest.mark.parametrize("backbone", ["timm/resnet10t", {"type": "timm/resnet10t"}])
def test_a_timm_backbone_by_name_in_the_config(backbone):
    """``timm/<model>`` names a backbone in a config as in ``build_backbone`` (issue 16)."""
    head = CFG["head"]
    if isinstance(backbone, dict):
        backbone = {**backbone, "out_indices": [1, 2, 3]}
    else:  # all four stages: four levels
        head = {**head, "size_ranges": None}
    model = MODELS.build({"type": "detector", **CFG, "backbone": backbone, "head": head})
    assert isinstance(model, Detector) and model.head.strides[-3:] == [8, 16, 32]
    image, target = image_and_target()
    assert set(model(image[None], [target])) >= {"loss", "loss_cls"}
    with torch.no_grad():
        out = model.eval()(image[None])
    assert len(out) == 1 and set(out[0]) == {"boxes", "scores", "labels"}


def test_training_returns_losses_and_eval_returns_detections():
    torch.manual_seed(0)
    model = build_detector(CFG)
    image, target = image_and_target()
    losses = model(image[None], [target])
    assert set(losses) == {"loss", "loss_cls", "loss_box", "loss_centerness"}
    torch.testing.assert_close(
        losses["loss"], losses["loss_cls"] + losses["loss_box"] + losses["loss_centerness"]
    )
    model.eval()
    for images in (image[None], image[None].float(), [image]):
        out = model(images)
        assert len(out) == 1 and set(out[0]) == {"boxes", "scores", "labels"}
    with pytest.raises(ValueError, match=r"training mode and needs targets.*model\.eval\(\)"):
        model.train()(image[None])


def test_list_inputs_are_padded_and_sizes_kept():
    model = build_detector(CFG).eval()
    small, large = (
        torch.zeros(3, 40, 50, dtype=torch.uint8),
        torch.zeros(3, 64, 70, dtype=torch.uint8),
    )
    for image, out in zip((small, large), model([small, large])):
        if len(out["boxes"]):
            assert (
                out["boxes"][:, 2].max() <= image.shape[-1]
                and out["boxes"][:, 3].max() <= image.shape[-2]
            )


@pytest.mark.slow  # trains
def test_learns_one_image():
    """A few dozen steps on one image must find both objects: the loss, the targets and the
    decoding agree with each other."""
    torch.manual_seed(0)
    model = build_detector(CFG)
    image, target = image_and_target()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(120):
        loss = model(image[None], [target])["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = model.eval()(image[None])[0]
    for box, label in zip(target["boxes"], target["labels"]):
        same = out["labels"] == label
        assert same.any()
        assert box_iou(out["boxes"][same][:1], box[None]).item() > 0.6


def test_levels_that_disagree_with_the_backbone_are_refused_at_build_time():
    # The backbone sorts its stages and a neck cannot see absolute strides: either mistake
    # would place every box at the wrong scale.
    with pytest.raises(
        ValueError, match=r"out_indices must list the stages finest first.*\[3, 1, 2\]"
    ):
        build_detector({**CFG, "backbone": {**CFG["backbone"], "out_indices": [3, 1, 2]}})
    with pytest.raises(
        ValueError, match=r"neck.strides must be the backbone's strides \[8, 16, 32\]"
    ):
        build_detector({**CFG, "neck": {**CFG["neck"], "strides": [16, 32, 64]}})
    negative = {**CFG["backbone"], "out_indices": [-3, -2, -1]}  # stages 1, 2, 3: in order
    model = build_detector(
        {**CFG, "backbone": negative, "neck": {**CFG["neck"], "strides": [8, 16, 32]}}
    )
    assert model.head.strides == [8, 16, 32]


def test_errors():
    with pytest.raises(ValueError, match="cfg needs 'backbone', 'neck' and 'head'"):
        build_detector({"backbone": "vb_tiny", "neck": "fpn"})
    with pytest.raises(ValueError, match=r"got keys \['backbone', 'extra', 'head', 'neck'\]"):
        build_detector({**CFG, "extra": 1})
    with pytest.raises(KeyError, match="Did you mean"):
        build_detector({**CFG, "head": {"type": "fcoss", "num_classes": 2}})
    with pytest.raises(TypeError, match="head must be a module, a registered name or a dict"):
        build_detector({**CFG, "head": 3})
    with pytest.raises(TypeError, match="head must have a loss"):
        Detector(torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity())
    with pytest.raises(ValueError, match=r"images must have shape \(B, C, H, W\)"):
        build_detector(CFG).eval()(torch.zeros(3, 32, 32))
    with pytest.raises(ValueError, match="images have 1 channels, but the model normalises 3"):
        build_detector(CFG).eval()(torch.zeros(1, 1, 32, 32))


def test_decode_and_postprocess():
    torch.testing.assert_close(
        decode_ltrb(torch.tensor([[10.0, 10.0]]), torch.tensor([[2.0, 3.0, 4.0, 5.0]])),
        torch.tensor([[8.0, 7.0, 14.0, 15.0]]),
    )
    scores = [torch.tensor([[0.9, 0.0], [0.85, 0.0], [0.2, 0.7]]), torch.tensor([[0.01, 0.6]])]
    boxes = [
        torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 40.0, 40.0]]),
        torch.tensor([[-5.0, 0.0, 100.0, 50.0]]),
    ]
    out = postprocess_detections(scores, boxes, (32, 48), score_thresh=0.1, nms_thresh=0.5)
    # (0, class 0) suppresses (1, class 0); class 1 boxes don't overlap class 0 ones; clipped
    assert out["scores"].tolist() == pytest.approx([0.9, 0.7, 0.6, 0.2])
    assert out["labels"].tolist() == [0, 1, 1, 0]
    assert out["boxes"][2].tolist() == [0.0, 0.0, 48.0, 32.0]
    top = postprocess_detections(scores, boxes, (32, 48), max_detections=2, topk_candidates=1)
    assert top["scores"].tolist() == pytest.approx([0.9, 0.6])
    with pytest.raises(ValueError, match="scores and boxes must hold as many levels"):
        postprocess_detections(scores, boxes[:1], (32, 48))


def test_targets_in_other_box_formats_and_crowd_rows():
    from torchvision import tv_tensors

    torch.manual_seed(0)
    model = build_detector(CFG)
    image, target = image_and_target()
    expected = model(image[None], [target])
    cxcywh = tv_tensors.BoundingBoxes(
        torch.tensor([[20.0, 19.0, 28.0, 22.0], [50.0, 48.0, 20.0, 24.0]]),
        format="CXCYWH",
        canvas_size=(64, 64),
    )
    crowd = {
        "boxes": torch.cat([target["boxes"], torch.tensor([[0.0, 0.0, 64.0, 64.0]])]),
        "labels": torch.tensor([0, 1, 1]),
        "iscrowd": torch.tensor([0, 0, 1]),
    }
    for other in ({"boxes": cxcywh, "labels": target["labels"]}, crowd):
        got = model(image[None], [other])
        for key in expected:
            torch.testing.assert_close(got[key], expected[key])


# --------------------------------------------------------------------------- bad inputs
# Issue 19: no silent wrong answers. Each mistake below used to train on nothing, detect
# nothing or fail deep inside torch; each must now raise a clear error naming the field.


def _train_model():
    torch.manual_seed(0)
    return build_detector(CFG).train()


def _fit(model, **fields):
    image, target = image_and_target()
    return model(image[None].repeat(2, 1, 1, 1), [{**target, **fields}, target])


BAD_TARGETS = [
    # COCO's [x, y, w, h]: x2 < x1
    ({"boxes": torch.tensor([[6.0, 8.0, 28.0, 22.0], [40.0, 36.0, 20.0, 24.0]])}, ValueError,
     r'targets\[0\]\["boxes"\]\[1\] = \[40.0, 36.0, 20.0, 24.0\].*x2 > x1.*box_convert'),
    ({"boxes": torch.tensor([[6.0, 8.0, 34.0, 30.0], [40.0, float("nan"), 60.0, 60.0]])},
     ValueError, r'targets\[0\]\["boxes"\]\[1\] = \[40.0, nan'),
    ({"boxes": torch.tensor([[6.0, 8.0, float("inf"), 30.0], [40.0, 36.0, 60.0, 60.0]])},
     ValueError, r'targets\[0\]\["boxes"\]\[0\] = \[6.0, 8.0, inf'),
    # zero-size boxes: no location lies inside them; rejected rather than silently ignored
    ({"boxes": torch.tensor([[6.0, 8.0, 6.0, 30.0], [40.0, 36.0, 60.0, 60.0]])}, ValueError,
     r'targets\[0\]\["boxes"\]\[0\].*zero-size boxes'),
    ({"labels": torch.tensor([0])}, ValueError,
     r'targets\[0\]\["labels"\] has 1 entries but targets\[0\]\["boxes"\] has 2 rows'),
    ({"labels": torch.tensor([0, 2])}, ValueError, r'targets\[0\]\["labels"\] must lie in \[0, 2\)'),
    ({"labels": torch.tensor([-1, 0])}, ValueError, r'targets\[0\]\["labels"\] must lie in'),
    ({"boxes": torch.zeros(2, 5)}, ValueError,
     r'targets\[0\]\["boxes"\] must have shape \(N, 4\).*\(2, 5\)'),
    ({"iscrowd": torch.tensor([0, 0, 1])}, ValueError,
     r'targets\[0\]\["iscrowd"\] has 3 entries but targets\[0\]\["boxes"\] has 2 rows'),
    ({"iscrowd": torch.tensor([0, 2])}, ValueError, r'targets\[0\]\["iscrowd"\] must hold 0 or 1'),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "error", "match"), BAD_TARGETS)
def test_bad_training_targets_are_rejected(fields, error, match):
    with pytest.raises(error, match=match):
        _fit(_train_model(), **fields)


def test_target_list_errors():
    model = _train_model()
    image, target = image_and_target()
    images = image[None].repeat(2, 1, 1, 1)
    with pytest.raises(ValueError, match="images has 2 images but targets has 1 entries"):
        model(images, [target])
    with pytest.raises(TypeError, match=r"targets\[1\] must be a dict"):
        model(images, [target, target["boxes"]])
    with pytest.raises(ValueError, match=r"""targets\[0\] has no 'labels'"""):
        model(images, [{"boxes": target["boxes"]}, target])
    with pytest.raises(TypeError, match="targets must be a list of dicts"):
        model(images, target)


def test_value_checks_can_be_turned_off():
    import visionblocks

    xywh = torch.tensor([[6.0, 8.0, 28.0, 22.0], [40.0, 36.0, 20.0, 24.0]])
    with visionblocks.value_checks(False):
        assert torch.isfinite(_fit(_train_model(), boxes=xywh)["loss"])
        with pytest.raises(ValueError, match=r"must have shape \(N, 4\)"):  # shapes: always
            _fit(_train_model(), boxes=torch.zeros(2, 5))


@pytest.mark.parametrize(
    ("stats", "match"),
    [
        ({"pixel_std": [0.0, 1.0, 1.0]}, r"pixel_std\[0\] must be positive and finite"),
        ({"pixel_mean": [120.0]}, "one value per image channel \\(3, the backbone's input"),
        ({"pixel_std": [58.0, 57.0]}, "got 3 and 2"),
    ],
)
def test_bad_pixel_statistics_are_rejected_at_build_time(stats, match):
    with pytest.raises(ValueError, match=match):
        build_detector(CFG, **stats)


def test_bad_images_are_rejected():
    model = build_detector(CFG).eval()
    with pytest.raises(ValueError, match=r"\(one image\? add the batch dimension"):
        model(torch.zeros(3, 32, 32))
    with pytest.raises(ValueError, match="images must be finite"):
        model(torch.full((1, 3, 32, 32), float("nan")))
    with pytest.raises(ValueError, match=r"image_sizes\[0\] must be a pair of ints"):
        model(torch.zeros(1, 3, 32, 32), image_sizes=[(40, 32)])


def test_postprocess_rejects_mismatched_levels_and_bad_options():
    scores, boxes = [torch.rand(2, 3)], [torch.rand(3, 4)]
    with pytest.raises(ValueError, match=r"scores\[0\] must be \(A, C\) and boxes\[0\] \(A, 4\)"):
        postprocess_detections(scores, boxes, (32, 32))
    boxes = [torch.rand(2, 4)]
    with pytest.raises(ValueError, match=r"scores\[0\] must hold probabilities in \[0, 1\]"):
        postprocess_detections([torch.randn(2, 3) * 10], boxes, (32, 32))
