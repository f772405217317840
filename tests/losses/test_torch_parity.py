"""cross_entropy / CrossEntropyLoss and binary_cross_entropy_with_logits / BCEWithLogitsLoss
against PyTorch's functions and modules of the same names (issue 16).

With their extras off (``top_k``; ``label_smoothing``/``ignore_index`` of BCE) they are
PyTorch's: positional signatures, values, gradients, dtypes, NaN of an empty ``"mean"``,
legacy ``size_average``/``reduce``, module attributes and state dicts, and the error types for
bad inputs. The deliberate differences are only for calls PyTorch rejects (or that break its
documented value ranges), and are checked at the end.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import visionblocks
from visionblocks.losses import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    binary_cross_entropy_with_logits,
    cross_entropy,
)

PAIRS = [
    (cross_entropy, F.cross_entropy),
    (binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits),
    (CrossEntropyLoss, nn.CrossEntropyLoss),
    (BCEWithLogitsLoss, nn.BCEWithLogitsLoss),
]


def _same(actual, expected, *, exact_dtype=True):
    if exact_dtype:
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, equal_nan=True, check_dtype=exact_dtype)


def _both(fn, ref, *args, **kwargs):
    """Run ``fn`` and ``ref`` on copies of the same inputs; compare values and gradients.

    The floating-point tensors among the first two arguments (logits, soft targets) are made
    leaves that require grad, in the same way for both.
    """
    leaves = [a for a in args[:2] if isinstance(a, torch.Tensor) and a.is_floating_point()]
    ours = [a.detach().clone().requires_grad_(True) for a in leaves]
    theirs = [a.detach().clone().requires_grad_(True) for a in leaves]

    def swap(copies):
        it = iter(copies)
        return [next(it) if any(a is leaf for leaf in leaves) else a for a in args]

    actual = fn(*swap(ours), **kwargs)
    expected = ref(*swap(theirs), **kwargs)
    _same(actual, expected)
    if expected.requires_grad and expected.numel():
        g_ours = torch.autograd.grad(actual.sum(), ours, allow_unused=True)
        g_theirs = torch.autograd.grad(expected.sum(), theirs, allow_unused=True)
        for a, e in zip(g_ours, g_theirs):
            if e is None:
                assert a is None or not a.any()
            else:
                _same(a, e)
    return actual


# ----------------------------------------------------------------------------- signatures
@pytest.mark.parametrize(("ours", "torchs"), PAIRS, ids=lambda f: f.__name__)
def test_positional_signature_is_torchs_then_keyword_only_extras(ours, torchs):
    ours_params = list(inspect.signature(ours).parameters.values())
    torch_params = list(inspect.signature(torchs).parameters.values())
    # The tensors come first (named logits/target, inputs/targets: ours, input/target: torch's).
    skip = 0 if inspect.isclass(ours) else 2
    positional = [p for p in ours_params if p.kind is p.POSITIONAL_OR_KEYWORD][skip:]
    expected = [(p.name, p.default) for p in torch_params[skip:]]
    assert [(p.name, p.default) for p in positional] == expected
    extras = ours_params[skip + len(positional) :]
    assert extras and all(p.kind is p.KEYWORD_ONLY for p in extras)


def test_positional_calls_mean_what_they_mean_in_torch():
    x, t, w = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0]), torch.rand(3) + 0.5
    args = (w, None, 1, None, "sum", 0.1)  # weight, size_average, ignore_index, reduce, ...
    _both(cross_entropy, F.cross_entropy, x, t, *args)
    ours, theirs = CrossEntropyLoss(*args), nn.CrossEntropyLoss(*args)
    for name in ("ignore_index", "reduction", "label_smoothing"):
        assert getattr(ours, name) == getattr(theirs, name)
    _same(ours(x, t), theirs(x, t))
    assert CrossEntropyLoss(w).weight is w and nn.CrossEntropyLoss(w).weight is w

    y = (torch.rand(5, 3) > 0.5).float()
    args = (w, None, None, "sum", torch.rand(3) + 0.5)  # weight, ..., reduction, pos_weight
    _both(binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits, x, y, *args)
    ours, theirs = BCEWithLogitsLoss(*args), nn.BCEWithLogitsLoss(*args)
    assert ours.reduction == theirs.reduction == "sum"
    assert ours.pos_weight is theirs.pos_weight
    _same(ours(x, y), theirs(x, y))


@pytest.mark.parametrize(
    ("size_average", "reduce"), [(False, None), (None, False), (True, True), (False, True)]
)
def test_legacy_size_average_and_reduce(size_average, reduce):
    x, t = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    y = torch.rand(4, 3)
    legacy = {"size_average": size_average, "reduce": reduce}
    with pytest.warns(UserWarning, match="size_average and reduce args will be deprecated"):
        actual = cross_entropy(x, t, **legacy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(actual, F.cross_entropy(x, t, **legacy))
        _same(
            binary_cross_entropy_with_logits(x, y, **legacy),
            F.binary_cross_entropy_with_logits(x, y, **legacy),
        )
        for ours, theirs in PAIRS[2:]:
            assert ours(**legacy).reduction == theirs(**legacy).reduction


@pytest.mark.parametrize(("ours", "torchs"), PAIRS[:2], ids=lambda f: f.__name__)
def test_reduction_values(ours, torchs):
    x = torch.randn(4, 3)
    t = torch.tensor([0, 1, 2, 1]) if ours is cross_entropy else torch.rand(4, 3)
    for reduction in ("none", "mean", "sum"):
        _same(ours(x, t, reduction=reduction), torchs(x, t, reduction=reduction))
    with pytest.warns(UserWarning, match="elementwise_mean"):
        actual = ours(x, t, reduction="elementwise_mean")
    with pytest.warns(UserWarning, match="elementwise_mean"):
        _same(actual, torchs(x, t, reduction="elementwise_mean"))
    for bad in ("avg", "MEAN", "batchmean"):
        with pytest.raises(ValueError):
            torchs(x, t, reduction=bad)
        with pytest.raises(ValueError, match="reduction"):
            ours(x, t, reduction=bad)


# ------------------------------------------------------------------------- cross entropy
# (logits shape, target shape): no batch (0-d target), classification, sequence, segmentation.
CE_SHAPES = [((4,), ()), ((6, 4), (6,)), ((2, 4, 5), (2, 5)), ((2, 3, 5, 7), (2, 5, 7))]


@pytest.mark.parametrize(("logits_shape", "target_shape"), CE_SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"weight": True},
        {"label_smoothing": 0.3},
        {"label_smoothing": 1.0},
        {"ignore_index": 2},
        {"weight": True, "ignore_index": 1, "label_smoothing": 0.1},
    ],
    ids=["plain", "weight", "smoothing", "smoothing1", "ignore", "weight_ignore_smoothing"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ce_class_indices(logits_shape, target_shape, reduction, options, dtype):
    options = dict(options)
    num_classes = logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]
    logits = torch.randn(logits_shape, dtype=dtype) * 2
    target = torch.randint(0, num_classes, target_shape)
    if options.pop("weight", False):
        options["weight"] = torch.rand(num_classes, dtype=dtype) + 0.1
    # weight + ignore_index: "mean" divides by the sum of the counted targets' weights
    _both(cross_entropy, F.cross_entropy, logits, target, reduction=reduction, **options)


@pytest.mark.parametrize("logits_shape", [(4,), (6, 4), (2, 3, 5, 7)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    "options",
    [{}, {"weight": True}, {"label_smoothing": 0.25}, {"weight": True, "label_smoothing": 1.0}],
)
def test_ce_class_probabilities(logits_shape, reduction, options):
    options = dict(options)
    dim = 0 if len(logits_shape) == 1 else 1
    logits = torch.randn(logits_shape, dtype=torch.float64)
    probs = torch.randn(logits_shape, dtype=torch.float64).softmax(dim)
    if options.pop("weight", False):
        options["weight"] = torch.rand(logits_shape[dim], dtype=torch.float64)
    _both(cross_entropy, F.cross_entropy, logits, probs, reduction=reduction, **options)


@pytest.mark.parametrize(
    ("logits", "target", "options"),
    [
        (torch.randn(3, 4), torch.full((3,), -100), {}),  # every element ignored
        (torch.randn(2, 4, 3), torch.full((2, 3), 255), {"ignore_index": 255}),
        (torch.randn(4), torch.tensor(-100), {}),  # no batch, ignored
        # targets only of zero-weight classes (an all-zero weight is refused: test_ce.py)
        (torch.randn(3, 4), torch.tensor([0, 1, 2]), {"weight": torch.tensor([0.0, 0, 0, 1])}),
        (torch.randn(0, 4), torch.zeros(0, dtype=torch.long), {}),  # empty batch
        (torch.randn(2, 4, 0), torch.zeros(2, 0, dtype=torch.long), {"weight": torch.ones(4)}),
        (torch.randn(0, 4), torch.rand(0, 4), {}),  # empty, probabilities
    ],
)
def test_ce_mean_over_nothing_is_nan_as_torch(logits, target, options):
    actual = _both(cross_entropy, F.cross_entropy, logits, target, **options)
    assert actual.isnan()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ce_dtypes(dtype, reduction):
    logits, target = torch.randn(4, 3, 5).to(dtype), torch.randint(0, 3, (4, 5))
    _both(cross_entropy, F.cross_entropy, logits, target, reduction=reduction)
    probs = torch.rand(4, 3, 5).softmax(1)
    for t in (probs, probs.to(dtype), probs.double()):  # promoted with the logits' dtype
        _both(cross_entropy, F.cross_entropy, logits, t, reduction=reduction)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast runs it in float32
        _both(cross_entropy, F.cross_entropy, logits, target, reduction=reduction)
        _both(cross_entropy, F.cross_entropy, logits.float(), target, reduction=reduction)
    # OHEM (an extra) keeps PyTorch's dtype too.
    assert cross_entropy(logits, target, reduction=reduction, top_k=0.5).dtype == dtype


def test_ce_module_state_dict_and_attributes():
    w = torch.rand(3)
    ours, theirs = CrossEntropyLoss(w, ignore_index=4), nn.CrossEntropyLoss(w, ignore_index=4)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    ours.load_state_dict(nn.CrossEntropyLoss(torch.ones(3)).state_dict())
    assert torch.equal(ours.weight, torch.ones(3))
    theirs.load_state_dict(CrossEntropyLoss(torch.full((3,), 2.0)).state_dict())
    assert torch.equal(theirs.weight, torch.full((3,), 2.0))
    for name in ("ignore_index", "reduction", "label_smoothing"):
        assert getattr(CrossEntropyLoss(), name) == getattr(nn.CrossEntropyLoss(), name)
    assert CrossEntropyLoss().weight is None and list(CrossEntropyLoss().state_dict()) == []


# Bad inputs: where PyTorch raises (type), ours raises that type too (and ValueError).
CE_ERRORS = [
    ("target batch", torch.zeros(2, 3), torch.zeros(3).long(), {}, ValueError),
    ("target shape", torch.zeros(2, 3, 4), torch.zeros(2, 5).long(), {}, RuntimeError),
    ("probs shape", torch.zeros(2, 3), torch.zeros(2, 4), {}, RuntimeError),
    (
        "weight shape",
        torch.zeros(2, 3),
        torch.zeros(2).long(),
        {"weight": torch.ones(4)},
        RuntimeError,
    ),
    ("index too big", torch.zeros(2, 3), torch.tensor([0, 3]), {}, IndexError),
    ("index negative", torch.zeros(2, 3), torch.tensor([0, -1]), {}, IndexError),
    ("no classes", torch.zeros(2, 0), torch.tensor([0, 0]), {}, IndexError),
    ("0-d logits", torch.zeros(()), torch.zeros((), dtype=torch.long), {}, RuntimeError),
    ("probs + ignore", torch.zeros(2, 3), torch.rand(2, 3), {"ignore_index": 0}, RuntimeError),
    (
        "smoothing > 1",
        torch.zeros(2, 3),
        torch.zeros(2).long(),
        {"label_smoothing": 1.5},
        RuntimeError,
    ),
    ("reduction", torch.zeros(2, 3), torch.zeros(2).long(), {"reduction": "avg"}, ValueError),
    ("ignore float", torch.zeros(2, 3), torch.zeros(2).long(), {"ignore_index": 1.5}, TypeError),
    ("logits list", [[0.0, 1.0]], torch.zeros(1).long(), {}, TypeError),
]


@pytest.mark.parametrize(
    ("logits", "target", "options", "error"),
    [case[1:] for case in CE_ERRORS],
    ids=[case[0] for case in CE_ERRORS],
)
def test_ce_error_types(logits, target, options, error):
    with pytest.raises(error):
        F.cross_entropy(logits, target, **options)
    with pytest.raises(error) as info:
        cross_entropy(logits, target, **options)
    assert isinstance(info.value, ValueError | TypeError)  # and visionblocks' clear error


# ------------------------------------------------------------------------------------ BCE
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    ("shape", "weight_shape", "pos_weight_shape"),
    [
        ((), None, None),  # 0-d
        ((), (), ()),
        ((7,), (7,), (1,)),
        ((4, 5), (5,), (5,)),
        ((4, 5), (4, 1), (1, 5)),
        ((2, 3, 4, 4), (), (3, 1, 1)),
        ((2, 3, 4, 4), (2, 3, 4, 4), (4,)),
    ],
)
def test_bce_values_and_grads(reduction, shape, weight_shape, pos_weight_shape):
    inputs = torch.randn(shape, dtype=torch.float64) * 3
    targets = torch.rand(shape, dtype=torch.float64)  # soft targets: differentiable too
    kwargs = {}
    if weight_shape is not None:
        kwargs["weight"] = torch.rand(weight_shape, dtype=torch.float64)
    if pos_weight_shape is not None:
        kwargs["pos_weight"] = torch.rand(pos_weight_shape, dtype=torch.float64) * 3
    _both(
        binary_cross_entropy_with_logits,
        F.binary_cross_entropy_with_logits,
        inputs,
        targets,
        reduction=reduction,
        **kwargs,
    )


def test_bce_mean_over_nothing_is_nan_as_torch():
    x = torch.randn(0, 3)
    actual = _both(binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits, x, x)
    assert actual.isnan()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    ("x_dtype", "t_dtype"),
    [
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float32, torch.float16),  # PyTorch returns the targets' dtype
        (torch.float32, torch.float64),
    ],
)
def test_bce_dtypes(reduction, x_dtype, t_dtype):
    x, t = torch.randn(4, 6).to(x_dtype), (torch.rand(4, 6) > 0.5).to(t_dtype)
    f = (binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits)
    _both(*f, x, t, reduction=reduction)
    _both(*f, x, t, reduction=reduction, pos_weight=torch.rand(6), weight=torch.rand(6).double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _both(*f, x, t, reduction=reduction)
    expected = F.binary_cross_entropy_with_logits(x, t, reduction=reduction).dtype
    for extras in ({"label_smoothing": 0.1}, {"ignore_index": 0.0}):  # extras keep the dtype
        assert (
            binary_cross_entropy_with_logits(x, t, reduction=reduction, **extras).dtype == expected
        )


def test_bce_integer_weights_as_torch():
    x, t = torch.randn(3, 4), torch.rand(3, 4)
    f = (binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits)
    _both(*f, x, t, weight=torch.tensor([1, 2, 0, 3]))
    _both(*f, x, t, pos_weight=torch.tensor([1, 2, 0, 3]))


def test_bce_module_state_dict_and_attributes():
    w, pw = torch.rand(3), torch.rand(3)
    ours, theirs = BCEWithLogitsLoss(w, pos_weight=pw), nn.BCEWithLogitsLoss(w, pos_weight=pw)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "pos_weight"]
    ours.load_state_dict(nn.BCEWithLogitsLoss(torch.ones(3), pos_weight=torch.ones(3)).state_dict())
    assert torch.equal(ours.pos_weight, torch.ones(3))
    theirs.load_state_dict(BCEWithLogitsLoss(w, pos_weight=pw).state_dict())
    assert torch.equal(theirs.pos_weight, pw)
    assert BCEWithLogitsLoss().reduction == nn.BCEWithLogitsLoss().reduction
    assert list(BCEWithLogitsLoss().state_dict()) == list(nn.BCEWithLogitsLoss().state_dict())


BCE_ERRORS = [
    ("shape", torch.zeros(2, 3), torch.zeros(2, 4), {}, ValueError),
    ("broadcastable shape", torch.zeros(2, 3), torch.zeros(1, 3), {}, ValueError),
    ("weight shape", torch.zeros(2, 3), torch.zeros(2, 3), {"weight": torch.ones(4)}, RuntimeError),
    (
        "weight larger",
        torch.zeros(2, 3),
        torch.zeros(2, 3),
        {"weight": torch.ones(5, 2, 3)},
        RuntimeError,
    ),
    (
        "pos_weight shape",
        torch.zeros(2, 3),
        torch.zeros(2, 3),
        {"pos_weight": torch.ones(2)},
        RuntimeError,
    ),
    ("reduction", torch.zeros(2, 3), torch.zeros(2, 3), {"reduction": "avg"}, ValueError),
]


@pytest.mark.parametrize(
    ("inputs", "targets", "options", "error"),
    [case[1:] for case in BCE_ERRORS],
    ids=[case[0] for case in BCE_ERRORS],
)
def test_bce_error_types(inputs, targets, options, error):
    with pytest.raises(error):
        F.binary_cross_entropy_with_logits(inputs, targets, **options)
    with pytest.raises(error) as info:
        binary_cross_entropy_with_logits(inputs, targets, **options)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- deliberate differences
def test_differences_only_where_torch_rejects_the_call():
    x, t = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    # Class indices of any integer dtype (PyTorch: int64 or uint8 only).
    with pytest.raises(RuntimeError):
        F.cross_entropy(x, t.int())
    _same(cross_entropy(x, t.int()), F.cross_entropy(x, t))
    # A weight of another floating dtype is cast to the logits' (PyTorch: RuntimeError).
    with pytest.raises(RuntimeError):
        F.cross_entropy(x, t, weight=torch.ones(3).double())
    _same(cross_entropy(x, t, weight=torch.ones(3).double()), F.cross_entropy(x, t))
    # Integer and boolean BCE targets are converted (PyTorch: RuntimeError / NotImplementedError).
    y = (torch.rand(4, 3) > 0.5).float()
    for other in (y.long(), y.bool(), y.to(torch.uint8)):
        with pytest.raises(RuntimeError):
            F.binary_cross_entropy_with_logits(x, other)
        _same(binary_cross_entropy_with_logits(x, other), F.binary_cross_entropy_with_logits(x, y))
    # Non-floating logits: TypeError (PyTorch: NotImplementedError).
    with pytest.raises(NotImplementedError):
        F.cross_entropy(t.view(2, 2), t[:2])
    with pytest.raises(TypeError, match="floating"):
        cross_entropy(t.view(2, 2), t[:2])


def test_targets_outside_documented_ranges_raise_unless_value_checks_are_off():
    # PyTorch documents targets in [0, 1] (probabilities) but computes whatever it is given:
    # a 0/255 mask passed as is. The value check refuses; switched off, PyTorch's result.
    x = torch.randn(2, 3)
    probs = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 255.0, 1.0], [1.0, 0.0, 255.0]])
    with pytest.raises(ValueError, match=r"target must be in \[0, 1\]"):
        cross_entropy(x, probs)
    with pytest.raises(ValueError, match=r"targets must be in \[0, 1\].*ignore_index"):
        binary_cross_entropy_with_logits(x, mask)
    with visionblocks.value_checks(False):
        _same(cross_entropy(x, probs), F.cross_entropy(x, probs))
        _same(
            binary_cross_entropy_with_logits(x, mask), F.binary_cross_entropy_with_logits(x, mask)
        )


def test_old_positional_options_are_refused_not_misread():
    # Before issue 16 the second positional argument was ignore_index (CE) / pos_weight (BCE);
    # it is now PyTorch's size_average, which must be None or a bool.
    with pytest.raises(TypeError, match="size_average must be None or a bool"):
        CrossEntropyLoss(None, 255)
    with pytest.raises(TypeError, match="size_average must be None or a bool"):
        BCEWithLogitsLoss(None, torch.ones(3))
    with pytest.raises(TypeError, match="reduce must be None or a bool"):
        cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), None, None, -100, "sum")


def test_extras_give_zero_instead_of_nan_when_nothing_is_counted():
    x = torch.randn(3, 4, requires_grad=True)
    loss = cross_entropy(x, torch.full((3,), -100), top_k=1.0)
    assert loss.item() == 0.0
    loss.backward()
    assert not x.grad.any()
    loss = binary_cross_entropy_with_logits(x, torch.full((3, 4), 255), ignore_index=255)
    assert loss.item() == 0.0
