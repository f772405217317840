"""Fused Triton kernels for `visionblocks.ops.local.local_filter` (forward and backward).

Called by ``local_filter`` (after validation) as
``local_filter_triton(x, kernels, kernel_size, dilation, stride)``: ``x (B, C, H, W)`` and
``kernels (B, G*k*k, Ho, Wo)`` of one floating dtype, ``G`` dividing ``C``; the result
``(B, C, Ho, Wo)`` is in that dtype, differentiable with respect to both inputs. Geometry
(tap ``t = i*k + j`` of output pixel ``(h, w)`` reads ``(h*s + (i - k//2)*d, w*s +
(j - k//2)*d)``, zero outside) is that of the torch path,
`visionblocks.ops._local_filter_torch`. Every load is cast to the compute dtype (float32, or
float64 for float64) right away; results are stored in the tensors' dtype.

- ``_gather_kernel`` (forward, and ``grad_x`` transposed): a program owns one (batch item,
  group), a block of the group's channels and a block of pixels; it loops over the ``k*k``
  taps (unrolled), loading each tap's kernel values once for all its channels. Forward:
  ``out[p] = sum_t K[t, p] x[p*s + o_t]``. ``grad_x`` gathers instead of scattering (no
  atomics): ``grad_x[q] = sum_t K[t, p] grad_out[p]`` over the ``p`` with
  ``p*s + o_t = q``, i.e. ``p = (q - o_t) / s`` where that is an integer inside the output.
- ``_grad_kernels_kernel``: a program owns one (batch item, group), one tap and a block of
  output pixels, and sums ``grad_out * x`` over the group's channels in blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["local_filter_triton"]

_BLOCK_P = 128  # pixels per program
_MAX_BLOCK_C = 16  # channels per program (the group's channels, up to this)


@triton.jit
def _gather_kernel(
    src_ptr, ker_ptr, dst_ptr,
    C, G, CG, H_SRC, W_SRC, H_DST, W_DST, H_K, W_K,
    KS: tl.constexpr, DIL: tl.constexpr, STRIDE: tl.constexpr, TRANSPOSE: tl.constexpr,
    CDT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """``dst`` pixels of one (batch item, group), channel block and pixel block.

    Forward (``TRANSPOSE=False``): src = x, dst = out, kernels on the dst grid.
    ``grad_x`` (``TRANSPOSE=True``): src = grad_out, dst = grad_x, kernels on the src grid.
    """
    bg = tl.program_id(2)
    b = bg // G
    g = bg % G
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c_mask = offs_c < CG
    p_mask = offs_p < H_DST * W_DST
    h = offs_p // W_DST
    w = offs_p % W_DST
    chan = (b * C + g * CG + offs_c).to(tl.int64)
    src_base = chan * (H_SRC * W_SRC)
    ker_base = bg.to(tl.int64) * (KS * KS) * (H_K * W_K)
    acc = tl.zeros((BLOCK_C, BLOCK_P), dtype=CDT)
    for i in tl.static_range(KS):
        for j in tl.static_range(KS):
            oh = (i - KS // 2) * DIL
            ow = (j - KS // 2) * DIL
            if TRANSPOSE:
                nh = h - oh
                nw = w - ow
                sh = tl.where(nh >= 0, nh, 0) // STRIDE
                sw = tl.where(nw >= 0, nw, 0) // STRIDE
                valid = p_mask & (nh >= 0) & (nw >= 0) & (sh < H_SRC) & (sw < W_SRC)
                if STRIDE > 1:
                    valid = valid & (sh * STRIDE == nh) & (sw * STRIDE == nw)
                src_pix = sh * W_SRC + sw
                ker_pix = src_pix
            else:
                sh = h * STRIDE + oh
                sw = w * STRIDE + ow
                valid = p_mask & (sh >= 0) & (sh < H_SRC) & (sw >= 0) & (sw < W_SRC)
                src_pix = sh * W_SRC + sw
                ker_pix = offs_p
            kv = tl.load(
                ker_ptr + ker_base + (i * KS + j) * (H_K * W_K) + ker_pix, mask=valid, other=0.0
            ).to(CDT)
            sv = tl.load(
                src_ptr + src_base[:, None] + src_pix[None, :],
                mask=c_mask[:, None] & valid[None, :],
                other=0.0,
            ).to(CDT)
            acc += sv * kv[None, :]
    dst = dst_ptr + chan[:, None] * (H_DST * W_DST) + offs_p[None, :]
    tl.store(dst, acc.to(dst_ptr.dtype.element_ty), mask=c_mask[:, None] & p_mask[None, :])


@triton.jit
def _grad_kernels_kernel(
    x_ptr, go_ptr, gk_ptr,
    C, G, CG, H, W, HO, WO,
    KS: tl.constexpr, DIL: tl.constexpr, STRIDE: tl.constexpr,
    CDT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """``grad_kernels[b, g, t, p] = sum over the group's channels of grad_out[p] x[p*s + o_t]``."""
    bg = tl.program_id(2)
    t = tl.program_id(1)
    b = bg // G
    g = bg % G
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HO * WO
    ih = (offs_p // WO) * STRIDE + (t // KS - KS // 2) * DIL
    iw = (offs_p % WO) * STRIDE + (t % KS - KS // 2) * DIL
    valid = p_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    x_pix = ih * W + iw
    acc = tl.zeros((BLOCK_P,), dtype=CDT)
    for c0 in range(0, CG, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_mask = offs_c < CG
        chan = (b * C + g * CG + offs_c).to(tl.int64)
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


def _block_c(cg: int) -> int:
    return min(_MAX_BLOCK_C, triton.next_power_of_2(max(cg, 1)))


def _gather(
    src: Tensor, kernels: Tensor, dst: Tensor, geometry: tuple[int, int, int], transpose: bool
) -> None:
    ks, dil, stride = geometry
    b, c, h_dst, w_dst = dst.shape
    g = kernels.shape[1] // (ks * ks)
    cg = c // g
    block_c = _block_c(cg)
    # Pixel blocks on axis 0: CUDA allows 2**31 - 1 programs there but only 65535 on 1 and 2.
    grid = (triton.cdiv(h_dst * w_dst, _BLOCK_P), triton.cdiv(cg, block_c), b * g)
    if min(grid) == 0:
        dst.zero_()
        return
    _gather_kernel[grid](
        src, kernels, dst,
        c, g, cg, src.shape[2], src.shape[3], h_dst, w_dst, kernels.shape[2], kernels.shape[3],
        KS=ks, DIL=dil, STRIDE=stride, TRANSPOSE=transpose,
        CDT=_cdt(dst.dtype), BLOCK_C=block_c, BLOCK_P=_BLOCK_P,
    )  # fmt: skip


class _LocalFilterTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int
    ) -> Tensor:  # type: ignore[override]
        x, kernels = x.contiguous(), kernels.contiguous()
        b, c = x.shape[:2]
        out = x.new_empty(b, c, kernels.shape[2], kernels.shape[3])
        geometry = (kernel_size, dilation, stride)
        _gather(x, kernels, out, geometry, transpose=False)
        ctx.save_for_backward(x, kernels)
        ctx.geometry = geometry
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, kernels = ctx.saved_tensors
        grad_out = grad_out.contiguous()
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
            grid = (triton.cdiv(ho * wo, _BLOCK_P), ks * ks, b * g)
            if min(grid) == 0 or cg == 0:
                grad_kernels.zero_()
            else:
                _grad_kernels_kernel[grid](
                    x, grad_out, grad_kernels,
                    c, g, cg, h, w, ho, wo,
                    KS=ks, DIL=dil, STRIDE=stride,
                    CDT=_cdt(x.dtype), BLOCK_C=_block_c(cg), BLOCK_P=_BLOCK_P,
                )  # fmt: skip
        return grad_x, grad_kernels, None, None, None


def local_filter_triton(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int = 1, stride: int = 1
) -> Tensor:
    """Fused `visionblocks.ops.local.local_filter`; the inputs are already validated.

    Reached through dispatch (``local_filter(..., impl="triton")``), not called directly.

    Args:
        x (Tensor[B, C, H, W]): Input, float16, bfloat16, float32 or float64.
        kernels (Tensor[B, G*k*k, Ho, Wo]): Per-pixel kernels of ``x``'s dtype, ``G`` dividing
            ``C``; ``Ho = ceil(H / stride)``, ``Wo = ceil(W / stride)``.
        kernel_size: Odd window size ``k``.
        dilation: Tap spacing.
        stride: Output stride.

    Returns:
        Tensor[B, C, Ho, Wo]: The filtered input in ``x``'s dtype, differentiable with
        respect to ``x`` and ``kernels``.

    Examples:
        >>> import torch
        >>> x, kernels = torch.randn(1, 4, 8, 8), torch.randn(1, 18, 8, 8)  # G = 2, k = 3
        >>> local_filter_triton(x.cuda(), kernels.cuda(), 3).shape  # doctest: +SKIP
        torch.Size([1, 4, 8, 8])
    """
    return _LocalFilterTriton.apply(x, kernels, kernel_size, dilation, stride)
