"""varifocal_loss / VarifocalLoss: float64 reference (mmdet), ultralytics, edges, AMP.

The float64 reference is mmdet's ``varifocal_loss`` (open-mmlab/mmdetection,
mmdet/models/losses/varifocal_loss.py), re-expressed::

    focal_weight = q * (q > 0) + alpha * |sigmoid(pred) - q| ** gamma * (q <= 0)
    loss = BCEWithLogits(pred, q) * focal_weight        # (q > 0) instead of q: iou_weighted=False

then mmdet's ``weight_reduce_loss`` (element weight, then mean or sum). At ``q = 0`` its
``|p - q| ** gamma`` is the paper's ``p ** gamma``, whose derivative in ``q`` (0) differs:
target gradients are compared with the paper's form (``paper=True``, ultralytics' too).
ultralytics' ``VarifocalLoss`` (ultralytics/utils/loss.py) is the other oracle (importorskip).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close
from visionblocks.losses import VarifocalLoss, varifocal_loss
from visionblocks.registry import LOSSES


def reference(pred, target, alpha=0.75, gamma=2.0, iou_weighted=True, paper=False):
    """mmdet's element-wise varifocal loss in float64 (``paper``: ``p ** gamma`` on negatives)."""
    pred, target = pred.double(), target.double()
    p = pred.sigmoid()
    positive = (target > 0).double()
    scale = target if iou_weighted else torch.ones_like(target)
    negative = p if paper else (p - target).abs()
    focal_weight = scale * positive + alpha * negative.pow(gamma) * (1 - positive)
    # BCEWithLogits without its cancellation (float64 torch loses log1p(exp(-100)))
    bce = (1 - target) * F.softplus(pred) + target * F.softplus(-pred)
    return bce * focal_weight


def _inputs(n: int = 300, c: int = 20, seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(n, c, generator=g) * scale
    positive = torch.rand(n, c, generator=g) < 0.1
    target = torch.where(positive, torch.rand(n, c, generator=g), 0.0)
    target.view(-1)[:3] = torch.tensor([1.0, 1e-6, 0.5])  # edges of the positive scores
    return pred, target


def _value_and_grad(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("iou_weighted", [True, False])
@pytest.mark.parametrize(("alpha", "gamma"), [(0.75, 2.0), (0.25, 1.5), (1.0, 0.5), (0.5, 0.0)])
def test_float32_equals_float64_reference(alpha, gamma, iou_weighted):
    pred, target = _inputs()
    opts = {"alpha": alpha, "gamma": gamma}
    out, grads = _value_and_grad(
        lambda p, t: varifocal_loss(p, t, **opts, iou_weighted=iou_weighted, reduction="none"),
        pred,
        target,
    )
    expected, expected_grads = _value_and_grad(
        lambda p, t: reference(p, t, **opts, iou_weighted=iou_weighted, paper=True),
        pred.double(),
        target.double(),
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=0)
    # mmdet's |p - q| ** gamma: the same values
    mmdet = reference(pred, target, **opts, iou_weighted=iou_weighted)
    torch.testing.assert_close(mmdet, expected, rtol=1e-12, atol=0)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_equals_mmdet_reductions_and_avg_factor(reduction):
    pred, target = _inputs(seed=1)
    weight = torch.rand(300, 1)
    elements = reference(pred, target) * weight.double()
    expected = elements.mean() if reduction == "mean" else elements.sum()
    out = varifocal_loss(pred, target, weight=weight, reduction=reduction)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=0)
    # avg_factor: mmdet's "mean" is sum / (avg_factor + float32 eps)
    avg_factor = 17.0
    expected = elements.sum() / (avg_factor + torch.finfo(torch.float32).eps)
    out = varifocal_loss(pred, target, weight=weight, normalizer=avg_factor)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("shape", [(300, 80), (2, 300, 80)])
def test_equals_ultralytics(shape):
    """ultralytics' ``(...).mean(1).sum()`` is ``reduction="sum", normalizer=pred.shape[1]``,
    for its ``label`` the positives ``gt_score > 0``."""
    loss_module = pytest.importorskip("ultralytics.utils.loss")
    g = torch.Generator().manual_seed(2)
    pred = torch.randn(shape, generator=g) * 3
    target = torch.where(torch.rand(shape, generator=g) < 0.02, torch.rand(shape, generator=g), 0.0)
    label = (target > 0).float()
    theirs, (their_grad,) = _value_and_grad(
        lambda p: loss_module.VarifocalLoss()(p, target, label), pred
    )
    ours, (our_grad,) = _value_and_grad(
        lambda p: varifocal_loss(p, target, reduction="sum", normalizer=shape[1]), pred
    )
    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_edges_give_finite_values_and_gradients(gamma, dtype):
    """Logits +-100 with targets 0 and 1."""
    logits = torch.tensor([[100.0, -100.0, 17.0, -17.0, 0.0, 30.0]]).expand(2, 6)
    pred = logits.to(dtype)
    target = torch.stack([torch.zeros(6), torch.ones(6)]).to(dtype)
    out, grads = _value_and_grad(
        lambda p, t: varifocal_loss(p, t, gamma=gamma, reduction="none"), pred, target
    )
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    expected = reference(pred, target, gamma=gamma)
    rtol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    atol = torch.finfo(dtype).smallest_normal  # subnormals: fixed spacing
    # negatives (q = 0): softplus(pred), relatively exact at any logit
    torch.testing.assert_close(out[0].double(), expected[0], rtol=rtol, atol=atol)
    # positives: softplus(pred) - q pred, exact to float32's eps * |pred| (as torch's BCE)
    atol = max(atol, torch.finfo(torch.float32).eps * 100)
    torch.testing.assert_close(out[1:].double(), expected[1:], rtol=rtol, atol=atol)


def test_half_negatives_far_below_do_not_underflow():
    """alpha p ** gamma BCE for p = sigmoid(-20), below float16's range: computed in float32,
    the sum keeps it (a float16 computation gives 0)."""
    pred = torch.tensor([[-20.0, -12.0]], dtype=torch.float16)
    out = varifocal_loss(pred, torch.zeros(1, 2), gamma=0.5, reduction="sum")
    expected = reference(pred, torch.zeros(1, 2), gamma=0.5).sum()
    assert out.dtype == torch.float32 and expected < torch.finfo(torch.float16).tiny
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_half_inputs_are_computed_in_float32(dtype, reduction):
    pred, target = _inputs(64)
    pred_h, target_h = pred.to(dtype), target.to(dtype)
    out = varifocal_loss(pred_h, target_h, reduction=reduction)
    expected = varifocal_loss(pred_h.float(), target_h.float(), reduction=reduction)
    assert out.dtype == (dtype if reduction == "none" else torch.float32)
    assert torch.equal(out, expected.to(out.dtype))


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_autocast_changes_nothing(reduction):
    pred, target = _inputs(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = varifocal_loss(pred.bfloat16(), target, reduction=reduction)
        inside32 = varifocal_loss(pred, target, reduction=reduction)
    assert torch.equal(inside, varifocal_loss(pred.bfloat16(), target, reduction=reduction))
    assert torch.equal(inside32, varifocal_loss(pred, target, reduction=reduction))


def test_reductions_weight_and_normalizer():
    pred, target = _inputs(16, 5)
    none = varifocal_loss(pred, target, reduction="none")
    assert_close(varifocal_loss(pred, target, reduction="sum"), none.sum())
    assert_close(varifocal_loss(pred, target), none.mean())
    weight = torch.rand(5)
    assert_close(varifocal_loss(pred, target, weight=weight, reduction="none"), none * weight)
    assert_close(varifocal_loss(pred, target, weight=weight), (none * weight).mean())
    for reduction in ("mean", "sum"):
        out = varifocal_loss(pred, target, reduction=reduction, normalizer=torch.tensor([4.0]))
        assert_close(out, none.sum() / 4)
    assert_close(varifocal_loss(pred, target, reduction="none", normalizer=2), none / 2)


def test_gradients_reach_target_and_weight():
    pred, target = _inputs(8, 3)
    weight = torch.rand(8, 1)
    _, grads = _value_and_grad(
        lambda p, t, w: varifocal_loss(p, t, weight=w, reduction="none"), pred, target, weight
    )
    _, expected = _value_and_grad(
        lambda p, t, w: reference(p, t, paper=True) * w,
        pred.double(),
        target.double(),
        weight.double(),
    )
    for grad, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad.double(), want, rtol=1e-5, atol=1e-6)


def test_empty_mean_is_a_connected_zero():
    pred = torch.zeros(0, 3, requires_grad=True)
    out = varifocal_loss(pred, torch.zeros(0, 3))
    assert out.item() == 0.0 and out.requires_grad


def test_module_and_registry():
    assert LOSSES.get("varifocal") is VarifocalLoss and LOSSES.get("vfl") is VarifocalLoss
    module = LOSSES.build({"type": "vfl", "alpha": 0.5, "gamma": 1.0, "iou_weighted": False})
    assert (
        repr(module) == "VarifocalLoss(alpha=0.5, gamma=1.0, iou_weighted=False, reduction='mean')"
    )
    pred, target = _inputs(8, 3)
    weight = torch.rand(8, 1)
    expected = varifocal_loss(
        pred, target, 0.5, 1.0, iou_weighted=False, weight=weight, normalizer=3.0
    )
    assert torch.equal(module(pred, target, weight=weight, normalizer=3.0), expected)
    for kwargs, error in (
        ({"alpha": -1.0}, ValueError),
        ({"gamma": float("nan")}, ValueError),
        ({"iou_weighted": 1}, TypeError),
        ({"reduction": "avg"}, ValueError),
    ):
        with pytest.raises(error, match=next(iter(kwargs))):
            VarifocalLoss(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pred": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "pred must be a floating"),
        ({"target": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "target must be a floating"),
        ({"target": torch.zeros(4, 2)}, ValueError, r"shape of pred \(4, 3\).*\(4, 2\)"),
        ({"target": torch.full((4, 3), 1.5)}, ValueError, r"target must be in \[0, 1\].*1\.5"),
        ({"target": torch.full((4, 3), -0.1)}, ValueError, r"target must be in \[0, 1\]"),
        ({"alpha": -0.5}, ValueError, r"alpha must be in \[0.0, inf\)"),
        ({"alpha": "0.75"}, TypeError, "alpha"),
        ({"gamma": float("inf")}, ValueError, "gamma"),
        ({"gamma": True}, TypeError, "gamma"),
        ({"iou_weighted": None}, TypeError, "iou_weighted"),
        ({"weight": torch.ones(2)}, ValueError, r"weight must broadcast.*\(2,\)"),
        ({"reduction": "avg"}, ValueError, "reduction"),
        ({"normalizer": -1.0}, ValueError, "normalizer must be a positive"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"pred": torch.zeros(4, 3), "target": torch.zeros(4, 3), **kwargs}
    with pytest.raises(error, match=match):
        varifocal_loss(**args)


@pytest.mark.slow
def test_torch_compile_fullgraph_equals_eager():
    torch._dynamo.reset()

    def loss(p, t, w):
        return varifocal_loss(p, t, 0.75, 2.0, weight=w, reduction="sum", normalizer=7.0)

    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (9, 23):
        pred, target = _inputs(n, 5, seed=n)
        weight = torch.rand(5)
        actual, actual_grad = _value_and_grad(lambda p, t=target, w=weight: compiled(p, t, w), pred)
        expected, expected_grad = _value_and_grad(lambda p, t=target, w=weight: loss(p, t, w), pred)
        assert_close(actual, expected)
        assert_close(actual_grad[0], expected_grad[0])


def test_a_per_anchor_weight_is_ambiguous_when_anchors_equal_classes():
    pred, target = torch.zeros(5, 5), torch.zeros(5, 5)
    with pytest.raises(ValueError, match=r"weight is ambiguous.*pass shape \(5, 1\)"):
        varifocal_loss(pred, target, weight=torch.ones(5))
    varifocal_loss(torch.zeros(8, 5), torch.zeros(8, 5), weight=torch.ones(5))  # per class: fine
