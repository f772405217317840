"""TorchScript and tracing of sigmoid_focal_loss (visionblocks.losses._focal_script)."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from torch import Tensor, nn

from visionblocks.losses.focal import sigmoid_focal_loss

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
]

_SCRIPTED = []


def scripted():
    if not _SCRIPTED:
        _SCRIPTED.append(torch.jit.script(sigmoid_focal_loss))
    return _SCRIPTED[0]


def inputs(dtype, shape=(6, 5, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 6).to(dtype)
    binary = (torch.rand(shape, generator=g) > 0.7).to(dtype)
    soft = torch.rand(shape, generator=g).to(dtype)
    index = torch.randint(-1, shape[-1] + 1, shape[:-1], generator=g)  # -1 and C: background
    return x, {"binary": binary, "soft": soft, "index": index}


def close(eager: Tensor, script: Tensor) -> None:
    assert script.dtype == eager.dtype and script.shape == eager.shape
    torch.testing.assert_close(script.double(), eager.double(), rtol=2e-5, atol=1e-7)


def test_scripts():
    assert isinstance(scripted(), torch.jit.ScriptFunction)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("kind", ["binary", "soft", "index"])
@pytest.mark.parametrize("alpha", [None, 0.25, -1.0])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0, 1.7])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_equals_eager(dtype, kind, alpha, gamma, reduction):
    x, targets = inputs(dtype)
    t = targets[kind]
    close(
        sigmoid_focal_loss(x, t, alpha, gamma, reduction),
        scripted()(x, t, alpha, gamma, reduction),
    )


@pytest.mark.parametrize("kind", ["binary", "index"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("normalizer", [None, 3.0, torch.tensor(2.5), torch.tensor([2.5])])
def test_weight_ignore_normalizer_equal_eager(kind, reduction, normalizer):
    x, targets = inputs(torch.float32)
    t = targets[kind].clone()
    ignore = -1.0
    if kind == "binary":
        t[0, 0, :2] = -1.0
    else:
        ignore = 2  # a class index (every row whose target is 2)
    w = torch.rand(4)
    kwargs = {"weight": w, "ignore_index": ignore, "normalizer": normalizer}
    eager = sigmoid_focal_loss(x, t, 0.25, 2.0, reduction, **kwargs)
    close(eager, scripted()(x, t, 0.25, 2.0, reduction, **kwargs))


def test_confident_logits_exact():
    x = torch.tensor([[14.7, -14.7, 30.0, -30.0]])
    t = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    script = scripted()(x, t, 0.25, 2.0, "none")
    torch.testing.assert_close(script, sigmoid_focal_loss(x, t), rtol=1e-5, atol=0)
    assert (script > 0).all()  # 1 - p_t by subtraction would give 0 at |x| = 30


def test_matches_torchvision_scripted():
    x, targets = inputs(torch.float64)
    theirs = torch.jit.script(tvo.sigmoid_focal_loss)
    for t in (targets["binary"], targets["soft"]):
        for reduction in ("none", "mean", "sum"):
            torch.testing.assert_close(
                scripted()(x, t, 0.25, 2.0, reduction), theirs(x, t, 0.25, 2.0, reduction)
            )


def test_errors():
    x, targets = inputs(torch.float32)
    fn = scripted()
    with pytest.raises(torch.jit.Error, match="impl must be 'auto' or 'torch'"):
        fn(x, targets["binary"], impl="triton")
    with pytest.raises(torch.jit.Error, match="reduction must be"):
        fn(x, targets["binary"], 0.25, 2.0, "avg")
    with pytest.raises(torch.jit.Error, match="alpha must be in"):
        fn(x, targets["binary"], 1.5)
    with pytest.raises(torch.jit.Error, match="gamma must be"):
        fn(x, targets["binary"], 0.25, -1.0)
    with pytest.raises(torch.jit.Error, match="shape inputs.shape"):
        fn(x, targets["index"][:2])
    with pytest.raises(torch.jit.Error, match="normalizer must be"):
        fn(x, targets["binary"], normalizer=0.0)


def test_gradients_equal_eager():
    x, targets = inputs(torch.float64)
    x.requires_grad_()
    for t in targets.values():
        (g_script,) = torch.autograd.grad(scripted()(x, t, 0.25, 2.0, "sum"), x)
        (g_eager,) = torch.autograd.grad(sigmoid_focal_loss(x, t, 0.25, 2.0, "sum"), x)
        torch.testing.assert_close(g_script, g_eager)


class _Head(nn.Module):
    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return sigmoid_focal_loss(logits, labels, 0.25, 2.0, "sum", normalizer=2.0)


def test_called_from_scripted_module():
    x, targets = inputs(torch.float32)
    out = torch.jit.script(_Head())(x, targets["index"])
    close(sigmoid_focal_loss(x, targets["index"], reduction="sum", normalizer=2.0), out)


@pytest.mark.parametrize("kind", ["binary", "index"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore", [None, -1])
def test_trace_generalises_to_other_sizes(kind, reduction, ignore):
    """The torch sweep cuts rows into parts on the traced size; a trace must not bake it in."""

    def loss(x: Tensor, t: Tensor) -> Tensor:
        return sigmoid_focal_loss(x, t, 0.25, 2.0, reduction, ignore_index=ignore, impl="torch")

    x, targets = inputs(torch.float64, shape=(64, 5))
    traced = torch.jit.trace(loss, (x, targets[kind]), check_trace=False)
    for rows in (7, 64, 70_000):  # 70K rows: several parts of the eager sweep
        x2, targets2 = inputs(torch.float64, shape=(rows, 5), seed=rows)
        t2 = targets2[kind]
        if ignore is not None and kind == "binary":
            t2[::3, 0] = -1.0
        close(loss(x2, t2), traced(x2, t2))
