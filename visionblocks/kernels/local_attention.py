"""Fused Triton kernels for `visionblocks.ops.local_attention.local_attention2d`.

Called by ``local_attention2d`` (after validation) as
``local_attention2d_triton(q, k, v, kernel_size, dilation, num_heads)``: ``q``, ``k``, ``v``
``(B, C, H, W)`` of one floating dtype, ``num_heads`` dividing ``C``; the result
``(B, C, H, W)`` is in that dtype, differentiable with respect to all three. Geometry and
masking (tap ``t = i*k + j`` of query pixel ``(h, w)`` is key pixel
``(h + (i - k//2)*d, w + (j - k//2)*d)``; taps outside the image are left out of the
softmax) are those of the torch path, `visionblocks.ops._local_attention_torch`. Every load
is cast to the compute dtype (float32, or float64 for float64) right away; results are
stored in the inputs' dtype.

A program owns one (batch item, head) and a block of pixels, with the head's ``D`` channels
in one block of lanes; the ``k*k`` taps are unrolled.

- ``_fwd_kernel``: online softmax over the taps (flash-attention style). The centre tap,
  always inside the image, starts the running max, so no ``-inf - -inf`` ever occurs.
  Writes ``out`` and the log-sum-exp ``lse (B, heads, H, W)``, the only thing saved
  besides the inputs and the output.
- ``_bwd_q_kernel``: per query pixel, ``delta = sum_D grad_out * out`` (stored for the next
  kernel), then per tap ``attn = exp(logit - lse)``, ``ds = attn * (grad_out . v - delta)``
  and ``dq = scale * sum_t ds * k``.
- ``_bwd_kv_kernel``: per *key* pixel it gathers from the query pixels that see it
  (``p = n - o_t``), recomputing their ``attn`` and ``ds``:
  ``dv = sum_t attn * grad_out[p]``, ``dk = scale * sum_t ds * q[p]``. Gathering instead
  of scattering needs no atomics and is deterministic.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["local_attention2d_triton"]


@triton.jit
def _offsets(
    C, HEADS, D, H, W, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr
):  # fmt: skip
    """Lane offsets of this program: channel rows (int64), pixels, masks, ``(b, head)``."""
    bn = tl.program_id(1)
    b = bn // HEADS
    n = bn % HEADS
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < H * W
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    chan = (b * C + n * D + offs_d).to(tl.int64) * (H * W)
    return bn, chan, offs_p, p_mask, d_mask


@triton.jit
def _scale(scale, D, CDT: tl.constexpr, BLOCK_P: tl.constexpr):
    """``1 / sqrt(D)`` in the compute dtype: float arguments arrive as float32, so float64
    computes its own (IEEE ``sqrt`` and division in float64)."""
    if CDT == tl.float64:  # noqa: SIM300 (CDT is the constexpr argument)
        return (1.0 / tl.sqrt(tl.zeros((BLOCK_P,), CDT) + D))[None, :]
    return scale


@triton.jit
def _load(ptr, chan, pix, d_mask, p_mask, CDT: tl.constexpr):
    """``(BLOCK_D, BLOCK_P)`` values at channels ``chan`` and pixels ``pix``, 0 if masked."""
    mask = d_mask[:, None] & p_mask[None, :]
    return tl.load(ptr + chan[:, None] + pix[None, :], mask=mask, other=0.0).to(CDT)


@triton.jit
def _tap(h, w, p_mask, H, W, TI: tl.constexpr, TJ: tl.constexpr, KS: tl.constexpr,
         DIL: tl.constexpr, SIGN: tl.constexpr):  # fmt: skip
    """Pixel index and validity of tap ``(TI, TJ)`` (``SIGN = -1``: the query seeing a key)."""
    nh = h + SIGN * (TI - KS // 2) * DIL
    nw = w + SIGN * (TJ - KS // 2) * DIL
    valid = p_mask & (nh >= 0) & (nh < H) & (nw >= 0) & (nw < W)
    return nh * W + nw, valid


@triton.jit
def _fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    C, HEADS, D, H, W, scale,
    KS: tl.constexpr, DIL: tl.constexpr,
    CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, chan, offs_p, p_mask, d_mask = _offsets(C, HEADS, D, H, W, BLOCK_D, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    q = _load(q_ptr, chan, offs_p, d_mask, p_mask, CDT) * _scale(scale, D, CDT, BLOCK_P)
    m = tl.sum(q * _load(k_ptr, chan, offs_p, d_mask, p_mask, CDT), 0)  # the centre tap
    l_sum = tl.full((BLOCK_P,), 1.0, CDT)
    acc = _load(v_ptr, chan, offs_p, d_mask, p_mask, CDT)
    for i in tl.static_range(KS):
        for j in tl.static_range(KS):
            if i * KS + j != (KS * KS) // 2:
                pix, valid = _tap(h, w, p_mask, H, W, i, j, KS, DIL, 1)
                logit = tl.sum(q * _load(k_ptr, chan, pix, d_mask, valid, CDT), 0)
                logit = tl.where(valid, logit, -float("inf"))
                m_new = tl.maximum(m, logit)
                alpha = tl.exp(m - m_new)
                prob = tl.exp(logit - m_new)
                l_sum = l_sum * alpha + prob
                vt = _load(v_ptr, chan, pix, d_mask, valid, CDT)
                acc = acc * alpha[None, :] + prob[None, :] * vt
                m = m_new
    out = acc / l_sum[None, :]
    mask = d_mask[:, None] & p_mask[None, :]
    tl.store(o_ptr + chan[:, None] + offs_p[None, :], out.to(o_ptr.dtype.element_ty), mask=mask)
    plane = bn.to(tl.int64) * (H * W)
    tl.store(lse_ptr + plane + offs_p, m + tl.log(l_sum), mask=p_mask)


@triton.jit
def _bwd_q_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, go_ptr, lse_ptr, delta_ptr, dq_ptr,
    C, HEADS, D, H, W, scale,
    KS: tl.constexpr, DIL: tl.constexpr,
    CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, chan, offs_p, p_mask, d_mask = _offsets(C, HEADS, D, H, W, BLOCK_D, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    plane = bn.to(tl.int64) * (H * W)
    scale = _scale(scale, D, CDT, BLOCK_P)
    q = _load(q_ptr, chan, offs_p, d_mask, p_mask, CDT) * scale
    g = _load(go_ptr, chan, offs_p, d_mask, p_mask, CDT)
    delta = tl.sum(g * _load(o_ptr, chan, offs_p, d_mask, p_mask, CDT), 0)
    lse = tl.load(lse_ptr + plane + offs_p, mask=p_mask, other=0.0).to(CDT)
    dq = tl.zeros((BLOCK_D, BLOCK_P), CDT)
    for i in tl.static_range(KS):
        for j in tl.static_range(KS):
            pix, valid = _tap(h, w, p_mask, H, W, i, j, KS, DIL, 1)
            kt = _load(k_ptr, chan, pix, d_mask, valid, CDT)
            vt = _load(v_ptr, chan, pix, d_mask, valid, CDT)
            prob = tl.where(valid, tl.exp(tl.sum(q * kt, 0) - lse), 0.0)
            ds = prob * (tl.sum(g * vt, 0) - delta)
            dq += ds[None, :] * kt
    mask = d_mask[:, None] & p_mask[None, :]
    dq = dq * scale
    tl.store(dq_ptr + chan[:, None] + offs_p[None, :], dq.to(dq_ptr.dtype.element_ty), mask=mask)
    tl.store(delta_ptr + plane + offs_p, delta, mask=p_mask)


@triton.jit
def _bwd_kv_kernel(
    q_ptr, k_ptr, v_ptr, go_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    C, HEADS, D, H, W, scale,
    KS: tl.constexpr, DIL: tl.constexpr,
    CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, chan, offs_p, p_mask, d_mask = _offsets(C, HEADS, D, H, W, BLOCK_D, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    plane = bn.to(tl.int64) * (H * W)
    scale = _scale(scale, D, CDT, BLOCK_P)
    k = _load(k_ptr, chan, offs_p, d_mask, p_mask, CDT)
    v = _load(v_ptr, chan, offs_p, d_mask, p_mask, CDT)
    dk = tl.zeros((BLOCK_D, BLOCK_P), CDT)
    dv = tl.zeros((BLOCK_D, BLOCK_P), CDT)
    for i in tl.static_range(KS):
        for j in tl.static_range(KS):
            pix, valid = _tap(h, w, p_mask, H, W, i, j, KS, DIL, -1)  # the query at k - o_t
            qt = _load(q_ptr, chan, pix, d_mask, valid, CDT) * scale
            gt = _load(go_ptr, chan, pix, d_mask, valid, CDT)
            lse = tl.load(lse_ptr + plane + pix, mask=valid, other=0.0).to(CDT)
            delta = tl.load(delta_ptr + plane + pix, mask=valid, other=0.0).to(CDT)
            prob = tl.where(valid, tl.exp(tl.sum(qt * k, 0) - lse), 0.0)
            dv += prob[None, :] * gt
            ds = prob * (tl.sum(gt * v, 0) - delta)
            dk += ds[None, :] * qt  # qt holds scale * q: d logit / dk
    mask = d_mask[:, None] & p_mask[None, :]
    offs = chan[:, None] + offs_p[None, :]
    tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty), mask=mask)


def _cdt(dtype: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _head_scale(q: Tensor, num_heads: int) -> float:
    return 1.0 / math.sqrt(max(q.shape[1] // num_heads, 1))


def _launch(q: Tensor, num_heads: int) -> tuple[tuple[int, int], dict[str, int], tuple[int, ...]]:
    """Grid, block sizes and the ``(C, heads, D, H, W)`` runtime arguments for ``q``."""
    batch, channels, height, width = q.shape
    depth = channels // num_heads
    block_d = max(2, triton.next_power_of_2(depth))
    block_p = max(16, min(128, 2048 // block_d))
    # Pixel blocks on axis 0: CUDA allows 2**31 - 1 programs there but only 65535 on axis 1.
    grid = (triton.cdiv(height * width, block_p), batch * num_heads)
    return (
        grid,
        {"BLOCK_D": block_d, "BLOCK_P": block_p},
        (channels, num_heads, depth, height, width),
    )


class _LocalAttentionTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
    ) -> Tensor:  # type: ignore[override]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        batch, _, height, width = q.shape
        tdt, cdt = _cdt(q.dtype)
        out = torch.empty_like(q)
        lse = q.new_empty(batch, num_heads, height, width, dtype=tdt)
        grid, blocks, sizes = _launch(q, num_heads)
        if q.numel():
            _fwd_kernel[grid](
                q, k, v, out, lse, *sizes, _head_scale(q, num_heads),
                KS=kernel_size, DIL=dilation, CDT=cdt, **blocks,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geometry = (kernel_size, dilation, num_heads)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        kernel_size, dilation, num_heads = ctx.geometry
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty_like(lse)
        grid, blocks, sizes = _launch(q, num_heads)
        scale = _head_scale(q, num_heads)
        common = {"KS": kernel_size, "DIL": dilation, "CDT": _cdt(q.dtype)[1], **blocks}
        if q.numel():  # else every gradient is empty
            _bwd_q_kernel[grid](q, k, v, out, grad_out, lse, delta, dq, *sizes, scale, **common)
            if need_k or need_v:
                _bwd_kv_kernel[grid](q, k, v, grad_out, lse, delta, dk, dv, *sizes, scale, **common)
        return (
            dq if need_q else None,
            dk if need_k else None,
            dv if need_v else None,
            None,
            None,
            None,
        )


def local_attention2d_triton(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
) -> Tensor:
    """Fused `visionblocks.ops.local_attention.local_attention2d`; inputs already validated.

    Reached through dispatch (``local_attention2d(..., impl="triton")``), not called directly.

    Args:
        q (Tensor[B, C, H, W]): Queries, float16, bfloat16, float32 or float64.
        k (Tensor[B, C, H, W]): Keys, like ``q``.
        v (Tensor[B, C, H, W]): Values, like ``q``.
        kernel_size: Odd window size.
        dilation: Spacing of the window's positions.
        num_heads: Heads, dividing ``C``.

    Returns:
        Tensor[B, C, H, W]: The attention output in ``q``'s dtype, differentiable with
        respect to ``q``, ``k`` and ``v`` (fused backward).

    Examples:
        >>> import torch
        >>> q, k, v = (torch.randn(1, 8, 6, 6, device="cuda") for _ in range(3))  # doctest: +SKIP
        >>> local_attention2d_triton(q, k, v, 3, 1, 2).shape  # doctest: +SKIP
        torch.Size([1, 8, 6, 6])
    """
    return _LocalAttentionTriton.apply(q, k, v, kernel_size, dilation, num_heads)
