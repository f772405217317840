"""distribution_focal_loss / DistributionFocalLoss: float64 reference, ultralytics, edges.

The float64 reference is mmdet's ``distribution_focal_loss``
(open-mmlab/mmdetection, mmdet/models/losses/gfocal_loss.py), re-expressed: with
``l = t.long()``, ``CE(pred, l) (l + 1 - t) + CE(pred, l + 1) (t - l)``; it indexes past the
last bin at ``t = reg_max``, where the loss is ``-log p[reg_max]`` (tested on its own).
ultralytics' ``DFLoss`` (ultralytics/utils/loss.py) is the other oracle (importorskip).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import visionblocks
from tests.helpers import assert_close
from visionblocks.losses import DistributionFocalLoss, distribution_focal_loss
from visionblocks.registry import LOSSES

REG_MAX = 16  # 17 bins (mmdet's reg_max; ultralytics' DFLoss(reg_max=17))


def reference(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mmdet's formula in float64, per distance (``target < reg_max``)."""
    pred, target = pred.double(), target.double()
    log_p = F.log_softmax(pred, -1)
    left = target.long()
    right = left + 1
    ce_left = -log_p.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    ce_right = -log_p.gather(-1, right.unsqueeze(-1)).squeeze(-1)
    return ce_left * (right.double() - target) + ce_right * (target - left.double())


def _inputs(n: int = 256, reg_max: int = REG_MAX, seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(n, 4, reg_max + 1, generator=g) * scale
    target = torch.rand(n, 4, generator=g) * reg_max
    # edges: every integer below reg_max, just below reg_max, just above an integer
    ints = torch.arange(reg_max, dtype=torch.float32)
    below = torch.nextafter(torch.tensor(float(reg_max)), torch.tensor(0.0))
    target.view(-1)[:reg_max] = ints
    target.view(-1)[reg_max] = below
    target.view(-1)[reg_max + 1] = reg_max - 0.01
    target.view(-1)[reg_max + 2] = torch.nextafter(torch.tensor(3.0), torch.tensor(4.0))
    return pred, target


def _value_and_grad(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    return out.detach(), grads


@pytest.mark.parametrize("scale", [1.0, 3.0, 20.0])
def test_float32_equals_float64_reference(scale):
    pred, target = _inputs(scale=scale)
    out, (grad,) = _value_and_grad(
        lambda p: distribution_focal_loss(p, target, reduction="none"), pred
    )
    expected, (expected_grad,) = _value_and_grad(lambda p: reference(p, target), pred.double())
    assert out.dtype == torch.float32 and out.shape == target.shape
    # float32 log-softmax: one rounding of logits of size `scale` per term
    atol = 4 * scale * torch.finfo(torch.float32).eps
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=atol)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-7)


def test_float64_equals_reference_exactly_enough():
    pred, target = _inputs()
    out = distribution_focal_loss(pred.double(), target.double(), reduction="none")
    torch.testing.assert_close(out, reference(pred, target), rtol=1e-12, atol=1e-12)


def test_target_gradient_is_the_bin_difference():
    pred, target = _inputs(32)
    t = target.double().requires_grad_()
    distribution_focal_loss(pred.double(), t, reduction="sum").backward()
    log_p = F.log_softmax(pred.double(), -1)
    left = target.double().floor().clamp(max=REG_MAX - 1).long().unsqueeze(-1)
    expected = (log_p.gather(-1, left) - log_p.gather(-1, left + 1)).squeeze(-1)
    torch.testing.assert_close(t.grad, expected)


def test_target_at_reg_max_is_the_last_bin():
    pred = torch.randn(5, REG_MAX + 1, dtype=torch.float64)
    target = torch.full((5,), float(REG_MAX), dtype=torch.float64)
    out = distribution_focal_loss(pred, target, reduction="none")
    torch.testing.assert_close(out, -F.log_softmax(pred, -1)[:, -1])
    zero = distribution_focal_loss(pred, torch.zeros(5, dtype=torch.float64), reduction="none")
    torch.testing.assert_close(zero, -F.log_softmax(pred, -1)[:, 0])


def test_two_bins():
    pred, target = torch.tensor([[0.0, 1.0]]), torch.tensor([0.25])
    out = distribution_focal_loss(pred, target, reduction="none")
    torch.testing.assert_close(out, reference(pred, target).float())


@pytest.mark.parametrize("logit", [100.0, -100.0])
def test_extreme_logits_give_finite_values_and_gradients(logit):
    pred = torch.zeros(4, REG_MAX + 1)
    pred[:, ::2] = logit
    pred[:, 1::2] = -logit
    target = torch.tensor([0.0, 7.5, REG_MAX - 0.01, float(REG_MAX)])
    out, grads = _value_and_grad(
        lambda p, t: distribution_focal_loss(p, t, reduction="none"), pred, target
    )
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    expected = reference(pred, torch.where(target < REG_MAX, target, 0.0))  # mmdet: t < reg_max
    expected[3] = -F.log_softmax(pred.double(), -1)[3, REG_MAX]
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_equals_ultralytics_dfloss():
    loss_module = pytest.importorskip("ultralytics.utils.loss")
    bins = REG_MAX + 1  # ultralytics' reg_max is the number of bins
    pred, target = _inputs(512)
    # ultralytics clamps to reg_max - 0.01 first: the same targets, inside that range
    target = target.clamp(0, REG_MAX - 0.01)
    theirs, (their_grad,) = _value_and_grad(
        lambda p: loss_module.DFLoss(bins)(p.view(-1, bins), target.clone()), pred
    )
    ours, (our_grad,) = _value_and_grad(
        lambda p: distribution_focal_loss(p, target, reduction="none").mean(-1, keepdim=True), pred
    )
    assert theirs.shape == ours.shape == (512, 1)
    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)


def test_equals_ultralytics_bbox_loss_dfl_term():
    """BboxLoss's ``loss_dfl``: ``(DFLoss(...) * weight).sum() / target_scores_sum``."""
    loss_module = pytest.importorskip("ultralytics.utils.loss")
    bins = REG_MAX + 1
    pred, target = _inputs(64, seed=3)
    target = target.clamp(0, REG_MAX - 0.01)
    weight = torch.rand(64, 1)
    target_scores_sum = weight.sum() * 1.3
    theirs = (loss_module.DFLoss(bins)(pred.view(-1, bins), target.clone()) * weight).sum()
    theirs = theirs / target_scores_sum
    ours = distribution_focal_loss(
        pred, target, weight=weight, reduction="sum", normalizer=4 * target_scores_sum
    )
    assert_close(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_half_inputs_are_computed_in_float32(dtype, reduction):
    pred, target = _inputs(64)
    pred_h, target_h = pred.to(dtype), target.to(dtype).clamp(max=REG_MAX)
    out = distribution_focal_loss(pred_h, target_h, reduction=reduction)
    expected = distribution_focal_loss(pred_h.float(), target_h.float(), reduction=reduction)
    assert out.dtype == (dtype if reduction == "none" else torch.float32)
    assert torch.equal(out, expected.to(out.dtype))
    pred_h.requires_grad_()
    distribution_focal_loss(pred_h, target_h, reduction=reduction).sum().backward()
    assert pred_h.grad.dtype == dtype and torch.isfinite(pred_h.grad).all()


def test_autocast_changes_nothing():
    pred, target = _inputs(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = distribution_focal_loss(pred.bfloat16(), target, reduction="sum")
    assert torch.equal(inside, distribution_focal_loss(pred.bfloat16(), target, reduction="sum"))


def test_reductions_weight_and_normalizer():
    pred, target = _inputs(16)
    none = distribution_focal_loss(pred, target, reduction="none")
    assert_close(distribution_focal_loss(pred, target, reduction="sum"), none.sum())
    assert_close(distribution_focal_loss(pred, target), none.mean())
    weight = torch.rand(16, 1)
    weighted = distribution_focal_loss(pred, target, weight=weight, reduction="none")
    assert_close(weighted, none * weight)
    # weight does not change "mean"'s count
    assert_close(distribution_focal_loss(pred, target, weight=weight), (none * weight).mean())
    for reduction in ("mean", "sum"):
        out = distribution_focal_loss(pred, target, reduction=reduction, normalizer=5.0)
        assert_close(out, none.sum() / 5)
    out = distribution_focal_loss(pred, target, reduction="none", normalizer=torch.tensor(2.0))
    assert_close(out, none / 2)


def test_empty_mean_is_a_connected_zero():
    pred = torch.zeros(0, 4, REG_MAX + 1, requires_grad=True)
    out = distribution_focal_loss(pred, torch.zeros(0, 4))
    assert out.item() == 0.0 and out.requires_grad


def test_module_and_registry():
    assert LOSSES.get("distribution_focal") is DistributionFocalLoss
    assert LOSSES.get("dfl") is DistributionFocalLoss
    module = LOSSES.build({"type": "dfl", "reduction": "sum"})
    assert repr(module) == "DistributionFocalLoss(reduction='sum')"
    pred, target = _inputs(8)
    weight = torch.rand(8, 1)
    expected = distribution_focal_loss(pred, target, weight=weight, reduction="sum", normalizer=3.0)
    assert torch.equal(module(pred, target, weight=weight, normalizer=3.0), expected)
    with pytest.raises(ValueError, match="reduction"):
        DistributionFocalLoss(reduction="avg")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pred": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "pred must be a floating"),
        ({"target": torch.zeros(4, dtype=torch.long)}, TypeError, "target must be a floating"),
        ({"pred": torch.zeros(4, 1)}, ValueError, r"pred must have shape \(\.\.\., reg_max \+ 1\)"),
        ({"pred": torch.zeros(())}, ValueError, "at least 2 bins"),
        ({"target": torch.zeros(4, 1)}, ValueError, r"target must have shape.*\(4,\).*\(4, 1\)"),
        ({"target": torch.tensor([0.0, 1.0, 2.5, 3.0])}, ValueError, r"\[0, 2\].*3\.0"),
        (
            {"target": torch.tensor([0.0, -0.5, 1.0, 1.0])},
            ValueError,
            r"target must be in \[0, 2\]",
        ),
        ({"target": torch.tensor([0.0, float("nan"), 1.0, 1.0])}, ValueError, "target must be in"),
        ({"weight": torch.ones(3)}, ValueError, r"weight must broadcast.*\(4,\).*\(3,\)"),
        ({"weight": torch.ones(4, dtype=torch.long)}, TypeError, "weight"),
        ({"reduction": "avg"}, ValueError, "reduction"),
        ({"normalizer": 0.0}, ValueError, "normalizer must be a positive"),
        ({"normalizer": "4"}, TypeError, "normalizer"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"pred": torch.zeros(4, 3), "target": torch.ones(4), **kwargs}
    with pytest.raises(error, match=match):
        distribution_focal_loss(**args)


def test_devices_must_match():
    with pytest.raises(ValueError, match="pred and target must be on the same device"):
        distribution_focal_loss(torch.zeros(4, 3), torch.ones(4, device="meta"))


def test_value_checks_off_extrapolates_from_the_end_bins():
    pred = torch.randn(2, 4, dtype=torch.float64)
    target = torch.tensor([-0.5, 3.5], dtype=torch.float64)
    with visionblocks.value_checks(False):
        out = distribution_focal_loss(pred, target, reduction="none")
    log_p = F.log_softmax(pred, -1)
    expected = torch.stack(
        [-(1.5 * log_p[0, 0] - 0.5 * log_p[0, 1]), -(-0.5 * log_p[1, 2] + 1.5 * log_p[1, 3])]
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.slow
def test_torch_compile_fullgraph_equals_eager():
    torch._dynamo.reset()

    def loss(p, t, w):
        return distribution_focal_loss(p, t, weight=w, reduction="sum", normalizer=7.0)

    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (9, 23):
        pred, target = _inputs(n, seed=n)
        weight = torch.rand(n, 1)
        actual, actual_grad = _value_and_grad(lambda p, t=target, w=weight: compiled(p, t, w), pred)
        expected, expected_grad = _value_and_grad(lambda p, t=target, w=weight: loss(p, t, w), pred)
        assert_close(actual, expected)
        assert_close(actual_grad[0], expected_grad[0])


def test_a_per_box_weight_without_its_unit_dim_is_refused_not_broadcast_per_side():
    # (P,) against the (P, 4) loss: for P == 4 it would weigh the four sides, not the boxes
    pred, target = torch.zeros(4, 4, 17), torch.full((4, 4), 8.0)
    with pytest.raises(ValueError, match=r"weight is ambiguous.*pass shape \(4, 1\)"):
        distribution_focal_loss(pred, target, weight=torch.tensor([1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"must broadcast.*got \(5,\); pass shape \(5, 1\)"):
        distribution_focal_loss(
            torch.zeros(5, 4, 17), torch.full((5, 4), 8.0), weight=torch.ones(5)
        )
    per_box = distribution_focal_loss(pred, target, weight=torch.tensor([[1.0], [0], [0], [0]]),
                                      reduction="none")  # fmt: skip
    assert (per_box[0] > 0).all() and (per_box[1:] == 0).all()
