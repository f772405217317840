"""YOLOv8 head: losses equal to ultralytics' v8DetectionLoss, the detector's training and
inference paths, compile, export, and learning on synthetic COCO."""

from __future__ import annotations

import math
import types

import pytest
import torch
from torch import nn

from visionblocks.models import YOLOv8Head, build_detector
from visionblocks.models.detector import training_targets

STRIDES = [8, 16, 32]
STEPS = 60  # training steps of the learning test
CFG = {
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [8, 16, 32, 64]},
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {"type": "yolov8", "num_classes": 2},
}


def _targets():
    return [
        {"boxes": torch.tensor([[6.0, 8.0, 34.0, 30.0], [40.0, 36.0, 60.0, 60.0]]),
         "labels": torch.tensor([0, 1])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)},
    ]  # fmt: skip


def _images(batch=2, size=64):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 255, (batch, 3, size, size), generator=gen, dtype=torch.uint8)


# ------------------------------------------------------------------ the peer: ultralytics
def _ultralytics_loss(num_classes, reg_max, strides, min_side):
    """ultralytics' ``v8DetectionLoss`` built on a bare ``Detect`` (no weights, no yaml):
    the loss reads only the model's ``args`` (gains), its last module's ``nc``, ``reg_max``
    and ``stride``, and its parameters' device."""
    pytest.importorskip("ultralytics")
    from ultralytics.nn.modules.head import Detect
    from ultralytics.utils.loss import v8DetectionLoss

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            detect = Detect(nc=num_classes, reg_max=reg_max, ch=(8,) * len(strides))
            detect.stride = torch.tensor(strides, dtype=torch.float32)
            self.model = nn.ModuleList([detect])
            self.args = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5)

    criterion = v8DetectionLoss(Model(), tal_topk=10)
    if min_side is None:  # ultralytics 8.4 widens boxes below stride[1]; 0 widens nothing
        criterion.assigner.stride_val = 0
    else:
        criterion.assigner.stride_val = min_side
    return criterion


def _ultralytics_inputs(cls_logits, box_logits, sizes, targets, image_size):
    """Our per-level outputs and targets in ultralytics' layout: ``(B, 4 reg_max, A)`` box
    and ``(B, C, A)`` class logits, normalised ``xywh`` targets with their image index."""
    h, w = image_size
    preds = {
        "boxes": torch.cat(box_logits, 1).flatten(2).transpose(1, 2),
        "scores": torch.cat(cls_logits, 1).transpose(1, 2),
        "feats": [torch.zeros(1, 1, *size) for size in sizes],
    }
    index, classes, boxes = [], [], []
    for i, t in enumerate(targets):
        b = t["boxes"]
        xywh = torch.cat([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]], 1)
        boxes.append(xywh / torch.tensor([w, h, w, h], dtype=b.dtype))
        index.append(torch.full((len(b),), float(i)))
        classes.append(t["labels"].to(b.dtype))
    batch = {"batch_idx": torch.cat(index), "cls": torch.cat(classes), "bboxes": torch.cat(boxes)}
    return preds, batch


def _crowded_targets(gen, image_size, counts, num_classes):
    """Boxes on an eighth-pixel grid (exact through ultralytics' normalised xywh round
    trip), among them duplicates and nested boxes (anchors claimed by several objects)."""
    h, w = image_size
    out = []
    for count in counts:
        xy = torch.rand(count, 2, generator=gen) * torch.tensor([w - 8.0, h - 8.0])
        wh = 2 + torch.rand(count, 2, generator=gen) * torch.tensor([w / 2, h / 2])
        boxes = torch.cat([xy, torch.minimum(xy + wh, torch.tensor([w, h]))], 1)
        boxes = (boxes * 8).round() / 8
        if count > 2:
            boxes[1] = boxes[0]  # an exact duplicate
            boxes[2] = torch.cat([boxes[0, :2] + 1, boxes[0, 2:] - 1])  # nested in it
        out.append(
            {"boxes": boxes, "labels": torch.randint(0, num_classes, (count,), generator=gen)}
        )
    return out


@pytest.mark.parametrize("min_side", [None, 16.0], ids=["yolov8", "min_side16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("counts", [(4, 1, 0), (40, 25, 3)], ids=["sparse", "crowded"])
def test_losses_equal_ultralytics_v8_detection_loss(min_side, dtype, counts):
    """Peer oracle: the same raw per-level predictions and targets give ultralytics'
    ``v8DetectionLoss`` terms (box, cls, dfl, before its batch-size factor) to 1e-6
    relative, and the same gradients (ultralytics/utils/loss.py, 8.4)."""
    num_classes, reg_max, image_size = 5, 16, (128, 96)
    criterion = _ultralytics_loss(num_classes, reg_max, STRIDES, min_side)
    head = YOLOv8Head(8, num_classes, STRIDES, reg_max=reg_max, tal_min_side=min_side)
    gen = torch.Generator().manual_seed(len(counts) + sum(counts))
    sizes = [(image_size[0] // s, image_size[1] // s) for s in STRIDES]
    cls_logits = [
        torch.randn(3, h * w, num_classes, generator=gen, dtype=dtype) - 2 for h, w in sizes
    ]
    box_logits = [
        torch.randn(3, h * w, 4, reg_max, generator=gen, dtype=dtype) * 2 for h, w in sizes
    ]
    targets = _crowded_targets(gen, image_size, counts, num_classes)
    for t in cls_logits + box_logits:
        t.requires_grad_(True)

    ours = head.loss({"cls_logits": cls_logits, "box_logits": box_logits, "sizes": sizes}, targets)
    preds, batch = _ultralytics_inputs(cls_logits, box_logits, sizes, targets, image_size)
    theirs, items = criterion(preds, batch)
    for key, name in (("loss_box", "box_loss"), ("loss_cls", "cls_loss"), ("loss_dfl", "dfl_loss")):
        assert items[name] > 0
        torch.testing.assert_close(ours[key].double(), items[name].double(), rtol=1e-6, atol=0)

    mine = torch.autograd.grad(sum(ours.values()), cls_logits + box_logits)
    peer = torch.autograd.grad(theirs.sum() / 3, cls_logits + box_logits)  # batch size 3
    for a, b in zip(mine, peer):
        torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-5, atol=1e-7)


def test_the_assignment_sees_positives_in_the_oracle_case():
    """The oracle test is not vacuous: the sparse case has positives on every level."""
    head = YOLOv8Head(8, 5, STRIDES)
    gen = torch.Generator().manual_seed(8)
    targets = _crowded_targets(gen, (128, 96), (4, 1, 0), 5)
    sizes = [(128 // s, 96 // s) for s in STRIDES]
    out = {"cls_logits": [torch.zeros(3, h * w, 5) for h, w in sizes],
           "box_logits": [torch.zeros(3, h * w, 4, 16) for h, w in sizes], "sizes": sizes}  # fmt: skip
    losses = head.loss(out, targets)
    assert losses["loss_box"] > 0 and losses["loss_dfl"] > 0


# ------------------------------------------------------------------ head and detector
@pytest.mark.parametrize("depthwise_cls", [False, True])
def test_init_follows_ultralytics(depthwise_cls):
    head = YOLOv8Head(16, 4, STRIDES, depthwise_cls=depthwise_cls)
    for branch, stride in zip(head.cls_branches, STRIDES):
        expected = math.log(5 / 4 / (640 / stride) ** 2)
        torch.testing.assert_close(branch[-1].bias, torch.full((4,), expected))
        first = branch[0].pointwise.conv if depthwise_cls else branch[0].conv
        assert first.out_channels == 16  # max(in_channels, min(nc, 100))
    for branch in head.box_branches:
        assert (branch[-1].bias == 1.0).all() and branch[-1].out_channels == 64
        assert branch[0].conv.out_channels == 64  # max(16, in_channels // 4, 4 reg_max)
        assert isinstance(branch[0].norm, nn.BatchNorm2d) and isinstance(branch[0].act, nn.SiLU)


def test_depthwise_class_branch_is_ultralytics_yolo11_branch(monkeypatch):
    """Peer oracle: with ``depthwise_cls=True`` each level's class branch has the modules,
    parameter shapes and outputs of ultralytics' ``Detect(legacy=False)`` ``cv3`` (YOLO11
    and later), its weights and BatchNorm statistics copied in order; the box branch is
    unchanged. The default keeps YOLOv8's two 3x3 convolutions."""
    pytest.importorskip("ultralytics")
    from ultralytics.nn.modules.head import Detect

    torch.manual_seed(0)
    # more classes than input channels: the branch is 40 wide on 16 input channels
    ours = YOLOv8Head(16, 40, [8, 16], reg_max=8, depthwise_cls=True).eval()
    legacy = YOLOv8Head(16, 40, [8, 16], reg_max=8).eval()
    # ultralytics' model parser sets the class attribute for the models it builds; its
    # constructor reads it
    monkeypatch.setattr(Detect, "legacy", False)
    detect = Detect(nc=40, reg_max=8, ch=(16, 16)).eval()
    feats = [torch.randn(2, 16, 8, 8), torch.randn(2, 16, 4, 4)]
    for level, (branch, theirs) in enumerate(zip(ours.cls_branches, detect.cv3)):
        mine, peer = branch.state_dict(), theirs.state_dict()
        assert [v.shape for v in mine.values()] == [v.shape for v in peer.values()]
        for module in branch.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
        theirs.load_state_dict(dict(zip(peer, (v.clone() for v in branch.state_dict().values()))))
        with torch.no_grad():
            torch.testing.assert_close(branch(feats[level]), theirs(feats[level]))
        for block, width in zip(branch[:2], (16, 40)):
            depthwise = block.depthwise.conv
            assert depthwise.groups == depthwise.in_channels == width
            assert depthwise.kernel_size == (3, 3) and block.pointwise.conv.out_channels == 40
            assert isinstance(block.depthwise.act, nn.SiLU)
    for a, b in zip(ours.box_branches, legacy.box_branches):
        assert [v.shape for v in a.state_dict().values()] == [
            v.shape for v in b.state_dict().values()
        ]
    assert [m.kernel_size for m in legacy.cls_branches[0].modules() if isinstance(m, nn.Conv2d)] == [
        (3, 3), (3, 3), (1, 1)
    ]  # fmt: skip
    ours.train()
    out = ours(feats)
    loss = ours.loss(out, [_targets()[0], _targets()[0]])
    sum(loss.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in ours.parameters())


def test_detector_trains_with_finite_losses_and_gradients():
    torch.manual_seed(0)
    model = build_detector(CFG)
    losses = model(_images(), _targets())
    assert set(losses) == {"loss", "loss_cls", "loss_box", "loss_dfl"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    torch.testing.assert_close(
        losses["loss"], losses["loss_cls"] + losses["loss_box"] + losses["loss_dfl"]
    )
    losses["loss"].backward()
    head = [p for n, p in model.named_parameters() if n.startswith("head.")]
    assert head and all(p.grad is not None and torch.isfinite(p.grad).all() for p in head)
    assert all(p.grad is not None for p in model.parameters())


def test_images_without_objects_have_only_a_classification_loss():
    torch.manual_seed(0)
    model = build_detector(CFG)
    empty = _targets()[1]
    losses = model(_images(), [empty, empty])
    assert losses["loss_box"] == 0 and losses["loss_dfl"] == 0 and losses["loss_cls"] > 0
    losses["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_detections_have_the_fcos_format():
    torch.manual_seed(0)
    yolo = build_detector({**CFG, "head": {**CFG["head"], "score_thresh": 0.001}}).eval()
    fcos = build_detector({**CFG, "head": {"type": "fcos", "num_classes": 2, "num_convs": 1}})
    images = [torch.zeros(3, 40, 50, dtype=torch.uint8), _images(1)[0]]
    with torch.no_grad():
        ours, theirs = yolo(images), fcos.eval()(images)
    assert len(ours) == len(theirs) == 2
    for a, b, image in zip(ours, theirs, images):
        assert set(a) == set(b) == {"boxes", "scores", "labels"}
        assert all(a[k].dtype == b[k].dtype and a[k].dim() == b[k].dim() for k in a)
        assert len(a["boxes"]) > 0  # the class prior at stride 32 is 0.006
        assert (a["boxes"][:, 2] <= image.shape[-1]).all() and (
            a["boxes"][:, 3] <= image.shape[-2]
        ).all()
        assert (a["scores"][:-1] >= a["scores"][1:]).all() and (a["labels"] < 2).all()


def test_predict_decodes_a_confident_location():
    torch.manual_seed(0)
    head = YOLOv8Head(8, 3, [8, 16]).eval()
    out = head([torch.randn(1, 8, 8, 8), torch.randn(1, 8, 4, 4)])
    out["cls_logits"] = [torch.full_like(t, -20.0) for t in out["cls_logits"]]
    # cell 9 of level 0 is (1, 1): its point (1.5, 1.5) grid cells = (12, 12) pixels
    out["cls_logits"][0][0, 9, 1] = 20.0
    box = torch.full((4, 16), -30.0)  # each side's distribution on one bin: l 1, t 2, r 2, b 1
    box[0, 1] = box[1, 2] = box[2, 2] = box[3, 1] = 30.0
    out["box_logits"][0] = out["box_logits"][0].detach().clone()
    out["box_logits"][0][0, 9] = box
    result = head.predict(out, [(64, 64)])[0]
    assert result["labels"].tolist() == [1]
    torch.testing.assert_close(
        result["boxes"], torch.tensor([[4.0, 0.0, 28.0, 20.0]])
    )  # y1 clipped
    assert result["scores"].item() == pytest.approx(1.0, abs=1e-6)


def test_padded_detections_match_the_list():
    torch.manual_seed(0)
    model = build_detector({**CFG, "head": {**CFG["head"], "score_thresh": 0.001}}).eval()
    images = _images(2, 96)
    with torch.no_grad():
        listed, padded = model(images), model(images, padded=True)
    for b, det in enumerate(listed):
        n = int(padded["num_detections"][b])
        assert n == len(det["scores"]) > 0
        torch.testing.assert_close(padded["boxes"][b, :n], det["boxes"], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded["scores"][b, :n], det["scores"], atol=1e-6, rtol=0)
        assert torch.equal(padded["labels"][b, :n], det["labels"])


def test_channels_last_features_give_the_same_outputs():
    torch.manual_seed(0)
    head = YOLOv8Head(8, 3, [8, 16]).eval()
    feats = [torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4)]
    plain = head(feats)
    last = head([f.to(memory_format=torch.channels_last) for f in feats])
    for key in ("cls_logits", "box_logits"):
        for a, b in zip(plain[key], last[key]):
            torch.testing.assert_close(a, b)


@pytest.mark.slow  # compiles
@pytest.mark.parametrize("depthwise_cls", [False, True])
def test_head_forward_and_loss_compile_fullgraph(depthwise_cls):
    """The head's forward and loss under ``torch.compile(fullgraph=True)`` (the detector
    checks the targets before it: `training_targets`' result is passed on as is)."""
    torch.manual_seed(0)
    head = YOLOv8Head(16, 2, STRIDES, depthwise_cls=depthwise_cls)
    feats = [torch.randn(2, 16, 8, 8), torch.randn(2, 16, 4, 4), torch.randn(2, 16, 2, 2)]
    checked = training_targets(_targets(), num_classes=2)
    compiled = torch.compile(
        lambda f, t: head.loss(head(f), t), fullgraph=True, backend="aot_eager"
    )
    got, expected = compiled(feats, checked), head.loss(head(feats), checked)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
    sum(got.values()).backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reg_max": 1}, ValueError, r"reg_max must be in \[2,"),
        ({"tal_topk": 0}, ValueError, "tal_topk must be in"),
        ({"tal_alpha": -1.0}, ValueError, "tal_alpha"),
        ({"box_gain": math.inf}, ValueError, "box_gain must be a finite"),
        ({"tal_min_side": "16"}, TypeError, "tal_min_side"),
        ({"norm": "nope"}, ValueError, "nope"),
        ({"strides": [16, 8]}, ValueError, "strides must increase"),
        ({"score_thresh": 1.5}, ValueError, "score_thresh must be in"),
        ({"depthwise_cls": 1}, TypeError, "depthwise_cls must be"),
    ],
)
def test_options_are_checked_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        YOLOv8Head(**{"in_channels": 8, "num_classes": 3, "strides": STRIDES, **kwargs})


def test_bad_targets_and_features_are_rejected():
    head = YOLOv8Head(8, 3, [8, 16])
    feats = [torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4)]
    bad = {"boxes": torch.tensor([[0.0, 0.0, 5.0, 5.0]]), "labels": torch.tensor([3])}
    with pytest.raises(ValueError, match=r"targets\[0\]\[\"labels\"\] must lie in \[0, 3\)"):
        head.loss(head(feats), [bad, bad])
    with pytest.raises(ValueError, match="features must hold 2 levels"):
        head(feats[:1])
    with pytest.raises(ValueError, match=r"image_sizes must hold 2"):
        head.predict(head(feats), [(64, 64)])


# ------------------------------------------------------------------ slow: export, learning
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_detector_exports_with_dynamic_shapes(tmp_path):
    from visionblocks.deploy import export_model

    torch.manual_seed(0)
    head = {**CFG["head"], "max_detections": 20, "score_thresh": 0.001}
    model = build_detector({**CFG, "head": head}).eval()
    example = _images(2, 64)
    result = export_model(model, example, tmp_path / "yolov8.pt2", "pt2", kwargs={"padded": True})
    assert result.max_abs_diff < 1e-4
    program = torch.export.load(str(result.path)).module()
    images = _images(3, 96)
    with torch.no_grad():
        got, expected = program(images, padded=True), model(images, padded=True)
    assert expected["num_detections"].min() > 0
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_learns_on_synthetic_coco(tmp_path):
    """A short training on synthetic COCO images finds their objects: a clearly positive AP
    on those images (the loss, the assignment and the decoding agree with each other)."""
    from torch.utils.data import DataLoader

    from visionblocks.data import (
        CocoInstances,
        coco_evaluate,
        collate_detection,
        make_synthetic_coco,
    )

    torch.manual_seed(0)
    data = {"image_size": (64, 64), "max_objects": 3, "object_size": (0.3, 0.6)}
    annotations = make_synthetic_coco(tmp_path, num_images=16, seed=0, **data)
    dataset = CocoInstances(tmp_path / "images", annotations)
    model = build_detector({**CFG, "head": {"type": "yolov8", "num_classes": 3}})
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collate_detection)
    model.train()
    for _ in range(STEPS // len(loader)):
        for images, targets, sizes in loader:
            loss = model(images, targets, sizes)["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    predictions = {}
    with torch.no_grad():
        for images, targets, sizes in DataLoader(
            dataset, batch_size=16, collate_fn=collate_detection
        ):
            for target, output in zip(targets, model(images, image_sizes=sizes)):
                predictions[target["image_id"]] = output
    stats = coco_evaluate(predictions, dataset)
    assert stats["AP50"] > 0.5 and stats["AP"] > 0.2, stats
