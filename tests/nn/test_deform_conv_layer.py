"""`DeformConv2d` against torchvision's: initialisation, outputs, gradients, script, autocast."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from torch import nn

from visionblocks.nn import DeformConv2d
from visionblocks.registry import LAYERS


def _inputs(c: int = 4, groups: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, c, 7, 6, generator=g)
    offset = torch.randn(2, 2 * groups * 9, 4, 3, generator=g)
    mask = torch.rand(2, groups * 9, 4, 3, generator=g)
    return x, offset, mask


@pytest.mark.parametrize("bias", [True, False])
def test_initialisation_equals_torchvision(bias):
    torch.manual_seed(3)
    peer = tvo.DeformConv2d(6, 4, (3, 2), stride=2, padding=1, dilation=2, groups=2, bias=bias)
    torch.manual_seed(3)
    ours = DeformConv2d(6, 4, (3, 2), stride=2, padding=1, dilation=2, groups=2, bias=bias)
    assert ours.state_dict().keys() == peer.state_dict().keys()
    for key, value in peer.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    for name in ("kernel_size", "stride", "padding", "dilation", "groups", "in_channels"):
        assert getattr(ours, name) == getattr(peer, name), name


@pytest.mark.parametrize("use_mask", [False, True])
def test_outputs_and_gradients_equal_torchvision(use_mask):
    torch.manual_seed(0)
    peer = tvo.DeformConv2d(4, 6, 3, stride=2, padding=1, groups=2)
    ours = DeformConv2d(4, 6, 3, stride=2, padding=1, groups=2)
    ours.load_state_dict(peer.state_dict())
    x, offset, mask = _inputs(groups=2)
    grads = []
    for layer in (ours, peer):
        leaves = [t.clone().requires_grad_() for t in (x, offset, mask)]
        out = layer(leaves[0], leaves[1], leaves[2] if use_mask else None)
        seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        wrt = [*leaves[: 3 if use_mask else 2], *layer.parameters()]
        grads.append((out, *torch.autograd.grad(out, wrt, seed)))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_scripts_compiles_and_registered():
    torch.manual_seed(0)
    ours = DeformConv2d(4, 6, 3, stride=2, padding=1, bias=False)
    x, offset, mask = _inputs()
    scripted = torch.jit.script(ours)
    for m in (mask, None):
        assert torch.equal(scripted(x, offset, m), ours(x, offset, m))
    compiled = torch.compile(ours, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, offset, mask), ours(x, offset, mask))
    built = LAYERS.build({"type": "deform_conv2d", "in_channels": 4, "out_channels": 2,
                          "kernel_size": 3})  # fmt: skip
    assert isinstance(built, DeformConv2d)


def test_bfloat16_offsets_under_autocast_compute_in_float32():
    torch.manual_seed(0)
    offsets = nn.Conv2d(4, 18, 3, stride=2, padding=1)
    ours = DeformConv2d(4, 6, 3, stride=2, padding=1)
    x = _inputs()[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        offset = offsets(x)
        out = ours(x, offset)
    assert offset.dtype == torch.bfloat16 and out.dtype == torch.float32
    assert torch.equal(out, ours(x, offset.float()))
    with pytest.raises(ValueError, match="offset has dtype"):
        ours(x, offset)  # outside autocast, mixed dtypes are refused


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: DeformConv2d(4, 6, 3, groups=4), ValueError, "out_channels"),
        (lambda: DeformConv2d(4, 6, 3, bias=1), TypeError, "bias"),
        (lambda: DeformConv2d(4, 6, (3, 3, 3)), ValueError, "kernel_size"),
        (lambda: DeformConv2d(4, 6, 3, padding=-1), ValueError, "padding"),
        (
            lambda: DeformConv2d(4, 6, 3)(torch.randn(2, 5, 7, 6), _inputs()[1]),
            ValueError,
            "weight",
        ),
        (lambda: DeformConv2d(4, 6, 3)(*_inputs()[:2]), ValueError, "offset"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
