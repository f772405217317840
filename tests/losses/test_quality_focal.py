"""quality_focal_loss / QualityFocalLoss: float64 references (mmdet, the GFL paper), edges, AMP.

The float64 references re-express mmdet's ``quality_focal_loss_tensor_target`` and
``quality_focal_loss`` (open-mmlab/mmdetection, mmdet/models/losses/gfocal_loss.py, v3.x):
every element starts as the negative's ``BCE(pred, 0) * sigmoid(pred) ** beta``, and the
elements with a target (``target != 0``; with ``(label, score)`` targets, the label's class of
the rows whose label is in ``[0, C)``) are replaced by ``BCE(pred, q) * |q - sigmoid(pred)|
** beta``; the loss is then summed over the classes (dim 1). The BCE is written without the
cancellation of torch's ``binary_cross_entropy_with_logits`` (which float64 torch has too).
mmdet's masking makes the zero targets constants; the paper's formula (``paper=True``) has a
derivative in them: target gradients are compared with it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close
from visionblocks.losses import QualityFocalLoss, quality_focal_loss
from visionblocks.registry import LOSSES


def _bce(pred, target):
    return (1 - target) * F.softplus(pred) + target * F.softplus(-pred)


def _distance(pred, target):
    """``|q - sigmoid(pred)|`` without float64's cancellation at ``q = 1`` (``1 - p``)."""
    return (target * torch.sigmoid(-pred) - (1 - target) * torch.sigmoid(pred)).abs()


def reference(pred, target, beta=2.0, paper=False):
    """mmdet's ``quality_focal_loss_tensor_target`` in float64, before its sum over dim 1
    (``paper``: the paper's formula on every element, the same values)."""
    pred, target = pred.double(), target.double()
    p = pred.sigmoid()
    if paper:
        return _bce(pred, target) * _distance(pred, target).pow(beta)
    loss = _bce(pred, torch.zeros_like(pred)) * p.pow(beta)
    pos = target != 0
    positives = _bce(pred[pos], target[pos]) * _distance(pred[pos], target[pos]).pow(beta)
    return loss.masked_scatter(pos, positives)


def reference_label_score(pred, label, score, beta=2.0):
    """mmdet's ``quality_focal_loss`` with ``(label, score)`` targets (label C: background)."""
    pred, score = pred.double(), score.double()
    p = pred.sigmoid()
    loss = _bce(pred, torch.zeros_like(pred)) * p.pow(beta)
    pos = ((label >= 0) & (label < pred.shape[1])).nonzero().squeeze(1)
    cls = label[pos]
    s = score[pos]
    loss[pos, cls] = _bce(pred[pos, cls], s) * _distance(pred[pos, cls], s).pow(beta)
    return loss.sum(1)


def _inputs(n: int = 300, c: int = 20, seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(n, c, generator=g) * scale
    positive = torch.rand(n, c, generator=g) < 0.1
    target = torch.where(positive, torch.rand(n, c, generator=g), 0.0)
    target.view(-1)[:3] = torch.tensor([1.0, 1e-6, 0.5])
    return pred, target


def _value_and_grad(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("beta", [2.0, 1.0, 0.5, 0.0, 3.0])
@pytest.mark.parametrize("scale", [1.0, 3.0, 12.0])
def test_float32_equals_float64_reference(beta, scale):
    pred, target = _inputs(scale=scale)
    out, grads = _value_and_grad(
        lambda p, t: quality_focal_loss(p, t, beta, reduction="none"), pred, target
    )
    expected, expected_grads = _value_and_grad(
        lambda p, t: reference(p, t, beta, paper=True), pred.double(), target.double()
    )
    torch.testing.assert_close(reference(pred, target, beta), expected, rtol=1e-12, atol=0)
    assert out.dtype == torch.float32 and out.shape == pred.shape
    # |q - p| near 0 (p close to a soft q) is formed by subtraction: relative to the BCE there
    atol = 1e-6 * float(expected.max())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=atol)
    # |q - p| ** beta's derivative grows without bound as p nears a soft q for beta < 1: there
    # the rounding of p (relative to |q - p|) is amplified; compare where |q - p| > 1e-3
    keep = _distance(pred.double(), target.double()) > 1e-3 if beta < 1 else slice(None)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert torch.isfinite(grad).all()
        atol = 1e-5 * float(expected_grad.abs().max())
        torch.testing.assert_close(grad[keep].double(), expected_grad[keep], rtol=1e-5, atol=atol)


def test_binary_targets_are_exact_relatively():
    """At q = 0 (negatives) no term is formed by subtraction: relative accuracy everywhere; at
    q = 1 the BCE is exact to float32's eps * |pred| (as torch's), |q - p| relatively."""
    x = torch.linspace(-30, 30, 6001)
    pred = torch.stack([x, x], 1)
    target = torch.tensor([[0.0, 1.0]]).expand(6001, 2)
    out = quality_focal_loss(pred, target, reduction="none").double()
    expected = reference(pred, target)
    mask = expected[:, 0] > 1e-30
    rel = ((out[:, 0] - expected[:, 0]).abs() / expected[:, 0])[mask].max()
    assert rel <= 1e-5
    atol = torch.finfo(torch.float32).eps * 30  # eps * |pred|
    torch.testing.assert_close(out[:, 1], expected[:, 1], rtol=1e-5, atol=atol)


def test_mmdet_per_sample_sum_and_label_score_targets():
    pred, _ = _inputs(64, 5, seed=4)
    g = torch.Generator().manual_seed(5)
    label = torch.randint(0, 6, (64,), generator=g)  # 5: background
    score = torch.rand(64, generator=g)
    target = torch.zeros(64, 5)
    rows = (label < 5).nonzero().squeeze(1)
    target[rows, label[rows]] = score[rows]
    per_sample = quality_focal_loss(pred, target, reduction="none").sum(1)
    torch.testing.assert_close(
        per_sample.double(), reference(pred, target).sum(1), rtol=1e-5, atol=0
    )
    expected = reference_label_score(pred, label, score)
    torch.testing.assert_close(per_sample.double(), expected, rtol=1e-5, atol=0)
    # mmdet's "mean" of the per-sample losses: reduction="sum", normalizer=N
    out = quality_focal_loss(pred, target, reduction="sum", normalizer=64)
    torch.testing.assert_close(out.double(), expected.mean(), rtol=1e-5, atol=0)


def test_beta_zero_is_bce():
    pred, target = _inputs(16, 4)
    out = quality_focal_loss(pred.double(), target.double(), 0.0, reduction="none")
    expected = F.binary_cross_entropy_with_logits(pred.double(), target.double(), reduction="none")
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_edges_give_finite_values_and_gradients(beta, dtype):
    """Logits +-100 with targets 0 and 1, and a soft target equal to sigmoid(pred) (|q - p| = 0)."""
    logits = torch.tensor([[100.0, -100.0, 17.0, -17.0, 0.0, 30.0]]).expand(3, 6).clone()
    target = torch.stack([torch.zeros(6), torch.ones(6), torch.full((6,), 0.5)])
    pred, target = logits.to(dtype), target.to(dtype)
    out, grads = _value_and_grad(
        lambda p, t: quality_focal_loss(p, t, beta, reduction="none"), pred, target
    )
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    expected = reference(pred, target, beta)
    rtol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    atol = torch.finfo(dtype).smallest_normal  # subnormals: fixed spacing
    # negatives (q = 0): softplus(pred), relatively exact at any logit
    torch.testing.assert_close(out[0].double(), expected[0], rtol=rtol, atol=atol)
    # positives: softplus(pred) - q pred, exact to float32's eps * |pred| (as torch's BCE)
    atol = max(atol, torch.finfo(torch.float32).eps * 100)
    torch.testing.assert_close(out[1:].double(), expected[1:], rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_half_inputs_are_computed_in_float32(dtype, reduction):
    pred, target = _inputs(64)
    pred_h, target_h = pred.to(dtype), target.to(dtype)
    out = quality_focal_loss(pred_h, target_h, reduction=reduction)
    expected = quality_focal_loss(pred_h.float(), target_h.float(), reduction=reduction)
    assert out.dtype == (dtype if reduction == "none" else torch.float32)
    assert torch.equal(out, expected.to(out.dtype))


def test_autocast_changes_nothing():
    pred, target = _inputs(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = quality_focal_loss(pred.bfloat16(), target, reduction="sum")
        inside32 = quality_focal_loss(pred, target, reduction="none")
    assert torch.equal(inside, quality_focal_loss(pred.bfloat16(), target, reduction="sum"))
    assert torch.equal(inside32, quality_focal_loss(pred, target, reduction="none"))


def test_reductions_weight_and_normalizer():
    pred, target = _inputs(16, 5)
    none = quality_focal_loss(pred, target, reduction="none")
    assert_close(quality_focal_loss(pred, target, reduction="sum"), none.sum())
    assert_close(quality_focal_loss(pred, target), none.mean())
    weight = torch.rand(16, 1)
    assert_close(quality_focal_loss(pred, target, weight=weight, reduction="none"), none * weight)
    assert_close(quality_focal_loss(pred, target, weight=weight), (none * weight).mean())
    for reduction in ("mean", "sum"):
        out = quality_focal_loss(pred, target, reduction=reduction, normalizer=torch.tensor(4.0))
        assert_close(out, none.sum() / 4)
    assert_close(quality_focal_loss(pred, target, reduction="none", normalizer=2.0), none / 2)


def test_empty_mean_is_a_connected_zero():
    pred = torch.zeros(0, 3, requires_grad=True)
    out = quality_focal_loss(pred, torch.zeros(0, 3))
    assert out.item() == 0.0 and out.requires_grad


def test_module_and_registry():
    assert LOSSES.get("quality_focal") is QualityFocalLoss and LOSSES.get("qfl") is QualityFocalLoss
    module = LOSSES.build({"type": "qfl", "beta": 1.5, "reduction": "sum"})
    assert repr(module) == "QualityFocalLoss(beta=1.5, reduction='sum')"
    pred, target = _inputs(8, 3)
    weight = torch.rand(3)
    expected = quality_focal_loss(pred, target, 1.5, weight=weight, reduction="sum", normalizer=3)
    assert torch.equal(module(pred, target, weight=weight, normalizer=3), expected)
    with pytest.raises(ValueError, match="beta"):
        QualityFocalLoss(beta=-1.0)
    with pytest.raises(TypeError, match="beta"):
        QualityFocalLoss(beta=None)
    with pytest.raises(ValueError, match="reduction"):
        QualityFocalLoss(reduction="avg")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pred": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "pred must be a floating"),
        ({"target": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "target must be a floating"),
        ({"target": torch.zeros(3)}, ValueError, r"shape of pred \(4, 3\).*\(3,\)"),
        ({"target": torch.full((4, 3), 2.0)}, ValueError, r"target must be in \[0, 1\].*2\.0"),
        ({"target": torch.full((4, 3), float("nan"))}, ValueError, r"target must be in \[0, 1\]"),
        ({"beta": -0.5}, ValueError, r"beta must be in \[0.0, inf\)"),
        ({"beta": "2"}, TypeError, "beta"),
        ({"weight": torch.ones(4)}, ValueError, r"weight must broadcast.*\(4,\)"),
        ({"reduction": "avg"}, ValueError, "reduction"),
        ({"normalizer": float("inf")}, ValueError, "normalizer must be a positive"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"pred": torch.zeros(4, 3), "target": torch.zeros(4, 3), **kwargs}
    with pytest.raises(error, match=match):
        quality_focal_loss(**args)


def test_devices_must_match():
    with pytest.raises(ValueError, match="pred, target and weight must be on the same device"):
        quality_focal_loss(
            torch.zeros(4, 3), torch.zeros(4, 3), weight=torch.ones(3, device="meta")
        )


@pytest.mark.slow
def test_torch_compile_fullgraph_equals_eager():
    torch._dynamo.reset()

    def loss(p, t, w):
        return quality_focal_loss(p, t, 2.0, weight=w, reduction="mean")

    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (9, 23):
        pred, target = _inputs(n, 5, seed=n)
        weight = torch.rand(n, 1)
        actual, actual_grad = _value_and_grad(lambda p, t=target, w=weight: compiled(p, t, w), pred)
        expected, expected_grad = _value_and_grad(lambda p, t=target, w=weight: loss(p, t, w), pred)
        assert_close(actual, expected)
        assert_close(actual_grad[0], expected_grad[0])
