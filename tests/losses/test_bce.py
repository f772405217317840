"""binary_cross_entropy_with_logits / BCEWithLogitsLoss: parity with PyTorch, smoothing, ignore."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import visionblocks
from tests.helpers import assert_close, gradcheck
from visionblocks.losses.bce import BCEWithLogitsLoss, binary_cross_entropy_with_logits
from visionblocks.registry import LOSSES

bce = binary_cross_entropy_with_logits


def _grads(loss, *xs):
    return torch.autograd.grad(loss.sum(), xs)


# ------------------------------------------------------------------------ parity with torch
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    ("shape", "weight_shape", "pos_weight_shape"),
    [
        ((7,), None, None),
        ((4, 5), (5,), None),
        ((4, 5), (4, 1), (5,)),
        ((2, 3, 4, 4), (), (3, 1, 1)),
        ((2, 3, 4, 4), (2, 3, 4, 4), (4,)),
    ],
)
def test_matches_torch(reduction, shape, weight_shape, pos_weight_shape):
    inputs = (torch.randn(shape, dtype=torch.float64) * 3).requires_grad_(True)
    targets = torch.rand(shape, dtype=torch.float64).requires_grad_(True)  # soft targets
    kwargs = {}
    if weight_shape is not None:
        kwargs["weight"] = torch.rand(weight_shape, dtype=torch.float64)
    if pos_weight_shape is not None:
        kwargs["pos_weight"] = torch.rand(pos_weight_shape, dtype=torch.float64) * 3
    expected = F.binary_cross_entropy_with_logits(inputs, targets, reduction=reduction, **kwargs)
    actual = bce(inputs, targets, reduction=reduction, **kwargs)
    assert_close(actual, expected)
    for a, e in zip(_grads(actual, inputs, targets), _grads(expected, inputs, targets)):
        assert_close(a, e)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_label_smoothing(smoothing):
    inputs = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 2, (4, 6)).double()
    pos_weight = torch.rand(6, dtype=torch.float64)
    smoothed = targets * (1 - smoothing) + smoothing / 2  # 1 -> 1 - s/2, 0 -> s/2
    expected = F.binary_cross_entropy_with_logits(inputs, smoothed, pos_weight=pos_weight)
    actual = bce(inputs, targets, pos_weight=pos_weight, label_smoothing=smoothing)
    assert_close(actual, expected)
    assert_close(*(_grads(actual, inputs) + _grads(expected, inputs)))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    ("targets", "ignore_index"),
    [
        (torch.tensor([[1.0, 0.0, -1.0], [0.3, -1.0, 1.0]], dtype=torch.float64), -1),
        (torch.tensor([[1, 0, 255], [0, 255, 1]], dtype=torch.uint8), 255),
        (torch.tensor([[True, False, True], [False, False, True]]), 2),  # nothing ignored
    ],
    ids=["float", "uint8", "bool"],
)
def test_ignore_index_matches_valid_subset(reduction, targets, ignore_index):
    inputs = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(3, dtype=torch.float64)
    valid = targets != ignore_index
    actual = bce(inputs, targets, weight=weight, ignore_index=ignore_index, reduction=reduction)
    full = F.binary_cross_entropy_with_logits(
        inputs, targets.double().masked_fill(~valid, 0), weight=weight, reduction="none"
    )
    expected = {
        "none": full * valid,
        "sum": full[valid].sum(),
        "mean": full[valid].mean(),
    }[reduction]
    assert_close(actual, expected)
    grad = _grads(actual, inputs)[0]
    assert bool((grad[~valid] == 0).all())
    assert_close(grad, _grads(expected, inputs)[0])


def test_ignore_compares_targets_before_smoothing():
    inputs = torch.randn(6, dtype=torch.float64)
    targets = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    # ignore_index=1.0 drops the raw 1.0 targets even though smoothing would turn them into 0.95.
    actual = bce(inputs, targets, label_smoothing=0.1, ignore_index=1.0, reduction="none")
    assert bool((actual[targets == 1.0] == 0).all()) and bool((actual[targets == 0] > 0).all())
    expected = F.binary_cross_entropy_with_logits(inputs[1::2], torch.full((3,), 0.05).double())
    assert_close(bce(inputs, targets, label_smoothing=0.1, ignore_index=1.0), expected)


# ------------------------------------------------------------------------------ edge cases
@pytest.mark.parametrize("extras", [{"ignore_index": -1}, {"label_smoothing": 0.1}])
def test_empty_mean_with_extras_is_connected_zero(extras):
    inputs = torch.randn(0, 4, requires_grad=True)
    # Without extras: NaN, as PyTorch (tests/losses/test_torch_parity.py).
    assert bce(inputs, torch.zeros(0, 4)).isnan()
    loss = bce(inputs, torch.zeros(0, 4), **extras)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert inputs.grad.shape == (0, 4)
    assert bce(inputs, torch.zeros(0, 4), reduction="none").shape == (0, 4)


def test_all_ignored_mean_is_zero_not_nan():
    inputs = torch.randn(3, 4, requires_grad=True)
    loss = bce(inputs, torch.full((3, 4), -1.0), ignore_index=-1, label_smoothing=0.1)
    assert loss.item() == 0.0
    loss.backward()
    assert bool((inputs.grad == 0).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtypes_are_torchs(dtype):
    inputs = torch.randn(4, 8).to(dtype)
    targets = torch.randint(0, 2, (4, 8)).to(dtype)
    # PyTorch returns the targets' dtype for every reduction; the extras keep it.
    for extras in ({}, {"label_smoothing": 0.1}, {"ignore_index": 1.0}):
        assert bce(inputs, targets, reduction="none", **extras).dtype == dtype
        assert bce(inputs, targets, **extras).dtype == dtype
        assert bce(inputs, targets, reduction="sum", **extras).dtype == dtype
    assert bce(inputs, targets.float()).dtype == torch.float32
    assert bce(inputs, targets.long()).dtype == dtype  # integer targets: the inputs' dtype
    pos_weight = torch.rand(8)
    expected = bce(inputs.float(), targets.float(), pos_weight=pos_weight, label_smoothing=0.1)
    actual = bce(inputs, targets, pos_weight=pos_weight, label_smoothing=0.1)
    assert_close(actual, expected, check_dtype=False)


def test_extreme_logits_are_finite():
    inputs = torch.tensor([[1e4, -1e4, 1e4], [-1e4, 1e4, -1e4]], requires_grad=True)
    targets = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    loss = bce(
        inputs, targets, pos_weight=torch.full((3,), 5.0), label_smoothing=0.1, ignore_index=-1
    )
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(inputs.grad).all())


def test_gradcheck():
    targets = torch.tensor([[1.0, 0.0, -1.0], [0.25, 1.0, 0.0]], dtype=torch.float64)
    weight = torch.rand(2, 1, dtype=torch.float64)
    pos_weight = torch.rand(3, dtype=torch.float64) + 0.5  # PyTorch has no gradient for it

    def fn(x, t):
        t = t.masked_fill(targets == -1, -1)  # soft targets are differentiable; -1 is ignored
        return bce(x, t, weight=weight, pos_weight=pos_weight, label_smoothing=0.2, ignore_index=-1)

    # gradcheck nudges targets of 0 and 1 out of [0, 1], which the value check refuses
    with visionblocks.value_checks(False):
        assert gradcheck(fn, (torch.randn(2, 3), targets.clamp_min(0)))


# ----------------------------------------------------------------------- module / registry
def test_module_matches_function_and_registry():
    weight, pos_weight = torch.rand(5), torch.rand(5)
    module = BCEWithLogitsLoss(weight, pos_weight=pos_weight, label_smoothing=0.1, ignore_index=-1)
    inputs, targets = torch.randn(3, 5), torch.randint(-1, 2, (3, 5)).float()
    expected = bce(
        inputs, targets, weight=weight, pos_weight=pos_weight, label_smoothing=0.1, ignore_index=-1
    )
    assert_close(module(inputs, targets), expected)
    assert "label_smoothing=0.1" in repr(module) and "ignore_index=-1" in repr(module)
    assert {"weight", "pos_weight"} <= set(module.state_dict())
    assert LOSSES.get("bce") is BCEWithLogitsLoss
    assert isinstance(LOSSES.build({"type": "bce", "label_smoothing": 0.1}), BCEWithLogitsLoss)


# ------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"targets": torch.zeros(2, 4)}, ValueError, r"same shape, got \(2, 3\) and \(2, 4\)"),
        ({"weight": torch.ones(4)}, ValueError, r"weight must broadcast.*\(2, 3\).*\(4,\)"),
        ({"weight": torch.ones(5, 2, 3)}, ValueError, "weight must broadcast"),
        ({"pos_weight": torch.ones(2)}, ValueError, "pos_weight must broadcast"),
        ({"pos_weight": torch.ones(3) * 1j}, TypeError, "pos_weight must be a real tensor"),
        ({"label_smoothing": 1.0}, ValueError, r"label_smoothing must be in \[0.0, 1.0\)"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"inputs": torch.zeros(2, 3), "targets": torch.zeros(2, 3), **kwargs}
    with pytest.raises(error, match=match):
        bce(**args)


def test_module_validates_eagerly():
    with pytest.raises(ValueError, match="label_smoothing"):
        BCEWithLogitsLoss(label_smoothing=2.0)
    with pytest.raises(TypeError, match="weight"):
        BCEWithLogitsLoss(weight=torch.ones(3) * 1j)
    with pytest.raises(TypeError, match="size_average must be None or a bool"):
        BCEWithLogitsLoss(None, torch.ones(3))  # pos_weight is the 5th argument, as in torch


# ------------------------------------------------------------ target values (issue 19)
def test_mask_with_255_needs_ignore_index():
    inputs = torch.zeros(2, 4)
    mask = torch.tensor([[0, 1, 255, 1], [1, 0, 0, 255]], dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"targets must be in \[0, 1\].*255.*ignore_index"):
        bce(inputs, mask)  # was -126: 255 taken as a probability
    assert bce(inputs, mask, ignore_index=255).item() == pytest.approx(0.6931, abs=1e-4)


@pytest.mark.parametrize("bad", [-1.0, 1.5, float("nan")])
def test_targets_outside_0_1_raise(bad):
    targets = torch.tensor([0.0, 1.0, bad])
    with pytest.raises(ValueError, match=r"targets must be in \[0, 1\]"):
        bce(torch.zeros(3), targets)
    if bad == bad:  # declared as ignored: fine
        assert torch.isfinite(bce(torch.zeros(3), targets, ignore_index=bad))
    with pytest.raises(ValueError, match=r"ignore_index=0.5"):
        bce(torch.zeros(3), targets, ignore_index=0.5)


def test_tensors_on_different_devices_raise():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="inputs and targets must be on the same device"):
        bce(x, x.to("meta"))
    with pytest.raises(ValueError, match=r"inputs, targets and pos_weight .*pos_weight on meta"):
        bce(x, x, pos_weight=torch.ones(3, device="meta"))


def test_bool_weights_and_ignore_index_beyond_int64_are_refused_by_name():
    inputs, targets = torch.zeros(3), torch.tensor([1.0, 0.0, 0.0])
    for name in ("weight", "pos_weight"):
        with pytest.raises(TypeError, match=rf"{name} must be a real tensor.*bool"):
            binary_cross_entropy_with_logits(inputs, targets, **{name: torch.ones(3).bool()})
    with pytest.raises(ValueError, match=r"ignore_index must be in \[-9223372036854775808"):
        binary_cross_entropy_with_logits(inputs, targets, ignore_index=2**70)
