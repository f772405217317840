"""Every public loss under ``torch.autocast`` (issue 18): CPU bfloat16, CUDA float16/bfloat16.

Two dtype rules (see each loss's docstring, "Under torch.autocast"):

- ``"policy"`` (focal, softmax focal, the IoU family; `visionblocks.losses._reduce`): computed in
  float32 inside autocast or not; ``"none"`` returns the inputs' dtype (the logits' for the
  focal losses, ``pred`` and ``target`` promoted for the box losses), ``"sum"``/``"mean"``
  float32. Autocast changes nothing: the results are the ones outside it.
- ``"torch"`` (`cross_entropy`, `binary_cross_entropy_with_logits`): PyTorch's dtypes, so
  float32 inside autocast (PyTorch runs both in float32) and, outside it, half in, half out
  (promoted with float targets).

Every case is compared with a float64 reference on the same values: results computed in
float32 must be float32-accurate, or off by one rounding where they come back in half
precision; only PyTorch's half-precision computations (``"torch"`` outside autocast) get the
suite's half tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import visionblocks.losses as L
import visionblocks.ops
from tests.helpers import TOLERANCES
from visionblocks.kernels._launch import INTERPRET

REDUCTIONS = ("none", "mean", "sum")
_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
#: (device, autocast dtype): CPU bfloat16 always; CUDA float16 and bfloat16 when present.
AMP = [
    pytest.param(("cpu", torch.bfloat16), id="cpu-bf16"),
    pytest.param(("cuda", torch.float16), id="cuda-fp16", marks=[_CUDA, pytest.mark.cuda]),
    pytest.param(("cuda", torch.bfloat16), id="cuda-bf16", marks=[_CUDA, pytest.mark.cuda]),
]
#: Relative tolerances of results computed in float32: float32 itself, or one rounding to a
#: half dtype (its unit roundoff u, 2**-8 and 2**-11) with a 2x margin. A half input's gradient
#: under a half result is rounded twice (the incoming gradient, then the result): `GRAD_RTOL`.
RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-5}
GRAD_RTOL = {torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9, torch.float32: 1e-4}
#: (a) float32 inputs inside autocast (and outside it, as a baseline); (b) half inputs (an autocast model's output) and half
#: targets/weights, inside and outside autocast; (c) half inputs with float32 targets/weights.
MODES = {
    "f32": (False, False, False),  # (half inputs, half targets and weights, autocast)
    "f32-autocast": (False, False, True),
    "half-autocast": (True, True, True),
    "half": (True, True, False),
    "mixed-autocast": (True, False, True),
    "mixed": (True, False, False),
}


@dataclass(frozen=True)
class Case:
    name: str  # an entry of visionblocks.losses.__all__
    kind: str  # "binary", "index", "dense", "probs", "soft", "bins" or "boxes": its data
    options: dict = field(default_factory=dict)  # tensors: float32 on CPU, moved per mode

    @property
    def rule(self) -> str:
        torch_like = ("cross_entropy", "binary_cross_entropy", "CrossEntropy", "BCE")
        return "torch" if self.name.startswith(torch_like) else "policy"

    def __str__(self) -> str:
        opts = ",".join(f"{k}={'T' if torch.is_tensor(v) else v}" for k, v in self.options.items())
        return f"{self.name}({self.kind}{',' + opts if opts else ''})"


def _w(n: int = 5) -> torch.Tensor:
    return torch.linspace(0.3, 1.7, n)


CASES = [
    Case("sigmoid_focal_loss", "binary"),
    Case("sigmoid_focal_loss", "index"),
    Case("sigmoid_focal_loss", "binary", {"weight": _w(), "ignore_index": -1.0, "gamma": 0.5}),
    Case("SigmoidFocalLoss", "index", {"ignore_index": -1, "alpha": None}),
    Case("softmax_focal_loss", "dense"),
    Case("softmax_focal_loss", "dense", {"gamma": 0.0}),
    Case(
        "softmax_focal_loss",
        "dense",
        {"label_smoothing": 0.1, "weight": _w(), "alpha": _w().flip(0) / 2, "ignore_index": 255},
    ),
    Case("SoftmaxFocalLoss", "dense", {"label_smoothing": 0.2, "weight": _w()}),
    Case("binary_cross_entropy_with_logits", "binary"),
    Case("binary_cross_entropy_with_logits", "binary", {"weight": _w(), "pos_weight": _w() * 2}),
    Case(
        "binary_cross_entropy_with_logits",
        "binary",
        {"label_smoothing": 0.1, "ignore_index": -1.0},
    ),
    Case("BCEWithLogitsLoss", "binary", {"label_smoothing": 0.1}),
    Case("cross_entropy", "dense"),
    Case("cross_entropy", "dense", {"label_smoothing": 0.1, "weight": _w(), "ignore_index": 255}),
    Case("cross_entropy", "dense", {"top_k": 0.3}),
    Case("cross_entropy", "probs"),
    Case("CrossEntropyLoss", "dense", {"top_k": 0.5, "ignore_index": 255}),
    *(Case(n, "boxes") for n in L.__all__ if n.endswith(("box_iou_loss", "BoxIoULoss"))),
    Case("distribution_focal_loss", "bins"),
    Case("distribution_focal_loss", "bins", {"weight": torch.linspace(0.3, 1.7, 4)}),
    Case("DistributionFocalLoss", "bins"),
    Case("varifocal_loss", "soft"),
    Case("varifocal_loss", "soft", {"weight": _w(), "gamma": 0.5, "iou_weighted": False}),
    Case("VarifocalLoss", "soft", {"alpha": 0.5}),
    Case("quality_focal_loss", "soft"),
    Case("quality_focal_loss", "soft", {"weight": _w(), "beta": 0.5}),
    Case("QualityFocalLoss", "soft", {"beta": 1.0}),
    # The segmentation losses (a "mode"): no reduction argument, always a scalar.
    Case("dice_loss", "dense", {"mode": "multiclass"}),
    Case("dice_loss", "dense", {"mode": "multiclass", "ignore_index": 255, "per_image": True}),
    Case("DiceLoss", "binary", {"mode": "multilabel", "smooth": 1.0}),
    Case("jaccard_loss", "binary", {"mode": "multilabel", "log_loss": True}),
    Case("JaccardLoss", "dense", {"mode": "multiclass", "class_weights": _w()}),
    Case("tversky_loss", "dense", {"mode": "multiclass", "alpha": 0.3, "beta": 0.7, "gamma": 0.75}),
    Case("TverskyLoss", "binary", {"mode": "multilabel", "ignore_index": -1, "per_image": True}),
    Case("lovasz_loss", "dense", {"mode": "multiclass"}),
    Case("lovasz_loss", "dense", {"mode": "multiclass", "ignore_index": 255, "per_image": True}),
    Case("LovaszLoss", "binary", {"mode": "multilabel", "ignore_index": -1, "per_image": True}),
]


def _data(case: Case, round_to: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 inputs and targets (float ones exact in ``round_to``), on CPU."""
    gen = torch.Generator().manual_seed(18)
    ignore = case.options.get("ignore_index")
    if case.kind == "boxes":
        xy, wh = torch.rand(256, 2, generator=gen) * 50, torch.rand(256, 2, generator=gen) * 20 + 1
        gxy = xy + torch.randn(256, 2, generator=gen) * 4
        gwh = wh * (0.5 + torch.rand(256, 2, generator=gen))
        pred, target = torch.cat([xy, xy + wh], 1), torch.cat([gxy, gxy + gwh], 1)
        if "Rotated" in case.name or "rotated" in case.name:  # (cx, cy, w, h, degrees)
            angle = torch.rand(256, 1, generator=gen) * 180 - 90
            turn = angle + torch.randn(256, 1, generator=gen) * 10
            pred, target = torch.cat([xy, wh, angle], 1), torch.cat([gxy, gwh, turn], 1)
        return pred.to(round_to).float(), target.to(round_to).float()
    if case.kind == "bins":  # (N, 4 sides, 9 bins) logits, distances in [0, 8]
        logits = (torch.randn(64, 4, 9, generator=gen) * 3).to(round_to).float()
        return logits, (torch.rand(64, 4, generator=gen) * 8).to(round_to).float()
    shape = (4, 5, 8, 8) if case.kind == "dense" else (256, 5)
    logits = (torch.randn(shape, generator=gen) * 3).to(round_to).float()
    if case.kind == "soft":  # IoU-aware scores, 0 for negatives
        scores = torch.rand(shape, generator=gen).to(round_to).float()
        targets = torch.where(torch.rand(shape, generator=gen) < 0.3, scores, 0.0)
    elif case.kind == "binary":
        targets = (torch.rand(shape, generator=gen) > 0.7).float()
    elif case.kind == "probs":
        targets = torch.randn(shape, generator=gen).softmax(1).to(round_to).float()
    else:
        index_shape = (shape[0], *shape[2:])
        targets = torch.randint(0, 5, index_shape, generator=gen)
    if ignore is not None:
        drop = torch.rand(targets.shape, generator=gen) < 0.1
        targets = targets.masked_fill(drop, ignore)
    return logits, targets


def _call(case: Case, inputs, targets, reduction: str, options: dict) -> torch.Tensor:
    loss = getattr(L, case.name)
    if "mode" not in options:  # the segmentation losses take no reduction
        options = {"reduction": reduction, **options}
    if isinstance(loss, type):  # a module: the options go to its constructor
        return loss(**options)(inputs, targets)
    return loss(inputs, targets, **options)


def _options(case: Case, dtype: torch.dtype, device: str) -> dict:
    return {
        k: v.to(device=device, dtype=dtype) if torch.is_tensor(v) else v
        for k, v in case.options.items()
    }


def _expected_dtype(case: Case, reduction: str, x: torch.Tensor, t: torch.Tensor, amp: bool):
    t_dtype = t.dtype if t.is_floating_point() else x.dtype
    if case.rule == "torch":  # PyTorch's: float32 under autocast, else promoted
        return torch.float32 if amp else torch.promote_types(x.dtype, t_dtype)
    dtype = torch.promote_types(x.dtype, t.dtype) if case.kind == "boxes" else x.dtype
    return dtype if reduction == "none" and "mode" not in case.options else torch.float32


def _near(actual, expected, rtol: float, what: str, atol_frac: float = 1e-6) -> None:
    """``actual`` within ``rtol`` of the float64 ``expected``, plus ``atol_frac`` of its largest
    value."""
    atol = atol_frac * float(expected.detach().abs().max()) if expected.numel() else 0.0
    if actual.dtype == torch.float16:  # below its smallest normal, float16 has fixed spacing
        atol = max(
            atol, torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps
        )
    torch.testing.assert_close(
        actual.double(), expected, rtol=rtol, atol=atol, check_dtype=False, msg=lambda m: what + m
    )


def _run(case, mode, amp_dtype, device, reduction):
    """``(result, input grad, reference result, reference grad, autocast on, inputs, targets)``."""
    half_x, half_t, amp = MODES[mode]
    x32, t32 = _data(case, amp_dtype)
    x = x32.to(device=device, dtype=amp_dtype if half_x else torch.float32).requires_grad_()
    t_dtype = amp_dtype if half_t else torch.float32
    t = t32.to(device=device, dtype=t_dtype if t32.is_floating_point() else t32.dtype)
    options = _options(case, t_dtype, device)
    with torch.autocast(device, dtype=amp_dtype, enabled=amp):
        out = _call(case, x, t, reduction, options)
    weights = torch.rand(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (grad,) = torch.autograd.grad((out.double() * weights).sum(), x)

    x64 = x.detach().double().requires_grad_()
    t64 = t.double() if t.is_floating_point() else t
    ref = _call(
        case,
        x64,
        t64,
        reduction,
        {k: v.double() if torch.is_tensor(v) else v for k, v in options.items()},
    )
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), x64)
    return out, grad, ref, ref_grad, amp, x, t


@pytest.mark.parametrize("amp_case", AMP)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_dtype_values_and_gradients(case, mode, reduction, amp_case):
    device, amp_dtype = amp_case
    out, grad, ref, ref_grad, amp, x, t = _run(case, mode, amp_dtype, device, reduction)

    assert out.dtype == _expected_dtype(case, reduction, x, t, amp)
    assert out.shape == ref.shape
    assert grad.dtype == x.dtype and torch.isfinite(grad).all()
    half_compute = case.rule == "torch" and not amp and x.dtype != torch.float32
    if half_compute:  # PyTorch's half-precision kernels: small elements lose every digit,
        tol = TOLERANCES[amp_dtype][0]  # so errors are bounded relative to the largest one
        _near(out, ref, tol, "value: ", atol_frac=tol)
        if "top_k" not in case.options:  # half losses tie: OHEM may keep other elements
            _near(grad, ref_grad, tol, "grad: ", atol_frac=tol)
        return
    # Computed in float32: exact to float32, then at most one rounding to the result's dtype.
    _near(out, ref, RTOL[out.dtype], "value: ")
    _near(grad, ref_grad, GRAD_RTOL[grad.dtype], "grad: ")


@pytest.mark.parametrize("amp_case", AMP)
@pytest.mark.parametrize("mode", ["f32", "half", "mixed"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", [c for c in CASES if c.rule == "policy"], ids=str)
def test_policy_losses_ignore_autocast(case, mode, reduction, amp_case):
    """The focal and box losses give the same result inside autocast as outside it."""
    device, amp_dtype = amp_case
    outside = _run(case, mode, amp_dtype, device, reduction)
    inside = _run(case, mode + "-autocast", amp_dtype, device, reduction)
    for a, b in zip(inside[:2], outside[:2], strict=True):
        assert a.dtype == b.dtype
        if device == "cpu":
            assert torch.equal(a, b)
        else:  # other kernels may add in another order
            torch.testing.assert_close(a, b, rtol=RTOL[a.dtype], atol=1e-6)


def test_every_public_loss_is_covered():
    names = {c.name for c in CASES}
    assert names == set(L.__all__), "add the new loss to CASES (and document its autocast rule)"
    assert {n for n in visionblocks.ops.__all__ if n.endswith("_loss")} <= names


# ------------------------------------------------------------------- the gamma=0 decision
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_softmax_focal_gamma0_keeps_the_focal_dtype_rule(reduction, amp):
    """gamma=0 is cross entropy's value, but the dtype never depends on gamma."""
    logits = (torch.randn(4, 5, 8, 8) * 3).bfloat16()
    target = torch.randint(0, 5, (4, 8, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        focal0 = L.softmax_focal_loss(logits, target, gamma=0.0, reduction=reduction)
        focal2 = L.softmax_focal_loss(logits, target, gamma=2.0, reduction=reduction)
        ce = L.cross_entropy(logits, target, reduction=reduction)
    expected = torch.bfloat16 if reduction == "none" else torch.float32
    assert focal0.dtype == focal2.dtype == expected
    assert ce.dtype == (torch.float32 if amp else torch.bfloat16)  # PyTorch's rule
    reference = L.cross_entropy(logits.double(), target, reduction=reduction)
    _near(focal0, reference, RTOL[focal0.dtype], "gamma=0 vs cross entropy: ")


# ------------------------------------------------------------ fast paths under autocast
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", ["binary", "index", "boxes"])
def test_fused_kernels_follow_the_same_rule(impl, kind, reduction):
    """The Triton kernels (on the GPU, or interpreted on CPU) give the torch path's dtypes and
    values."""
    device = "cpu" if impl == "torch" or INTERPRET else "cuda"
    names = ["sigmoid_focal_loss"] if kind != "boxes" else ["generalized_box_iou_loss"]
    if kind == "boxes":
        names += ["distance_box_iou_loss", "complete_box_iou_loss"]
    for name in names:
        case, fn = Case(name, kind), getattr(L, name)
        x, t = (v[:64].to(device) for v in _data(case, torch.bfloat16))
        x, t = x.bfloat16().requires_grad_(), t.bfloat16() if t.is_floating_point() else t
        with torch.autocast(device, dtype=torch.bfloat16):
            out = fn(x, t, reduction=reduction, impl=impl)
            expected = fn(x, t, reduction=reduction, impl="torch")
        assert out.dtype == expected.dtype == _expected_dtype(case, reduction, x, t, True)
        torch.testing.assert_close(out, expected, rtol=RTOL[out.dtype], atol=1e-6)
        (grad,) = torch.autograd.grad(out.float().sum(), x)
        assert grad.dtype == torch.bfloat16 and torch.isfinite(grad).all()


# ------------------------------------------------------------------------- other inputs
@pytest.mark.parametrize(
    "normalizer",
    [
        3.0,
        torch.tensor(3.0, dtype=torch.float64),
        torch.tensor(3.0, dtype=torch.bfloat16),
        torch.tensor(3),
    ],
)
def test_sigmoid_focal_normalizer_does_not_change_the_dtype(normalizer):
    x, t = torch.randn(64, 5).bfloat16(), (torch.rand(64, 5) > 0.5).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for reduction in REDUCTIONS:
            out = L.sigmoid_focal_loss(x, t, reduction=reduction, normalizer=normalizer)
            assert out.dtype == (torch.bfloat16 if reduction == "none" else torch.float32)
            summed = "sum" if reduction == "mean" else reduction  # it replaces the count
            plain = L.sigmoid_focal_loss(x.double(), t.double(), reduction=summed) / 3
            _near(out, plain, RTOL[out.dtype], reduction)


def test_gradients_reach_float32_targets_and_weights_in_their_dtype():
    """Soft targets and a weight that need gradients (the plain autograd composition)."""
    x = torch.randn(64, 5).bfloat16().requires_grad_()
    t = torch.rand(64, 5).requires_grad_()
    w = torch.rand(5).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = L.sigmoid_focal_loss(x, t, reduction="sum", weight=w)
    grads = torch.autograd.grad(out, (x, t, w))
    assert out.dtype == torch.float32
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32, torch.bfloat16]
    x64, t64, w64 = (v.detach().double().requires_grad_() for v in (x, t, w))
    ref = L.sigmoid_focal_loss(x64, t64, reduction="sum", weight=w64)
    for g, r in zip(grads, torch.autograd.grad(ref, (x64, t64, w64)), strict=True):
        _near(g, r, GRAD_RTOL[g.dtype], "grad: ")
    _near(out, ref, RTOL[torch.float32], "value: ")


@pytest.mark.parametrize("name", [n for n in L.__all__ if n.endswith("box_iou_loss")])
def test_box_losses_give_both_boxes_gradients_in_their_dtype(name):
    pred, target = _data(Case(name, "boxes"), torch.bfloat16)
    pred, target = pred.bfloat16().requires_grad_(), target.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = getattr(L, name)(pred, target, reduction="mean")
    grads = torch.autograd.grad(out, (pred, target))
    assert out.dtype == torch.float32
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32]
    p64, t64 = (v.detach().double().requires_grad_() for v in (pred, target))
    ref = getattr(L, name)(p64, t64, reduction="mean")
    for g, r in zip(grads, torch.autograd.grad(ref, (p64, t64)), strict=True):
        _near(g, r, GRAD_RTOL[g.dtype], "grad: ")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_smooths_half_targets_in_float32_under_autocast(reduction):
    """Smoothed targets (0.95, 0.05) are not bfloat16 numbers: autocast must not round them."""
    x = torch.tensor([-6.0, -3.0, 4.0, 8.0]).bfloat16()
    t = torch.tensor([1.0, 1.0, 0.0, 0.0]).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = L.binary_cross_entropy_with_logits(x, t, reduction=reduction, label_smoothing=0.1)
    ref = L.binary_cross_entropy_with_logits(
        x.double(), t.double(), reduction=reduction, label_smoothing=0.1
    )
    assert out.dtype == torch.float32
    _near(out, ref, 1e-6, "")
