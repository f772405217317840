"""Fused Triton kernels for `visionblocks.ops.local_attention.local_attention2d`.

Called by ``local_attention2d`` (after validation) as
``local_attention2d_triton(q, k, v, kernel_size, dilation, num_heads, reference)``: ``q``, ``k``, ``v``
``(B, C, H, W)`` of one floating dtype, ``num_heads`` dividing ``C``; the result
``(B, C, H, W)`` is in that dtype, differentiable with respect to all three. Geometry and
masking (tap ``t = i*k + j`` of query pixel ``(h, w)`` is key pixel
``(h + (i - k//2)*d, w + (j - k//2)*d)``; taps outside the image are left out of the
softmax) are those of the torch formula, `visionblocks.ops.local_attention._local_attention`,
which the tests compare it with. Every load is cast to the compute dtype (float32, or
float64 for float64) right away; results are stored in the inputs' dtype.

A program owns one (batch item, head) and a block of pixels (a one-axis grid, decoded in
the kernel), with the head's ``D`` channels in one block of lanes when ``D <= 64``; wider
heads loop over blocks of 64 channels (``SPLIT``: the full-D logits are recomputed per
block, so registers stay bounded). The ``k*k`` taps are a runtime loop: window size and
dilation are runtime arguments.

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

__all__ = ["local_attention2d_triton"]
__dir__ = public_dir(__name__, __all__)


@triton.jit
def _program(HEADS, H, W, N_PB, BLOCK_P: tl.constexpr):
    """This program's ``(batch item, head)`` index, pixels and pixel mask (1-D grid)."""
    pid = tl.program_id(0)
    bn = pid // N_PB
    offs_p = (pid % N_PB) * BLOCK_P + tl.arange(0, BLOCK_P)
    return bn, offs_p, offs_p < H * W


@triton.jit
def _chan(bn, HEADS, C, D, H, W, c0, BLOCK_D: tl.constexpr):
    """Offsets (int64) of the channel rows ``c0 .. c0 + BLOCK_D`` of head ``bn`` and their mask."""
    offs_d = c0 + tl.arange(0, BLOCK_D)
    base = (bn // HEADS).to(tl.int64) * C + (bn % HEADS) * D
    return (base + offs_d) * (H * W), offs_d < D


@triton.jit
def _scale(scale, D, CDT: tl.constexpr, BLOCK_P: tl.constexpr):
    """``1 / sqrt(D)`` in the compute dtype: float arguments arrive as float32, so float64
    computes its own (IEEE ``sqrt`` and division in float64)."""
    if CDT == tl.float64:  # noqa: SIM300 (CDT is the constexpr argument)
        return 1.0 / tl.sqrt(tl.zeros((BLOCK_P,), CDT) + D)
    return tl.zeros((BLOCK_P,), CDT) + scale


@triton.jit
def _load(ptr, chan, pix, d_mask, p_mask, CDT: tl.constexpr):
    """``(BLOCK_D, BLOCK_P)`` values at channels ``chan`` and pixels ``pix``, 0 if masked."""
    mask = d_mask[:, None] & p_mask[None, :]
    return tl.load(ptr + chan[:, None] + pix[None, :], mask=mask, other=0.0).to(CDT)


@triton.jit
def _tap(h, w, p_mask, H, W, t, KS, DIL, SIGN: tl.constexpr):
    """Pixel index and validity of tap ``t`` (``SIGN = -1``: the query seeing a key)."""
    nh = h + SIGN * (t // KS - KS // 2) * DIL
    nw = w + SIGN * (t % KS - KS // 2) * DIL
    valid = p_mask & (nh >= 0) & (nh < H) & (nw >= 0) & (nw < W)
    return nh * W + nw, valid


@triton.jit
def _dot(a_ptr, a_pix, a_valid, b_ptr, b_pix, b_valid, bn, HEADS, C, D, H, W,
         CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):  # fmt: skip
    """Per pixel, ``sum over the head's D channels of a[a_pix] * b[b_pix]`` (D in blocks)."""
    acc = tl.zeros((BLOCK_P,), CDT)
    for c0 in range(0, D, BLOCK_D):
        chan, d_mask = _chan(bn, HEADS, C, D, H, W, c0, BLOCK_D)
        a = _load(a_ptr, chan, a_pix, d_mask, a_valid, CDT)
        acc += tl.sum(a * _load(b_ptr, chan, b_pix, d_mask, b_valid, CDT), 0)
    return acc


@jit
def _fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    C: tl.int32, HEADS: tl.int32, D: tl.int32, H: tl.int32, W: tl.int32,
    KS: tl.int32, DIL: tl.int32, N_PB: tl.int32, scale: tl.float32,
    SPLIT: tl.constexpr, CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, offs_p, p_mask = _program(HEADS, H, W, N_PB, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    sc = _scale(scale, D, CDT, BLOCK_P)
    centre = (KS * KS) // 2
    if SPLIT:
        # Pass 1: the log-sum-exp from full-D logits; pass 2, per block of D: the output.
        m = _dot(q_ptr, offs_p, p_mask, k_ptr, offs_p, p_mask, bn, HEADS, C, D, H, W,
                 CDT, BLOCK_D, BLOCK_P) * sc  # fmt: skip
        l_sum = tl.full((BLOCK_P,), 1.0, CDT)
        for t in range(0, KS * KS):
            pix, valid = _tap(h, w, p_mask, H, W, t, KS, DIL, 1)
            valid = valid & (t != centre)
            logit = _dot(q_ptr, offs_p, p_mask, k_ptr, pix, valid, bn, HEADS, C, D, H, W,
                         CDT, BLOCK_D, BLOCK_P) * sc  # fmt: skip
            logit = tl.where(valid, logit, -float("inf"))
            m_new = tl.maximum(m, logit)
            l_sum = l_sum * tl.exp(m - m_new) + tl.exp(logit - m_new)
            m = m_new
        lse = m + tl.log(l_sum)
        for c0 in range(0, D, BLOCK_D):
            chan, d_mask = _chan(bn, HEADS, C, D, H, W, c0, BLOCK_D)
            acc = tl.zeros((BLOCK_D, BLOCK_P), CDT)
            for t in range(0, KS * KS):
                pix, valid = _tap(h, w, p_mask, H, W, t, KS, DIL, 1)
                logit = _dot(q_ptr, offs_p, p_mask, k_ptr, pix, valid, bn, HEADS, C, D, H, W,
                             CDT, BLOCK_D, BLOCK_P) * sc  # fmt: skip
                prob = tl.where(valid, tl.exp(logit - lse), 0.0)
                acc += prob[None, :] * _load(v_ptr, chan, pix, d_mask, valid, CDT)
            mask = d_mask[:, None] & p_mask[None, :]
            dst = o_ptr + chan[:, None] + offs_p[None, :]
            tl.store(dst, acc.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        # One pass, online softmax; the centre tap (always inside) starts the running max.
        chan, d_mask = _chan(bn, HEADS, C, D, H, W, 0, BLOCK_D)
        q = _load(q_ptr, chan, offs_p, d_mask, p_mask, CDT) * sc[None, :]
        m = tl.sum(q * _load(k_ptr, chan, offs_p, d_mask, p_mask, CDT), 0)
        l_sum = tl.full((BLOCK_P,), 1.0, CDT)
        acc = _load(v_ptr, chan, offs_p, d_mask, p_mask, CDT)
        for t in range(0, KS * KS):
            pix, valid = _tap(h, w, p_mask, H, W, t, KS, DIL, 1)
            valid = valid & (t != centre)
            logit = tl.sum(q * _load(k_ptr, chan, pix, d_mask, valid, CDT), 0)
            logit = tl.where(valid, logit, -float("inf"))
            m_new = tl.maximum(m, logit)
            alpha = tl.exp(m - m_new)
            prob = tl.exp(logit - m_new)
            l_sum = l_sum * alpha + prob
            acc = acc * alpha[None, :] + prob[None, :] * _load(v_ptr, chan, pix, d_mask, valid, CDT)
            m = m_new
        lse = m + tl.log(l_sum)
        mask = d_mask[:, None] & p_mask[None, :]
        out = acc / l_sum[None, :]
        tl.store(o_ptr + chan[:, None] + offs_p[None, :], out.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_ptr + bn.to(tl.int64) * (H * W) + offs_p, lse, mask=p_mask)


@jit
def _bwd_q_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, go_ptr, lse_ptr, delta_ptr, dq_ptr,
    C: tl.int32, HEADS: tl.int32, D: tl.int32, H: tl.int32, W: tl.int32,
    KS: tl.int32, DIL: tl.int32, N_PB: tl.int32, scale: tl.float32,
    SPLIT: tl.constexpr, CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, offs_p, p_mask = _program(HEADS, H, W, N_PB, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    plane = bn.to(tl.int64) * (H * W)
    sc = _scale(scale, D, CDT, BLOCK_P)
    lse = tl.load(lse_ptr + plane + offs_p, mask=p_mask, other=0.0).to(CDT)
    delta = _dot(go_ptr, offs_p, p_mask, o_ptr, offs_p, p_mask, bn, HEADS, C, D, H, W,
                 CDT, BLOCK_D, BLOCK_P)  # fmt: skip
    tl.store(delta_ptr + plane + offs_p, delta, mask=p_mask)
    for c0 in range(0, D, BLOCK_D):  # one block of D unless SPLIT
        chan, d_mask = _chan(bn, HEADS, C, D, H, W, c0, BLOCK_D)
        if not SPLIT:
            q = _load(q_ptr, chan, offs_p, d_mask, p_mask, CDT) * sc[None, :]
            g = _load(go_ptr, chan, offs_p, d_mask, p_mask, CDT)
        dq = tl.zeros((BLOCK_D, BLOCK_P), CDT)
        for t in range(0, KS * KS):
            pix, valid = _tap(h, w, p_mask, H, W, t, KS, DIL, 1)
            kt = _load(k_ptr, chan, pix, d_mask, valid, CDT)
            if SPLIT:
                logit = _dot(q_ptr, offs_p, p_mask, k_ptr, pix, valid, bn, HEADS, C, D, H, W,
                             CDT, BLOCK_D, BLOCK_P) * sc  # fmt: skip
                gv = _dot(go_ptr, offs_p, p_mask, v_ptr, pix, valid, bn, HEADS, C, D, H, W,
                          CDT, BLOCK_D, BLOCK_P)  # fmt: skip
            else:
                logit = tl.sum(q * kt, 0)
                gv = tl.sum(g * _load(v_ptr, chan, pix, d_mask, valid, CDT), 0)
            prob = tl.where(valid, tl.exp(logit - lse), 0.0)
            dq += (prob * (gv - delta))[None, :] * kt
        mask = d_mask[:, None] & p_mask[None, :]
        dq = dq * sc[None, :]
        dst = dq_ptr + chan[:, None] + offs_p[None, :]
        tl.store(dst, dq.to(dq_ptr.dtype.element_ty), mask=mask)


@jit
def _bwd_kv_kernel(
    q_ptr, k_ptr, v_ptr, go_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    C: tl.int32, HEADS: tl.int32, D: tl.int32, H: tl.int32, W: tl.int32,
    KS: tl.int32, DIL: tl.int32, N_PB: tl.int32, scale: tl.float32,
    SPLIT: tl.constexpr, CDT: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    bn, offs_p, p_mask = _program(HEADS, H, W, N_PB, BLOCK_P)
    h = offs_p // W
    w = offs_p % W
    plane = bn.to(tl.int64) * (H * W)
    sc = _scale(scale, D, CDT, BLOCK_P)
    for c0 in range(0, D, BLOCK_D):  # one block of D unless SPLIT
        chan, d_mask = _chan(bn, HEADS, C, D, H, W, c0, BLOCK_D)
        if not SPLIT:
            k = _load(k_ptr, chan, offs_p, d_mask, p_mask, CDT)
            v = _load(v_ptr, chan, offs_p, d_mask, p_mask, CDT)
        dk = tl.zeros((BLOCK_D, BLOCK_P), CDT)
        dv = tl.zeros((BLOCK_D, BLOCK_P), CDT)
        for t in range(0, KS * KS):
            pix, valid = _tap(h, w, p_mask, H, W, t, KS, DIL, -1)  # the query at k - o_t
            qt = _load(q_ptr, chan, pix, d_mask, valid, CDT) * sc[None, :]
            gt = _load(go_ptr, chan, pix, d_mask, valid, CDT)
            lse = tl.load(lse_ptr + plane + pix, mask=valid, other=0.0).to(CDT)
            delta = tl.load(delta_ptr + plane + pix, mask=valid, other=0.0).to(CDT)
            if SPLIT:
                logit = _dot(q_ptr, pix, valid, k_ptr, offs_p, p_mask, bn, HEADS, C, D, H, W,
                             CDT, BLOCK_D, BLOCK_P) * sc  # fmt: skip
                gv = _dot(go_ptr, pix, valid, v_ptr, offs_p, p_mask, bn, HEADS, C, D, H, W,
                          CDT, BLOCK_D, BLOCK_P)  # fmt: skip
            else:
                logit = tl.sum(qt * k, 0)
                gv = tl.sum(gt * v, 0)
            prob = tl.where(valid, tl.exp(logit - lse), 0.0)
            dv += prob[None, :] * gt
            dk += (prob * (gv - delta))[None, :] * qt  # qt holds scale * q: d logit / dk
        mask = d_mask[:, None] & p_mask[None, :]
        offs = chan[:, None] + offs_p[None, :]
        tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty), mask=mask)
        tl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty), mask=mask)


def _cdt(dtype: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _head_scale(channels: int, num_heads: int) -> float:
    return 1.0 / math.sqrt(max(channels // num_heads, 1))


def plan(
    shape: tuple[int, int, int, int], num_heads: int, float64: bool = False
) -> dict[str, int | bool]:
    """Grid and tile sizes for ``(B, C, H, W)`` inputs with ``num_heads`` heads.

    A head's ``D = C / heads`` channels sit in one block of lanes (``BLOCK_D`` 16, 32 or 64)
    when ``D <= 64``; beyond, ``SPLIT`` loops over blocks of 64 (recomputing the full-D
    logits per block), so registers stay bounded at any channel count. Pixel blocks hold
    ``2048 / BLOCK_D`` pixels (``1024 / BLOCK_D`` in float64), 8 warps per program: at most
    8 tile elements per thread. The 1-D grid enumerates (batch item and head, pixel block).

    Returns:
        dict: ``programs``, ``N_PB``, ``SPLIT``, ``BLOCK_D``, ``BLOCK_P``.

    Raises:
        LaunchLimitError: If a plane has ``2**31`` pixels or more.

    Examples:
        >>> plan((2, 256, 64, 64), num_heads=8)  # D = 32
        {'programs': 1024, 'N_PB': 64, 'SPLIT': False, 'BLOCK_D': 32, 'BLOCK_P': 64}
        >>> plan((1, 4096, 8, 8), num_heads=1)["SPLIT"]  # D = 4096: blocks of 64
        True
    """
    batch, channels, height, width = shape
    check_plane(height, width, "local_attention2d")
    depth = channels // num_heads
    block_d = 16 if depth <= 16 else 32 if depth <= 32 else 64
    block_p = (1024 if float64 else 2048) // block_d
    n_pb = triton.cdiv(height * width, block_p)
    return {
        "programs": n_pb * batch * num_heads,
        "N_PB": n_pb,
        "SPLIT": depth > 64,
        "BLOCK_D": block_d,
        "BLOCK_P": block_p,
    }


def _launch_all(kernel, q: Tensor, geometry: tuple[int, int, int], **tensors: Tensor) -> None:
    kernel_size, dilation, num_heads = geometry
    _, channels, height, width = q.shape
    p = plan(tuple(q.shape), num_heads, q.dtype == torch.float64)
    launch(
        "local_attention2d", kernel, (p["programs"],), 8, **tensors,
        C=channels, HEADS=num_heads, D=channels // num_heads, H=height, W=width,
        KS=kernel_size, DIL=dilation, N_PB=p["N_PB"], scale=_head_scale(channels, num_heads),
        SPLIT=p["SPLIT"], CDT=_cdt(q.dtype)[1], BLOCK_D=p["BLOCK_D"], BLOCK_P=p["BLOCK_P"],
    )  # fmt: skip


class _LocalAttentionTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int,
        reference,
    ) -> Tensor:  # type: ignore[override]  # fmt: skip
        q, k, v = prepare(q), prepare(k), prepare(v)
        batch, _, height, width = q.shape
        out = torch.empty_like(q)
        lse = q.new_empty(batch, num_heads, height, width, dtype=_cdt(q.dtype)[0])
        geometry = (kernel_size, dilation, num_heads)
        if q.numel():
            _launch_all(_fwd_kernel, q, geometry, q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=out, lse_ptr=lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geometry, ctx.reference = geometry, reference
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        try:
            if q.numel():  # else every gradient is empty
                go = prepare(grad_out)
                delta = torch.empty_like(lse)
                common = {"q_ptr": q, "k_ptr": k, "v_ptr": v, "go_ptr": go, "lse_ptr": lse}
                _launch_all(
                    _bwd_q_kernel, q, ctx.geometry, **common, o_ptr=out, delta_ptr=delta,
                    dq_ptr=dq,
                )  # fmt: skip
                if need_k or need_v:
                    _launch_all(
                        _bwd_kv_kernel, q, ctx.geometry, **common, delta_ptr=delta, dk_ptr=dk,
                        dv_ptr=dv,
                    )  # fmt: skip
        except KernelFailure as exc:
            grads = reference_grads(
                "local_attention2d", exc, ctx.reference, (q, k, v, *ctx.geometry),
                ctx.needs_input_grad[:6], (grad_out,),
            )  # fmt: skip
            return (*grads, None)
        grads = (dq if need_q else None, dk if need_k else None, dv if need_v else None)
        return (*grads, None, None, None, None)


@with_fallback("local_attention2d")
def local_attention2d_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel_size: int,
    dilation: int,
    num_heads: int,
    reference: Callable[..., Tensor] | None = None,
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
        reference: The torch formula with the same first six arguments; used for the
            gradients if a backward kernel fails (None: raise instead).

    Returns:
        Tensor[B, C, H, W]: The attention output in ``q``'s dtype, differentiable with
        respect to ``q``, ``k`` and ``v`` (fused backward).

    Raises:
        KernelFailure: If a kernel fails to compile, load or launch.

    Examples:
        >>> import torch
        >>> q, k, v = (torch.randn(1, 8, 6, 6, device="cuda") for _ in range(3))  # doctest: +SKIP
        >>> local_attention2d_triton(q, k, v, 3, 1, 2).shape  # doctest: +SKIP
        torch.Size([1, 8, 6, 6])
    """
    return _LocalAttentionTriton.apply(q, k, v, kernel_size, dilation, num_heads, reference)
