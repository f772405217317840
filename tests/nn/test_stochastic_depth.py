"""`drop_path` / `StochasticDepth` against torchvision's ``stochastic_depth`` and timm's
``DropPath`` with the same seed; scripting and export."""

from __future__ import annotations

import pytest
import timm.layers
import torch
import torchvision.ops

from visionblocks.nn import StochasticDepth, drop_path
from visionblocks.registry import LAYERS


def _seeded(fn, seed: int = 0):
    torch.manual_seed(seed)
    return fn()


@pytest.mark.parametrize("mode", ["row", "batch"])
@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_matches_torchvision_with_the_same_seed(p, mode):
    x = torch.randn(16, 3, 4, 5)
    ours = _seeded(lambda: drop_path(x, p, mode))
    ref = _seeded(lambda: torchvision.ops.stochastic_depth(x, p, mode))
    assert torch.equal(ours, ref)
    module = StochasticDepth(p, mode)
    assert torch.equal(_seeded(lambda: module(x)), ref)
    assert torch.equal(module.eval()(x), x) and torch.equal(drop_path(x, p, mode, False), x)


@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
def test_row_mode_is_timms_drop_path(p):
    x = torch.randn(32, 7, dtype=torch.float64)
    peer = timm.layers.DropPath(p).train()
    assert torch.equal(_seeded(lambda: StochasticDepth(p)(x)), _seeded(lambda: peer(x)))
    dropped = drop_path(x, p) == 0
    assert dropped.all(1).eq(dropped.any(1)).all()  # whole rows


def test_gradient_and_half():
    x = torch.randn(8, 4, requires_grad=True)
    out = _seeded(lambda: drop_path(x, 0.5))
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out / x).detach().nan_to_num())
    half = _seeded(lambda: drop_path(x.detach().bfloat16(), 0.5))
    assert half.dtype == torch.bfloat16


def test_scripts_with_the_same_draws():
    module = StochasticDepth(0.4, "row")
    scripted = torch.jit.script(module)
    x = torch.randn(10, 3)
    assert torch.equal(_seeded(lambda: scripted(x)), _seeded(lambda: module(x)))
    assert torch.equal(_seeded(lambda: torch.jit.script(drop_path)(x, 0.4, "batch", True)),
                       _seeded(lambda: drop_path(x, 0.4, "batch")))  # fmt: skip


def test_compiles_and_registered():
    x = torch.randn(6, 3)
    compiled = torch.compile(lambda t: drop_path(t, 0.3), fullgraph=True, backend="eager")
    assert torch.equal(_seeded(lambda: compiled(x)), _seeded(lambda: drop_path(x, 0.3)))
    assert isinstance(LAYERS.build({"type": "stochastic_depth", "p": 0.1}), StochasticDepth)
    assert repr(StochasticDepth(0.25)) == "StochasticDepth(p=0.25, mode='row')"


@pytest.mark.slow
def test_exports_to_onnx_in_eval_mode(tmp_path):
    pytest.importorskip("onnxscript")
    from visionblocks.deploy import export_model

    result = export_model(
        StochasticDepth(0.3).eval(), torch.randn(2, 4, 64, 64), tmp_path / "s.onnx"
    )
    assert result.max_abs_diff == 0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: StochasticDepth(1.5), ValueError, r"p must be in \[0.0, 1.0\]"),
        (lambda: StochasticDepth(0.1, "rows"), ValueError, "mode"),
        (
            lambda: drop_path(torch.ones(2, dtype=torch.long), 0.1),
            TypeError,
            "input must be a floating",
        ),
        (lambda: drop_path(torch.ones(2), 0.1, training=1), TypeError, "training"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_autocast_changes_nothing():
    x = torch.randn(6, 3, 4, 4)
    ref = _seeded(lambda: StochasticDepth(0.5)(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(_seeded(lambda: StochasticDepth(0.5)(x)), ref)
