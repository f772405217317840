"""Exact numerics of the sigmoid focal loss: every path against the float64 reference.

The oracle is `tests.reference.focal` (the paper's formula in float64, written without
cancellation). Over logits in [-30, 30] every path must give a relative error below 1e-5
wherever the true loss exceeds 1e-30, for float (binary and soft), bool and class-index
targets; and with gamma = 0 the loss never exceeds BCE.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import focal as ref
from visionblocks.losses import sigmoid_focal_loss

LOGITS = torch.linspace(-30.0, 30.0, 6001)  # step 0.01: includes x = 14.7 (t = 1 case)
RTOL = 1e-5
FLOOR = 1e-30


def _rel_error(actual, expected):
    mask = expected > FLOOR
    rel = (actual.double() - expected).abs() / expected
    return rel[mask].max().item()


def _autograd_path(fn):
    """Run ``fn(x, targets)`` on the autograd composition (float targets requiring grad)."""

    def run(x, t, **kw):
        return fn(x, t.clone().requires_grad_(True), **kw).detach()

    return run


def _paths(impl):
    call = lambda x, t, **kw: sigmoid_focal_loss(x, t, impl=impl, **kw)  # noqa: E731
    return call


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("alpha", [0.25, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binary_targets_relative_error(impl, gamma, alpha, dtype):
    x = torch.cat([LOGITS, LOGITS]).to(dtype).reshape(-1, 1)
    t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    expected = ref.sigmoid_focal_loss(x, t, alpha, gamma)
    for target in (t.to(dtype), t.bool()):
        loss = sigmoid_focal_loss(x, target, alpha, gamma, impl=impl)
        assert _rel_error(loss, expected) <= RTOL, (target.dtype, gamma, alpha)


def test_confident_logit_example(impl):
    """The issue's example: x = 14.7, t = 1 gave 5.4e-20 for 1.9e-20 (1 - p_t by subtraction)."""
    x, t = torch.tensor([[14.7]]), torch.tensor([[1.0]])
    expected = ref.sigmoid_focal_loss(x, t)
    assert expected.item() == pytest.approx(1.9e-20, rel=0.05)
    loss = sigmoid_focal_loss(x, t, impl=impl)
    assert loss.item() == pytest.approx(expected.item(), rel=RTOL)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("ignore", [None, 7])
def test_class_index_targets_relative_error(impl, gamma, ignore):
    num_classes = 5
    x = LOGITS[:6000].reshape(-1, num_classes + 1)[:, :num_classes].contiguous()
    labels = torch.arange(x.shape[0]) % (num_classes + 2) - 1  # -1 .. C, every class
    if ignore is not None:
        labels[::9] = ignore
    expected = ref.sigmoid_focal_loss(x, ref.one_hot(labels, num_classes), 0.25, gamma)
    if ignore is not None:
        expected = expected * (labels != ignore).unsqueeze(1)
    loss = sigmoid_focal_loss(x, labels, 0.25, gamma, ignore_index=ignore, impl=impl)
    assert _rel_error(loss, expected) <= RTOL
    if ignore is not None:
        assert (loss[labels == ignore] == 0).all()


@pytest.mark.parametrize("soft", [0.1, 0.5, 0.9, 0.999])
def test_soft_targets_relative_error(impl, soft):
    x = LOGITS.reshape(-1, 1)
    t = torch.full_like(x, soft)
    expected = ref.sigmoid_focal_loss(x, t)
    assert _rel_error(sigmoid_focal_loss(x, t, impl=impl), expected) <= RTOL


@pytest.mark.parametrize("gamma", [0.0, 2.0])
def test_autograd_composition_is_exact(gamma):
    """Targets that need gradients take the autograd composition: the same exact forms."""
    x = torch.cat([LOGITS, LOGITS]).reshape(-1, 1)
    t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    expected = ref.sigmoid_focal_loss(x, t, 0.25, gamma)
    loss = _autograd_path(sigmoid_focal_loss)(x, t, gamma=gamma)
    assert _rel_error(loss, expected) <= RTOL
    labels = torch.tensor([0, 2, -1])
    xi = torch.tensor([[14.7, -20.0, 3.0], [0.5, 25.0, -25.0], [30.0, -30.0, 0.0]])
    y = torch.tensor([[1.0, 0, 0], [0, 0, 1], [0, 0, 0]], requires_grad=True)
    loss = sigmoid_focal_loss(xi, y, gamma=gamma)
    loss.sum().backward()
    assert torch.isfinite(y.grad).all()
    expected = ref.sigmoid_focal_loss(xi, ref.one_hot(labels, 3), 0.25, gamma)
    assert _rel_error(loss.detach(), expected) <= RTOL


@pytest.mark.parametrize("alpha", [0.25, None])
@pytest.mark.parametrize("soft", [False, True])
def test_gamma_zero_never_exceeds_bce(impl, alpha, soft):
    """focal <= BCE element-wise for gamma = 0 (against the exact BCE, rounded to float32).

    Without alpha the two are the same quantity: equal up to float32 rounding.
    """
    x = torch.cat([LOGITS, LOGITS]).reshape(-1, 1)
    if soft:
        t = torch.rand(x.shape)
    else:
        t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    focal = sigmoid_focal_loss(x, t, alpha, 0.0, impl=impl)
    bce = ref.binary_cross_entropy(x, t).float()
    assert _rel_error(focal, ref.sigmoid_focal_loss(x, t, alpha, 0.0)) <= RTOL
    if alpha is None:  # the same value: equal up to float32 rounding
        assert _rel_error(focal, bce.double()) <= 4 * torch.finfo(torch.float32).eps
    else:
        assert (focal <= bce).all()
        # torch's own BCE, where it has no cancellation (above 1e-3 it is within 2e-4)
        torch_bce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
        big = bce > 1e-3
        assert (focal[big] <= torch_bce[big]).all()


def test_gradient_finite_and_accurate_for_confident_logits(impl):
    """The analytic gradient against autograd through the float64 reference."""
    x = torch.cat([LOGITS, LOGITS]).reshape(-1, 1)
    t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    x64 = x.double().requires_grad_(True)
    ref.sigmoid_focal_loss(x64, t).sum().backward()
    x32 = x.clone().requires_grad_(True)
    sigmoid_focal_loss(x32, t, reduction="sum", impl=impl).backward()
    expected = x64.grad
    assert torch.isfinite(x32.grad).all()
    big = expected.abs() > 1e-30
    rel = ((x32.grad.double() - expected).abs() / expected.abs())[big]
    assert rel.max().item() <= 1e-4


def test_broadcast_weight_is_not_written(impl):
    x = torch.randn(40, 6)
    t = (torch.rand(40, 6) < 0.3).float()
    t[::5] = -1.0
    weight = torch.rand(1, 6)
    before = weight.clone()
    for alpha in (None, 0.25):
        sigmoid_focal_loss(x, t, alpha, weight=weight, ignore_index=-1.0, impl=impl)
    assert torch.equal(weight, before)
