"""GIoU / DIoU / CIoU losses: torchvision oracle, degenerate boxes, gradcheck, policies, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.ops as tvops

from tests.helpers import assert_close, gradcheck
from tests.reference import boxes as ref
from visionblocks.losses.iou import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

LOSSES = {  # name: (ours, torchvision's, is CIoU)
    "giou": (generalized_box_iou_loss, tvops.generalized_box_iou_loss, False),
    "diou": (distance_box_iou_loss, tvops.distance_box_iou_loss, False),
    "ciou": (complete_box_iou_loss, tvops.complete_box_iou_loss, True),
}


def random_pairs(n: int, dtype=torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid xyxy box pairs ``(n, 4)``: a third overlapping jitters, the rest anywhere."""
    gen = torch.Generator().manual_seed(seed)

    def boxes(m: int) -> torch.Tensor:
        xy = torch.rand(m, 2, generator=gen, dtype=torch.float64) * 20
        wh = torch.rand(m, 2, generator=gen, dtype=torch.float64) * 8 + 0.5
        return torch.cat([xy, xy + wh], 1)

    pred, target = boxes(n), boxes(n)
    k = n // 3
    jitter = pred[:k] + torch.randn(k, 4, generator=gen, dtype=torch.float64)
    target[:k] = torch.cat(
        [jitter[:, :2].minimum(jitter[:, 2:]), jitter[:, :2].maximum(jitter[:, 2:])], 1
    )
    return pred.to(dtype), target.to(dtype)


def loss_and_grads(fn, pred, target, grad_out=None, **kwargs):
    pred = pred.detach().clone().requires_grad_(True)
    target = target.detach().clone().requires_grad_(True)
    loss = fn(pred, target, **kwargs)
    grad_out = torch.ones_like(loss) if grad_out is None else grad_out.to(loss.dtype)
    gp, gt = torch.autograd.grad(loss, (pred, target), grad_out)
    return loss, gp, gt


def reference(name: str):
    """The float64 reference loss (tests/reference/boxes.py) as a loss function."""

    def fn(pred, target, reduction="none", eps=1e-7):
        loss = ref.loss(name, pred, target, eps)
        return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction]

    return fn


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_the_reference_values_and_grads(name, dtype, impl):
    ours = LOSSES[name][0]
    pred, target = random_pairs(300, dtype)
    grad_out = torch.rand(300, dtype=dtype)
    expected = loss_and_grads(reference(name), pred, target, grad_out)
    actual = loss_and_grads(ours, pred, target, grad_out, impl=impl)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == dtype
        assert_close(a, e.to(dtype))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_matches_torchvision(name):
    # torchvision adds eps to every denominator, we only to zero ones: ~eps / area apart.
    ours, tv, _ = LOSSES[name]
    pred, target = random_pairs(300, torch.float64)
    grad_out = torch.rand(300, dtype=torch.float64)
    expected = loss_and_grads(tv, pred, target, grad_out)
    for a, e in zip(loss_and_grads(ours, pred, target, grad_out), expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions_match_the_reference(name, reduction):
    ours = LOSSES[name][0]
    pred, target = random_pairs(100, torch.float64)
    for a, e in zip(
        loss_and_grads(ours, pred, target, reduction=reduction),
        loss_and_grads(reference(name), pred, target, reduction=reduction),
        strict=True,
    ):
        assert_close(a, e)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_leading_batch_dims(name):
    ours, tv, _ = LOSSES[name]
    pred, target = random_pairs(2 * 3 * 5)
    pred, target = pred.view(2, 3, 5, 4), target.view(2, 3, 5, 4)
    actual = loss_and_grads(ours, pred, target)
    assert actual[0].shape == (2, 3, 5)
    expected = loss_and_grads(tv, pred.reshape(-1, 4), target.reshape(-1, 4))
    for a, e in zip(actual, expected, strict=True):
        assert_close(a.reshape(e.shape), e)


def test_single_box_without_batch_dim():
    pred, target = random_pairs(1)
    loss = generalized_box_iou_loss(pred[0], target[0])
    assert loss.shape == ()
    assert_close(loss, tvops.generalized_box_iou_loss(pred[0], target[0]))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_identical_boxes_zero_loss_and_tie_gradients(name, impl):
    # Every max/min ties: autograd splits those gradients half and half; so must we.
    ours, tv, _ = LOSSES[name]
    pred, _ = random_pairs(20, torch.float64)
    actual = loss_and_grads(ours, pred, pred.clone(), impl=impl)
    assert torch.equal(actual[0], torch.zeros(20, dtype=torch.float64))
    for a, e in zip(actual, loss_and_grads(reference(name), pred, pred.clone()), strict=True):
        assert_close(a, e)
    for a, e in zip(actual, loss_and_grads(tv, pred, pred.clone()), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-7)


DEGENERATE = {  # name: (pred, target)
    "zero_width": ([2.0, 1.0, 2.0, 4.0], [1.0, 0.0, 3.0, 3.0]),
    "zero_height": ([1.0, 2.0, 4.0, 2.0], [0.0, 1.0, 3.0, 3.0]),
    "point_inside_target": ([1.5, 1.5, 1.5, 1.5], [1.0, 1.0, 2.0, 2.0]),
    "point_outside_target": ([5.0, 5.0, 5.0, 5.0], [1.0, 1.0, 2.0, 2.0]),
    "both_zero_width": ([1.0, 0.0, 1.0, 2.0], [3.0, 1.0, 3.0, 4.0]),
    "identical_points": ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]),
    "identical_lines": ([0.0, 1.0, 3.0, 1.0], [0.0, 1.0, 3.0, 1.0]),
    "collinear_lines": ([0.0, 0.0, 0.0, 2.0], [0.0, 1.0, 0.0, 3.0]),
    "all_zero": ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_degenerate_boxes_finite_and_torchvision_where_finite(name, dtype, impl):
    ours, tv, _ = LOSSES[name]
    pred = torch.tensor([p for p, _ in DEGENERATE.values()], dtype=dtype)
    target = torch.tensor([t for _, t in DEGENERATE.values()], dtype=dtype)
    for p, t in ((pred, target), (target, pred)):  # degenerate pred and degenerate target
        actual = loss_and_grads(ours, p, t, impl=impl)
        for x in actual:
            assert torch.isfinite(x).all(), f"{name}: non-finite {x}"
        for a, e in zip(actual, loss_and_grads(reference(name), p, t), strict=True):
            assert_close(a, e.to(dtype))
        expected = loss_and_grads(tv, p, t)
        ok = torch.isfinite(expected[0]) & torch.isfinite(expected[1]).all(1)
        ok &= torch.isfinite(expected[2]).all(1)
        if name != "ciou":  # torchvision is finite everywhere for GIoU/DIoU
            assert ok.all()
        for a, e in zip(actual, expected, strict=True):
            assert_close(a[ok], e[ok], scale=10)


def test_degenerate_pair_loss_is_one():
    # A zero-area box has IoU 0 and an identical pair nothing else: loss 1 (as torchvision).
    points = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 3.0, 2.0]])
    for fn, _, _ in LOSSES.values():
        assert_close(fn(points, points.clone()), torch.ones(2))


def test_ciou_angle_policy_for_zero_height():
    # h = 0 gives the limit angle pi/2 (torchvision: NaN gradient); a point box angle 0.
    pred = torch.tensor([[0.0, 0.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    target = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    loss = complete_box_iou_loss(pred, target)
    diou = distance_box_iou_loss(pred, target)
    iou = torch.zeros(2, dtype=torch.float64)  # zero-area pred: IoU 0
    v = 4 / math.pi**2 * torch.tensor([(math.pi / 4 - math.pi / 2) ** 2, (math.pi / 4) ** 2])
    assert_close(loss, diou + v / (1 - iou + v) * v.to(torch.float64))


def _ciou_frozen_alpha(pred, target, alpha0):
    """CIoU plus a detached term that turns alpha into the constant ``alpha0`` in *value*.

    torchvision's CIoU gradient holds alpha constant, so it is not the derivative of the
    loss; it is the derivative of ``diou + alpha0 v`` at the point where ``alpha == alpha0``.
    The added term is zero there and has no gradient, so gradcheck's finite differences see
    exactly that function.
    """
    alpha, v = _alpha_v(pred, target)
    return complete_box_iou_loss(pred, target, impl="torch") + (alpha0 - alpha).detach() * v


def _alpha_v(pred, target):
    w, h = pred[:, 2] - pred[:, 0], pred[:, 3] - pred[:, 1]
    wg, hg = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    v = 4 / math.pi**2 * (torch.atan(wg / hg) - torch.atan(w / h)) ** 2
    iw = (torch.minimum(pred[:, 2], target[:, 2]) - torch.maximum(pred[:, 0], target[:, 0])).clamp(
        min=0
    )
    ih = (torch.minimum(pred[:, 3], target[:, 3]) - torch.maximum(pred[:, 1], target[:, 1])).clamp(
        min=0
    )
    iou = iw * ih / (w * h + wg * hg - iw * ih)
    return v / (1 - iou + v), v


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradcheck(name):
    fn, _, is_ciou = LOSSES[name]
    pred, target = random_pairs(9, torch.float64, seed=3)
    if is_ciou:
        alpha0 = _alpha_v(pred, target)[0]
        assert gradcheck(lambda p, t: _ciou_frozen_alpha(p, t, alpha0), (pred, target))
    else:
        assert gradcheck(lambda p, t: fn(p, t, impl="torch"), (pred, target))


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_compiles_fullgraph_dynamic_and_equals_eager(reduction):
    # One graph for the three losses, traced with dynamic shapes, then run on two sizes.
    def all_three(p, t):
        return torch.stack([fn(p, t, reduction, impl="torch") for fn, _, _ in LOSSES.values()])

    torch._dynamo.reset()
    compiled = torch.compile(all_three, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (11, 4):
        pred, target = random_pairs(n)
        pred[0, 2] = pred[0, 0]  # a zero-width box
        target[1] = pred[1]  # identical boxes
        grad_out = torch.rand(3, n) if reduction == "none" else torch.rand(3)
        actual = loss_and_grads(compiled, pred, target, grad_out)
        eager = loss_and_grads(all_three, pred, target, grad_out)
        for a, e in zip(actual, eager, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_grad_for_target_only_and_no_grad():
    pred, target = random_pairs(10)
    target.requires_grad_(True)
    loss = generalized_box_iou_loss(pred, target, reduction="sum")
    (gt,) = torch.autograd.grad(loss, target)
    _, _, expected = loss_and_grads(
        tvops.generalized_box_iou_loss, pred, target.detach(), reduction="sum"
    )
    assert_close(gt, expected)
    with torch.no_grad():
        assert not generalized_box_iou_loss(pred, target).requires_grad


def test_backward_twice_with_retain_graph():
    pred, target = random_pairs(10)
    pred.requires_grad_(True)
    loss = distance_box_iou_loss(pred, target, reduction="sum")
    loss.backward(retain_graph=True)
    first = pred.grad.clone()
    loss.backward()
    assert_close(pred.grad, 2 * first)


def test_non_contiguous_and_odd_offset_inputs():
    pred, target = random_pairs(40)
    wide = torch.zeros(40, 9)
    wide[:, 1:5] = pred  # rows of stride 9, odd storage offset
    expected = generalized_box_iou_loss(pred, target)
    assert_close(generalized_box_iou_loss(wide[:, 1:5], target), expected)
    assert_close(generalized_box_iou_loss(pred.t().contiguous().t(), target), expected)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_empty_input(name, impl):
    fn = LOSSES[name][0]
    pred = torch.zeros(0, 4, requires_grad=True)
    target = torch.zeros(0, 4)
    assert fn(pred, target, impl=impl).shape == (0,)
    assert fn(pred, target, reduction="sum", impl=impl).item() == 0.0
    mean = fn(pred, target, reduction="mean", impl=impl)
    assert mean.item() == 0.0 and mean.requires_grad
    mean.backward()
    assert pred.grad.shape == (0, 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_policy_half(dtype, impl):
    pred, target = random_pairs(64)
    half_p = pred.to(dtype).requires_grad_(True)
    loss = complete_box_iou_loss(half_p, target.to(dtype), impl=impl)
    assert loss.dtype == dtype
    expected = complete_box_iou_loss(pred.to(dtype).float(), target.to(dtype).float())
    assert_close(loss, expected.to(dtype))
    for reduction in ("sum", "mean"):
        out = complete_box_iou_loss(half_p, target.to(dtype), reduction=reduction, impl=impl)
        assert out.dtype == torch.float32
    (grad,) = torch.autograd.grad(out, half_p)
    assert grad.dtype == dtype and torch.isfinite(grad).all()


def test_dtype_policy_full_and_mixed():
    pred, target = random_pairs(8, torch.float64)
    assert generalized_box_iou_loss(pred, target, reduction="mean").dtype == torch.float64
    mixed = generalized_box_iou_loss(pred.float(), target)
    assert mixed.dtype == torch.float64
    assert_close(mixed, generalized_box_iou_loss(pred.float().double(), target))


@pytest.mark.parametrize(
    ("pred", "target", "kwargs", "error", "match"),
    [
        (
            torch.zeros(5, 3),
            torch.zeros(5, 3),
            {},
            ValueError,
            r"pred must have shape \(\.\.\., 4\)",
        ),
        (
            torch.zeros(5, 4),
            torch.zeros(5, 5),
            {},
            ValueError,
            r"target must have shape \(\.\.\., 4\)",
        ),
        (torch.zeros(5, 4), torch.zeros(4, 4), {}, ValueError, "must have the same shape"),
        (torch.zeros(()), torch.zeros(()), {}, ValueError, "must have shape"),
    ],
)
def test_bad_inputs(pred, target, kwargs, error, match):
    for fn, _, _ in LOSSES.values():
        with pytest.raises(error, match=match):
            fn(pred, target, **kwargs)


def test_python_calls_at_most_twice_torchvision():
    from tests.ops.test_box_iou import python_calls

    pred, target = random_pairs(10)
    ours = python_calls(lambda: generalized_box_iou_loss(pred, target))
    peer = python_calls(lambda: tvops.generalized_box_iou_loss(pred, target))
    assert ours <= 2 * peer, (ours, peer)
