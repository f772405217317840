"""`MLP` against torchvision's: same layers and state dict, same output, script, export."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.ops import MLP as PeerMLP

from visionblocks.nn import MLP
from visionblocks.registry import LAYERS


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"norm_layer": nn.LayerNorm, "dropout": 0.2},
        {"activation_layer": nn.GELU, "bias": False},
        {"inplace": True, "activation_layer": nn.ReLU},
        {"norm_layer": nn.BatchNorm1d, "inplace": False},
    ],
)
def test_equals_torchvision(kwargs):
    torch.manual_seed(0)
    peer = PeerMLP(16, [32, 24, 8], **kwargs)
    ours = MLP(16, [32, 24, 8], **kwargs)
    assert repr(ours).replace("MLP", "") == repr(peer).replace("MLP", "")
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(5, 16)
    ours.eval(), peer.eval()
    assert torch.equal(ours(x), peer(x))
    ours.train(), peer.train()
    torch.manual_seed(1)
    out = ours(x)
    torch.manual_seed(1)
    assert torch.equal(out, peer(x))  # dropout draws too


def test_named_activation_and_leading_dims():
    mlp = MLP(4, [6, 3], activation_layer="silu")
    assert isinstance(mlp[1], nn.SiLU)
    assert mlp(torch.randn(2, 7, 4)).shape == (2, 7, 3)
    assert len(MLP(4, [3])) == 2  # Linear, Dropout


def test_scripts_compiles_and_registered():
    torch.manual_seed(0)
    mlp = MLP(8, [16, 4], norm_layer=nn.LayerNorm).eval()
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.jit.script(mlp)(x), mlp(x))
    torch.testing.assert_close(torch.compile(mlp, fullgraph=True, backend="eager")(x), mlp(x))
    built = LAYERS.build({"type": "mlp", "in_channels": 8, "hidden_channels": [4]})
    assert isinstance(built, MLP)


@pytest.mark.slow
def test_exports_to_onnx(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    mlp = MLP(8, [16, 4], norm_layer=nn.LayerNorm).eval()
    x = torch.randn(3, 8)
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(mlp, (x,), str(path), dynamo=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), mlp(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: MLP(0, [4]), ValueError, "in_channels must be in"),
        (lambda: MLP(4, []), ValueError, "hidden_channels must name"),
        (lambda: MLP(4, 8), TypeError, "hidden_channels must be"),
        (lambda: MLP(4, [8], dropout=1.5), ValueError, "dropout must be in"),
        (lambda: MLP(4, [8], norm_layer="ln"), TypeError, "norm_layer must be a factory"),
        (lambda: MLP(4, [8])(torch.randn(2, 5)), ValueError, r"input must have shape \(\*, 4\)"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
