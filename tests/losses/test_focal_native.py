"""The C kernel of the sigmoid focal loss (`visionblocks.losses._focal_native`).

It must give what the torch sweep gives (values, gradients, counts) for every target kind,
option and extreme logit, be used where it applies (and only there), not depend on the thread
count, and step aside when it cannot be built.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import team_fixture
from tests.reference import focal as ref
from visionblocks.losses import _focal_native, sigmoid_focal_loss


@pytest.fixture
def native():
    reason = _focal_native.LIBRARY.reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def calls(monkeypatch):
    """Counts the kernel's calls (one per loss call on the OpenMP team, one per part else)."""
    seen = []
    real = _focal_native.LIBRARY.functions

    def spy():
        fns = real()
        if fns is None:
            return None
        fn = fns["vb_focal_f32_parts"]
        return {"vb_focal_f32_parts": lambda *a: seen.append(1) or fn(*a)}

    monkeypatch.setattr(_focal_native.LIBRARY, "functions", spy)
    return seen


def _torch_path(monkeypatch):
    monkeypatch.setattr(_focal_native.LIBRARY, "functions", lambda: None)


def _run(x, t, **kw):
    x = x.clone().requires_grad_(True)
    loss = sigmoid_focal_loss(x, t, impl="torch", **kw)
    (grad,) = torch.autograd.grad(loss, x, torch.ones_like(loss))
    return loss.detach(), grad


def _inputs(rows=300, cols=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * 6
    extremes = torch.tensor([0.0, -0.0, 30.0, -30.0, 90.0, -90.0, 110.0])
    x.view(-1)[:7] = extremes
    labels = torch.randint(-1, cols + 1, (rows,), generator=gen)
    onehot = (labels.unsqueeze(1) == torch.arange(cols)).float()
    soft = torch.rand(rows, cols, generator=gen)
    return x, labels, onehot, soft


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 7.5])
@pytest.mark.parametrize("alpha", [0.25, None, 1.0])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("kind", ["onehot", "soft", "labels"])
def test_equals_the_torch_sweep(native, calls, monkeypatch, gamma, alpha, reduction, kind):
    x, labels, onehot, soft = _inputs()
    t = {"onehot": onehot, "soft": soft, "labels": labels}[kind]
    kw = dict(alpha=alpha, gamma=gamma, reduction=reduction)
    loss, grad = _run(x, t, **kw)
    assert calls  # the kernel ran
    _torch_path(monkeypatch)
    loss_t, grad_t = _run(x, t, **kw)
    torch.testing.assert_close(loss, loss_t, rtol=2e-6, atol=1e-30)
    # Soft targets: p - t cancels where p is near t, in both paths alike (a few float eps of
    # the gradient's scale apart); binary targets: element-wise relative (the torch sweep
    # forms 1 - p for class indices, a few eps off at gamma >= 3; ours is nearer float64).
    torch.testing.assert_close(grad, grad_t, rtol=1e-5, atol=1e-7 if kind == "soft" else 1e-30)


@pytest.mark.parametrize("kind", ["onehot", "labels"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_ignore_index_equals_the_torch_sweep(native, calls, monkeypatch, kind, reduction):
    x, labels, onehot, _ = _inputs(seed=1)
    if kind == "labels":
        t, ignore = labels.clone(), -1
    else:
        t, ignore = onehot.clone(), 2.0
        t[::3, ::2] = 2.0
    loss, grad = _run(x, t, ignore_index=ignore, reduction=reduction)
    assert calls
    _torch_path(monkeypatch)
    loss_t, grad_t = _run(x, t, ignore_index=ignore, reduction=reduction)
    torch.testing.assert_close(loss, loss_t, rtol=2e-6, atol=1e-30)
    torch.testing.assert_close(grad, grad_t, rtol=2e-6, atol=1e-30)


def test_extreme_and_non_finite_logits(native):
    x = torch.tensor([[-200.0, -104.5, -103.0, -88.0, -87.0, -1e-30, 1e-30, 87.0, 103.0, 200.0]])
    for t in (torch.zeros_like(x), torch.ones_like(x)):
        loss, grad = _run(x, t, alpha=None, gamma=0.0)
        expected = ref.sigmoid_focal_loss(x, t, None, 0.0)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
        big = expected > 1e-30
        assert ((loss.double() - expected).abs()[big] / expected[big]).max() <= 1e-5
        assert (loss.double()[~big] <= 1e-30).all()
    nan = _run(torch.tensor([[float("nan"), 1.0]]), torch.ones(1, 2))[0]
    assert nan[0, 0].isnan() and nan[0, 1].isfinite()


team = team_fixture(_focal_native.LIBRARY)


def test_sum_does_not_depend_on_the_thread_count(team):
    x, labels, onehot, _ = _inputs(rows=5000, cols=80, seed=2)
    before = torch.get_num_threads()
    try:
        out = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append([_run(x, t, reduction="sum") for t in (onehot, labels)])
    finally:
        torch.set_num_threads(before)
    for (a_loss, a_grad), (b_loss, b_grad) in zip(*out, strict=True):
        assert torch.equal(a_loss, b_loss) and torch.equal(a_grad, b_grad)


def test_not_used_where_it_does_not_apply(native, calls):
    x, _, onehot, _ = _inputs(rows=20, cols=5)
    _run(x.double(), onehot.double())  # float64
    _run(x, onehot, gamma=0.3)  # not a multiple of 1/2
    _run(x, onehot, weight=torch.rand(20, 5))  # weighted
    assert not calls
    _run(x, onehot, gamma=2.5)
    assert calls


def test_falls_back_when_the_kernel_cannot_be_built(monkeypatch, tmp_path):
    monkeypatch.setattr(_focal_native.LIBRARY, "state", {})
    monkeypatch.setenv("VISIONBLOCKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert "could not build the focal_kernel" in _focal_native.LIBRARY.reason()
    x, _, onehot, _ = _inputs(rows=10, cols=4)
    loss = sigmoid_focal_loss(x, onehot, reduction="sum", impl="torch")
    expected = ref.sigmoid_focal_loss(x.double(), onehot.double()).sum()
    assert abs(loss.item() - expected.item()) <= 1e-5 * expected.item()
