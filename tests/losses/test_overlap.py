"""dice_loss, jaccard_loss, tversky_loss and their modules against segmentation_models_pytorch.

smp 0.6's ``DiceLoss``/``JaccardLoss``/``TverskyLoss`` (segmentation_models_pytorch/losses/
dice.py, jaccard.py, tversky.py, _functional.py) are the oracle wherever every class has a
target pixel; the tests of the two documented differences (classes with no target pixel are
left out of the mean, Tversky's gamma per class) show smp's result next to ours.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from tests.helpers import gradcheck
from visionblocks.losses.overlap import (
    MODES,
    DiceLoss,
    JaccardLoss,
    TverskyLoss,
    dice_loss,
    jaccard_loss,
    tversky_loss,
)
from visionblocks.registry import LOSSES

FUNCTIONS = {"dice": dice_loss, "jaccard": jaccard_loss, "tversky": tversky_loss}
TVERSKY = {"alpha": 0.3, "beta": 0.7}
IGNORE = 255


def _smp(kind: str):
    smp = pytest.importorskip("segmentation_models_pytorch.losses")
    return {"dice": smp.DiceLoss, "jaccard": smp.JaccardLoss, "tversky": smp.TverskyLoss}[kind]


def _inputs(mode: str, ignore_index=None, *, soft=False, n=3, c=4, hw=(6, 5), seed=0):
    """float64 logits and targets in which every class has target pixels (ignored ones aside)."""
    g = torch.Generator().manual_seed(seed)
    c = 1 if mode == "binary" else c
    x = torch.randn(n, c, *hw, generator=g, dtype=torch.float64) * 2
    if mode == "multiclass":
        t = torch.randint(0, c, (n, *hw), generator=g)
        t.view(n, -1)[0, :c] = torch.arange(c)  # every class present
    elif soft:
        t = torch.rand(n, c, *hw, generator=g, dtype=torch.float64)
    else:
        t = torch.randint(0, 2, (n, c, *hw), generator=g)
        t.view(n, c, -1)[0, :, 0] = 1
    if mode == "binary" and not soft:
        t = t[:, 0]
    if ignore_index is not None:
        drop = torch.rand(t.shape, generator=g) < 0.25
        drop.view(-1)[:c] = False
        t = t.masked_fill(drop, ignore_index)
    return x, t


def _value_and_grad(fn, x, t):
    x = x.detach().clone().requires_grad_()
    loss = fn(x, t)
    (grad,) = torch.autograd.grad(loss, x)
    return loss, grad


CASES = [
    (mode, kind, from_logits, ignore, classes, smooth_log)
    for mode, kind, from_logits, ignore, classes, smooth_log in itertools.product(
        MODES,
        FUNCTIONS,
        (True, False),
        (None, IGNORE),
        (None, [0, 2]),
        ((0.0, False), (1.0, False), (0.0, True), (0.5, True)),
    )
    if not (mode == "binary" and classes is not None)
]


@pytest.mark.parametrize(("mode", "kind", "from_logits", "ignore", "classes", "smooth_log"), CASES)
def test_equals_smp(mode, kind, from_logits, ignore, classes, smooth_log):
    """Values and gradients: float64 to 1e-12, float32 against smp's float64 run to 1e-6."""
    smooth, log_loss = smooth_log
    x, t = _inputs(mode, ignore)
    if not from_logits:
        x = x.softmax(1) if mode == "multiclass" else x.sigmoid()
    options = {
        "classes": classes,
        "log_loss": log_loss,
        "from_logits": from_logits,
        "smooth": smooth,
        "ignore_index": ignore,
        **(TVERSKY if kind == "tversky" else {}),
    }
    smp = _smp(kind)(mode, **options)
    ref, ref_grad = _value_and_grad(smp, x, t)
    ours, grad = _value_and_grad(lambda a, b: FUNCTIONS[kind](a, b, mode, **options), x, t)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)
    ours32, grad32 = _value_and_grad(
        lambda a, b: FUNCTIONS[kind](a, b, mode, **options), x.float(), t
    )
    assert ours32.dtype == torch.float32
    torch.testing.assert_close(ours32.double(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad32.double(), ref_grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["multiclass", "multilabel"])
@pytest.mark.parametrize("kind", list(FUNCTIONS))
def test_class_weights_equal_smp(mode, kind):
    x, t = _inputs(mode, IGNORE)
    options = {"class_weights": [0.5, 2.0, 1.0, 0.25], "ignore_index": IGNORE}
    ref, ref_grad = _value_and_grad(_smp(kind)(mode, **options), x, t)
    ours, grad = _value_and_grad(lambda a, b: FUNCTIONS[kind](a, b, mode, **options), x, t)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)
    w = torch.tensor(options["class_weights"], dtype=torch.float64)  # a tensor: the same
    tensor = FUNCTIONS[kind](x, t, mode, class_weights=w, ignore_index=IGNORE)
    torch.testing.assert_close(tensor, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", list(FUNCTIONS))
@pytest.mark.parametrize("binary_shape", ["N,H,W", "N,1,H,W"])
def test_soft_and_channel_targets_equal_smp(kind, binary_shape):
    """Soft targets give smp's semimetric overlap (sum of min(p, t)); binary targets may keep
    their channel."""
    x, t = _inputs("multilabel", soft=True)
    ref = _smp(kind)("multilabel")(x, t)
    torch.testing.assert_close(FUNCTIONS[kind](x, t, "multilabel"), ref, rtol=0, atol=1e-12)
    xb, tb = _inputs("binary")
    tb = tb.unsqueeze(1) if binary_shape == "N,1,H,W" else tb
    ref, ref_grad = _value_and_grad(_smp(kind)("binary"), xb, tb)
    for labels in (tb, tb.double(), tb.bool()):  # integer, float and boolean 0/1 labels
        ours, grad = _value_and_grad(lambda a, b: FUNCTIONS[kind](a, b, "binary"), xb, labels)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


# ----------------------------------------------------------------- the differences from smp
@pytest.mark.parametrize("kind", list(FUNCTIONS))
def test_ignore_index_does_not_dilute_the_class_mean(kind):
    """smp issue #852: a class whose pixels are all ignored keeps a zero in smp's class mean.
    Ours leaves it out: it equals smp over the classes that remain."""
    x, t = _inputs("multiclass")
    t = t.masked_fill(t == 3, IGNORE)  # class 3 only in ignored pixels
    options = {"ignore_index": IGNORE, **(TVERSKY if kind == "tversky" else {})}
    ours = FUNCTIONS[kind](x, t, "multiclass", **options)
    smp_all = _smp(kind)("multiclass", **options)(x, t)
    smp_kept = _smp(kind)("multiclass", classes=[0, 1, 2], **options)(x, t)
    torch.testing.assert_close(ours, smp_kept, rtol=0, atol=1e-12)
    torch.testing.assert_close(smp_all, ours * 3 / 4, rtol=0, atol=1e-12)  # smp: diluted
    assert ours > smp_all + 0.05


@pytest.mark.parametrize("mode", ["multiclass", "multilabel"])
def test_classes_absent_from_target_and_prediction_are_left_out(mode):
    """A class with no target pixel has an undefined score (0 / 0 when the prediction is empty
    too): adding such a class leaves the loss as it was; in smp it shrinks the loss."""
    x, t = _inputs(mode, c=3)
    if mode == "multiclass":  # a 4th class predicted nowhere (probability ~1e-22)
        x4 = torch.cat([x, torch.full_like(x[:, :1], -50.0)], 1)
        t4 = t
    else:  # a 4th label that is nowhere in the target nor in the prediction
        x4 = torch.cat([x, torch.full_like(x[:, :1], -50.0)], 1)
        t4 = torch.cat([t, torch.zeros_like(t[:, :1])], 1)
    for kind, fn in FUNCTIONS.items():
        before, after = fn(x, t, mode), fn(x4, t4, mode)
        torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
        smp_before, smp_after = _smp(kind)(mode)(x, t), _smp(kind)(mode)(x4, t4)
        torch.testing.assert_close(smp_before, before, rtol=0, atol=1e-12)
        torch.testing.assert_close(smp_after, before * 3 / 4, rtol=0, atol=1e-12)


def test_nothing_to_count_gives_a_connected_zero():
    x = torch.randn(2, 1, 4, 4, requires_grad=True)
    for t in (torch.zeros(2, 4, 4), torch.full((2, 4, 4), IGNORE)):  # no foreground; all ignored
        loss = dice_loss(x, t, "binary", ignore_index=IGNORE)
        assert loss.item() == 0.0 and loss.requires_grad
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.equal(grad, torch.zeros_like(grad))


def test_ignored_pixels_get_no_gradient():
    x, t = _inputs("multiclass", IGNORE)
    _, grad = _value_and_grad(lambda a, b: dice_loss(a, b, "multiclass", ignore_index=IGNORE), x, t)
    ignored = (t == IGNORE).unsqueeze(1).expand_as(grad)
    assert torch.equal(grad[ignored], torch.zeros_like(grad[ignored]))
    assert grad[~ignored].abs().min() > 0


def test_tversky_gamma_raises_each_class_loss():
    """The focal Tversky loss: gamma per class, then the mean (smp: the mean, then gamma);
    the two agree for a single class."""
    x, t = _inputs("multiclass")
    x[:, 0] += 6.0 * (t == 0)  # class 0 easy, the others hard
    per_class = [tversky_loss(x, t, "multiclass", classes=[c], **TVERSKY) for c in range(4)]
    ours = tversky_loss(x, t, "multiclass", gamma=0.75, **TVERSKY)
    torch.testing.assert_close(ours, torch.stack(per_class).pow(0.75).mean(), rtol=0, atol=1e-12)
    smp = _smp("tversky")("multiclass", gamma=0.75, **TVERSKY)(x, t)
    torch.testing.assert_close(smp, torch.stack(per_class).mean().pow(0.75), rtol=0, atol=1e-12)
    assert ours < smp - 0.01  # mean(l ** 0.75) < mean(l) ** 0.75 (Jensen)
    xb, tb = _inputs("binary")
    for gamma in (0.75, 2.0):
        ours_b, grad_b = _value_and_grad(
            lambda a, b, g=gamma: tversky_loss(a, b, "binary", gamma=g, **TVERSKY), xb, tb
        )
        smp_fn = _smp("tversky")("binary", gamma=gamma, **TVERSKY)
        ref_b, ref_grad_b = _value_and_grad(smp_fn, xb, tb)
        torch.testing.assert_close(ours_b, ref_b, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad_b, ref_grad_b, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- per image
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(FUNCTIONS))
@pytest.mark.parametrize("ignore", [None, IGNORE])
def test_per_image_equals_a_loop_over_images(mode, kind, ignore):
    """Each (image, class) with target pixels scored apart, then the mean over them. An image
    fully ignored counts for nothing (a loss of 0 in the loop's sum, none in its count)."""
    x, t = _inputs(mode, ignore, n=4)
    if ignore is not None:
        t[3] = ignore  # the last image: every pixel ignored
    if mode == "multiclass":
        t[1] = t[1].masked_fill(t[1] == 2, 0)  # class 2 absent from image 1
    elif mode == "multilabel":
        t[1, 2] = t[1, 2].masked_fill(t[1, 2] == 1, 0)  # label 2 absent from image 1
    else:
        t[2] = t[2].masked_fill(t[2] == 1, 0)  # image 2 empty
    options = {"ignore_index": ignore, "smooth": 0.5, **(TVERSKY if kind == "tversky" else {})}
    fn = FUNCTIONS[kind]
    channels = range(1) if mode == "binary" else range(x.shape[1])
    total, count = 0.0, 0
    for i in range(x.shape[0]):
        for c in channels:
            xi, ti = x[i : i + 1], t[i : i + 1]
            if mode == "binary":
                present = (ti == 1).any()
                loss = fn(xi, ti, mode, **options)
            else:
                kept = ti if mode == "multiclass" else ti[:, c]
                present = (kept == (c if mode == "multiclass" else 1)).any()
                loss = fn(xi, ti, mode, classes=[c], **options)
            total, count = total + loss, count + int(present)
    expected = total / count
    torch.testing.assert_close(
        fn(x, t, mode, per_image=True, **options), expected, rtol=0, atol=1e-12
    )
    assert count < x.shape[0] * len(channels)


def test_per_image_module_and_gradcheck():
    x, t = _inputs("multiclass", IGNORE, n=2, hw=(3, 3))
    module = DiceLoss("multiclass", ignore_index=IGNORE, per_image=True, smooth=0.1)
    torch.testing.assert_close(
        module(x, t), dice_loss(x, t, "multiclass", ignore_index=IGNORE, per_image=True, smooth=0.1)
    )
    assert gradcheck(lambda a: module(a, t), (x.detach().requires_grad_(),))


# ---------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_half_inputs_are_computed_in_float32(dtype, mode):
    x, t = _inputs(mode, IGNORE)
    xh = x.to(dtype)
    out, grad = _value_and_grad(lambda a, b: tversky_loss(a, b, mode, ignore_index=IGNORE), xh, t)
    ref, ref_grad = _value_and_grad(
        lambda a, b: tversky_loss(a, b, mode, ignore_index=IGNORE), xh.double(), t
    )
    assert out.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-7)
    rtol = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]  # one rounding to dtype
    torch.testing.assert_close(grad.double(), ref_grad, rtol=rtol, atol=1e-7)
    # Half probabilities (from_logits=False) too, and half soft targets.
    probs = (x.softmax(1) if mode == "multiclass" else x.sigmoid()).to(dtype)
    out = dice_loss(probs, t, mode, from_logits=False, ignore_index=IGNORE)
    ref = dice_loss(probs.double(), t, mode, from_logits=False, ignore_index=IGNORE)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- modules
def test_modules_registry_and_repr():
    assert LOSSES.get("dice") is DiceLoss
    assert LOSSES.get("jaccard") is JaccardLoss
    assert LOSSES.get("tversky") is TverskyLoss
    built = LOSSES.build({"type": "tversky", "mode": "multilabel", "alpha": 0.3, "beta": 0.7})
    assert repr(built) == (
        "TverskyLoss(mode='multilabel', log_loss=False, from_logits=True, smooth=0.0, eps=1e-07,"
        " per_image=False, alpha=0.3, beta=0.7, gamma=1.0)"
    )
    module = JaccardLoss("multiclass", classes=[1, 0], class_weights=[1.0, 2.0, 3.0])
    assert torch.equal(module.state_dict()["class_weights"], torch.tensor([1.0, 2.0, 3.0]))
    x, t = _inputs("multiclass", c=3)
    expected = jaccard_loss(x, t, "multiclass", classes=[1, 0], class_weights=[1.0, 2.0, 3.0])
    torch.testing.assert_close(module(x, t), expected)


# ----------------------------------------------------------------------------- errors
_G = torch.Generator().manual_seed(43)  # seeded: xdist workers must collect the same tests
_X, _T = torch.randn(2, 3, 4, 4, generator=_G), torch.randint(0, 3, (2, 4, 4), generator=_G)
_XB = torch.randn(2, 1, 4, 4, generator=_G)
ERRORS = [
    ({"mode": "multi"}, ValueError, "mode must be one of 'binary', 'multiclass', 'multilabel'"),
    ({"mode": 1}, TypeError, "mode must be str"),
    ({"smooth": -1.0}, ValueError, "smooth must be in [0.0, inf), got -1.0"),
    ({"eps": -1e-7}, ValueError, "eps must be in [0.0, inf)"),
    ({"alpha": -0.1}, ValueError, "alpha must be in [0.0, inf)"),
    ({"alpha": 0.0, "beta": 0.0}, ValueError, "alpha + beta must be > 0"),
    ({"gamma": 0.0}, ValueError, "gamma must be in (0.0, inf)"),
    (
        {"classes": [0, 3]},
        ValueError,
        "classes must be in [0, 3) (the classes of pred), got [0, 3]",
    ),
    ({"classes": [1, 1]}, ValueError, "classes must be distinct"),
    ({"classes": 1}, TypeError, "classes must be None or a sequence of ints, got int"),
    ({"classes": [0.0]}, TypeError, "classes entries must be int"),
    ({"class_weights": [1.0, 2.0]}, ValueError, "class_weights must have 3 entries"),
    ({"class_weights": [0.0, 0.0, 0.0]}, ValueError, "class_weights must have a nonzero entry"),
    ({"class_weights": torch.ones(4)}, ValueError, "class_weights must have shape (3,)"),
    ({"ignore_index": 1.5}, TypeError, "ignore_index must be int"),
    ({"log_loss": 1}, TypeError, "log_loss must be bool"),
    ({"per_image": "yes"}, TypeError, "per_image must be bool"),
    ({"target": _T.float()}, TypeError, "target must hold class indices (an integer dtype)"),
    ({"target": _T[:, :3]}, ValueError, "target must have shape (2, 4, 4) (N, ...)"),
    ({"target": _T + 3}, ValueError, "target must be in [0, 2]"),
    ({"target": _T.masked_fill(_T == 0, -1), "ignore_index": 255}, ValueError, "target must be"),
    ({"pred": _X.long()}, TypeError, "pred must be a floating-point tensor"),
    ({"pred": torch.randn(3, generator=_G)}, ValueError, "pred must have shape (N, C, ...)"),
    ({"pred": _X.to("meta")}, ValueError, "pred and target must be on the same device"),
    ({"mode": "binary"}, ValueError, "pred must have one channel (N, 1, ...) with mode='binary'"),
    ({"mode": "binary", "pred": _XB, "classes": [0]}, ValueError, "classes must be None with"),
    ({"mode": "binary", "pred": _XB, "target": _T[:1]}, ValueError, "target must have shape"),
    ({"mode": "binary", "pred": _XB, "target": _T.float() * 0.6}, ValueError, "in [0, 1]"),
    ({"mode": "multilabel", "target": _T}, ValueError, "target must have shape (2, 3, 4, 4)"),
]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    ERRORS,
    ids=[f"{i}-{m[:32]}" for i, (_, _, m) in enumerate(ERRORS)],
)
def test_bad_input_is_refused(options, error, match):
    kwargs = {"pred": _X, "target": _T, "mode": "multiclass", **options}
    with pytest.raises(error, match=re.escape(match)):
        tversky_loss(**kwargs)


def test_modules_refuse_bad_options_at_construction():
    with pytest.raises(ValueError, match="mode must be one of"):
        DiceLoss("segmentation")
    with pytest.raises(ValueError, match="gamma must be in"):
        TverskyLoss("binary", gamma=-1.0)
    with pytest.raises(ValueError, match="class_weights must be None with mode='binary'"):
        JaccardLoss("binary", class_weights=[1.0])


@pytest.mark.parametrize("fn", [dice_loss, jaccard_loss, tversky_loss])
def test_an_empty_batch_is_a_connected_zero(fn):
    pred = torch.zeros(0, 3, 4, 4, requires_grad=True)
    loss = fn(pred, torch.zeros(0, 4, 4, dtype=torch.long), "multiclass")
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert pred.grad.shape == pred.shape


@pytest.mark.parametrize(
    ("options", "name"),
    [({"smooth": float("inf")}, "smooth"), ({"eps": float("inf")}, "eps"),
     ({"alpha": float("inf")}, "alpha"), ({"gamma": float("inf")}, "gamma")],
)  # fmt: skip
def test_infinite_options_are_refused(options, name):
    pred, target = torch.randn(1, 3, 4), torch.tensor([[0, 1, 2, 2]])
    with pytest.raises(ValueError, match=rf"{name} must be in .*, got inf"):
        tversky_loss(pred, target, "multiclass", **options)


@pytest.mark.parametrize("bad", [-1.0, float("inf")])
def test_class_weight_tensors_are_checked_as_the_list_form(bad):
    pred, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    weights = torch.tensor([1.0, bad, 0.0])
    with pytest.raises(ValueError, match=r"class_weights must be finite and >= 0"):
        dice_loss(pred, target, "multiclass", class_weights=weights)
    with pytest.raises(ValueError, match=r"class_weights entries must be in"):
        dice_loss(pred, target, "multiclass", class_weights=weights.tolist())


@pytest.mark.parametrize("value", [5.0, -1.0, float("nan")])
def test_probabilities_outside_zero_one_are_refused(value):
    pred = torch.full((1, 1, 4), value)
    target = torch.tensor([[1, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"pred must be in \[0, 1\].*from_logits=False"):
        jaccard_loss(pred, target, "binary", from_logits=False)
    assert torch.isfinite(jaccard_loss(pred.nan_to_num(0.0), target, "binary"))  # logits: any
