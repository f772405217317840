"""The public layers of `visionblocks.nn` under ``torch.autocast`` (float32 module and input).

What CPU bfloat16 autocast does to each (``EXPECT``), as the docstrings state it:

- ``"bf16"``: a convolution runs in bfloat16 (autocast lowers ``conv2d``) and what follows
  it keeps that dtype: `ConvNormAct` (any norm), `DepthwiseConv2d`,
  `DepthwiseSeparableConv2d`, `LocalAttention2d` (its attention is computed in float32 on
  the bfloat16 q, k, v and returned in bfloat16), a fused Conv+BN.
- ``"float32"``: `Involution2d` and `LocalFilter2d` generate their kernels with bfloat16
  convolutions, and the filter promotes the float32 input and those kernels to float32.
- ``"exact"``: nothing is lowered, the result is bitwise the float32 one: `ChannelShuffle`,
  `LayerNorm2d`, `LocalFilter2d` with given kernels, every activation and norm built by
  `make_activation` / `make_norm`.

Gradients of the float32 input and parameters stay float32; BatchNorm statistics stay
float32. Outputs within 1% (norm-relative) of the float32 module, gradients within 10%
(ReLU masks flip where a bfloat16 value rounds across 0). On CUDA (skipped without it) the
same module runs under float16 and bfloat16 autocast with the same tolerances.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

import visionblocks.nn as vnn
from tests.helpers import cuda_autocast_dtypes
from visionblocks.nn.layers import ACTIVATIONS

CUDA_AUTOCASTS = cuda_autocast_dtypes("CUDA not available: the CUDA autocast checks need a GPU")
NOT_APPLICABLE = {
    "find_conv_bn_pairs": "returns module names: no tensor computation",
    "DeformConv2d": "torchvision's kernel in float32 (its autocast wrapper), forward only as "
    "ops.deform_conv2d's case (a backward inside autocast lowers torchvision's inner products); "
    "bfloat16 offsets under autocast in tests/nn/test_deform_conv_layer.py",
    **{
        name: "random masks of element-wise ops (none lowered by autocast): seeded bitwise "
        "checks under autocast in tests/nn/test_stochastic_depth.py and test_drop_block.py"
        for name in (
            "StochasticDepth",
            "drop_path",
            "DropBlock2d",
            "DropBlock3d",
            "drop_block2d",
            "drop_block3d",
        )
    },
}
OUT_TOL, GRAD_TOL = 1e-2, 1e-1


@dataclass
class Case:
    name: str  # the public name
    build: Callable[[], Callable[[Tensor], Tensor]]
    expect: str  # "bf16" | "float32" | "exact"
    channels: int = 16


def _eval_bn(module: nn.Module) -> nn.Module:
    """Random running statistics, so that a fold or an eval pass is not the identity."""
    gen = torch.Generator().manual_seed(5)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return module


def _fused_conv() -> nn.Module:
    block = _eval_bn(vnn.ConvNormAct(16, 24, 3, act=None)).eval()
    return vnn.fuse_conv_bn(block.conv, block.norm)


def _fused_model() -> nn.Module:
    model = nn.Sequential(vnn.ConvNormAct(16, 24, 3), vnn.ConvNormAct(24, 16, 1, act="silu"))
    return vnn.fuse_modules(_eval_bn(model).eval())


def _frozen_bn() -> nn.Module:
    norm, gen = vnn.FrozenBatchNorm2d(16), torch.Generator().manual_seed(5)
    for buffer in norm.buffers():
        buffer.copy_(torch.rand(16, generator=gen) + 0.5)
    return norm


def _given_kernels() -> Callable[[Tensor], Tensor]:
    layer = vnn.LocalFilter2d(16, 3, groups=4, predict=False)
    kernels = torch.randn(2, 36, 12, 13, generator=torch.Generator().manual_seed(6))
    return lambda x: layer(x, kernels.to(x))


class _DeformableOverPixels(nn.Module):
    """`MultiScaleDeformableAttention` of 20 queries over the image's pixels (one level)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = vnn.MultiScaleDeformableAttention(16, num_heads=2, num_levels=1, num_points=3)
        self.ref = torch.rand(1, 20, 1, 2, generator=torch.Generator().manual_seed(9))

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.flatten(2).transpose(1, 2)  # (B, H * W, C)
        ref = self.ref.to(x).expand(x.shape[0], -1, -1, -1)
        return self.attn(tokens[:, :20], ref, tokens, [tuple(x.shape[-2:])])


CASES = [
    *(
        Case("ConvNormAct", lambda n=n, a=a: vnn.ConvNormAct(16, 24, 3, norm=n, act=a), "bf16")
        for n, a in (("bn", "relu"), ("gn", "silu"), ("ln2d", "gelu"), (None, None))
    ),
    Case("ConvNormAct", lambda: vnn.ConvNormAct(16, 24, 3, stride=2, groups=4), "bf16"),
    Case("DepthwiseConv2d", lambda: vnn.DepthwiseConv2d(16, 5, multiplier=2), "bf16"),
    Case("DepthwiseSeparableConv2d", lambda: vnn.DepthwiseSeparableConv2d(16, 24), "bf16"),
    Case("fuse_conv_bn", _fused_conv, "bf16"),
    Case("fuse_modules", _fused_model, "bf16"),
    Case("LocalAttention2d", lambda: vnn.LocalAttention2d(16, 5, num_heads=2), "bf16"),
    # Its linear layers run in bfloat16, the sampling in float32 on their outputs.
    Case("MultiScaleDeformableAttention", _DeformableOverPixels, "bf16"),
    Case("Involution2d", lambda: vnn.Involution2d(16, 5, groups=4), "float32"),
    Case("Involution2d", lambda: vnn.Involution2d(16, 3, stride=2, groups=4), "float32"),
    Case("LocalFilter2d", lambda: vnn.LocalFilter2d(16, 3, groups=4), "float32"),
    Case("LocalFilter2d", lambda: vnn.LocalFilter2d(16, 5, normalize="none"), "float32"),
    Case("LocalFilter2d", _given_kernels, "exact"),
    Case("ChannelShuffle", lambda: vnn.ChannelShuffle(4), "exact"),
    Case("channel_shuffle", lambda: lambda x: vnn.channel_shuffle(x, 4), "exact"),
    Case("LayerNorm2d", lambda: vnn.LayerNorm2d(16), "exact"),
    Case("FrozenBatchNorm2d", lambda: _frozen_bn(), "exact"),
    Case("SqueezeExcitation", lambda: vnn.SqueezeExcitation(16, 4), "float32"),
    Case("MLP", lambda: vnn.MLP(13, [8, 13], norm_layer=nn.LayerNorm), "bf16"),
    Case(
        "ConvNormAct3d",
        lambda: nn.Sequential(nn.Unflatten(1, (4, 4)), vnn.ConvNormAct3d(4, 4), nn.Flatten(1, 2)),
        "bf16",
    ),
    Case("Permute", lambda: vnn.Permute([0, 2, 3, 1]), "exact"),
    *(Case("make_norm", lambda n=n: vnn.make_norm(n, 16), "exact") for n in ("bn", "gn", "ln2d")),
    *(Case("make_activation", lambda a=a: vnn.make_activation(a), "exact") for a in ACTIVATIONS),
]
IDS = [f"{c.name}-{i}" for i, c in enumerate(CASES)]


def test_every_public_layer_is_covered():
    covered = {c.name for c in CASES}
    missing = set(vnn.__all__) - covered - set(NOT_APPLICABLE)
    assert not missing, (
        f"layers without an autocast case (add one, or to NOT_APPLICABLE): {missing}"
    )
    assert covered <= set(vnn.__all__), (
        f"cases for names no longer public: {covered - set(vnn.__all__)}"
    )


def _params(fn: object) -> list[Tensor]:
    return [p for p in fn.parameters() if p.requires_grad] if isinstance(fn, nn.Module) else []


def _run(fn: Callable[[Tensor], Tensor], x: Tensor, grad_out: Tensor | None = None):
    x = x.detach().requires_grad_()
    out = fn(x)
    if grad_out is None:
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad(out, [x, *_params(fn)], grad_out.to(out), allow_unused=True)
    return out, list(grads), grad_out


def _nrel(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pair(case: Case, train: bool, device: str = "cpu"):
    """Two identical copies (BatchNorm statistics move in training mode)."""
    fn = case.build()
    if isinstance(fn, nn.Module):
        fn = fn.train(train).to(device)
    return fn, copy.deepcopy(fn)


def _input(device: str = "cpu") -> Tensor:
    return torch.randn(2, 16, 12, 13, generator=torch.Generator().manual_seed(8)).to(device)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cpu_bfloat16_autocast(case, train):
    fn, twin = _pair(case, train)
    x = _input()
    ref, ref_grads, grad_out = _run(fn, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads, _ = _run(twin, x, grad_out)
    want = torch.bfloat16 if case.expect == "bf16" else torch.float32
    assert out.dtype == want
    if case.expect == "exact":
        assert torch.equal(out, ref)
    assert _nrel(out, ref) <= OUT_TOL
    for g, g_ref, p in zip(grads, ref_grads, [x, *_params(twin)], strict=True):
        assert g.dtype == p.dtype == torch.float32 and torch.isfinite(g).all()
        assert torch.equal(g, g_ref) if case.expect == "exact" else _nrel(g, g_ref) <= GRAD_TOL


def test_batchnorm_statistics_stay_float32_under_autocast():
    block, twin = _pair(CASES[0], train=True)
    x = _input()
    block(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        twin(x)
    for name in ("running_mean", "running_var"):
        stat, ref = getattr(twin.norm, name), getattr(block.norm, name)
        assert stat.dtype == torch.float32 and _nrel(stat, ref) <= OUT_TOL


def test_fusing_under_autocast_folds_in_float64():
    block = _eval_bn(vnn.ConvNormAct(16, 24, 3)).eval()
    ref = vnn.fuse_conv_bn(block.conv, block.norm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = vnn.fuse_conv_bn(block.conv, block.norm)
        model = vnn.fuse_modules(block)
    for p, q, r in zip(fused.parameters(), model.conv.parameters(), ref.parameters(), strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, r) and torch.equal(q, r)


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-module", "autocast"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bfloat16_inputs_give_bfloat16(case, autocast):
    fn, twin = _pair(case, train=False)
    x = _input()
    ref, _, grad_out = _run(fn, x)
    if isinstance(twin, nn.Module) and not autocast:
        twin = twin.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, grads, _ = _run(twin, x.bfloat16(), grad_out)
    assert out.dtype == torch.bfloat16 and _nrel(out, ref) <= 2 * OUT_TOL
    assert grads[0].dtype == torch.bfloat16 and torch.isfinite(grads[0]).all()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", CUDA_AUTOCASTS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_autocast(case, dtype):
    fn, twin = _pair(case, train=True, device="cuda")
    x = _input("cuda")
    ref, ref_grads, grad_out = _run(fn, x)
    with torch.autocast("cuda", dtype=dtype):
        out, grads, _ = _run(twin, x, grad_out)
    assert out.dtype in (dtype, torch.float32) and torch.isfinite(out).all()
    assert _nrel(out, ref) <= OUT_TOL
    for g, g_ref in zip(grads, ref_grads, strict=True):
        assert g.dtype == torch.float32 and torch.isfinite(g).all()
        assert _nrel(g, g_ref) <= GRAD_TOL
