"""`lovasz_loss` / `LovaszLoss`: equal to segmentation_models_pytorch's ``LovaszLoss`` (smp
0.6.0, ``segmentation_models_pytorch/losses/lovasz.py``) in values and gradients wherever smp
is right, and the definition (Berman et al., CVPR 2018) where smp is not.

smp is run in float64 against ours in float32 (tolerance 1e-6). smp's ``_lovasz_grad`` casts
to float32 (``.float()``), which makes its float64 run fail (``torch.dot`` of float64 and
float32): the `smp64` fixture swaps in the same formula in the input's dtype.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import visionblocks
from visionblocks.losses import LovaszLoss, lovasz_loss
from visionblocks.losses.lovasz import _radix_order
from visionblocks.registry import LOSSES

MODES = ("binary", "multiclass", "multilabel")
IGNORE = 255


def _data(mode: str, shape=(3, 4, 5, 6), ignore: int | None = None, seed: int = 0):
    """Float64 logits (continuous: no tied errors) and labels of ``mode``."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    c = 1 if mode == "binary" else c
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64) * 2
    if mode == "multiclass":
        y = torch.randint(0, c, (n, h, w), generator=g)
    else:
        y = torch.randint(0, 2, (n, h, w) if mode == "binary" else (n, c, h, w), generator=g)
    if ignore is not None:
        y = y.masked_fill(torch.rand(y.shape, generator=g) < 0.3, ignore)
    return x, y


@pytest.fixture
def smp64(monkeypatch):
    """smp's ``LovaszLoss`` with its Lovász gradient computed in the input's dtype."""
    smp_lovasz = pytest.importorskip("segmentation_models_pytorch.losses.lovasz")

    def lovasz_grad(gt_sorted):  # smp's formula (Alg. 1 of the paper), without `.float()`
        gt = gt_sorted.to(torch.float64)
        total = gt.sum()
        jaccard = 1.0 - (total - gt.cumsum(0)) / (total + (1 - gt).cumsum(0))
        if len(gt) > 1:
            jaccard[1:] = jaccard[1:] - jaccard[:-1]
        return jaccard

    monkeypatch.setattr(smp_lovasz, "_lovasz_grad", lovasz_grad)
    return smp_lovasz


def _value_and_grad(fn, x):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    (grad,) = torch.autograd.grad(out, x)
    return out.detach(), grad


def _close(ours, ref, atol=1e-6):
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=atol)


# ------------------------------------------------------------------------ smp parity
@pytest.mark.parametrize("size", ["small", "radix"])  # "radix": CPU's int64-key sort path
@pytest.mark.parametrize(
    ("mode", "per_image", "ignore"),
    list(itertools.product(MODES, [False, True], [None, IGNORE])),
)
def test_equals_smp_in_values_and_gradients(smp64, mode, per_image, ignore, size):
    shape = (3, 4, 5, 6) if size == "small" else (2, 5, 60, 64)
    x, y = _data(mode, shape, ignore)
    peer = smp64.LovaszLoss(mode, per_image=per_image, ignore_index=ignore)
    ref, ref_grad = _value_and_grad(lambda a: peer(a, y), x)
    out, grad = _value_and_grad(lambda a: lovasz_loss(a, y, mode, per_image, ignore), x.float())
    assert out.dtype == torch.float32 and out.shape == ()
    _close(out, ref)
    _close(grad, ref_grad)


@pytest.mark.parametrize("mode", MODES)
def test_ignored_pixels_are_removed(smp64, mode):
    """With ``ignore_index`` the loss is smp's on the kept pixels alone (cut out on the host
    here, as one image), and the ignored pixels get exactly zero gradient."""
    x, y = _data(mode, ignore=IGNORE)
    out, grad = _value_and_grad(lambda a: lovasz_loss(a, y, mode, ignore_index=IGNORE), x.float())
    kept = y.flatten() != IGNORE

    def entries(a):  # multiclass: one row of C scores per pixel; else every (class, pixel)
        return a.movedim(1, -1).reshape(-1, a.shape[1]) if mode == "multiclass" else a.flatten()

    def smp_on_kept(a):
        scores = entries(a)[kept]
        scores = scores.T[None, :, :, None] if mode == "multiclass" else scores[None, None, :, None]
        return smp64.LovaszLoss("multiclass" if mode == "multiclass" else "binary")(
            scores, y.flatten()[kept][None, :, None]
        )

    ref, ref_grad = _value_and_grad(smp_on_kept, x)
    _close(out, ref)
    _close(grad, ref_grad)
    ignored = entries(grad)[~kept]
    assert ignored.numel() and torch.equal(ignored, torch.zeros_like(ignored))


@pytest.mark.parametrize("per_image", [False, True])
def test_absent_classes_are_left_out(smp64, per_image):
    """Only classes present in the labels count (smp's ``"present"``): here 1 and 3 of 5."""
    x, _ = _data("multiclass", (2, 5, 6, 7))
    y = torch.where(torch.rand(2, 6, 7, generator=torch.Generator().manual_seed(1)) < 0.4, 1, 3)
    peer = smp64.LovaszLoss("multiclass", per_image=per_image)
    ref, ref_grad = _value_and_grad(lambda a: peer(a, y), x)
    out, grad = _value_and_grad(lambda a: lovasz_loss(a, y, "multiclass", per_image), x.float())
    _close(out, ref)
    _close(grad, ref_grad)


def test_soft_binary_labels_equal_smp(smp64):
    """Soft labels, and gradients with respect to them too (none is NaN, even for an image
    without foreground, where the Lovász weights start with a 0 / 0 made 1)."""
    x, _ = _data("binary")
    y = torch.rand(x.shape[0], *x.shape[2:], dtype=torch.float64)
    y[1] = 0.0
    grads = []
    for fn, dtype in ((smp64.LovaszLoss("binary", per_image=True), torch.float64),
                      (lambda a, b: lovasz_loss(a, b, "binary", True), torch.float32)):  # fmt: skip
        a, b = x.to(dtype).requires_grad_(True), y.to(dtype).requires_grad_(True)
        out = fn(a, b)
        grads.append((out.detach(), *torch.autograd.grad(out, (a, b))))
    for ours, ref in zip(grads[1], grads[0], strict=True):
        assert torch.isfinite(ours).all()
        _close(ours, ref)


# ------------------------------------------------------------ where smp is wrong
def test_from_logits_false_takes_probabilities(smp64):
    """smp ignores ``from_logits`` (it applies softmax again); ours takes the probabilities."""
    x, y = _data("multiclass")
    probs = x.softmax(1)
    ref = smp64.LovaszLoss("multiclass")(x, y)
    ours = lovasz_loss(probs.float(), y, "multiclass", from_logits=False)
    _close(ours, ref)
    smp_probs = smp64.LovaszLoss("multiclass", from_logits=False)(probs, y)
    assert abs(float(smp_probs) - float(ref)) > 1e-2  # softmax of probabilities


def test_binary_probabilities_use_absolute_errors(smp64):
    """``from_logits=False`` in binary mode: errors ``|y - p|`` (Berman's Lovász-softmax of a
    sigmoid output: smp's ``_lovasz_softmax_flat`` of the foreground class)."""
    x, y = _data("binary", ignore=IGNORE)
    p = x.sigmoid()
    kept = (y != IGNORE).flatten()
    ref, ref_grad = _value_and_grad(
        lambda a: smp64._lovasz_softmax_flat(
            torch.stack([1 - a.flatten(), a.flatten()], 1)[kept], y.flatten()[kept], [1]
        ),
        p,
    )
    out, grad = _value_and_grad(
        lambda a: lovasz_loss(a, y, "binary", ignore_index=IGNORE, from_logits=False), p.float()
    )
    _close(out, ref)
    _close(grad, ref_grad)


@pytest.mark.parametrize("mode", MODES)
def test_every_pixel_ignored_gives_zero(smp64, mode):
    """Ours: 0, connected to the graph (zero gradient). smp: an empty tensor (multiclass)."""
    x, y = _data(mode)
    y = torch.full_like(y, IGNORE)
    for per_image in (False, True):
        out, grad = _value_and_grad(
            lambda a, per_image=per_image: lovasz_loss(a, y, mode, per_image, ignore_index=IGNORE),
            x.float(),
        )
        assert out.shape == () and out.item() == 0.0
        assert torch.equal(grad, torch.zeros_like(grad))
    if mode == "multiclass":
        assert smp64.LovaszLoss(mode, ignore_index=IGNORE)(x, y).numel() == 0


def test_per_image_averages_the_images_with_pixels(smp64):
    """An image with every pixel ignored has no loss to average: smp counts it as 0."""
    x, y = _data("binary", ignore=IGNORE)
    y[1] = IGNORE
    ours = lovasz_loss(x.float(), y, "binary", per_image=True, ignore_index=IGNORE)
    keep = [0, 2]
    on_kept = smp64.LovaszLoss("binary", per_image=True, ignore_index=IGNORE)(x[keep], y[keep])
    _close(ours, on_kept)
    smp = smp64.LovaszLoss("binary", per_image=True, ignore_index=IGNORE)(x, y)
    _close(smp, on_kept.double() * 2 / 3, atol=1e-12)


def test_perfect_prediction_has_zero_loss():
    """The layout bug smp fixed in PR #461 (classes flattened without moving dim 1 last) made
    a perfect prediction score badly; ours is 0 in every mode, contiguous or not."""
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 4, (2, 5, 6), generator=g)
    onehot = torch.nn.functional.one_hot(y, 4).permute(0, 3, 1, 2).float()  # not contiguous
    assert lovasz_loss(onehot * 50, y, "multiclass") < 1e-6
    assert lovasz_loss(onehot, y, "multiclass", from_logits=False) == 0
    assert lovasz_loss(onehot * 2 - 1, onehot, "multilabel") == 0  # hinge: margin 1 met
    assert lovasz_loss(onehot[:, :1] * 4 - 2, onehot[:, 0], "binary") == 0
    wrong_layout = (onehot * 50).reshape(-1, 4).softmax(1)  # smp before PR #461
    assert lovasz_loss(wrong_layout.T.reshape(1, 4, -1), y.reshape(1, -1), "multiclass",
                       from_logits=False) > 0.5  # fmt: skip


# ------------------------------------------------------------------------- options
def test_class_subset(smp64):
    x, y = _data("multiclass", (2, 5, 6, 7))
    ref = smp64._lovasz_softmax(x.softmax(1), y, classes=[0, 2, 4])  # all present here
    assert all((y == c).any() for c in (0, 2, 4))
    _close(lovasz_loss(x.float(), y, "multiclass", classes=[0, 2, 4]), ref)
    x, y = _data("multilabel", (2, 5, 6, 7))
    ref = smp64.LovaszLoss("multilabel")(x[:, [1, 3]], y[:, [1, 3]])
    _close(lovasz_loss(x.float(), y, "multilabel", classes=[1, 3]), ref)
    y[:, 1, 0] = IGNORE
    ref = smp64.LovaszLoss("multilabel", ignore_index=IGNORE)(x[:, [1, 3]], y[:, [1, 3]])
    _close(lovasz_loss(x.float(), y, "multilabel", ignore_index=IGNORE, classes=[1, 3]), ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    x, y = _data("multiclass")
    x = x.to(dtype)
    out, grad = _value_and_grad(lambda a: lovasz_loss(a, y, "multiclass", ignore_index=0), x)
    ref, ref_grad = _value_and_grad(lambda a: lovasz_loss(a, y, "multiclass", ignore_index=0),
                                    x.float())  # fmt: skip
    assert out.dtype == torch.float32 and grad.dtype == dtype
    assert torch.equal(out, ref)
    torch.testing.assert_close(grad, ref_grad.to(dtype))


def test_radix_order_is_a_stable_descending_sort():
    g = torch.Generator().manual_seed(4)
    key = torch.rand(3, 20000, generator=g)
    key[:, :300] = 0.0
    key[:, 300:600] = -0.0
    key[:, 600:900] = 0.5  # ties
    keep = torch.rand(key.shape, generator=g) > 0.1
    masked = key.masked_fill(~keep, -torch.inf)
    expected = masked.sort(dim=-1, descending=True, stable=True).indices
    assert torch.equal(_radix_order(masked, keep), expected)
    assert torch.equal(
        _radix_order(key, None), key.sort(dim=-1, descending=True, stable=True).indices
    )
    errors = masked - 1.0  # negative errors sort as 0 (they add nothing); not kept: last
    expected = (
        errors.clamp_min(0)
        .masked_fill(~keep, -torch.inf)
        .sort(dim=-1, descending=True, stable=True)
    ).indices
    assert torch.equal(_radix_order(errors, keep), expected)


def test_module_registry_and_repr():
    assert LOSSES.get("lovasz") is LovaszLoss
    loss = LOSSES.build({"type": "lovasz", "mode": "multilabel", "classes": [0, 2]})
    assert repr(loss) == (
        "LovaszLoss(mode='multilabel', per_image=False, ignore_index=None, from_logits=True, "
        "classes=[0, 2])"
    )
    x, y = _data("multilabel")
    assert torch.equal(loss(x, y), lovasz_loss(x, y, "multilabel", classes=[0, 2]))


def test_compiles_fullgraph_and_equals_eager():
    x, y = _data("multiclass", ignore=IGNORE)
    x = x.float()

    def fn(a, b):
        return lovasz_loss(a, b, "multiclass", per_image=True, ignore_index=IGNORE)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, y), fn(x, y))


# -------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x, y: lovasz_loss(x, y, "softmax"), ValueError, "mode"),
        (lambda x, y: lovasz_loss(x, y, "multiclass", per_image=1), TypeError, "per_image"),
        (lambda x, y: lovasz_loss(x, y, "multiclass", ignore_index=2.0), TypeError, "ignore_index"),
        (lambda x, y: lovasz_loss(x, y, "multiclass", from_logits="no"), TypeError, "from_logits"),
        (lambda x, y: lovasz_loss(x, y, "multiclass", classes=[0, 0]), ValueError, "classes"),
        (lambda x, y: lovasz_loss(x, y, "multiclass", classes=[4]), ValueError, "classes"),
        (lambda x, y: lovasz_loss(x, y.float(), "multiclass"), TypeError, "target"),
        (lambda x, y: lovasz_loss(x, y[:, :2], "multiclass"), ValueError, "target"),
        (lambda x, y: lovasz_loss(x.long(), y, "multiclass"), TypeError, "pred"),
        (lambda x, y: lovasz_loss(x, y + 4, "multiclass"), ValueError, "target"),
        (lambda x, y: lovasz_loss(x, y, "binary"), ValueError, "pred"),
        (lambda x, y: lovasz_loss(x[:, :1], y, "binary", classes=[0]), ValueError, "classes"),
        (lambda x, y: lovasz_loss(x[:, :1], y * 2, "binary"), ValueError, "target"),
        (lambda x, y: lovasz_loss(x, y.to("meta"), "multiclass"), ValueError, "device"),
    ],
)
def test_bad_input_is_refused(call, error, match):
    x, y = _data("multiclass")
    with pytest.raises(error, match=match):
        call(x.float(), y)


def test_value_checks_can_be_turned_off():
    x, y = _data("multiclass")
    with visionblocks.value_checks(False):  # an index out of range counts for no class
        assert torch.isfinite(lovasz_loss(x, y + 1, "multiclass"))


def test_float64_rows_of_radix_size_sort_in_float64():
    # the CPU radix key reads float32 bits: float64 rows of that size sort with torch.sort
    gen = torch.Generator().manual_seed(3)
    pred = torch.randn(1, 1, 2**15, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 2, (1, 2**15), generator=gen)
    loss = lovasz_loss(pred, target, "binary")
    assert loss.dtype == torch.float64
    errors = 1.0 - pred.reshape(-1) * (2.0 * target.reshape(-1) - 1.0)
    order = errors.sort(descending=True, stable=True).indices
    fg = target.reshape(-1)[order].double()
    inter = fg.sum() - fg.cumsum(0)
    jaccard = 1.0 - inter / (inter + torch.arange(1, fg.numel() + 1, dtype=torch.float64))
    grad = torch.cat([jaccard[:1], jaccard[1:] - jaccard[:-1]])
    torch.testing.assert_close(loss, torch.dot(errors[order].relu(), grad))


def test_an_empty_batch_is_a_connected_zero():
    pred = torch.zeros(0, 3, 4, 4, requires_grad=True)
    loss = lovasz_loss(pred, torch.zeros(0, 4, 4, dtype=torch.long), "multiclass")
    assert loss.item() == 0.0 and loss.requires_grad


def test_probabilities_outside_zero_one_are_refused():
    with pytest.raises(ValueError, match=r"pred must be in \[0, 1\]"):
        lovasz_loss(torch.full((1, 2, 4), 5.0), torch.ones(1, 4, dtype=torch.long),
                    "multiclass", from_logits=False)  # fmt: skip
