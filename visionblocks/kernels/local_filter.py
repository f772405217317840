"""Fused Triton kernels for `visionblocks.ops.local.local_filter2d` (forward and backward).

Called by ``local_filter2d`` (after validation) as ``local_filter_triton(x, kernels,
kernel_size, dilation, stride, reference=...)``; the geometry is that of the torch formula,
`visionblocks.ops.local._local_filter`, which the tests compare it with. Loads are cast to
the compute dtype (float32, float64 for float64) right away; results are stored in the
tensors' dtype.

Kernel size, dilation and stride are runtime arguments (one compiled kernel serves every
window), and the grids have one axis, decoded in the kernel, so no axis limit applies.

- ``_gather_kernel`` (forward, and ``grad_x`` transposed): a program owns one (batch item,
  group), a block of up to 16 of the group's channels and a block of pixels; it loops over
  the ``k*k`` taps, loading each tap's kernel values once for all its channels. Forward:
  ``out[p] = sum_t K[t, p] x[p*s + o_t]``. ``grad_x`` gathers instead of scattering (no
  atomics): ``grad_x[q] = sum_t K[t, p] grad_out[p]`` over the ``p`` with
  ``p*s + o_t = q``, i.e. ``p = (q - o_t) / s`` where that is an integer inside the output.
- ``_grad_kernels_kernel``: a program owns one (batch item, group), one tap and a block of
  output pixels, and sums ``grad_out * x`` over the group's channels in blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.namespace import public_dir
from visionblocks.kernels._launch import (
    KernelFailure,
    check_plane,
    jit,
    launch,
    prepare,
    reference_grads,
    with_fallback,
)

__all__ = ["local_filter_triton"]
__dir__ = public_dir(__name__, __all__)

_BLOCK_P = 128  # pixels per program
_MAX_BLOCK_C = 16  # channels per program (the group's channels, up to this)


@jit
def _gather_kernel(
    src_ptr, ker_ptr, dst_ptr,
    C: tl.int32, G: tl.int32, CG: tl.int32, H_SRC: tl.int32, W_SRC: tl.int32,
    H_DST: tl.int32, W_DST: tl.int32, H_K: tl.int32, W_K: tl.int32,
    KS: tl.int32, DIL: tl.int32, STRIDE: tl.int32, N_PB: tl.int32, N_CB: tl.int32,
    TRANSPOSE: tl.constexpr, CDT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """``dst`` pixels of one (batch item, group), channel block and pixel block.

    Forward (``TRANSPOSE=False``): src = x, dst = out, kernels on the dst grid.
    ``grad_x`` (``TRANSPOSE=True``): src = grad_out, dst = grad_x, kernels on the src grid.
    The 1-D grid enumerates (batch item and group, channel block, pixel block).
    """
    pid = tl.program_id(0)
    pb = pid % N_PB
    rest = pid // N_PB
    cb = rest % N_CB
    bg = rest // N_CB
    b = bg // G
    g = bg % G
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    c_mask = offs_c < CG
    p_mask = offs_p < H_DST * W_DST
    h = offs_p // W_DST
    w = offs_p % W_DST
    chan = b.to(tl.int64) * C + g * CG + offs_c
    src_base = chan * (H_SRC * W_SRC)
    ker_base = bg.to(tl.int64) * (KS * KS) * (H_K * W_K)
    half = KS // 2
    acc = tl.zeros((BLOCK_C, BLOCK_P), dtype=CDT)
    for t in range(0, KS * KS):
        oh = (t // KS - half) * DIL
        ow = (t % KS - half) * DIL
        if TRANSPOSE:
            nh = h - oh
            nw = w - ow
            sh = tl.where(nh >= 0, nh, 0) // STRIDE
            sw = tl.where(nw >= 0, nw, 0) // STRIDE
            valid = p_mask & (nh >= 0) & (nw >= 0) & (sh < H_SRC) & (sw < W_SRC)
            valid = valid & (sh * STRIDE == nh) & (sw * STRIDE == nw)
            src_pix = sh * W_SRC + sw
            ker_pix = src_pix
        else:
            sh = h * STRIDE + oh
            sw = w * STRIDE + ow
            valid = p_mask & (sh >= 0) & (sh < H_SRC) & (sw >= 0) & (sw < W_SRC)
            src_pix = sh * W_SRC + sw
            ker_pix = offs_p
        kv = tl.load(ker_ptr + ker_base + t * (H_K * W_K) + ker_pix, mask=valid, other=0.0)
        sv = tl.load(
            src_ptr + src_base[:, None] + src_pix[None, :],
            mask=c_mask[:, None] & valid[None, :],
            other=0.0,
        )
        acc += sv.to(CDT) * kv.to(CDT)[None, :]
    dst = dst_ptr + chan[:, None] * (H_DST * W_DST) + offs_p[None, :]
    tl.store(dst, acc.to(dst_ptr.dtype.element_ty), mask=c_mask[:, None] & p_mask[None, :])


@jit
def _grad_kernels_kernel(
    x_ptr, go_ptr, gk_ptr,
    C: tl.int32, G: tl.int32, CG: tl.int32, H: tl.int32, W: tl.int32,
    HO: tl.int32, WO: tl.int32, KS: tl.int32, DIL: tl.int32, STRIDE: tl.int32, N_PB: tl.int32,
    CDT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """``grad_kernels[b, g, t, p] = sum over the group's channels of grad_out[p] x[p*s + o_t]``.

    The 1-D grid enumerates (batch item and group, tap, pixel block).
    """
    pid = tl.program_id(0)
    pb = pid % N_PB
    rest = pid // N_PB
    t = rest % (KS * KS)
    bg = rest // (KS * KS)
    b = bg // G
    g = bg % G
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HO * WO
    ih = (offs_p // WO) * STRIDE + (t // KS - KS // 2) * DIL
    iw = (offs_p % WO) * STRIDE + (t % KS - KS // 2) * DIL
    valid = p_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    x_pix = ih * W + iw
    acc = tl.zeros((BLOCK_P,), dtype=CDT)
    for c0 in range(0, CG, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_mask = offs_c < CG
        chan = b.to(tl.int64) * C + g * CG + offs_c
        go = tl.load(
            go_ptr + chan[:, None] * (HO * WO) + offs_p[None, :],
            mask=c_mask[:, None] & p_mask[None, :],
            other=0.0,
        ).to(CDT)
        xv = tl.load(
            x_ptr + chan[:, None] * (H * W) + x_pix[None, :],
            mask=c_mask[:, None] & valid[None, :],
            other=0.0,
        ).to(CDT)
        acc += tl.sum(go * xv, axis=0)
    dst = gk_ptr + (bg.to(tl.int64) * (KS * KS) + t) * (HO * WO) + offs_p
    tl.store(dst, acc.to(gk_ptr.dtype.element_ty), mask=p_mask)


def _cdt(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def block_c(cg: int) -> int:
    """Channels per program: the group's channel count rounded up to 1, 4 or 16."""
    return 1 if cg <= 1 else 4 if cg <= 4 else _MAX_BLOCK_C


def gather_grid(shape: tuple[int, int, int, int], groups: int) -> tuple[int, int, int]:
    """``(programs, pixel blocks, channel blocks)`` of `_gather_kernel` for a ``dst`` shape.

    Raises:
        ValueError: If a plane has ``2**31`` pixels or more (int32 pixel indices).

    Examples:
        >>> gather_grid((1, 64, 200, 200), groups=64)  # depthwise: one channel per program
        (20032, 313, 1)
    """
    b, c, h_dst, w_dst = shape
    check_plane(h_dst, w_dst)
    cg = c // groups
    n_pb = triton.cdiv(h_dst * w_dst, _BLOCK_P)
    n_cb = triton.cdiv(cg, block_c(cg))
    return n_pb * n_cb * b * groups, n_pb, n_cb


def grad_kernels_grid(
    batch: int, groups: int, taps: int, out_size: tuple[int, int]
) -> tuple[int, int]:
    """``(programs, pixel blocks)`` of `_grad_kernels_kernel`.

    Examples:
        >>> grad_kernels_grid(2, 3, 9, (64, 64))
        (1728, 32)
    """
    check_plane(*out_size)
    n_pb = triton.cdiv(out_size[0] * out_size[1], _BLOCK_P)
    return n_pb * taps * batch * groups, n_pb


def _gather(
    src: Tensor, kernels: Tensor, dst: Tensor, geometry: tuple[int, int, int], transpose: bool
) -> None:
    ks, dil, stride = geometry
    _, c, h_dst, w_dst = dst.shape
    g = kernels.shape[1] // (ks * ks)
    cg = c // g
    programs, n_pb, n_cb = gather_grid(tuple(dst.shape), g)
    if programs == 0:
        dst.zero_()
        return
    launch(
        "local_filter", _gather_kernel, (programs,), 8,
        src_ptr=src, ker_ptr=kernels, dst_ptr=dst, C=c, G=g, CG=cg,
        H_SRC=src.shape[2], W_SRC=src.shape[3], H_DST=h_dst, W_DST=w_dst,
        H_K=kernels.shape[2], W_K=kernels.shape[3], KS=ks, DIL=dil, STRIDE=stride,
        N_PB=n_pb, N_CB=n_cb, TRANSPOSE=transpose, CDT=_cdt(dst.dtype),
        BLOCK_C=block_c(cg), BLOCK_P=_BLOCK_P,
    )  # fmt: skip


class _LocalFilterTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int, reference
    ) -> Tensor:  # type: ignore[override]
        x, kernels = prepare(x), prepare(kernels)
        b, c = x.shape[:2]
        out = x.new_empty(b, c, kernels.shape[2], kernels.shape[3])
        geometry = (kernel_size, dilation, stride)
        _gather(x, kernels, out, geometry, transpose=False)
        ctx.save_for_backward(x, kernels)
        ctx.geometry, ctx.reference = geometry, reference
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, kernels = ctx.saved_tensors
        try:
            return (*_backward(x, kernels, prepare(grad_out), ctx), None, None, None, None)
        except KernelFailure as exc:
            grads = reference_grads(
                "local_filter", exc, ctx.reference, (x, kernels, *ctx.geometry),
                ctx.needs_input_grad[:5], (grad_out,),
            )  # fmt: skip
            return (*grads, None)


def _backward(x: Tensor, kernels: Tensor, grad_out: Tensor, ctx) -> tuple[Tensor | None, ...]:
    grad_x = grad_kernels = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.empty_like(x)
        _gather(grad_out, kernels, grad_x, ctx.geometry, transpose=True)
    if ctx.needs_input_grad[1]:
        grad_kernels = torch.empty_like(kernels)
        ks, dil, stride = ctx.geometry
        b, c, h, w = x.shape
        g = kernels.shape[1] // (ks * ks)
        cg = c // g
        ho, wo = kernels.shape[2:]
        programs, n_pb = grad_kernels_grid(b, g, ks * ks, (ho, wo))
        if programs == 0 or cg == 0:
            grad_kernels.zero_()
        else:
            launch(
                "local_filter", _grad_kernels_kernel, (programs,),
                x_ptr=x, go_ptr=grad_out, gk_ptr=grad_kernels,
                C=c, G=g, CG=cg, H=h, W=w, HO=ho, WO=wo, KS=ks, DIL=dil, STRIDE=stride,
                N_PB=n_pb, CDT=_cdt(x.dtype), BLOCK_C=block_c(cg), BLOCK_P=_BLOCK_P,
            )  # fmt: skip
    return grad_x, grad_kernels


@with_fallback("local_filter")
def local_filter_triton(
    x: Tensor,
    kernels: Tensor,
    kernel_size: int,
    dilation: int = 1,
    stride: int = 1,
    reference: Callable[..., Tensor] | None = None,
) -> Tensor:
    """Fused `visionblocks.ops.local.local_filter2d`; the inputs are already validated.

    Reached through dispatch (``local_filter2d(..., impl="triton")``), not called directly.

    Args:
        x (Tensor[B, C, H, W]): Input, float16, bfloat16, float32 or float64.
        kernels (Tensor[B, G*k*k, Ho, Wo]): Per-pixel kernels of ``x``'s dtype, ``G`` dividing
            ``C``; ``Ho = ceil(H / stride)``, ``Wo = ceil(W / stride)``.
        kernel_size: Odd window size ``k``.
        dilation: Tap spacing.
        stride: Output stride.
        reference: The torch formula with the same first five arguments; used for the
            gradients if a backward kernel fails (None: raise instead).

    Returns:
        Tensor[B, C, Ho, Wo]: The filtered input in ``x``'s dtype, differentiable with
        respect to ``x`` and ``kernels``.

    Raises:
        KernelFailure: If a kernel fails to compile, load or launch.

    Examples:
        >>> import torch
        >>> x, kernels = torch.randn(1, 4, 8, 8), torch.randn(1, 18, 8, 8)  # G = 2, k = 3
        >>> local_filter_triton(x.cuda(), kernels.cuda(), 3).shape  # doctest: +SKIP
        torch.Size([1, 4, 8, 8])
    """
    return _LocalFilterTriton.apply(x, kernels, kernel_size, dilation, stride, reference)
