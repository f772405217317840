"""`ConvNormAct3d` and `Permute` against torchvision's `Conv3dNormActivation` and `Permute`."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from torch import nn

from visionblocks.nn import ConvNormAct3d, Permute
from visionblocks.registry import LAYERS

_CONFIGS = [
    {},
    {"kernel_size": (3, 1, 5), "stride": (1, 2, 2), "dilation": 2, "groups": 2},
    {"kernel_size": 4, "padding": 1, "norm_layer": None, "activation_layer": nn.SiLU},
    {"kernel_size": 1, "norm_layer": nn.InstanceNorm3d, "activation_layer": None, "bias": True},
    {"padding": "same", "inplace": None, "activation_layer": nn.Hardswish},
]


@pytest.mark.parametrize("config", _CONFIGS)
def test_conv3d_equals_torchvision(config):
    torch.manual_seed(0)
    peer = tvo.Conv3dNormActivation(4, 6, **config)
    ours = ConvNormAct3d(4, 6, **config)
    assert repr(ours).replace("ConvNormAct3d", "") == repr(peer).replace("Conv3dNormActivation", "")
    ours.load_state_dict(peer.state_dict())
    for train in (True, False):
        x = torch.randn(2, 4, 5, 9, 8, requires_grad=True)
        outs = []
        for layer in (ours, peer):
            out = layer.train(train)(x)
            outs.append((out, *torch.autograd.grad(out.square().sum(), [x, *layer.parameters()])))
        for a, b in zip(*outs, strict=True):
            assert torch.equal(a, b)


def test_conv3d_named_activation_script_and_registry():
    block = ConvNormAct3d(4, 6, activation_layer="silu").eval()
    assert isinstance(block[2], nn.SiLU)
    x = torch.randn(1, 4, 3, 6, 6)
    torch.testing.assert_close(torch.jit.script(block)(x), block(x))
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), block(x))
    built = LAYERS.build({"type": "conv_norm_act3d", "in_channels": 4, "out_channels": 2})
    assert isinstance(built, ConvNormAct3d)


def test_permute_equals_torchvision():
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    ours, peer = Permute([0, 2, -1, 1]), tvo.Permute([0, 2, -1, 1])
    assert torch.equal(ours(x), peer(x)) and ours(x)._base is x
    assert torch.jit.script(ours)(x).shape == (2, 4, 5, 3)
    assert isinstance(LAYERS.build({"type": "permute", "dims": [1, 0]}), Permute)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["conv3d", "permute"])
def test_exports_to_onnx(tmp_path, block):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    if block == "conv3d":
        model, x = ConvNormAct3d(4, 6, stride=2).eval(), torch.randn(2, 4, 6, 8, 8)
    else:
        model, x = Permute([0, 2, 3, 1]), torch.randn(2, 4, 6, 8)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), model(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ConvNormAct3d(4, 6, kernel_size=(3, 3)), ValueError, "kernel_size"),
        (lambda: ConvNormAct3d(4, 6, groups=4), ValueError, "groups=4 must divide out_channels"),
        (lambda: ConvNormAct3d(4, 6, norm_layer="bn"), TypeError, "norm_layer"),
        (lambda: ConvNormAct3d(4, 6, activation_layer="nope"), ValueError, "activation_layer"),
        (lambda: ConvNormAct3d(4, 6)(torch.randn(2, 4, 6, 6)), ValueError, r"\(B, 4, D, H, W\)"),
        (lambda: ConvNormAct3d(4, 6)(torch.randn(1, 4, 3, 6, 6).double()), TypeError, "dtype"),
        (lambda: Permute([0, 0, 1]), ValueError, "permutation"),
        (lambda: Permute([0, 1.0]), TypeError, "dims"),
        (lambda: Permute([0, 2, 1])(torch.zeros(2, 3)), ValueError, "3 dims"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
