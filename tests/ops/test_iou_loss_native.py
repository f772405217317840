"""The C kernel of the aligned IoU measures and losses on CPU (`visionblocks.ops._iou_loss_native`).

Against the torch path (the library's ``functions`` patched to ``None``) on random and
degenerate pairs, values and gradients, per pair and summed; against the float64 reference
(tests/reference/boxes.py); thread-count independence; the fallbacks (no compiler, a trace, a
compiled call).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close, team_fixture
from tests.ops.test_iou_loss import LOSSES, loss_and_grads, random_pairs, reference
from visionblocks.ops import _iou_loss_native, _iou_loss_torch
from visionblocks.ops._iou_core import eps_tensor
from visionblocks.ops._iou_loss_torch import CIOU, DIOU, GIOU, IOU, AlignedIoUFunction
from visionblocks.ops.boxes import box_iou, complete_box_iou

KINDS = {"iou": IOU, "giou": GIOU, "diou": DIOU, "ciou": CIOU}
FN = "vb_iou_aligned_f32_parts"


@pytest.fixture
def native():
    reason = _iou_loss_native.native_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def calls(native, monkeypatch):
    """Counts the kernel's calls (one per call on the OpenMP team, one per part else)."""
    found = _iou_loss_native.LIBRARY.functions()
    real, counted = found[FN], []

    def spy(*args):
        counted.append(args[0])
        return real(*args)

    monkeypatch.setattr(_iou_loss_native.LIBRARY, "functions", lambda: {FN: spy})
    return counted


def torch_path(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the kernel unavailable (the torch ops run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_iou_loss_native.LIBRARY, "functions", lambda: None)
        return fn(*args, **kwargs)


def degenerate_pairs(scales=(1e-15, 1e-6, 1.0, 3e4, 1e15), with_scale: bool = False):
    """Zero-width, zero-height and point boxes, identical, touching, nested and disjoint pairs,
    collinear lines (gradients near 1 / eps), at each of ``scales`` (and, with ``with_scale``,
    each pair's scale)."""
    rows = [
        ([0, 0, 0, 2], [0, 1, 0, 3]),  # collinear zero-width
        ([0, 0, 2, 0], [1, 0, 3, 0]),  # collinear zero-height
        ([1, 1, 1, 1], [1, 1, 1, 1]),  # identical points
        ([1, 1, 1, 1], [0, 0, 2, 2]),  # point inside a box
        ([1, 1, 1, 1], [3, 3, 3, 3]),  # two points
        ([0, 0, 0, 2], [1, 0, 3, 2]),  # a line beside a box
        ([0, 0, 2, 0], [0, 0, 0, 2]),  # a horizontal and a vertical line
        ([0, 0, 2, 2], [0, 0, 2, 2]),  # identical
        ([0.5, 0.5, 0.7, 0.9], [0.5, 0.5, 0.7, 0.9]),
        ([0, 0, 1, 1], [1, 0, 2, 1]),  # touching edges
        ([0, 0, 1, 1], [1, 1, 2, 2]),  # touching corners
        ([0, 0, 4, 4], [1, 1, 2, 3]),  # nested
        ([0, 0, 1, 1], [5, 7, 6, 9]),  # disjoint
        ([0, 0, 1, 2], [0, 0, 2, 1]),  # same centre, swapped aspect
        ([0, 0, 3, 1], [0, 0, 1, 3]),
        ([2, 2, 3, 3], [0, 0, 1, 1]),
    ]
    pred = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    target = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    scales = torch.tensor(scales, dtype=torch.float64)
    pred = (pred[None] * scales[:, None, None]).reshape(-1, 4)
    target = (target[None] * scales[:, None, None]).reshape(-1, 4)
    pair_scale = scales.repeat_interleave(len(rows)).repeat(2).float()
    both = torch.cat([pred, target]).float(), torch.cat([target, pred]).float()  # both orders
    return (*both, pair_scale) if with_scale else both


def function_outputs(pred, target, kind, *, loss, reduce_sum, eps=1e-7, grad_out=None):
    """Value and the gradients of both inputs through `AlignedIoUFunction` (no rescaling)."""
    pred = pred.detach().clone().requires_grad_(True)
    target = target.detach().clone().requires_grad_(True)
    eps_t = eps_tensor(eps, None, pred.dtype, pred.device)
    value = AlignedIoUFunction.apply(pred, target, kind, eps_t, loss, reduce_sum)
    if grad_out is None:
        grad_out = torch.ones_like(value)
    return (value, *torch.autograd.grad(value, (pred, target), grad_out))


def assert_outputs_close(actual, expected, **tol):
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, **(tol or {"rtol": 1e-5, "atol": 1e-6}))


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("loss", [True, False])
@pytest.mark.parametrize("reduce_sum", [False, True])
def test_random_pairs_match_the_torch_path(name, loss, reduce_sum, calls):
    pred, target = random_pairs(1000, seed=5)
    grad_out = None if reduce_sum else torch.rand(1000, generator=torch.Generator().manual_seed(1))
    kwargs = {"loss": loss, "reduce_sum": reduce_sum, "grad_out": grad_out}
    actual = function_outputs(pred, target, KINDS[name], **kwargs)
    assert calls
    expected = torch_path(function_outputs, pred, target, KINDS[name], **kwargs)
    tol = {"rtol": 1e-5, "atol": 1e-3} if reduce_sum else {}  # a sum of 1000 values
    assert_outputs_close(actual, expected, **tol)


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("eps", [1e-7, 0.0])
def test_degenerate_pairs_match_the_torch_path(name, eps, calls):
    pred, target, scale = degenerate_pairs(with_scale=True)
    kind, loss = KINDS[name], KINDS[name] != IOU
    actual = function_outputs(pred, target, kind, loss=loss, reduce_sum=False, eps=eps)
    assert calls
    expected = torch_path(
        function_outputs, pred, target, kind, loss=loss, reduce_sum=False, eps=eps
    )
    # Gradients scale as 1 / scale; compared as gradient * scale. (The torch path's addcmul
    # fuses, so where two terms of ~1 / scale cancel exactly, as for identical boxes, it leaves
    # a rounding residual of ~1e-8 / scale; the kernel gives 0 there, as the reference.)
    actual = (actual[0], *(g * scale[:, None] for g in actual[1:]))
    expected = (expected[0], *(g * scale[:, None] for g in expected[1:]))
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, equal_nan=eps == 0)
    if eps > 0:
        assert all(torch.isfinite(t).all() for t in actual)
    identical = (pred == target).all(1) & (pred[:, 2:] > pred[:, :2]).all(1)
    assert (actual[0][identical] == (0.0 if loss else 1.0)).all()  # exactly
    assert (actual[1][identical] == 0).all() and (actual[2][identical] == 0).all()


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_losses_match_the_reference(name, reduction, calls):
    pred, target = random_pairs(700, seed=2)
    grad_out = torch.rand(700, generator=torch.Generator().manual_seed(3))
    grad_out = grad_out if reduction == "none" else None
    fn = LOSSES[name][0]
    actual = loss_and_grads(fn, pred, target, grad_out, reduction=reduction)
    assert calls
    expected = loss_and_grads(reference(name), pred, target, grad_out, reduction=reduction)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == torch.float32
        assert_close(a, e.float(), scale=10 if reduction == "sum" else 1)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_degenerate_losses_match_the_reference(name, calls):
    # One scale: the losses rescale a batch by its largest coordinate, the reference does not.
    pred, target = degenerate_pairs(scales=(1.0,))
    actual = loss_and_grads(LOSSES[name][0], pred, target)
    assert calls
    expected = loss_and_grads(reference(name), pred, target)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e.float(), rtol=1e-5, atol=1e-5)
    identical = (pred == target).all(1) & (pred[:, 2:] > pred[:, :2]).all(1)
    assert (actual[0][identical] == 0).all()  # exactly


def test_ciou_angles_over_every_aspect_ratio(calls):
    """The kernel's own atan: aspect ratios from 1e-6 to 1e6, flat and point boxes."""
    gen = torch.Generator().manual_seed(13)
    n = 2000
    ratio = 10 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 12 - 6)
    wh = torch.stack([ratio.sqrt(), 1 / ratio.sqrt()], 1)
    wh[:10] = torch.tensor([0.0, 1.0], dtype=torch.float64)  # w = 0
    wh[10:20] = torch.tensor([1.0, 0.0], dtype=torch.float64)  # h = 0
    wh[20:25] = 0.0  # points
    xy = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    pred = torch.cat([xy, xy + wh], 1).float()
    target = torch.cat([xy, xy + wh.flip(0) * 0.9 + 0.05], 1).float()
    actual = loss_and_grads(LOSSES["ciou"][0], pred, target)
    assert calls
    expected = loss_and_grads(reference("ciou"), pred, target)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e.float(), rtol=1e-5, atol=1e-5)


def test_aligned_box_ops_use_the_kernel(calls):
    pred, target = random_pairs(300, seed=4)
    for fn in (box_iou, complete_box_iou):
        actual = fn(pred, target, aligned=True)
        expected = torch_path(fn, pred, target, aligned=True)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert calls


@pytest.mark.parametrize("name", sorted(KINDS))
def test_summed_and_per_pair_calls_agree(name, native):
    pred, target = random_pairs(999, seed=6)
    per_pair = function_outputs(pred, target, KINDS[name], loss=True, reduce_sum=False)
    summed = function_outputs(pred, target, KINDS[name], loss=True, reduce_sum=True)
    assert torch.equal(per_pair[1], summed[1]) and torch.equal(per_pair[2], summed[2])
    torch.testing.assert_close(summed[0], per_pair[0].double().sum().float())
    # A pair's results do not depend on where it lies (block tails, vector remainders).
    shifted = function_outputs(pred[7:], target[7:], KINDS[name], loss=True, reduce_sum=False)
    assert all(torch.equal(s, p[7:]) for s, p in zip(shifted, per_pair, strict=True))


team = team_fixture(_iou_loss_native.LIBRARY)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_results_do_not_depend_on_the_thread_count(name, team, monkeypatch):
    monkeypatch.setattr(_iou_loss_torch, "_PIECE", 100)  # 31 parts
    pred, target = random_pairs(3001, seed=7)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(
                function_outputs(pred, target, KINDS[name], loss=True, reduce_sum=True)
                + function_outputs(pred, target, KINDS[name], loss=True, reduce_sum=False)[:1]
            )
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(other, results[0], strict=True))


def test_empty_single_and_strided_inputs(native):
    for n in (0, 1, 63, 65):
        pred, target = random_pairs(n, seed=n)
        actual = function_outputs(pred, target, CIOU, loss=True, reduce_sum=n % 2 == 1)
        expected = torch_path(
            function_outputs, pred, target, CIOU, loss=True, reduce_sum=n % 2 == 1
        )
        assert_outputs_close(actual, expected)
    pred, target = random_pairs(200, seed=8)
    strided = pred.t().contiguous().t()  # (200, 4), not contiguous
    assert not strided.is_contiguous()
    actual = function_outputs(strided, target, GIOU, loss=True, reduce_sum=False)
    assert_outputs_close(actual, function_outputs(pred, target, GIOU, loss=True, reduce_sum=False))


def test_float64_runs_the_torch_path(calls):
    pred, target = random_pairs(50, torch.float64)
    function_outputs(pred, target, CIOU, loss=True, reduce_sum=False)
    assert not calls


def test_falls_back_to_torch_when_the_kernel_cannot_be_built(monkeypatch, tmp_path):
    monkeypatch.setattr(_iou_loss_native.LIBRARY, "state", {})
    monkeypatch.setenv("VISIONBLOCKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    reason = _iou_loss_native.native_unavailable_reason()
    assert "could not build the iou_loss_kernel" in reason
    pred, target = random_pairs(100, seed=9)
    for name in sorted(LOSSES):
        actual = loss_and_grads(LOSSES[name][0], pred, target)
        expected = loss_and_grads(reference(name), pred, target)
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e.float())

    monkeypatch.setattr(_iou_loss_native.LIBRARY, "state", {})
    monkeypatch.setenv(_iou_loss_native.ENV_DISABLE, "1")
    assert "disabled" in _iou_loss_native.native_unavailable_reason()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::FutureWarning")
def test_traced_calls_run_the_torch_path(calls):
    """The kernel writes through ``data_ptr``, which a trace would not see: a traced call runs
    the torch ops, so the replayed trace stays right for new inputs."""
    fn = LOSSES["ciou"][0]
    pred, target = random_pairs(40, seed=10)
    new_pred, new_target = random_pairs(40, seed=11)
    traced = torch.jit.trace(fn, (pred, target), check_trace=False)
    assert not calls
    assert_close(traced(new_pred, new_target), torch_path(fn, new_pred, new_target))


def test_compiled_calls_run_the_torch_path(calls):
    fn = LOSSES["diou"][0]
    compiled = torch.compile(lambda p, t: fn(p, t, reduction="sum"), backend="eager")
    pred, target = random_pairs(40, seed=12)
    pred.requires_grad_(True)
    loss = compiled(pred, target)
    (grad,) = torch.autograd.grad(loss, pred)
    assert not calls
    expected = torch_path(loss_and_grads, fn, pred, target, reduction="sum")
    assert_close(loss, expected[0])
    assert_close(grad, expected[1])
