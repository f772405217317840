"""Exact numerics of the sigmoid focal loss: the formula and the kernel against float64.

The oracle is `tests.reference.focal` (the paper's formula in float64, written without
cancellation). Over logits in [-30, 30] every ``impl`` must give a relative error below 1e-5
wherever the true loss exceeds 1e-30, for float (binary and soft), bool and class-index
targets; with gamma = 0 and no alpha the loss is the exact BCE within 4 float32 eps; and
float targets give torchvision's values and gradients within rtol=1e-5, atol=1e-6, while
being the closer of the two to float64 (the docstring's statements).
"""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import sigmoid_focal_loss as tv_focal

from tests.reference import focal as ref
from visionblocks.losses import sigmoid_focal_loss

LOGITS = torch.linspace(-30.0, 30.0, 6001)  # step 0.01: includes x = 14.7 (t = 1 case)
RTOL = 1e-5
FLOOR = 1e-30


def _rel_error(actual, expected):
    mask = expected > FLOOR
    rel = (actual.double() - expected).abs() / expected
    return rel[mask].max().item()


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
def test_targets_requiring_grad_are_exact(gamma):
    """Targets that need gradients (the formula even where a kernel could run): exact too."""
    x = torch.cat([LOGITS, LOGITS]).reshape(-1, 1)
    t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    expected = ref.sigmoid_focal_loss(x, t, 0.25, gamma)
    loss = sigmoid_focal_loss(x, t.clone().requires_grad_(True), gamma=gamma).detach()
    assert _rel_error(loss, expected) <= RTOL
    labels = torch.tensor([0, 2, -1])
    xi = torch.tensor([[14.7, -20.0, 3.0], [0.5, 25.0, -25.0], [30.0, -30.0, 0.0]])
    y = torch.tensor([[1.0, 0, 0], [0, 0, 1], [0, 0, 0]], requires_grad=True)
    loss = sigmoid_focal_loss(xi, y, gamma=gamma)
    loss.sum().backward()
    assert torch.isfinite(y.grad).all()
    expected = ref.sigmoid_focal_loss(xi, ref.one_hot(labels, 3), 0.25, gamma)
    assert _rel_error(loss.detach(), expected) <= RTOL


@pytest.mark.parametrize("soft", [False, True])
def test_gamma_zero_without_alpha_is_exact_bce(impl, soft):
    """gamma = 0, alpha = None: the exact BCE within 4 float32 eps (relative)."""
    x = torch.cat([LOGITS, LOGITS]).reshape(-1, 1)
    if soft:
        t = torch.rand(x.shape)
    else:
        t = torch.cat([torch.zeros(6001), torch.ones(6001)]).reshape(-1, 1)
    focal = sigmoid_focal_loss(x, t, None, 0.0, impl=impl)
    bce = ref.binary_cross_entropy(x, t)
    assert _rel_error(focal, bce) <= 4 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("alpha", [0.25, None])
def test_close_to_torchvision_and_closer_to_float64(gamma, alpha):
    """The docstring's torchvision statement: values, and gradients where torchvision's are
    finite, within rtol=1e-5, atol=1e-6; and our error against float64 is the smaller."""
    x = torch.cat([LOGITS, LOGITS, LOGITS]).reshape(-1, 1)
    t = torch.cat([torch.zeros(6001), torch.ones(6001), torch.rand(6001)]).reshape(-1, 1)
    ours_x, tv_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = sigmoid_focal_loss(ours_x, t, alpha, gamma)
    theirs = tv_focal(tv_x, t, -1 if alpha is None else alpha, gamma)
    (ours_grad,) = torch.autograd.grad(ours.sum(), ours_x)
    (tv_grad,) = torch.autograd.grad(theirs.sum(), tv_x)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    finite = torch.isfinite(tv_grad)
    torch.testing.assert_close(ours_grad[finite], tv_grad[finite], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(ours_grad).all()
    expected = ref.sigmoid_focal_loss(x, t, alpha, gamma)
    assert _rel_error(ours.detach(), expected) <= min(RTOL, _rel_error(theirs.detach(), expected))


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
