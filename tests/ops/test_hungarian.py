"""`hungarian_match` and `HungarianMatcher` against DETR's matcher, and their one transfer.

The reference is DETR's ``HungarianMatcher.forward`` (facebookresearch/detr,
``models/matcher.py``: softmax class cost, ``torch.cdist`` L1 cost, GIoU of
``util/box_ops.py``) and Deformable DETR's focal class cost (fundamentalvision/Deformable-DETR,
``models/matcher.py``; transformers' ``DeformableDetrHungarianMatcher`` is the same), written
out in float64 in its first form: one cost matrix over all targets of the batch, each image's
block then solved by scipy. transformers is not a test dependency.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from visionblocks.ops import HungarianMatcher, hungarian_match
from visionblocks.ops.hungarian import _costs

linear_sum_assignment = pytest.importorskip("scipy.optimize").linear_sum_assignment


# ------------------------------------------------------------------------------- reference
def _detr_cxcywh_to_xyxy(x: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = x.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)


def _detr_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """DETR's util/box_ops.generalized_box_iou, ``(N, 4)`` against ``(M, 4)`` xyxy."""
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    wh = (torch.min(a[:, None, 2:], b[:, 2:]) - torch.max(a[:, None, :2], b[:, :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b - inter
    hull = (torch.max(a[:, None, 2:], b[:, 2:]) - torch.min(a[:, None, :2], b[:, :2])).clamp(min=0)
    hull_area = hull[..., 0] * hull[..., 1]
    return inter / union - (hull_area - union) / hull_area


def detr_costs(outputs, targets, cost_class=1.0, cost_bbox=1.0, cost_giou=1.0, focal=False,
               alpha=0.25, gamma=2.0) -> list[np.ndarray]:  # fmt: skip
    """Each image's ``(Q, M_i)`` cost matrix of DETR's (or Deformable DETR's) matcher."""
    bs, nq = outputs["pred_logits"].shape[:2]
    logits = outputs["pred_logits"].double().flatten(0, 1)
    out_bbox = outputs["pred_boxes"].double().flatten(0, 1)
    tgt_ids = torch.cat([t["labels"] for t in targets]).long()
    tgt_bbox = torch.cat([t["boxes"] for t in targets]).double()
    if focal:
        prob = logits.sigmoid()
        neg = (1 - alpha) * prob**gamma * -(1 - prob + 1e-8).log()
        pos = alpha * (1 - prob) ** gamma * -(prob + 1e-8).log()
        c_class = pos[:, tgt_ids] - neg[:, tgt_ids]
    else:
        c_class = -logits.softmax(-1)[:, tgt_ids]
    c_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
    c_giou = -_detr_giou(_detr_cxcywh_to_xyxy(out_bbox), _detr_cxcywh_to_xyxy(tgt_bbox))
    c = (cost_bbox * c_bbox + cost_class * c_class + cost_giou * c_giou).view(bs, nq, -1)
    sizes = [len(t["boxes"]) for t in targets]
    return [block[i].numpy() for i, block in enumerate(c.split(sizes, -1))]


def detr_match(outputs, targets, **weights) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        tuple(torch.as_tensor(x, dtype=torch.int64) for x in linear_sum_assignment(c))
        for c in detr_costs(outputs, targets, **weights)
    ]


# ---------------------------------------------------------------------------------- inputs
def _boxes(n: int, g: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    centres = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.8 + 0.1
    sides = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.4 + 0.02
    return torch.cat([centres, sides], 1).to(dtype)


def batch(sizes, queries=30, classes=7, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    outputs = {
        "pred_logits": (torch.randn(len(sizes), queries, classes, generator=g) * 2).to(dtype),
        "pred_boxes": _boxes(len(sizes) * queries, g, dtype).view(len(sizes), queries, 4),
        "aux_outputs": [],  # ignored, as DETR's matcher does
    }
    targets = [
        {"labels": torch.randint(0, classes, (m,), generator=g), "boxes": _boxes(m, g, dtype)}
        for m in sizes
    ]
    return outputs, targets


SIZES = [[3, 0, 7, 1], [0], [12], [0, 0, 2], [30, 5], [41, 2, 0]]  # 41 > Q = 30
WEIGHTS = [
    {},
    {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0},
    {"cost_class": 0.0, "cost_bbox": 1.0, "cost_giou": 0.0},
]


def _assert_same(got, want) -> None:
    assert len(got) == len(want)
    for (q, t), (wq, wt) in zip(got, want, strict=True):
        assert q.dtype == t.dtype == torch.int64 and q.device.type == t.device.type == "cpu"
        assert torch.equal(q, wq) and torch.equal(t, wt)


# ------------------------------------------------------------------------------- equality
@pytest.mark.parametrize("focal", [False, True])
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(len(SIZES)))
def test_equals_detr_matcher(seed, dtype, weights, focal):
    outputs, targets = batch(SIZES[seed], seed=seed, dtype=dtype)
    got = hungarian_match(outputs, targets, focal=focal, **weights)
    _assert_same(got, detr_match(outputs, targets, focal=focal, **weights))
    for (q, _), m in zip(got, SIZES[seed], strict=True):
        assert len(q) == min(30, m) and q.tolist() == sorted(q.tolist())


@pytest.mark.parametrize("focal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_costs_equal_detr_costs(dtype, focal):
    outputs, targets = batch([3, 0, 7, 1], seed=5, dtype=dtype)
    weights = (2.0, 5.0, 2.0)
    flat = _costs(
        outputs["pred_logits"],
        outputs["pred_boxes"],
        [t["labels"] for t in targets],
        [t["boxes"] for t in targets],
        weights,
        focal,
        0.3,
        1.5,
    )
    assert flat.dtype == dtype and flat.shape == (11, 30)
    want = detr_costs(outputs, targets, *weights, focal=focal, alpha=0.3, gamma=1.5)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 0, "atol": 1e-5}
    torch.testing.assert_close(flat.double().T, torch.from_numpy(np.concatenate(want, 1)), **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    outputs, targets = batch([4, 9, 0], seed=3)
    half = {k: v.to(dtype) for k, v in outputs.items() if k != "aux_outputs"}
    half_targets = [{"labels": t["labels"], "boxes": t["boxes"].to(dtype)} for t in targets]
    upcast = {k: v.float() for k, v in half.items()}
    up_targets = [{"labels": t["labels"], "boxes": t["boxes"].float()} for t in half_targets]
    args = (2.0, 5.0, 2.0)
    labels, boxes = [t["labels"] for t in half_targets], [t["boxes"] for t in half_targets]
    flat = _costs(half["pred_logits"], half["pred_boxes"], labels, boxes, args, True, 0.25, 2.0)
    assert flat.dtype == torch.float32
    up_boxes = [t["boxes"] for t in up_targets]
    want = _costs(
        upcast["pred_logits"], upcast["pred_boxes"], labels, up_boxes, args, True, 0.25, 2.0
    )
    torch.testing.assert_close(flat, want, rtol=0, atol=0)
    for focal in (False, True):
        _assert_same(
            hungarian_match(half, half_targets, *args, focal=focal),
            detr_match(
                upcast, up_targets, cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal=focal
            ),
        )


def test_module_equals_function():
    outputs, targets = batch([5, 0, 2], seed=1)
    matcher = HungarianMatcher(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal=True, gamma=1.0)
    assert repr(matcher) == (
        "HungarianMatcher(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal=True, alpha=0.25, "
        "gamma=1.0)"
    )
    want = hungarian_match(outputs, targets, 2.0, 5.0, 2.0, True, 0.25, 1.0)
    _assert_same(matcher(outputs, targets), want)


def test_no_targets_and_no_queries():
    outputs, targets = batch([0, 0])
    assert [(q.tolist(), t.tolist()) for q, t in hungarian_match(outputs, targets)] == [
        ([], [])
    ] * 2
    outputs, targets = batch([2, 3], queries=0)
    got = hungarian_match(outputs, targets)
    assert [(len(q), len(t), q.dtype) for q, t in got] == [(0, 0, torch.int64)] * 2
    no_images = {"pred_logits": torch.zeros(0, 5, 3), "pred_boxes": torch.zeros(0, 5, 4)}
    assert hungarian_match(no_images, []) == []


def test_no_gradient_recorded():
    outputs, targets = batch([3, 2], seed=2)
    leaves = {k: v.requires_grad_() for k, v in outputs.items() if k != "aux_outputs"}
    for q, t in hungarian_match(leaves, targets):
        assert not q.requires_grad and not t.requires_grad
    assert all(v.grad is None for v in leaves.values())


# ---------------------------------------------------------------------------- the transfer
def test_one_transfer_per_batch(monkeypatch):
    """One ``.cpu()`` (of all images' costs) and one ``.numpy()`` (of its result) per call;
    nothing else leaves torch (``tolist``, ``item``, ``.to("cpu")``)."""
    calls = {"cpu": [], "numpy": [], "tolist": 0, "item": 0, "to_device": 0}
    real_cpu, real_numpy, real_to = torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.to

    def cpu(self, *args, **kwargs):
        out = real_cpu(self, *args, **kwargs)
        calls["cpu"].append((tuple(self.shape), out))
        return out

    def numpy(self, *args, **kwargs):
        calls["numpy"].append(self)
        return real_numpy(self, *args, **kwargs)

    def count(key):
        def fn(self, *args, **kwargs):
            calls[key] += 1
            return getattr(torch._C.TensorBase, key)(self, *args, **kwargs)

        return fn

    def to(self, *args, **kwargs):
        if any(isinstance(a, str | torch.device) for a in (*args, *kwargs.values())):
            calls["to_device"] += 1
        return real_to(self, *args, **kwargs)

    outputs, targets = batch([3, 0, 7, 1, 12], seed=4)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    monkeypatch.setattr(torch.Tensor, "tolist", count("tolist"))
    monkeypatch.setattr(torch.Tensor, "item", count("item"))
    monkeypatch.setattr(torch.Tensor, "to", to)
    got = hungarian_match(outputs, targets, focal=True)
    monkeypatch.undo()
    assert [shape for shape, _ in calls["cpu"]] == [(23, 30)]  # sum(M_i) x Q
    assert calls["numpy"] == [calls["cpu"][0][1]]
    assert calls["tolist"] == calls["item"] == calls["to_device"] == 0
    _assert_same(got, detr_match(outputs, targets, focal=True))


def test_costs_stay_on_the_device_until_the_one_transfer(monkeypatch):
    """On fake CUDA tensors (no data: a host read raises) the first thing to leave the device
    is the flat cost tensor, through ``.cpu()``."""

    class Reached(Exception):
        pass

    def cpu(self, *args, **kwargs):
        raise Reached(tuple(self.shape), self.device.type)

    outputs, targets = batch([3, 0, 7], seed=6)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        fake = {k: mode.from_tensor(outputs[k]).to("cuda") for k in ("pred_logits", "pred_boxes")}
        fake_targets = [{k: mode.from_tensor(v).to("cuda") for k, v in t.items()} for t in targets]
        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        with pytest.raises(Reached) as info:
            hungarian_match(fake, fake_targets, focal=True)
    assert info.value.args == ((10, 30), "cuda")


@pytest.mark.slow
def test_costs_compile_fullgraph():
    """The part before the transfer compiles without a graph break (the solve is scipy's)."""
    outputs, targets = batch([3, 0, 7], seed=1)
    labels, boxes = [t["labels"] for t in targets], [t["boxes"] for t in targets]
    args = (outputs["pred_logits"], outputs["pred_boxes"], labels, boxes, (2.0, 5.0, 2.0), True)
    torch._dynamo.reset()
    compiled = torch.compile(_costs, fullgraph=True, dynamic=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args, 0.25, 2.0), _costs(*args, 0.25, 2.0))


# ------------------------------------------------------------------------------ validation
def test_non_finite_costs_name_the_image():
    outputs, targets = batch([2, 3], seed=7)
    outputs["pred_logits"][1, 4, 0] = float("nan")
    with pytest.raises(
        ValueError, match=r"costs of image 1 are NaN or infinite.*pred_logits'\]\[1\]"
    ):
        hungarian_match(outputs, targets)
    outputs, targets = batch([2, 3], seed=7)
    targets[0]["boxes"][1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"image 0 .*targets\[0\]\['boxes'\]"):
        hungarian_match(outputs, targets, focal=True)
    outputs, targets = batch([2, 0], seed=7)  # an image without targets has no costs to check
    outputs["pred_boxes"][1] = float("nan")
    assert [len(q) for q, _ in hungarian_match(outputs, targets)] == [2, 0]


def test_labels_out_of_range_name_the_image():
    outputs, targets = batch([2, 3], classes=7)
    targets[1]["labels"][2] = 7
    with pytest.raises(
        ValueError, match=r"targets\[1\]\['labels'\] must be in \[0, 7\), got \[7\]"
    ):
        hungarian_match(outputs, targets)
    targets[1]["labels"][2] = -1
    with pytest.raises(
        ValueError, match=r"targets\[1\]\['labels'\] must be in \[0, 7\), got \[-1\]"
    ):
        hungarian_match(outputs, targets, focal=True)


def _without(mapping, key):
    return {k: v for k, v in mapping.items() if k != key}


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda o, t: ([o["pred_logits"]], t), TypeError, "outputs must be"),
        (lambda o, t: (_without(o, "pred_boxes"), t), ValueError, "outputs must have the key 'pred_boxes'"),
        (lambda o, t: ({**o, "pred_logits": o["pred_logits"].long()}, t), TypeError, r"outputs\['pred_logits'\] must be a floating"),
        (lambda o, t: ({**o, "pred_logits": o["pred_logits"][0]}, t), ValueError, r"outputs\['pred_logits'\] must have shape \(B, Q, C\)"),
        (lambda o, t: ({**o, "pred_logits": o["pred_logits"][..., :0]}, t), ValueError, "C >= 1"),
        (lambda o, t: ({**o, "pred_boxes": o["pred_boxes"][:, :5]}, t), ValueError, r"outputs\['pred_boxes'\] must have shape \(B, Q, 4\) = \(2, 30, 4\)"),
        (lambda o, t: ({**o, "pred_boxes": o["pred_boxes"].to("meta")}, t), ValueError, r"outputs\['pred_boxes'\] is on meta"),
        (lambda o, t: (o, t[:1]), ValueError, "one dict per image, B = 2"),
        (lambda o, t: (o, {"labels": 1}), TypeError, "targets must be a list"),
        (lambda o, t: (o, [t[0], [1]]), TypeError, r"targets\[1\] must be"),
        (lambda o, t: (o, [t[0], _without(t[1], "labels")]), ValueError, r"targets\[1\] must have the key 'labels'"),
        (lambda o, t: (o, [t[0], {**t[1], "labels": t[1]["labels"].float()}]), TypeError, r"targets\[1\]\['labels'\] must be an integer"),
        (lambda o, t: (o, [t[0], {**t[1], "boxes": t[1]["boxes"][:2]}]), ValueError, r"targets\[1\]\['labels'\] and targets\[1\]\['boxes'\] must have shapes"),
        (lambda o, t: (o, [t[0], {**t[1], "boxes": t[1]["boxes"].tolist()}]), TypeError, r"targets\[1\]\['boxes'\] must be a torch.Tensor"),
        (lambda o, t: (o, [t[0], {**t[1], "labels": t[1]["labels"].to("meta")}]), ValueError, r"targets\[1\]\['labels'\] is on meta"),
    ],
)  # fmt: skip
def test_bad_inputs_are_refused(change, error, match):
    outputs, targets = batch([2, 3])
    with pytest.raises(error, match=match):
        hungarian_match(*change(outputs, targets))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cost_class": -1.0}, ValueError, r"cost_class must be in \[0.0, inf\), got -1.0"),
        ({"cost_giou": float("nan")}, ValueError, "cost_giou must be in"),
        ({"cost_bbox": float("inf")}, ValueError, "cost_bbox must be in"),
        ({"cost_bbox": "1"}, TypeError, "cost_bbox must be int or float"),
        ({"cost_class": 0, "cost_bbox": 0, "cost_giou": 0.0}, ValueError, "must not all be 0"),
        ({"focal": 1}, TypeError, "focal must be bool"),
        ({"alpha": 1.5}, ValueError, r"alpha must be in \[0.0, 1.0\]"),
        ({"gamma": -2.0}, ValueError, "gamma must be in"),
    ],
)
def test_bad_options_are_refused(kwargs, error, match):
    outputs, targets = batch([2, 3])
    with pytest.raises(error, match=match):
        hungarian_match(outputs, targets, **kwargs)
    with pytest.raises(error, match=match):
        HungarianMatcher(**kwargs)


def test_missing_scipy_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # import raises ImportError
    outputs, targets = batch([1])
    with pytest.raises(ImportError, match=r"needs scipy.*pip install scipy"):
        hungarian_match(outputs, targets)
