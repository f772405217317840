"""`SqueezeExcitation` against torchvision's: same state dict, same output, script, export."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.ops import SqueezeExcitation as PeerSqueezeExcitation

from visionblocks.nn import SqueezeExcitation
from visionblocks.registry import LAYERS


@pytest.mark.parametrize(
    ("activation", "scale_activation"), [(nn.ReLU, nn.Sigmoid), (nn.SiLU, nn.Hardsigmoid)]
)
def test_equals_torchvision(activation, scale_activation):
    torch.manual_seed(0)
    peer = PeerSqueezeExcitation(12, 4, activation, scale_activation)
    ours = SqueezeExcitation(12, 4, activation, scale_activation)
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(2, 12, 7, 5)
    assert torch.equal(ours(x), peer(x))
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in peer.named_modules()]


def test_named_activations_and_gradients():
    ours = SqueezeExcitation(8, 2, activation="silu")
    assert isinstance(ours.activation, nn.SiLU) and isinstance(ours.scale_activation, nn.Sigmoid)
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    ours(x).sum().backward()
    assert x.grad is not None and ours.fc1.weight.grad is not None


def test_scripts_compiles_and_registered():
    torch.manual_seed(0)
    ours = SqueezeExcitation(8, 2)
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(torch.jit.script(ours)(x), ours(x))
    torch.testing.assert_close(torch.compile(ours, fullgraph=True, backend="eager")(x), ours(x))
    built = LAYERS.build({"type": "squeeze_excitation", "input_channels": 8, "squeeze_channels": 2})
    assert isinstance(built, SqueezeExcitation)


@pytest.mark.slow
def test_exports_to_onnx(tmp_path):
    pytest.importorskip("onnxscript")
    from visionblocks.deploy import export_model

    result = export_model(
        SqueezeExcitation(8, 2).eval(), torch.randn(2, 8, 64, 64), tmp_path / "s.onnx"
    )
    assert result.max_abs_diff < 1e-5


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: SqueezeExcitation(0, 2), ValueError, "input_channels must be in"),
        (lambda: SqueezeExcitation(8, 2.0), TypeError, "squeeze_channels must be int"),
        (lambda: SqueezeExcitation(8, 2, activation=nn.ReLU()), TypeError, "act must be a name"),
        (
            lambda: SqueezeExcitation(8, 2)(torch.randn(2, 6, 4, 4)),
            ValueError,
            r"input must have shape \(B, 8, H, W\)",
        ),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
