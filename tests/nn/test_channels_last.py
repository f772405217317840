"""``channels_last`` inputs and modules give the results of contiguous NCHW ones.

For every conv block and local op: an input ``x.contiguous(memory_format=torch.channels_last)``
(``"input"``), a module ``module.to(memory_format=torch.channels_last)`` (``"module"``) and
both (``"both"``) give the output and gradients (input and parameters) of the contiguous
run, bitwise where ``bitwise`` says so (a layout change only moves data), otherwise within
``TOL`` of the largest value (oneDNN picks other convolution kernels for channels_last, which
sum in another order). ``FORMAT`` records the output's memory format in each variant:

- convolutions (`ConvNormAct`, `DepthwiseConv2d`, `DepthwiseSeparableConv2d`, a fused
  Conv+BN) return channels_last when the input or the weights are;
- `channel_shuffle` / `ChannelShuffle` keep the input's format; `LayerNorm2d` always returns
  channels_last (it normalises a channels-last view);
- the local ops (`local_filter2d`, `local_attention2d`, `sliding_windows`, `Involution2d`,
  `LocalFilter2d`) work on NCHW planes and return contiguous NCHW; `LocalAttention2d`
  returns what its output projection gives: channels_last for a channels_last module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

import visionblocks.nn as vnn
import visionblocks.ops as ops
from visionblocks.ops._local_parts import planar

CL = torch.channels_last
TOL = 1e-5
VARIANTS = ("input", "module", "both")


def _fmt(t: Tensor) -> str:
    if t.is_contiguous():
        return "nchw"
    return "cl" if t.is_contiguous(memory_format=CL) else "other"


CONV = {"input": "cl", "module": "cl", "both": "cl"}
FOLLOWS_INPUT = {"input": "cl", "module": "nchw", "both": "cl"}
ALWAYS_CL = {"input": "cl", "module": "cl", "both": "cl"}
NCHW = {"input": "nchw", "module": "nchw", "both": "nchw"}
FOLLOWS_MODULE = {"input": "nchw", "module": "cl", "both": "cl"}


@dataclass
class Block:
    name: str
    build: Callable[[], Callable[..., Tensor]]
    fmt: dict[str, str]  # output format per variant
    bitwise: bool = False
    shapes: tuple[tuple[int, ...], ...] = ((2, 16, 12, 13),)


def _fused() -> nn.Module:
    block = vnn.ConvNormAct(16, 24, 3, act=None).eval()
    block.norm.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(1))
    return vnn.fuse_conv_bn(block.conv, block.norm)


BLOCKS = [
    *(
        Block(f"ConvNormAct-{n}", lambda n=n: vnn.ConvNormAct(16, 24, 3, norm=n, act="silu"), CONV)
        for n in ("bn", "gn", "ln2d")
    ),
    Block("ConvNormAct-s2g4", lambda: vnn.ConvNormAct(16, 24, 3, stride=2, groups=4), CONV),
    Block("DepthwiseConv2d", lambda: vnn.DepthwiseConv2d(16, 5, multiplier=2), CONV),
    Block("DepthwiseSeparableConv2d", lambda: vnn.DepthwiseSeparableConv2d(16, 24), CONV),
    Block("fuse_conv_bn", _fused, CONV),
    Block("ChannelShuffle", lambda: vnn.ChannelShuffle(4), FOLLOWS_INPUT, bitwise=True),
    Block("LayerNorm2d", lambda: vnn.LayerNorm2d(16), ALWAYS_CL, bitwise=True),
    Block("Involution2d", lambda: vnn.Involution2d(16, 5, groups=4), NCHW),
    Block("Involution2d-s2", lambda: vnn.Involution2d(16, 3, stride=2, groups=4), NCHW),
    Block("LocalFilter2d", lambda: vnn.LocalFilter2d(16, 3, groups=4), NCHW),
    Block("LocalAttention2d", lambda: vnn.LocalAttention2d(16, 5, num_heads=2), FOLLOWS_MODULE),
    Block("channel_shuffle", lambda: lambda x: vnn.channel_shuffle(x, 2), FOLLOWS_INPUT, True),
    Block("sliding_windows", lambda: lambda x: ops.sliding_windows(x, 3, 2), NCHW, True),
    Block(
        "local_filter2d",
        lambda: lambda x, k: ops.local_filter2d(x, k, 3, impl="torch"),
        NCHW,
        True,
        ((2, 16, 12, 13), (2, 36, 12, 13)),
    ),
    Block(
        "local_filter2d-s2",
        lambda: lambda x, k: ops.local_filter2d(x, k, 5, 2, stride=2, impl="torch"),
        NCHW,
        True,
        ((2, 16, 12, 13), (2, 100, 6, 7)),
    ),
    Block(
        "local_attention2d",
        lambda: lambda q, k, v: ops.local_attention2d(q, k, v, 5, num_heads=2, impl="torch"),
        NCHW,
        True,
        ((2, 16, 12, 13),) * 3,
    ),
]
CASES = [
    pytest.param(b, v, id=f"{b.name}-{v}")
    for b in BLOCKS
    for v in VARIANTS
    if v == "input" or isinstance(b.build(), nn.Module)  # functions: no module variant
]


def _params(fn: object) -> list[Tensor]:
    return list(fn.parameters()) if isinstance(fn, nn.Module) else []


def _run(fn: Callable[..., Tensor], inputs: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    inputs = [x.detach().requires_grad_() for x in inputs]
    out = fn(*inputs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    return out, list(torch.autograd.grad(out, [*inputs, *_params(fn)], grad))


def _close(a: Tensor, b: Tensor, bitwise: bool) -> None:
    a, b = a.detach(), b.detach()
    if bitwise:
        assert torch.equal(a, b)
    else:
        err, scale = float((a - b).abs().max()), float(b.detach().abs().max())
        assert err <= TOL * max(scale, 1.0), f"off by {err:.2e} (largest value {scale:.2e})"


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(("block", "variant"), CASES)
def test_channels_last_gives_the_contiguous_result(block, variant, train):
    fn = block.build()
    if isinstance(fn, nn.Module):
        fn.train(train)
    twin = copy.deepcopy(fn)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*shape, generator=gen) for shape in block.shapes]
    ref, ref_grads = _run(fn, inputs)
    if variant in ("input", "both"):
        inputs = [x.contiguous(memory_format=CL) for x in inputs]
    if variant in ("module", "both"):
        twin = twin.to(memory_format=CL)
    out, grads = _run(twin, inputs)
    assert _fmt(ref) != "other" and _fmt(out) == block.fmt[variant]
    _close(out, ref, block.bitwise)
    for g, g_ref in zip(grads, ref_grads, strict=True):
        _close(g, g_ref, block.bitwise)


def test_channel_shuffle_keeps_channels_last_and_matches_torchvision():
    from torchvision.models.shufflenetv2 import channel_shuffle as tv_channel_shuffle

    x = torch.randn(2, 12, 5, 7)
    for groups in (1, 2, 3, 4, 6, 12):
        out = vnn.channel_shuffle(x.contiguous(memory_format=CL), groups)
        assert _fmt(out) == "cl" and torch.equal(out, tv_channel_shuffle(x, groups))
    sliced = torch.randn(2, 5, 6, 24).permute(0, 3, 1, 2)[:, :12]  # channel stride 1, not dense
    assert torch.equal(vnn.channel_shuffle(sliced, 3), tv_channel_shuffle(sliced.contiguous(), 3))


def test_fusing_a_channels_last_model_keeps_it_channels_last():
    model = nn.Sequential(vnn.ConvNormAct(16, 24, 3), vnn.ConvNormAct(24, 8, 1)).eval()
    model = model.to(memory_format=CL)
    fused = vnn.fuse_modules(model)
    weight = fused[0].conv.weight  # (a 1 x 1 kernel is both contiguous and channels_last)
    assert _fmt(weight) == "cl" and weight.requires_grad
    x = torch.randn(2, 16, 10, 10)
    out = fused(x)
    assert _fmt(out) == "cl"
    _close(out, model(x), bitwise=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 8, 5, 6), (1, 40, 64, 70), (3, 300, 20, 20)])
def test_planar_converts_channels_last_inputs(shape, dtype):
    x = torch.randn(shape, dtype=torch.bfloat16)
    for view in (
        x.contiguous(memory_format=CL),
        torch.randn(shape[0], shape[2], shape[3], 3 * shape[1]).permute(0, 3, 1, 2)[:, : shape[1]],
        x.transpose(2, 3).contiguous().transpose(2, 3),  # neither layout: the plain path
    ):
        out = planar(view, dtype)
        assert out.is_contiguous() and out.dtype == dtype
        assert torch.equal(out, view.to(dtype))
    assert planar(x, torch.bfloat16) is x  # contiguous, same dtype: no copy


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_local_ops_on_cuda_take_channels_last(impl):
    from visionblocks import kernels

    if impl == "triton" and kernels.available()["reason"]:
        pytest.skip("triton not installed")
    gen = torch.Generator().manual_seed(3)
    x, q, k = (torch.randn(2, 16, 12, 13, generator=gen).cuda() for _ in range(3))
    filters = torch.randn(2, 36, 12, 13, generator=gen).cuda()
    for fn, inputs in (
        (lambda a, b: ops.local_filter2d(a, b, 3, impl=impl), (x, filters)),
        (lambda a, b, c: ops.local_attention2d(a, b, c, 5, num_heads=2, impl=impl), (q, k, x)),
    ):
        ref = fn(*inputs)
        out = fn(*(t.contiguous(memory_format=CL) for t in inputs))
        assert _fmt(out) == "nchw"
        _close(out, ref, bitwise=False)
