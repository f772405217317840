"""`drop_block2d` / `drop_block3d` and their modules against torchvision's with the same seed."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops

from visionblocks.nn import DropBlock2d, DropBlock3d, drop_block2d, drop_block3d
from visionblocks.registry import LAYERS


def _seeded(fn, seed: int = 0):
    torch.manual_seed(seed)
    return fn()


@pytest.mark.parametrize(
    ("p", "block_size"), [(0.0, 3), (0.1, 3), (0.3, 5), (0.5, 7), (1.0, 3), (0.2, 99)]
)
def test_2d_matches_torchvision(p, block_size):
    x = torch.randn(3, 4, 11, 9)
    ref = _seeded(lambda: torchvision.ops.drop_block2d(x, p, block_size))
    assert torch.equal(_seeded(lambda: drop_block2d(x, p, block_size)), ref)
    peer = torchvision.ops.DropBlock2d(p, block_size, eps=1e-3)
    ours = DropBlock2d(p, block_size, eps=1e-3)
    assert torch.equal(_seeded(lambda: ours(x)), _seeded(lambda: peer(x)))
    assert torch.equal(ours.eval()(x), x)


@pytest.mark.parametrize(("p", "block_size"), [(0.1, 3), (0.4, 5), (1.0, 1)])
def test_3d_matches_torchvision(p, block_size):
    x = torch.randn(2, 3, 6, 7, 8, dtype=torch.float64)
    ref = _seeded(lambda: torchvision.ops.drop_block3d(x, p, block_size))
    assert torch.equal(_seeded(lambda: drop_block3d(x, p, block_size)), ref)
    assert torch.equal(_seeded(lambda: DropBlock3d(p, block_size)(x)), ref)


def test_inplace_and_gradient():
    x = torch.randn(2, 3, 8, 8)
    ref = _seeded(lambda: torchvision.ops.drop_block2d(x, 0.3, 3))
    y = x.clone()
    out = _seeded(lambda: drop_block2d(y, 0.3, 3, inplace=True))
    assert out is y and torch.equal(y, ref)
    leaf = x.clone().requires_grad_()
    _seeded(lambda: drop_block2d(leaf, 0.3, 3)).sum().backward()
    torch.testing.assert_close(leaf.grad, ref / x)


def test_scripts_with_the_same_draws():
    x = torch.randn(2, 3, 9, 9)
    for module in (DropBlock2d(0.3, 3), DropBlock3d(0.3, 3)):
        y = x if isinstance(module, DropBlock2d) else x[:, :, None].expand(2, 3, 4, 9, 9)
        scripted = torch.jit.script(module)
        ours = _seeded(lambda s=scripted, y=y: s(y))
        assert torch.equal(ours, _seeded(lambda m=module, y=y: m(y)))


def test_compiles_and_registered():
    x = torch.randn(2, 3, 9, 9)
    compiled = torch.compile(lambda t: drop_block2d(t, 0.3, 3), fullgraph=True, backend="eager")
    assert torch.equal(_seeded(lambda: compiled(x)), _seeded(lambda: drop_block2d(x, 0.3, 3)))
    assert isinstance(
        LAYERS.build({"type": "drop_block2d", "p": 0.1, "block_size": 3}), DropBlock2d
    )
    assert repr(DropBlock2d(0.1, 3)) == "DropBlock2d(p=0.1, block_size=3, inplace=False)"


@pytest.mark.slow
def test_exports_to_onnx_in_eval_mode(tmp_path):
    pytest.importorskip("onnxscript")
    from visionblocks.deploy import export_model

    result = export_model(
        DropBlock2d(0.3, 3).eval(), torch.randn(2, 4, 64, 64), tmp_path / "d.onnx"
    )
    assert result.max_abs_diff == 0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: DropBlock2d(-0.1, 3), ValueError, "p must be in"),
        (lambda: DropBlock2d(0.1, 0), ValueError, "block_size must be in"),
        (lambda: DropBlock2d(0.1, 3, eps=0.0), ValueError, "eps must be in"),
        (
            lambda: drop_block2d(torch.randn(2, 3, 8, 8), 0.1, 4),
            ValueError,
            "block_size must be odd",
        ),
        (lambda: drop_block2d(torch.randn(2, 3, 4, 8), 0.1, 5), ValueError, "got 4"),
        (
            lambda: drop_block2d(torch.randn(3, 8, 8), 0.1, 3),
            ValueError,
            r"input must have shape \(N, C, H, W\)",
        ),
        (lambda: drop_block3d(torch.randn(1, 3, 8, 8), 0.1, 3), ValueError, r"\(N, C, D, H, W\)"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_autocast_changes_nothing():
    x = torch.randn(2, 3, 9, 9)
    ref = _seeded(lambda: DropBlock2d(0.3, 3)(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(_seeded(lambda: DropBlock2d(0.3, 3)(x)), ref)
