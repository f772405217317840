"""cross_entropy / CrossEntropyLoss: parity with F.cross_entropy, OHEM against a naive loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close, gradcheck
from visionblocks.losses.ce import CrossEntropyLoss, _ohem_keep, cross_entropy
from visionblocks.registry import LOSSES

# (logits shape, target shape): unbatched, classification, sequence, segmentation.
SHAPES = [((4,), ()), ((6, 4), (6,)), ((2, 4, 5), (2, 5)), ((2, 3, 5, 7), (2, 5, 7))]


def _inputs(logits_shape, target_shape, *, ignore=None, dtype=torch.float64):
    num_classes = logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]
    logits = torch.randn(logits_shape, dtype=dtype) * 2
    target = torch.randint(0, num_classes, target_shape)
    if ignore is not None and target.dim() > 0:
        target.view(-1)[::3] = ignore
    return logits, target, num_classes


def _grad(loss, x):
    return torch.autograd.grad(loss.sum(), x)[0]


# ------------------------------------------------------------------------ F.cross_entropy parity
@pytest.mark.parametrize(("logits_shape", "target_shape"), SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"weight": True},
        {"label_smoothing": 0.2},
        {"weight": True, "label_smoothing": 0.3, "ignore_index": 255},
        {"ignore_index": -100},
    ],
    ids=["plain", "weight", "smoothing", "all", "ignore"],
)
def test_matches_torch_class_targets(logits_shape, target_shape, reduction, options):
    options = dict(options)
    logits, target, num_classes = _inputs(
        logits_shape, target_shape, ignore=options.get("ignore_index")
    )
    if options.pop("weight", False):
        options["weight"] = torch.rand(num_classes, dtype=torch.float64) + 0.1
    logits.requires_grad_(True)
    expected = F.cross_entropy(logits, target, reduction=reduction, **options)
    actual = cross_entropy(logits, target, reduction=reduction, **options)
    assert_close(actual, expected)
    assert_close(_grad(actual, logits), _grad(expected, logits))
    # top_k=1.0 keeps every valid element: identical to no mining.
    assert_close(cross_entropy(logits, target, reduction=reduction, top_k=1.0, **options), actual)


@pytest.mark.parametrize("logits_shape", [(4,), (6, 4), (2, 3, 5, 7)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("options", [{}, {"weight": True, "label_smoothing": 0.25}])
def test_matches_torch_probability_targets(logits_shape, reduction, options):
    options = dict(options)
    dim = 0 if len(logits_shape) == 1 else 1
    logits = torch.randn(logits_shape, dtype=torch.float64, requires_grad=True)
    probs = torch.randn(logits_shape, dtype=torch.float64).softmax(dim)
    if options.pop("weight", False):
        options["weight"] = torch.rand(logits_shape[dim], dtype=torch.float64)
    expected = F.cross_entropy(logits, probs, reduction=reduction, **options)
    actual = cross_entropy(logits, probs, reduction=reduction, **options)
    assert_close(actual, expected)
    assert_close(_grad(actual, logits), _grad(expected, logits))


# ----------------------------------------------------------------------------------- OHEM
def _naive_ohem(logits, target, top_k, *, weight=None, ignore_index=-100, label_smoothing=0.0):
    """Per-element loop: loss of each valid element alone, Python sort, weighted mean of the top k."""
    num_classes = logits.shape[1]
    flat_logits = logits.movedim(1, -1).reshape(-1, num_classes)
    flat_target = target.reshape(-1)
    items = []
    for row, t in zip(flat_logits, flat_target.tolist()):
        if t == ignore_index:
            continue
        loss = F.cross_entropy(
            row[None],
            torch.tensor([t]),
            weight=weight,
            label_smoothing=label_smoothing,
            reduction="sum",
        )
        items.append((loss, 1.0 if weight is None else float(weight[t])))
    k = math.ceil(top_k * len(items))
    kept = sorted(items, key=lambda item: -float(item[0]))[:k]
    return sum(loss for loss, _ in kept) / sum(w for _, w in kept)


@pytest.mark.parametrize("top_k", [0.05, 0.3, 0.7])
@pytest.mark.parametrize(
    "options",
    [{}, {"weight": True}, {"weight": True, "label_smoothing": 0.2, "ignore_index": 255}],
    ids=["plain", "weight", "all"],
)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (9, 4)])
def test_ohem_matches_naive_loop(top_k, options, shape):
    options = dict(options)
    logits, target, num_classes = _inputs(shape, (shape[0], *shape[2:]))
    if "ignore_index" in options:
        target.view(-1)[::4] = options["ignore_index"]
    if options.pop("weight", False):
        options["weight"] = torch.rand(num_classes, dtype=torch.float64) + 0.1
    actual = cross_entropy(logits, target, top_k=top_k, **options)
    assert_close(actual, _naive_ohem(logits, target, top_k, **options))


@pytest.mark.parametrize("use_sort", [False, True], ids=["topk", "sort"])
@pytest.mark.parametrize(
    ("top_k", "n", "expected"),
    [(0.07, 100, 7), (0.3, 10, 3), (0.5, 7, 4), (1e-9, 5, 1), (0.999, 3, 3), (0.34, 3, 2)],
)
def test_ohem_exact_count_with_ties(use_sort, top_k, n, expected):
    # All losses equal: exactly ceil(top_k * n) survive, at least one; 0.07 * 100 is
    # 7.000000000000001 in float64 but keeps 7.
    loss = torch.ones(n)
    assert int(_ohem_keep(loss, None, top_k, use_sort=use_sort).sum()) == expected
    valid = torch.ones(2 * n, dtype=torch.bool)
    valid[1::2] = False
    keep = _ohem_keep(torch.ones(2 * n), valid, top_k, use_sort=use_sort)
    assert int(keep.sum()) == expected and not bool((keep & ~valid).any())


@pytest.mark.parametrize("use_sort", [False, True], ids=["topk", "sort"])
def test_ohem_keeps_hardest_and_skips_ignored(use_sort):
    loss = torch.tensor([0.1, 5.0, 0.3, 9.0, 0.2, 4.0])
    valid = torch.tensor([True, True, True, False, True, True])  # 9.0 is ignored
    keep = _ohem_keep(loss, valid, 0.4, use_sort=use_sort)  # ceil(0.4 * 5) = 2
    assert keep.tolist() == [False, True, False, False, False, True]


def test_ohem_segmentation_count_gradient_and_reductions():
    logits = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 4, (2, 6, 6))
    target[0, :2] = 255
    n_valid = int((target != 255).sum())
    k = math.ceil(0.25 * n_valid)
    none = cross_entropy(logits, target, ignore_index=255, top_k=0.25, reduction="none")
    assert none.shape == target.shape and int((none > 0).sum()) == k
    assert bool((none[target == 255] == 0).all())
    total = cross_entropy(logits, target, ignore_index=255, top_k=0.25, reduction="sum")
    mean = cross_entropy(logits, target, ignore_index=255, top_k=0.25)
    assert_close(total, none.sum())
    assert_close(mean, total / k)
    grad = _grad(mean, logits)
    dropped = (none == 0).unsqueeze(1).expand_as(grad)
    assert bool((grad[dropped] == 0).all()) and bool((grad[~dropped] != 0).any())


def test_ohem_probability_targets():
    logits = torch.randn(10, 3, dtype=torch.float64)
    probs = torch.rand(10, 3, dtype=torch.float64).softmax(1)
    per_sample = F.cross_entropy(logits, probs, reduction="none")
    expected = per_sample.sort(descending=True).values[:4].mean()
    assert_close(cross_entropy(logits, probs, top_k=0.4), expected)


# ------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("top_k", [1.0, 0.5])
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4, 4), (2, 3, 0, 4)])
def test_empty_mean_with_ohem_is_connected_zero(top_k, weight, shape):
    logits = torch.randn(shape, requires_grad=True)
    target = torch.zeros((shape[0], *shape[2:]), dtype=torch.long)
    w = torch.rand(3) if weight else None
    # Without top_k: NaN, as F.cross_entropy (tests/losses/test_torch_parity.py).
    assert cross_entropy(logits, target, weight=w).isnan()
    loss = cross_entropy(logits, target, weight=w, top_k=top_k)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert logits.grad is not None and logits.grad.shape == logits.shape
    assert cross_entropy(logits, target, reduction="sum").item() == 0.0
    assert cross_entropy(logits, target, reduction="none").shape == target.shape


@pytest.mark.parametrize("top_k", [None, 0.5])
def test_an_all_zero_class_weight_is_refused(top_k):
    # every class weighs 0: the mean is 0 / 0 (F.cross_entropy: NaN), a config mistake
    logits, target = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    rule = r"weight must be finite and >= 0 with a nonzero entry"
    with pytest.raises(ValueError, match=rule + r".*got values in \[0.0, 0.0\]"):
        cross_entropy(logits, target, weight=torch.zeros(3), top_k=top_k)
    with pytest.raises(ValueError, match=rule):
        CrossEntropyLoss(weight=torch.zeros(3))
    one = torch.tensor([0.0, 1.0, 0.0])  # one class counts: the mean of its elements
    expected = F.cross_entropy(logits, target, reduction="none")[[1, 3]].mean()
    assert_close(cross_entropy(logits, target, weight=one, top_k=top_k and 1.0), expected)


@pytest.mark.parametrize("top_k", [1.0, 0.5])
@pytest.mark.parametrize("weight", [False, True])
def test_all_ignored_mean_with_ohem_is_zero_not_nan(top_k, weight):
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    target = torch.full((2, 4, 4), 255)
    loss = cross_entropy(
        logits, target, weight=torch.rand(3) if weight else None, ignore_index=255, top_k=top_k
    )
    assert loss.item() == 0.0
    loss.backward()
    assert bool((logits.grad == 0).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k", [None, 0.5])
def test_dtypes_are_torchs(dtype, top_k):
    logits32 = torch.randn(2, 5, 4, 4)
    target = torch.randint(0, 5, (2, 4, 4))
    logits = logits32.to(dtype)
    none = cross_entropy(logits, target, reduction="none", top_k=top_k)
    mean = cross_entropy(logits, target, top_k=top_k)
    # F.cross_entropy returns the logits' dtype for every reduction; OHEM too.
    assert none.dtype == mean.dtype == dtype
    assert cross_entropy(logits, target, reduction="sum", top_k=top_k).dtype == dtype
    expected = cross_entropy(logits.float(), target, top_k=top_k)
    assert_close(mean, expected, check_dtype=False)


@pytest.mark.parametrize("top_k", [None, 0.3])
def test_extreme_logits_are_finite(top_k):
    logits = (torch.randint(0, 2, (4, 3, 5)).float() * 2 - 1) * 1e4
    logits.requires_grad_(True)
    target = torch.randint(0, 3, (4, 5))
    loss = cross_entropy(logits, target, label_smoothing=0.1, weight=torch.rand(3), top_k=top_k)
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(logits.grad).all())


def test_gradcheck():
    logits = torch.randn(2, 3, 3, 2)
    target = torch.randint(0, 3, (2, 3, 2))
    target[0, 0, 0] = 7
    weight = torch.rand(3, dtype=torch.float64) + 0.2  # F.nll_loss has no gradient for weight

    def fn(x):
        return cross_entropy(
            x, target, weight=weight, ignore_index=7, label_smoothing=0.1, top_k=0.6
        )

    assert gradcheck(fn, (logits,))
    probs = torch.rand(4, 3).softmax(1)
    assert gradcheck(lambda x: cross_entropy(x, probs, label_smoothing=0.2), (torch.randn(4, 3),))


# ----------------------------------------------------------------------- module / registry
def test_module_matches_function_and_registry():
    weight = torch.rand(3)
    module = CrossEntropyLoss(weight=weight, ignore_index=255, label_smoothing=0.1, top_k=0.5)
    logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    expected = cross_entropy(
        logits, target, weight=weight, ignore_index=255, label_smoothing=0.1, top_k=0.5
    )
    assert_close(module(logits, target), expected)
    assert "top_k=0.5" in repr(module) and "label_smoothing=0.1" in repr(module)
    assert "weight" in module.state_dict()
    assert LOSSES.get("ce") is CrossEntropyLoss
    built = LOSSES.build({"type": "ce", "top_k": 0.5})
    assert isinstance(built, CrossEntropyLoss) and built.top_k == 0.5
    assert module.double().weight.dtype == torch.float64  # buffer follows .to()


# --------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("logits", "target", "kwargs", "error", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(3).long(), {}, ValueError, r"shape \(2,\).*got \(3,\)"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 5).long(), {}, ValueError, r"\(2, 4\)"),
        (torch.zeros(2, 3), torch.zeros(2, 4), {}, ValueError, "probability targets"),
        (torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool), {}, TypeError, "class indices"),
        (torch.zeros(()), torch.zeros(()).long(), {}, ValueError, "0-d"),
        (torch.zeros(2, 3), torch.tensor([0, 3]), {}, ValueError, r"\[0, 3\).*got 3"),
        (torch.zeros(2, 3), torch.tensor([0, -1]), {}, ValueError, "got -1"),
        (torch.zeros(2, 3), torch.zeros(2).long(), {"label_smoothing": 1.5}, ValueError, "1.5"),
        (torch.zeros(2, 3), torch.zeros(2).long(), {"top_k": 0.0}, ValueError, r"top_k.*\(0.0"),
        (torch.zeros(2, 3), torch.zeros(2).long(), {"top_k": 1.5}, ValueError, "1.5"),
        (torch.zeros(2, 3), torch.zeros(2).long(), {"top_k": True}, TypeError, "top_k"),
        (
            torch.zeros(2, 3),
            torch.zeros(2).long(),
            {"weight": torch.ones(4)},
            ValueError,
            r"\(3,\).*got \(4,\)",
        ),
        (
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            {"ignore_index": 0},
            ValueError,
            "not supported for probability",
        ),
    ],
)
def test_bad_inputs(logits, target, kwargs, error, match):
    with pytest.raises(error, match=match):
        cross_entropy(logits, target, **kwargs)


def test_module_validates_eagerly():
    with pytest.raises(ValueError, match="top_k"):
        CrossEntropyLoss(top_k=2.0)


# ------------------------------------------------------ values and devices (issue 19)
def test_class_indices_and_probabilities_out_of_range_raise():
    logits = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"in \[0, 3\) or equal ignore_index \(-100\), got 3"):
        cross_entropy(logits, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"got -1"):
        cross_entropy(logits, torch.tensor([-1, 255]), ignore_index=255)
    assert torch.isfinite(cross_entropy(logits, torch.tensor([1, 255]), ignore_index=255))
    with pytest.raises(ValueError, match=r"target must be in \[0, 1\].*probabilities"):
        cross_entropy(logits, torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.0]]))


def test_tensors_on_different_devices_raise():
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="logits and target must be on the same device"):
        cross_entropy(logits, target.to("meta"))
    with pytest.raises(ValueError, match=r"logits, target and weight .*weight on meta"):
        cross_entropy(logits, target, weight=torch.ones(3, device="meta"))


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_negative_or_non_finite_class_weights_are_refused(bad):
    # a negative weight makes the loss unbounded below (F.cross_entropy gives -inf here)
    logits, target = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]), torch.tensor([0, 1, 1])
    weight = torch.tensor([2.0, bad])
    with pytest.raises(ValueError, match=r"weight must be finite and >= 0.*got values in"):
        cross_entropy(logits, target, weight=weight)
    with pytest.raises(ValueError, match=r"weight must be finite and >= 0"):
        CrossEntropyLoss(weight=weight)


def test_a_batch_of_zero_weight_classes_is_nan_as_every_element_ignored():
    # the documented NaN: a mean over zero total weight, as F.cross_entropy
    logits, target = torch.zeros(3, 2), torch.ones(3, dtype=torch.long)
    weight = torch.tensor([1.0, 0.0])
    assert cross_entropy(logits, target, weight=weight).isnan()
    assert F.cross_entropy(logits, target, weight=weight).isnan()
    assert cross_entropy(logits, target, weight=weight, reduction="sum").item() == 0.0


def test_ignore_index_beyond_int64_is_refused_by_name():
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"ignore_index must be in \[-9223372036854775808"):
        cross_entropy(logits, target, ignore_index=2**70)
