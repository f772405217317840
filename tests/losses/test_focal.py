"""sigmoid_focal_loss / SigmoidFocalLoss: torchvision oracle, class-index targets, ignore, weight,
normalizer, dtype policy, numerics, validation. Kernel-vs-torch checks: tests/kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.ops import sigmoid_focal_loss as tv_focal

import visionblocks
from tests.helpers import assert_close, gradcheck
from visionblocks.losses import _focal_torch
from visionblocks.losses.focal import SigmoidFocalLoss, sigmoid_focal_loss
from visionblocks.registry import LOSSES

REDUCTIONS = ("none", "mean", "sum")


def one_hot(labels: torch.Tensor, num_classes: int, dtype=torch.float32) -> torch.Tensor:
    """Float targets equivalent to class indices (out-of-range labels: all zeros)."""
    return (labels.unsqueeze(-1) == torch.arange(num_classes)).to(dtype)


def reduce_like_tv(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction]


def value_and_grad(fn, x: torch.Tensor, grad_out: torch.Tensor | None = None):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    if grad_out is None:  # a varied upstream gradient; 1 for scalars
        grad_out = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
        grad_out = grad_out if out.numel() > 1 else torch.ones_like(out)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out, grad


@pytest.mark.parametrize("alpha", [0.25, 0.0, 1.0, -1.0, None])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 1.5, 2.0, 3.7])
def test_matches_torchvision(alpha, gamma, impl):
    x = torch.randn(6, 11) * 3
    binary = (torch.rand(6, 11) > 0.7).float()
    soft = torch.rand(6, 11)
    tv_alpha = -1 if alpha is None else alpha
    for t in (binary, soft):
        for reduction in REDUCTIONS:
            expected, expected_grad = value_and_grad(
                lambda x, t=t, r=reduction: tv_focal(x, t, tv_alpha, gamma, r), x
            )
            actual, grad = value_and_grad(
                lambda x, t=t, r=reduction: sigmoid_focal_loss(x, t, alpha, gamma, r, impl=impl), x
            )
            assert_close(actual, expected, scale=2)
            assert_close(grad, expected_grad, scale=2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_index_targets_equal_one_hot(reduction, impl):
    num_classes = 7
    x = torch.randn(4, 5, num_classes) * 2
    labels = torch.randint(0, num_classes, (4, 5))
    labels[0, :2] = num_classes  # mmdet's background
    labels[1, 3] = -1  # background too when not ignored
    targets = one_hot(labels, num_classes)
    expected, expected_grad = value_and_grad(
        lambda x, t=targets, r=reduction: sigmoid_focal_loss(x, t, reduction=r, impl=impl), x
    )
    actual, grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, labels, reduction=reduction, impl=impl), x
    )
    assert_close(actual, expected)
    assert_close(grad, expected_grad)
    tv_value = tv_focal(x, targets, reduction=reduction)
    assert_close(actual, tv_value)


def test_ignore_index_rows_for_class_indices(impl):
    x = torch.randn(6, 4)
    labels = torch.tensor([0, 3, -1, 4, -1, 2])  # 4 = C: background; -1 ignored
    keep = labels != -1
    mean, grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, labels, reduction="mean", ignore_index=-1, impl=impl), x
    )
    total = tv_focal(x[keep], one_hot(labels[keep], 4), reduction="sum")
    assert_close(mean, total / (4 * 4))  # 4 kept rows x 4 classes, not 24 elements
    assert torch.all(grad[~keep] == 0)
    loss = sigmoid_focal_loss(x, labels, ignore_index=-1, impl=impl)
    assert torch.all(loss[~keep] == 0)
    # An ignore_index inside [0, C) wins over "positive": those rows are ignored.
    loss = sigmoid_focal_loss(x, labels, ignore_index=3, impl=impl)
    assert torch.all(loss[1] == 0) and loss[0].abs().sum() > 0


def test_ignore_index_float_targets(impl):
    x = torch.randn(5, 3)
    t = (torch.rand(5, 3) > 0.5).float()
    t[0, 1] = t[3, 0] = t[3, 2] = -1.0  # RetinaNet-style ignored anchors/elements
    keep = t != -1
    mean, grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, t, reduction="mean", ignore_index=-1, impl=impl), x
    )
    assert_close(mean, tv_focal(x[keep], t[keep], reduction="sum") / 12)
    assert torch.all(grad[~keep] == 0) and torch.all(grad[keep] != 0)
    loss = sigmoid_focal_loss(x, t, ignore_index=-1.0, impl=impl)
    assert_close(loss[keep], tv_focal(x[keep], t[keep]))
    assert torch.all(loss[~keep] == 0)


def test_all_ignored_mean_is_zero(impl):
    x = torch.randn(3, 4, requires_grad=True)
    loss = sigmoid_focal_loss(x, torch.full((3,), 9), reduction="mean", ignore_index=9, impl=impl)
    loss.backward()
    assert loss.item() == 0 and torch.all(x.grad == 0)


@pytest.mark.parametrize("shape", [(5,), (4, 1), (4, 5), (1, 5)])
@pytest.mark.parametrize("index", [False, True])
def test_weight_broadcasting(shape, index, impl):
    x = torch.randn(4, 5)
    labels = torch.tensor([1, 5, 0, 4])
    targets = labels if index else one_hot(labels, 5)
    weight = torch.rand(shape) + 0.5
    plain = tv_focal(x, one_hot(labels, 5))
    for reduction, expected in [
        ("none", plain * weight),
        ("sum", (plain * weight).sum()),
        ("mean", (plain * weight).sum() / 20),  # count of elements, not sum of weights
    ]:
        actual = sigmoid_focal_loss(x, targets, reduction=reduction, weight=weight, impl=impl)
        assert_close(actual, expected)
    grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, targets, reduction="sum", weight=weight, impl=impl),
        x,
        torch.ones(()),
    )[1]
    expected_grad = value_and_grad(
        lambda x: tv_focal(x, one_hot(labels, 5)) * weight, x, torch.ones(4, 5)
    )[1]
    assert_close(grad, expected_grad)


def test_normalizer(impl):
    x, t = torch.randn(8, 3), (torch.rand(8, 3) > 0.8).float()
    total = tv_focal(x, t, reduction="sum")
    for normalizer in (4.0, torch.tensor(4.0)):
        for reduction in ("sum", "mean"):
            loss = sigmoid_focal_loss(x, t, reduction=reduction, normalizer=normalizer, impl=impl)
            assert_close(loss, total / 4)
        none = sigmoid_focal_loss(x, t, normalizer=normalizer, impl=impl)
        assert_close(none, tv_focal(x, t) / 4)
        assert_close(none.sum(), total / 4)


@pytest.mark.parametrize("index", [False, True])
def test_empty_mean_is_connected_zero(index, impl):
    x = torch.randn(0, 5, requires_grad=True)
    targets = torch.zeros(0, dtype=torch.long) if index else torch.zeros(0, 5)
    loss = sigmoid_focal_loss(x, targets, reduction="mean", impl=impl)
    assert loss.shape == () and loss.item() == 0 and loss.requires_grad
    loss.backward()
    assert x.grad.shape == (0, 5)
    for reduction in ("none", "sum"):
        out = sigmoid_focal_loss(x, targets, reduction=reduction, impl=impl)
        assert not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_policy(dtype, impl):
    x32, t = torch.randn(6, 7) * 2, (torch.rand(6, 7) > 0.7).float()
    x = x32.to(dtype)
    none = sigmoid_focal_loss(x, t.to(dtype), impl=impl)
    assert none.dtype == dtype
    assert_close(none, sigmoid_focal_loss(x.float(), t).to(dtype))
    for reduction in ("sum", "mean"):
        loss, grad = value_and_grad(
            lambda x, r=reduction: sigmoid_focal_loss(x, t.to(dtype), reduction=r, impl=impl), x
        )
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        assert_close(loss, sigmoid_focal_loss(x.float(), t, reduction=reduction), dtype=dtype)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
def test_extreme_logits_are_finite(gamma, impl):
    x = torch.tensor([[1e4, -1e4, 1e4, -1e4, 0.0]])
    t = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.5]])
    loss, grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, t, 0.25, gamma, "sum", impl=impl), x
    )
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # Confidently wrong elements cost ~|x| (weighted by alpha_t); right ones cost ~0.
    assert_close(
        loss,
        torch.tensor(0.75e4 + 0.25e4) + sigmoid_focal_loss(x[:, 4:], t[:, 4:], 0.25, gamma, "sum"),
    )
    assert_close(grad[0, :4], torch.tensor([0.0, 0.0, 0.75, -0.25]))
    labels = torch.tensor([0])
    loss, grad = value_and_grad(
        lambda x: sigmoid_focal_loss(x, labels, 0.25, gamma, "sum", impl=impl), x
    )
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_gradcheck_float_targets(gamma):
    x, t = torch.randn(3, 4) * 2, torch.rand(3, 4)
    weight = torch.rand(4)
    gradcheck(lambda x: sigmoid_focal_loss(x, t.double(), 0.25, gamma, "none", impl="torch"), [x])
    gradcheck(
        lambda x: sigmoid_focal_loss(
            x, t.double(), None, gamma, "mean", weight=weight.double(), impl="torch"
        ),
        [x],
    )


def test_gradcheck_index_targets():
    x, labels = torch.randn(5, 3), torch.tensor([0, 2, 3, -1, 1])
    gradcheck(
        lambda x: sigmoid_focal_loss(x, labels, 0.25, 1.5, "none", ignore_index=-1, impl="torch"),
        [x],
    )


def test_many_chunks(monkeypatch):
    """Tiny chunks: many chunks and a partial last one (the torch path's sweep)."""
    monkeypatch.setattr(_focal_torch, "_CHUNK", 7)
    x, labels = torch.randn(23, 3), torch.randint(-1, 4, (23,))
    t = one_hot(labels, 3)
    weight = torch.rand(23, 1)
    for reduction in REDUCTIONS:
        expected, expected_grad = value_and_grad(
            lambda x, r=reduction: reduce_like_tv(tv_focal(x, t) * weight, r), x
        )
        for targets in (t, labels):
            actual, grad = value_and_grad(
                lambda x, t=targets, r=reduction: sigmoid_focal_loss(
                    x, t, reduction=r, weight=weight, impl="torch"
                ),
                x,
            )
            assert_close(actual, expected)
            assert_close(grad, expected_grad)


def test_more_classes_than_a_chunk(monkeypatch):
    monkeypatch.setattr(_focal_torch, "_CHUNK", 64)
    x, labels = torch.randn(3, 100), torch.tensor([3, -1, 99])
    t = one_hot(labels, x.shape[1])
    for targets in (t, labels):
        actual, grad = value_and_grad(
            lambda x, t=targets: sigmoid_focal_loss(x, t, reduction="sum", impl="torch"), x
        )
        expected, expected_grad = value_and_grad(lambda x: tv_focal(x, t, reduction="sum"), x)
        assert_close(actual, expected)
        assert_close(grad, expected_grad)


def test_non_contiguous_inputs(impl):
    x, t = torch.randn(7, 5), (torch.rand(5, 7) > 0.6).float().t()
    xt = torch.randn(5, 7).t()
    weight = torch.rand(5, 7).t()
    for inputs in (x, xt):
        actual, grad = value_and_grad(
            lambda x: sigmoid_focal_loss(x, t, weight=weight, impl=impl), inputs
        )
        expected, expected_grad = value_and_grad(lambda x: tv_focal(x, t) * weight, inputs)
        assert_close(actual, expected)
        assert_close(grad, expected_grad)
    labels = torch.tensor([[0, 1], [2, 3], [4, 0]]).t()  # (2, 3), non-contiguous
    x = torch.randn(2, 3, 4)
    assert_close(
        sigmoid_focal_loss(x, labels, reduction="sum", impl=impl),
        tv_focal(x, one_hot(labels, 4), reduction="sum"),
    )


def test_bool_targets_and_target_gradients():
    x = torch.randn(4, 3)
    t = torch.rand(4, 3) > 0.5
    assert_close(sigmoid_focal_loss(x, t), tv_focal(x, t.float()))
    soft = torch.rand(4, 3, requires_grad=True)
    weight = torch.rand(3, requires_grad=True)
    ours = sigmoid_focal_loss(x, soft, reduction="sum", weight=weight)
    ref = (tv_focal(x, soft) * weight).sum()
    assert_close(ours, ref)
    grads = torch.autograd.grad(ours, (soft, weight))
    expected = torch.autograd.grad(ref, (soft, weight))
    assert_close(grads[0], expected[0])
    assert_close(grads[1], expected[1])


def test_module_matches_function_and_registry():
    assert LOSSES.get("focal") is SigmoidFocalLoss
    assert LOSSES.get("sigmoid_focal") is SigmoidFocalLoss
    module = LOSSES.build({"type": "focal", "alpha": 0.5, "gamma": 1.0, "ignore_index": -1})
    assert (
        repr(module) == "SigmoidFocalLoss(alpha=0.5, gamma=1.0, reduction='mean', ignore_index=-1)"
    )
    x, labels, weight = torch.randn(6, 4), torch.tensor([0, 1, -1, 4, 2, 3]), torch.rand(6, 1)
    expected = sigmoid_focal_loss(
        x, labels, 0.5, 1.0, "mean", weight=weight, ignore_index=-1, normalizer=3.0
    )
    assert_close(module(x, labels, weight=weight, normalizer=3.0), expected)
    assert SigmoidFocalLoss(reduction="none")(x, labels).shape == (6, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"targets": torch.zeros(4, 2)}, ValueError, r"shape of inputs \(4, 3\).*\(4, 2\)"),
        (
            {"targets": torch.zeros(3, dtype=torch.long)},
            ValueError,
            r"inputs.shape\[:-1\] = \(4,\)",
        ),
        ({"inputs": torch.zeros(4, 3, dtype=torch.long)}, TypeError, "floating-point"),
        ({"reduction": "avg"}, ValueError, "'avg'"),
        ({"alpha": 1.5}, ValueError, r"alpha must be in \[0, 1\].*1\.5"),
        ({"alpha": float("nan")}, ValueError, "alpha"),
        ({"alpha": True}, TypeError, "alpha"),
        ({"gamma": -1.0}, ValueError, "gamma must be in"),
        ({"weight": torch.ones(2)}, ValueError, r"weight must broadcast.*\(2,\)"),
        ({"ignore_index": 1.5, "targets": torch.zeros(4, dtype=torch.long)}, TypeError, "an int"),
        ({"ignore_index": True}, TypeError, "ignore_index"),
        ({"normalizer": 0.0}, ValueError, "normalizer"),
        ({"impl": "cuda"}, ValueError, "impl"),
        ({"targets": [0, 1]}, TypeError, "targets must be a torch.Tensor"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"inputs": torch.zeros(4, 3), "targets": torch.zeros(4, 3), **kwargs}
    with pytest.raises(error, match=match):
        sigmoid_focal_loss(**args)


def test_module_validates_options():
    with pytest.raises(ValueError, match="1.5"):
        SigmoidFocalLoss(alpha=1.5)
    with pytest.raises(ValueError, match="reduction"):
        SigmoidFocalLoss(reduction="avg")


# --------------------------------------------------- values, normalizers, devices (issue 19)
@pytest.mark.parametrize(
    "normalizer",
    [
        torch.tensor(0.0),
        torch.tensor([-2.0]),
        torch.tensor(float("inf")),
        0.0,
        np.float32(0.0),
        float("inf"),
        np.float64(-1.0),
    ],
    ids=["tensor-zero", "tensor-negative", "tensor-inf", "zero", "np-zero", "inf", "np-negative"],
)
def test_normalizer_must_be_positive_and_finite_whatever_its_type(normalizer):
    with pytest.raises(ValueError, match="normalizer must be a positive finite number"):
        sigmoid_focal_loss(torch.zeros(4, 3), torch.zeros(4, 3), normalizer=normalizer)


def test_normalizer_of_any_real_type_divides_the_same():
    x, t = torch.randn(4, 3), (torch.rand(4, 3) > 0.5).float()
    expected = sigmoid_focal_loss(x, t, reduction="sum") / 4
    for normalizer in (4, 4.0, np.float32(4.0), np.int64(4), torch.tensor(4), torch.tensor([4.0])):
        out = sigmoid_focal_loss(x, t, reduction="sum", normalizer=normalizer)
        assert out.shape == () and torch.allclose(out, expected)
    with pytest.raises(TypeError, match="normalizer must be a number"):
        sigmoid_focal_loss(x, t, normalizer="4")


@pytest.mark.parametrize(
    ("targets", "kwargs", "match"),
    [
        (torch.tensor([[0.0, 1.0, 255.0]] * 2), {}, r"targets must be in \[0, 1\].*255"),
        (torch.tensor([[0.0, 1.0, -1.0]] * 2), {}, r"pass it as ignore_index"),
        (
            torch.tensor([[0.5, -1.0, 2.0]] * 2),
            {"ignore_index": -1},
            r"ignore_index=-1\), got values in \[0.0, 2.0\]",
        ),
        (torch.tensor([0, 5]), {}, r"\[-1, 3\].*-1 and C = 3 mean background"),
        (torch.tensor([0, -2]), {"ignore_index": 255}, r"\[-1, 3\].*-2"),
    ],
)
def test_targets_out_of_range_raise(targets, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sigmoid_focal_loss(torch.zeros(2, 3), targets, **kwargs)


def test_tensors_on_different_devices_raise():
    x, t = torch.zeros(2, 3), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="inputs, targets and weight must be on the same device"):
        sigmoid_focal_loss(x, t, weight=torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="inputs and targets must be on the same device"):
        sigmoid_focal_loss(x, t.to("meta"))
    with pytest.raises(ValueError, match="normalizer must be on the inputs' device"):
        sigmoid_focal_loss(x, t, normalizer=torch.ones(1, device="meta"))


def test_value_checks_off_skips_value_checks_and_keeps_results():
    from visionblocks.losses import binary_cross_entropy_with_logits, cross_entropy

    x, t = torch.randn(4, 3), (torch.rand(4, 3) > 0.5).float()
    labels = torch.tensor([0, 2, 1, 1])
    valid = [
        lambda: sigmoid_focal_loss(x, t, reduction="sum", normalizer=torch.tensor(2.0)),
        lambda: sigmoid_focal_loss(x, labels, reduction="mean"),
        lambda: binary_cross_entropy_with_logits(x, t),
        lambda: cross_entropy(x, labels),
    ]
    expected = [call() for call in valid]
    with visionblocks.value_checks(False):
        for call, value in zip(valid, expected, strict=True):
            assert torch.equal(call(), value)
        # Unchecked: the silently wrong answers the checks exist for.
        assert binary_cross_entropy_with_logits(x.abs() + 1, t * 255) < 0  # issue 19: -126
        assert sigmoid_focal_loss(x, t, reduction="sum", normalizer=torch.tensor(0.0)).isinf()
    with pytest.raises(ValueError, match="targets must be in"):
        binary_cross_entropy_with_logits(x, t * 255)
