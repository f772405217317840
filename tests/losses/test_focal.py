"""sigmoid_focal_loss / SigmoidFocalLoss: torchvision oracle, class-index targets, ignore, weight,
normalizer, dtype policy, numerics, validation. Kernel-vs-torch checks: tests/kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torchvision.ops import sigmoid_focal_loss as tv_focal

import visionblocks
import visionblocks.losses.focal as focal_module
from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close, gradcheck
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


@pytest.mark.parametrize("index", [False, True])
def test_all_ignored_mean_is_connected_zero(index, impl):
    x = torch.randn(3, 4, requires_grad=True)
    targets = torch.full((3,), 9) if index else torch.full((3, 4), 9.0)
    loss = sigmoid_focal_loss(x, targets, reduction="mean", ignore_index=9, impl=impl)
    assert loss.requires_grad and loss.grad_fn is not None
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


def test_float_targets_take_one_softplus_and_keep_float32_precision():
    # BCE = softplus(-|x|) + ([x >= 0] - t) x: two terms >= 0, one softplus a call (its log1p
    # is most of a large call's cost); soft targets near 0, 1/2 and 1 stay within 1e-6 of float64.
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountSoftplus(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += func.overloadpacket is torch.ops.aten.softplus
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * 12
    u = torch.rand(4096, generator=g)
    t = torch.cat([u[:2048], 1 - u[2048:3072] * 1e-3, u[3072:] * 1e-3])
    with CountSoftplus() as count:
        loss = sigmoid_focal_loss(x, t, reduction="none", impl="torch")
    assert count.calls == 1
    xd, td = x.double(), t.double()
    ce = torch.lerp(torch.nn.functional.softplus(xd), torch.nn.functional.softplus(-xd), td)
    m = torch.lerp(torch.sigmoid(xd), torch.sigmoid(-xd), td)
    ref = (0.25 * td + 0.75 * (1 - td)) * m**2 * ce
    normal = ref > torch.finfo(torch.float32).tiny  # below it float32 has fewer digits
    assert ((loss.double() - ref).abs() / ref)[normal].max() < 1e-6


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


def _targets(kind: str, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    if kind == "index":
        return torch.randint(-1, shape[1] + 1, shape[:1])
    if kind == "soft":
        return torch.rand(shape, dtype=dtype)
    return (torch.rand(shape) > 0.7).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["binary", "soft", "index"])
@pytest.mark.parametrize(
    ("alpha", "gamma"), [(None, 0.0), (0.25, 0.5), (-1.0, 1.0), (0.25, 2.0), (0.75, 3.5)]
)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_closed_form_gradient_equals_autograd_of_the_formula(
    monkeypatch, dtype, kind, alpha, gamma, reduction
):
    """Eager calls backpropagate through `_FocalGrad`; its derivative equals autograd's
    through the same formula (logits from -100 to 100: saturated and clamped elements too)."""
    x = torch.cat(
        [
            torch.randn(40, 6, dtype=dtype) * 6,
            torch.linspace(-100, 100, 12, dtype=dtype).reshape(2, 6),
        ]
    )
    t = _targets(kind, tuple(x.shape), dtype)
    weight = torch.rand(6, dtype=dtype)

    def loss_fn(x):
        return sigmoid_focal_loss(x, t, alpha, gamma, reduction, weight=weight, impl="torch")

    loss, grad = value_and_grad(loss_fn, x)
    monkeypatch.setattr(focal_module, "_closed_form_grad", lambda x, t: False)
    loss_ref, grad_ref = value_and_grad(loss_fn, x)
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)  # the same forward
    assert torch.isfinite(grad).all()
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(grad, grad_ref, rtol=rtol, atol=rtol * grad_ref.abs().max())


@pytest.mark.parametrize("kind", ["binary", "soft", "index"])
def test_eager_backward_uses_the_closed_form_unless_targets_need_gradients(kind):
    x = torch.randn(4, 3, requires_grad=True)
    t = _targets(kind, (4, 3), torch.float32)
    assert type(sigmoid_focal_loss(x, t).grad_fn).__name__ == "_FocalGradBackward"
    with torch.no_grad():
        assert sigmoid_focal_loss(x, t).grad_fn is None
    if kind != "index":
        soft = t.clone().requires_grad_()
        loss = sigmoid_focal_loss(x, soft)
        assert type(loss.grad_fn).__name__ != "_FocalGradBackward"
        assert torch.autograd.grad(loss.sum(), soft)[0].abs().sum() > 0


@pytest.mark.parametrize("kind", ["soft", "index"])
def test_closed_form_second_derivatives_and_retained_graph(kind):
    x = torch.randn(4, 3, dtype=torch.float64) * 3
    t = _targets(kind, (4, 3), torch.float64)
    torch.autograd.gradgradcheck(
        lambda x: sigmoid_focal_loss(x, t, 0.25, 2.0, "none"), [x.requires_grad_()]
    )
    loss = sigmoid_focal_loss(x, t, 0.25, 2.0, "sum")
    first = torch.autograd.grad(loss, x, retain_graph=True)[0]
    second = torch.autograd.grad(loss, x)[0]  # the saved terms were not changed in place
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_weight_per_row_and_background_rows(impl):
    """Class indices with background rows (-1, C) and a per-row weight equal one-hot targets."""
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
                    x, t, reduction=r, weight=weight, impl=impl
                ),
                x,
            )
            assert_close(actual, expected)
            assert_close(grad, expected_grad)


def test_many_classes(impl):
    x, labels = torch.randn(3, 100), torch.tensor([3, -1, 99])
    t = one_hot(labels, x.shape[1])
    for targets in (t, labels):
        actual, grad = value_and_grad(
            lambda x, t=targets: sigmoid_focal_loss(x, t, reduction="sum", impl=impl), x
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
        ({"alpha": 1.5}, ValueError, r"alpha must be in \[0, 1\].*1\.5"),
        ({"alpha": True}, TypeError, "alpha"),
        ({"weight": torch.ones(2)}, ValueError, r"weight must broadcast.*\(2,\)"),
        ({"ignore_index": 1.5, "targets": torch.zeros(4, dtype=torch.long)}, TypeError, "an int"),
        ({"ignore_index": True}, TypeError, "ignore_index"),
        ({"normalizer": 0.0}, ValueError, "normalizer"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"inputs": torch.zeros(4, 3), "targets": torch.zeros(4, 3), **kwargs}
    with pytest.raises(error, match=match):
        sigmoid_focal_loss(**args)


def test_module_validates_options():
    with pytest.raises(ValueError, match="1.5"):
        SigmoidFocalLoss(alpha=1.5)


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


# ------------------------------------------------------- one formula: script, trace, compile
def _script_inputs(dtype, shape=(6, 5, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 6).to(dtype)
    binary = (torch.rand(shape, generator=g) > 0.7).to(dtype)
    soft = torch.rand(shape, generator=g).to(dtype)
    index = torch.randint(-1, shape[-1] + 1, shape[:-1], generator=g)  # -1 and C: background
    return x, {"binary": binary, "soft": soft, "index": index}


def _same(eager: torch.Tensor, other: torch.Tensor) -> None:
    assert other.dtype == eager.dtype and other.shape == eager.shape
    torch.testing.assert_close(other.double(), eager.double(), rtol=2e-5, atol=1e-7)


@pytest.fixture(scope="module")
def scripted():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*torch.jit.*", FutureWarning)
        return torch.jit.script(sigmoid_focal_loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("kind", ["binary", "soft", "index"])
@pytest.mark.parametrize(("alpha", "gamma"), [(None, 0.0), (0.25, 2.0), (-1.0, 0.5), (0.25, 1.7)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scripted_equals_eager(scripted, dtype, kind, alpha, gamma, reduction):
    x, targets = _script_inputs(dtype)
    t = targets[kind]
    _same(
        sigmoid_focal_loss(x, t, alpha, gamma, reduction),
        scripted(x, t, alpha, gamma, reduction),
    )


@pytest.mark.parametrize("kind", ["binary", "index"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("normalizer", [None, 3.0, torch.tensor(2.5), torch.tensor([2.5])])
def test_scripted_weight_ignore_normalizer_equal_eager(scripted, kind, reduction, normalizer):
    x, targets = _script_inputs(torch.float32)
    t = targets[kind].clone()
    ignore = -1.0
    if kind == "binary":
        t[0, 0, :2] = -1.0
    else:
        ignore = 2  # a class index (every row whose target is 2)
    kwargs = {"weight": torch.rand(4), "ignore_index": ignore, "normalizer": normalizer}
    eager = sigmoid_focal_loss(x, t, 0.25, 2.0, reduction, **kwargs)
    _same(eager, scripted(x, t, 0.25, 2.0, reduction, **kwargs))


def test_scripted_gradients_and_errors(scripted):
    x, targets = _script_inputs(torch.float64)
    x.requires_grad_()
    for t in targets.values():
        (g_script,) = torch.autograd.grad(scripted(x, t, 0.25, 2.0, "sum"), x)
        (g_eager,) = torch.autograd.grad(sigmoid_focal_loss(x, t, 0.25, 2.0, "sum"), x)
        torch.testing.assert_close(g_script, g_eager)
    x = x.detach()
    with pytest.raises(torch.jit.Error, match="impl must be 'auto' or 'torch'"):
        scripted(x, targets["binary"], impl="triton")
    with pytest.raises(torch.jit.Error, match="reduction must be"):
        scripted(x, targets["binary"], 0.25, 2.0, "avg")
    with pytest.raises(torch.jit.Error, match="alpha must be in"):
        scripted(x, targets["binary"], 1.5)
    with pytest.raises(torch.jit.Error, match="gamma must be"):
        scripted(x, targets["binary"], 0.25, -1.0)
    with pytest.raises(torch.jit.Error, match="shape inputs.shape"):
        scripted(x, targets["index"][:2])


@pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning")
def test_scripted_confident_logits_exact_and_matches_scripted_torchvision(scripted):
    x = torch.tensor([[14.7, -14.7, 30.0, -30.0]])
    t = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = scripted(x, t, 0.25, 2.0, "none")
    torch.testing.assert_close(out, sigmoid_focal_loss(x, t), rtol=1e-5, atol=0)
    assert (out > 0).all()  # 1 - p_t by subtraction would give 0 at |x| = 30
    import torchvision.ops as tvo

    theirs = torch.jit.script(tvo.sigmoid_focal_loss)
    x, targets = _script_inputs(torch.float64)
    for t in (targets["binary"], targets["soft"]):
        for reduction in REDUCTIONS:
            torch.testing.assert_close(
                scripted(x, t, 0.25, 2.0, reduction), theirs(x, t, 0.25, 2.0, reduction)
            )


class _Head(torch.nn.Module):
    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return sigmoid_focal_loss(logits, labels, 0.25, 2.0, "sum", normalizer=2.0)


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loss = SigmoidFocalLoss(alpha=0.5, gamma=1.5, reduction="mean", ignore_index=-1)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, labels)


@pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning")
def test_scripted_modules():
    x, targets = _script_inputs(torch.float32)
    labels = targets["index"]
    out = torch.jit.script(_Head())(x, labels)
    _same(sigmoid_focal_loss(x, labels, reduction="sum", normalizer=2.0), out)
    holder = _Holder()
    _same(holder(x, labels), torch.jit.script(holder)(x, labels))
    _same(holder.loss(x, labels), torch.jit.script(holder.loss)(x, labels))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning")
@pytest.mark.parametrize("kind", ["binary", "index"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ignore", [None, -1])
def test_trace_generalises_to_other_sizes(kind, reduction, ignore):
    def loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return sigmoid_focal_loss(x, t, 0.25, 2.0, reduction, ignore_index=ignore, impl="torch")

    x, targets = _script_inputs(torch.float64, shape=(64, 5))
    traced = torch.jit.trace(loss, (x, targets[kind]), check_trace=False)
    for rows in (7, 64, 300):
        x2, targets2 = _script_inputs(torch.float64, shape=(rows, 5), seed=rows)
        t2 = targets2[kind]
        if ignore is not None and kind == "binary":
            t2[::3, 0] = -1.0
        _same(loss(x2, t2), traced(x2, t2))


@pytest.mark.parametrize("kind", ["soft", "index"])
def test_torch_compile_fullgraph_dynamic_equals_eager(kind):
    """One graph (no host read, no graph break), equal to eager, also after a size change."""
    torch._dynamo.reset()

    def loss(x, t, w):
        return sigmoid_focal_loss(x, t, 0.25, 1.5, "mean", weight=w, ignore_index=-1)

    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows in (9, 23):
        x, targets = _script_inputs(torch.float32, shape=(rows, 5), seed=rows)
        t = targets[kind]
        if kind == "soft":
            t[::4, 1] = -1.0
        w = torch.rand(5)
        actual, grad = value_and_grad(lambda x, t=t, w=w: compiled(x, t, w), x)
        expected, expected_grad = value_and_grad(lambda x, t=t, w=w: loss(x, t, w), x)
        assert_close(actual, expected)
        assert_close(grad, expected_grad)


def test_python_calls_at_most_twice_torchvision():
    """Small calls cost Python overhead: one call makes at most 2x torchvision's calls."""
    import cProfile
    import pstats

    x, t = torch.randn(2000, 80), (torch.rand(2000, 80) > 0.9).float()

    def calls(fn) -> int:
        fn(x, t, reduction="sum")  # first-call work (imports, caches) not counted
        profile = cProfile.Profile()
        profile.runcall(fn, x, t, reduction="sum")
        return pstats.Stats(profile).total_calls

    ours, theirs = calls(sigmoid_focal_loss), calls(tv_focal)
    assert ours <= 2 * theirs, (ours, theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("impl_name", ["torch", "auto"])
def test_cuda_call_does_not_wait_for_the_gpu(impl_name):
    """No host read of CUDA values (value checks are device-side asserts there)."""
    x = torch.randn(64, 7, device="cuda", requires_grad=True)
    labels = torch.randint(-1, 8, (64,), device="cuda")
    soft = torch.rand(64, 7, device="cuda")
    soft[::5, 0] = -1.0
    calls = [
        lambda: sigmoid_focal_loss(x, labels, reduction="mean", ignore_index=-1, impl=impl_name),
        lambda: sigmoid_focal_loss(x, soft, reduction="mean", ignore_index=-1, impl=impl_name),
        lambda: sigmoid_focal_loss(
            x, soft.clamp(0), reduction="sum", normalizer=torch.tensor(3.0, device="cuda")
        ),
    ]
    for call in calls:
        call()  # warm-up: first-call work may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)
def test_auto_runs_the_formula_while_compiling_and_tracing():
    """The kernel runs eagerly where "auto" picks it; compiled and traced calls get the formula."""
    from benchmarks.kernel_specs import record_launches
    from visionblocks._core.dispatch import use_impl

    torch._dynamo.reset()
    x, t = torch.randn(6, 5), torch.rand(6, 5)

    def loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return sigmoid_focal_loss(x, t, reduction="sum")

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    with use_impl("triton"):
        with record_launches() as launched:
            eager = loss(x, t)
        assert launched
        with record_launches() as launched:
            assert_close(compiled(x, t), eager)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(loss, (x, t), check_trace=False)
                assert_close(traced(x, t), eager)
        assert not launched
