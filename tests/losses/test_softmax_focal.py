"""softmax_focal_loss / SoftmaxFocalLoss: F.cross_entropy at gamma=0, a naive loop otherwise."""

from __future__ import annotations

import kornia
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close, gradcheck
from visionblocks.losses.softmax_focal import SoftmaxFocalLoss, softmax_focal_loss
from visionblocks.registry import LOSSES

SHAPES = [((4,), ()), ((6, 4), (6,)), ((2, 4, 5), (2, 5)), ((2, 3, 5, 7), (2, 5, 7))]
OPTIONS = [
    {},
    {"weight": True},
    {"label_smoothing": 0.2},
    {"weight": True, "label_smoothing": 0.3, "ignore_index": 255},
]
OPTION_IDS = ["plain", "weight", "smoothing", "all"]


def _inputs(logits_shape, target_shape, options, dtype=torch.float64):
    options = dict(options)
    num_classes = logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]
    logits = (torch.randn(logits_shape, dtype=dtype) * 2).requires_grad_(True)
    target = torch.randint(0, num_classes, target_shape)
    if "ignore_index" in options and target.dim() > 0:
        target.view(-1)[::3] = options["ignore_index"]
    if options.pop("weight", False):
        options["weight"] = torch.rand(num_classes, dtype=dtype) + 0.1
    return logits, target, options


def _grad(loss, x):
    return torch.autograd.grad(loss.sum(), x)[0]


def _naive(
    logits,
    target,
    gamma,
    alpha=None,
    *,
    weight=None,
    ignore_index=-100,
    label_smoothing=0.0,
    reduction="mean",
):
    """Per-element loop over the documented formula."""
    if logits.dim() == 1:
        logits, target = logits[None], target[None]
    num_classes = logits.shape[1]
    w = torch.ones(num_classes, dtype=logits.dtype) if weight is None else weight
    flat_logits = logits.movedim(1, -1).reshape(-1, num_classes)
    losses, denom = [], 0.0
    for row, t in zip(flat_logits, target.reshape(-1).tolist()):
        if t == ignore_index:
            losses.append(row.sum() * 0)
            continue
        log_p = row.log_softmax(0)
        s = label_smoothing
        ce = (1 - s) * w[t] * -log_p[t] + s / num_classes * (w * -log_p).sum()
        a = 1.0 if alpha is None else (alpha[t] if isinstance(alpha, torch.Tensor) else alpha)
        losses.append(a * (1 - log_p[t].exp()) ** gamma * ce)
        denom += float(w[t])
    loss = torch.stack(losses)
    if reduction == "none":
        return loss.view(target.shape).squeeze(0) if target.dim() == 1 else loss.view(target.shape)
    return loss.sum() if reduction == "sum" else loss.sum() / denom


# ---------------------------------------------------------------- gamma=0: F.cross_entropy
@pytest.mark.parametrize(("logits_shape", "target_shape"), SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_gamma0_equals_cross_entropy(logits_shape, target_shape, reduction, options):
    logits, target, options = _inputs(logits_shape, target_shape, options)
    expected = F.cross_entropy(logits, target, reduction=reduction, **options)
    actual = softmax_focal_loss(logits, target, gamma=0.0, reduction=reduction, **options)
    assert_close(actual, expected)
    assert_close(_grad(actual, logits), _grad(expected, logits))


# ----------------------------------------------------------------- gamma>0: naive loop
@pytest.mark.parametrize(("logits_shape", "target_shape"), SHAPES[1:])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("alpha", [None, 0.25, "tensor"])
def test_matches_naive_loop(logits_shape, target_shape, reduction, options, alpha):
    logits, target, options = _inputs(logits_shape, target_shape, options)
    if alpha == "tensor":
        alpha = torch.rand(logits_shape[1], dtype=torch.float64)
    actual = softmax_focal_loss(logits, target, 2.0, alpha, reduction=reduction, **options)
    expected = _naive(logits, target, 2.0, alpha, reduction=reduction, **options)
    assert_close(actual, expected)
    assert_close(_grad(actual, logits), _grad(expected, logits))


def test_unbatched_and_fractional_gamma_match_naive_loop():
    logits = torch.randn(5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor(3)
    for gamma in (0.5, 1.5, 3.0):
        actual = softmax_focal_loss(logits, target, gamma, reduction="none")
        assert actual.shape == ()
        assert_close(actual, _naive(logits, target, gamma, reduction="none"))


def test_alpha_semantics_and_kornia_recipe():
    logits, target = torch.randn(3, 4, 5, 5, dtype=torch.float64), torch.randint(0, 4, (3, 5, 5))
    base = softmax_focal_loss(logits, target, reduction="none")
    # A float alpha is a plain scale: no class is treated as background.
    assert_close(softmax_focal_loss(logits, target, alpha=0.25, reduction="none"), 0.25 * base)
    # kornia's [1 - a, a, a, ...] convention (class 0 = background) is reproduced explicitly.
    alpha = torch.tensor([0.75, 0.25, 0.25, 0.25], dtype=torch.float64)
    ours = softmax_focal_loss(logits, target, 2.0, alpha, reduction="none")
    theirs = kornia.losses.focal_loss(logits, target, alpha=0.25, gamma=2.0, reduction="none")
    assert_close(ours, theirs.sum(1))
    # alpha is not in the mean's denominator (weight is).
    assert_close(
        softmax_focal_loss(logits, target, 2.0, alpha), (alpha[target] * base).sum() / base.numel()
    )


def test_focusing_downweights_easy_elements():
    logits = torch.tensor([[6.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    target = torch.tensor([0, 0])
    ce = F.cross_entropy(logits, target, reduction="none")
    fl = softmax_focal_loss(logits, target, reduction="none")
    assert fl[0] / ce[0] < 1e-4 and fl[1] / ce[1] > 0.4


# ---------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4, 4), (2, 3, 0, 4)])
def test_empty_mean_is_connected_zero(weight, shape):
    logits = torch.randn(shape, requires_grad=True)
    target = torch.zeros((shape[0], *shape[2:]), dtype=torch.long)
    loss = softmax_focal_loss(
        logits, target, weight=torch.rand(3) if weight else None, label_smoothing=0.1
    )
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert logits.grad.shape == logits.shape
    assert softmax_focal_loss(logits, target, reduction="none").shape == target.shape


@pytest.mark.parametrize("weight", [False, True])
def test_all_ignored_mean_is_zero_not_nan(weight):
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    target = torch.full((2, 4, 4), -100)
    loss = softmax_focal_loss(
        logits, target, weight=torch.rand(3) if weight else None, label_smoothing=0.2
    )
    assert loss.item() == 0.0
    loss.backward()
    assert bool((logits.grad == 0).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_policy(dtype):
    logits = torch.randn(2, 5, 4, 4).to(dtype)
    target = torch.randint(0, 5, (2, 4, 4))
    assert softmax_focal_loss(logits, target, reduction="none").dtype == dtype
    assert softmax_focal_loss(logits, target, weight=torch.rand(5)).dtype == torch.float32
    assert softmax_focal_loss(logits, target, reduction="sum").dtype == torch.float32
    # Computed from the same (rounded) logits in float32.
    expected = softmax_focal_loss(logits.float(), target, label_smoothing=0.1)
    assert_close(softmax_focal_loss(logits, target, label_smoothing=0.1), expected)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_extreme_logits_are_finite(gamma):
    logits = (torch.randint(0, 2, (4, 3, 5)).float() * 2 - 1) * 1e4
    logits.requires_grad_(True)
    target = torch.randint(0, 3, (4, 5))
    loss = softmax_focal_loss(
        logits, target, gamma, torch.rand(3), weight=torch.rand(3), label_smoothing=0.1
    )
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(logits.grad).all())


@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_gradcheck(gamma):
    logits = torch.randn(2, 3, 3, 2)
    target = torch.randint(0, 3, (2, 3, 2))
    target[1, 0, 1] = -1
    weight = torch.rand(3, dtype=torch.float64) + 0.2
    alpha = torch.rand(3, dtype=torch.float64)

    def fn(x):
        return softmax_focal_loss(
            x, target, gamma, alpha, weight=weight, ignore_index=-1, label_smoothing=0.1
        )

    assert gradcheck(fn, (logits,))


# ----------------------------------------------------------------------------- dispatch
def test_impl():
    logits, target = torch.randn(4, 3), torch.randint(0, 3, (4,))
    expected = softmax_focal_loss(logits, target, impl="torch")
    assert_close(softmax_focal_loss(logits, target, impl="auto"), expected)
    with pytest.raises(RuntimeError, match="'softmax_focal_loss' has no triton kernel"):
        softmax_focal_loss(logits, target, impl="triton")


# ---------------------------------------------------------------------- module / registry
def test_module_matches_function_and_registry():
    weight, alpha = torch.rand(3), torch.rand(3)
    module = SoftmaxFocalLoss(1.5, alpha, weight=weight, ignore_index=255, label_smoothing=0.1)
    logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    expected = softmax_focal_loss(
        logits, target, 1.5, alpha, weight=weight, ignore_index=255, label_smoothing=0.1
    )
    assert_close(module(logits, target), expected)
    assert "gamma=1.5" in repr(module) and "ignore_index=255" in repr(module)
    assert {"alpha", "weight"} <= set(module.state_dict())
    assert "alpha=0.25" in repr(SoftmaxFocalLoss(alpha=0.25))
    assert LOSSES.get("softmax_focal") is SoftmaxFocalLoss
    assert isinstance(LOSSES.build({"type": "softmax_focal", "gamma": 1.0}), SoftmaxFocalLoss)


# ---------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"target": torch.zeros(2, 3)}, TypeError, "use cross_entropy for probability"),
        ({"target": torch.zeros(3).long()}, ValueError, r"shape \(2,\).*got \(3,\)"),
        ({"target": torch.tensor([0, 5])}, ValueError, r"\[0, 3\).*got 5"),
        ({"gamma": True}, TypeError, "gamma"),
        ({"alpha": 1.5}, ValueError, r"alpha must be in \[0.0, 1.0\]"),
        ({"alpha": torch.ones(4)}, ValueError, r"alpha must have shape \(3,\)"),
        ({"weight": torch.ones(2)}, ValueError, r"weight must have shape \(3,\)"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"logits": torch.zeros(2, 3), "target": torch.zeros(2).long(), **kwargs}
    with pytest.raises(error, match=match):
        softmax_focal_loss(**args)


def test_tensors_on_different_devices_and_bad_indices_raise():
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="logits and target must be on the same device"):
        softmax_focal_loss(logits.to("meta"), target)
    with pytest.raises(ValueError, match=r"logits, target and alpha .*alpha on meta"):
        softmax_focal_loss(logits, target, alpha=torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match=r"in \[0, 3\) or equal ignore_index \(255\), got 7"):
        softmax_focal_loss(logits, torch.tensor([7, 255]), ignore_index=255)


def test_infinite_gamma_and_negative_alpha_are_refused():
    logits, target = torch.tensor([[0.0, 3.0]]), torch.tensor([0])
    with pytest.raises(ValueError, match=r"gamma must be in \[0.0, inf\), got inf"):
        softmax_focal_loss(logits, target, gamma=float("inf"))
    with pytest.raises(ValueError, match=r"alpha must be finite and >= 0"):
        softmax_focal_loss(logits, target, alpha=torch.tensor([-1.0, 2.0]))
