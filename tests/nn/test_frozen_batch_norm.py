"""`FrozenBatchNorm2d` against torchvision's: state dicts both ways, outputs, fusion, export."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d as PeerFrozenBatchNorm2d

from visionblocks.nn import FrozenBatchNorm2d, find_conv_bn_pairs, fuse_modules
from visionblocks.registry import LAYERS


def _random_state(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return {
        "weight": torch.rand(n, generator=g) + 0.5,
        "bias": torch.randn(n, generator=g),
        "running_mean": torch.randn(n, generator=g),
        "running_var": torch.rand(n, generator=g) + 0.1,
    }


def test_equals_torchvision_and_loads_its_state_both_ways():
    ours, peer = FrozenBatchNorm2d(6, eps=1e-3), PeerFrozenBatchNorm2d(6, eps=1e-3)
    peer.load_state_dict(_random_state(6))
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(2, 6, 5, 7)
    assert torch.equal(ours(x), peer(x))
    back = PeerFrozenBatchNorm2d(6, eps=1e-3)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back(x), ours(x))
    assert sorted(ours.state_dict()) == sorted(peer.state_dict())
    assert not list(ours.parameters())


def test_loads_a_batchnorm_state_dict():
    bn = nn.BatchNorm2d(4).eval()
    bn.load_state_dict({**_random_state(4), "num_batches_tracked": torch.tensor(7)})
    frozen = FrozenBatchNorm2d(4)
    frozen.load_state_dict(bn.state_dict())
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(frozen.double()(x), bn.double()(x))


def test_fuse_modules_folds_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), FrozenBatchNorm2d(6), nn.ReLU())
    model[1].load_state_dict(_random_state(6))
    assert find_conv_bn_pairs(model) == [("0", "1")]
    fused = fuse_modules(model.eval())
    assert isinstance(fused[1], nn.Identity)
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


def test_scripts_compiles_and_registered():
    norm = FrozenBatchNorm2d(4)
    norm.load_state_dict(_random_state(4))
    x = torch.randn(2, 4, 5, 5)
    assert torch.equal(torch.jit.script(norm)(x), norm(x))
    compiled = torch.compile(norm, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), norm(x))
    assert isinstance(LAYERS.build({"type": "frozen_bn", "num_features": 4}), FrozenBatchNorm2d)
    assert repr(norm) == "FrozenBatchNorm2d(4, eps=1e-05)"


@pytest.mark.slow
def test_exports_to_onnx(tmp_path):
    pytest.importorskip("onnxscript")
    from visionblocks.deploy import export_model

    norm = FrozenBatchNorm2d(4)
    norm.load_state_dict(_random_state(4))
    result = export_model(norm, torch.randn(2, 4, 64, 64), tmp_path / "f.onnx")
    assert result.max_abs_diff < 1e-5


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: FrozenBatchNorm2d(0), ValueError, "num_features must be in"),
        (lambda: FrozenBatchNorm2d(4, eps=0.0), ValueError, "eps must be in"),
        (
            lambda: FrozenBatchNorm2d(4)(torch.randn(2, 3, 5, 5)),
            ValueError,
            r"x must have shape \(B, 4, H, W\)",
        ),
        (
            lambda: FrozenBatchNorm2d(4)(torch.ones(2, 4, 5, 5, dtype=torch.long)),
            TypeError,
            "x must be a floating",
        ),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
