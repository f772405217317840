"""The lean torch path of `visionblocks.ops.local_attention.local_attention2d` (tap by tap).

Neither the ``k*k``-times unfolded keys nor values are ever built. With the channels viewed
as ``(heads, D)``, tap ``t = i*k + j`` of query pixel ``p = (h, w)`` reads key/value pixel
``p + o_t``, ``o_t = ((i - k//2)*d, (j - k//2)*d)``. For each tap the query pixels whose
neighbour lies inside the image form one rectangle, so every tap is a handful of ops on
strided slices of the unpadded inputs, and the taps outside the image are simply never
written (their logits stay ``-inf``)::

    logits[t] = scale * sum_D q * k[shifted by o_t]          (mul + sum over D)
    lse = logsumexp_t logits;   attn = exp(logits - lse)      (masked taps: exp(-inf) = 0)
    out += attn[t] * v[shifted by o_t]                         (one addcmul_ per tap)

The logits are ``D = C / heads`` times smaller than the unfolded keys. Backward recomputes
``attn`` from the saved log-sum-exp ``(B, heads, H, W)`` (flash-attention style: nothing of
size ``k*k`` is kept between forward and backward) and runs the taps again::

    dattn[t] = sum_D grad_out * v[shifted];   ds = attn * (dattn - sum_t attn * dattn)
    dq += scale * ds[t] * k[shifted];   dk[shifted] += scale * ds[t] * q;
    dv[shifted] += attn[t] * grad_out

(``dk``/``dv`` are scatters into the shifted rectangle of full-size gradient buffers).

Work runs in tiles of whole rows (and batch items) holding about ``_TILE`` logits, so the
per-tap slices stay in cache and no ``(B, heads, k*k, H, W)`` tensor is allocated on large
inputs. Measured on the benchmark size (``local_attention_*``: 2 x 64 x 128 x 128, k = 7,
8 heads, 2 threads): tiles of 5 rows lose about 1.6x to per-op overhead and 10 rows about
1.2x; 20 rows (this ``_TILE``) to no tiling at all are within noise. Half inputs are
computed in float32 and cast back.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["LocalAttentionFunction", "local_attention_backward", "local_attention_forward"]

_TILE = 1 << 21  # logits per tile (see the module notes)
_Rect = tuple[int, slice, slice, slice, slice]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def head_scale(channels: int, num_heads: int) -> float:
    """``1 / sqrt(C / heads)`` (1 for zero channels)."""
    return 1.0 / math.sqrt(max(channels // num_heads, 1))


def _tiles(batch: int, rows: int, row_logits: int) -> Iterator[tuple[slice, int, int]]:
    """``(batch slice, row start, row stop)`` tiles of about ``_TILE`` logits."""
    plane = rows * row_logits
    if batch * plane == 0:
        return
    if plane >= _TILE:
        n_batch, n_rows = 1, max(1, _TILE // row_logits)
    else:
        n_batch, n_rows = max(1, _TILE // plane), rows
    for b0 in range(0, batch, n_batch):
        for r0 in range(0, rows, n_rows):
            yield slice(b0, b0 + n_batch), r0, min(rows, r0 + n_rows)


def _rects(
    kernel_size: int, dilation: int, r0: int, r1: int, height: int, width: int
) -> Iterator[_Rect]:
    """Per valid tap of tile rows ``[r0, r1)``: ``(t, tile rows, cols, key rows, key cols)``.

    Query pixels ``(tile rows + r0, cols)`` see their tap-``t`` neighbours at
    ``(key rows, key cols)``; taps with no neighbour inside the image are skipped.
    """
    half = kernel_size // 2
    for i in range(kernel_size):
        oi = (i - half) * dilation
        h0, h1 = max(r0, -oi), min(r1, height - oi)
        if h0 >= h1:
            continue
        for j in range(kernel_size):
            oj = (j - half) * dilation
            w0, w1 = max(0, -oj), min(width, width - oj)
            if w0 >= w1:
                continue
            yield (
                i * kernel_size + j,
                slice(h0 - r0, h1 - r0),
                slice(w0, w1),
                slice(h0 + oi, h1 + oi),
                slice(w0 + oj, w1 + oj),
            )


def _heads(x: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
    """``(B, C, H, W)`` as ``(B, heads, D, H, W)`` in ``dtype``.

    A view when every batch item is one contiguous block (e.g. a channel chunk of a larger
    tensor), else a contiguous copy.
    """
    x = x.to(dtype)
    if x.shape[0] and not x[0].is_contiguous():
        x = x.contiguous()
    return x.unflatten(1, (num_heads, x.shape[1] // num_heads))


def _attention(
    qh: Tensor, kh: Tensor, bs: slice, r0: int, r1: int, kernel_size: int, dilation: int,
    scale: float, lse: Tensor | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Attention weights ``(b, heads, k*k, rows, W)`` of a tile, and its log-sum-exp.

    With ``lse`` given (backward) it is used instead of being computed.
    """
    b, heads, depth, height, width = qh[bs].shape
    logits = qh.new_full((b, heads, kernel_size * kernel_size, r1 - r0, width), -math.inf)
    prod = qh.new_empty(b, heads, depth, r1 - r0, width)
    for t, rows, cols, krows, kcols in _rects(kernel_size, dilation, r0, r1, height, width):
        p = prod[:, :, :, rows, cols]
        torch.mul(qh[bs, :, :, r0:r1][:, :, :, rows, cols], kh[bs, :, :, krows, kcols], out=p)
        torch.sum(p, 2, out=logits[:, :, t, rows, cols])
    logits.mul_(scale)
    if lse is None:
        lse = torch.logsumexp(logits, 2, keepdim=True)  # the centre tap is always finite
    return logits.sub_(lse).exp_(), lse


def local_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    """``(out (B, C, H, W) in q.dtype, lse (B, heads, H, W) in the compute dtype)``.

    Inputs are validated by the caller and share one dtype and shape.
    """
    cdt = compute_dtype(q.dtype)
    qh, kh, vh = (_heads(x, num_heads, cdt) for x in (q, k, v))
    batch, heads, _, height, width = qh.shape
    scale = head_scale(q.shape[1], num_heads)
    out = qh.new_zeros(qh.shape)
    lse = qh.new_empty(batch, heads, height, width)
    taps = kernel_size * kernel_size
    for bs, r0, r1 in _tiles(batch, height, heads * taps * width):
        attn, lse_t = _attention(qh, kh, bs, r0, r1, kernel_size, dilation, scale, None)
        lse[bs, :, r0:r1] = lse_t.squeeze(2)
        o = out[bs, :, :, r0:r1]
        for t, rows, cols, krows, kcols in _rects(kernel_size, dilation, r0, r1, height, width):
            o[:, :, :, rows, cols].addcmul_(
                attn[:, :, t : t + 1, rows, cols], vh[bs, :, :, krows, kcols]
            )
    return out.view(q.shape).to(q.dtype), lse


def local_attention_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor,
    kernel_size: int, dilation: int, num_heads: int, need: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """``(grad_q, grad_k, grad_v)`` in the inputs' dtype; ``None`` where ``need`` is False."""
    cdt = compute_dtype(q.dtype)
    qh, kh, vh, gh = (_heads(x, num_heads, cdt) for x in (q, k, v, grad_out))
    batch, heads, _, height, width = qh.shape
    scale = head_scale(q.shape[1], num_heads)
    taps = kernel_size * kernel_size
    dq, dk, dv = (qh.new_zeros(qh.shape) if n else None for n in need)
    need_ds = dq is not None or dk is not None
    for bs, r0, r1 in _tiles(batch, height, heads * taps * width):
        lse_t = lse[bs, :, r0:r1].unsqueeze(2)
        attn, _ = _attention(qh, kh, bs, r0, r1, kernel_size, dilation, scale, lse_t)
        g, q_t = gh[bs, :, :, r0:r1], qh[bs, :, :, r0:r1]
        rects = list(_rects(kernel_size, dilation, r0, r1, height, width))
        dattn = torch.zeros_like(attn) if need_ds else None  # masked taps stay 0, as attn
        prod = g.new_empty(g.shape)
        for t, rows, cols, krows, kcols in rects:
            if dattn is not None:
                p = prod[:, :, :, rows, cols]
                torch.mul(g[:, :, :, rows, cols], vh[bs, :, :, krows, kcols], out=p)
                torch.sum(p, 2, out=dattn[:, :, t, rows, cols])
            if dv is not None:
                a = attn[:, :, t : t + 1, rows, cols]
                dv[bs, :, :, krows, kcols].addcmul_(a, g[:, :, :, rows, cols])
        if dattn is None:
            continue
        delta = (attn * dattn).sum(2, keepdim=True)
        ds = dattn.sub_(delta).mul_(attn).mul_(scale)
        for t, rows, cols, krows, kcols in rects:
            s = ds[:, :, t : t + 1, rows, cols]
            if dq is not None:
                dq[bs, :, :, r0:r1][:, :, :, rows, cols].addcmul_(s, kh[bs, :, :, krows, kcols])
            if dk is not None:
                dk[bs, :, :, krows, kcols].addcmul_(s, q_t[:, :, :, rows, cols])
    return tuple(None if g is None else g.view(q.shape).to(q.dtype) for g in (dq, dk, dv))  # type: ignore[return-value]


class LocalAttentionFunction(torch.autograd.Function):
    """``local_attention2d`` with the tap-by-tap forward and backward (no double backward)."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
    ) -> Tensor:  # type: ignore[override]
        out, lse = local_attention_forward(q, k, v, kernel_size, dilation, num_heads)
        ctx.save_for_backward(q, k, v, lse)
        ctx.geometry = (kernel_size, dilation, num_heads)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, lse = ctx.saved_tensors
        need = tuple(ctx.needs_input_grad[:3])
        grads = local_attention_backward(grad_out, q, k, v, lse, *ctx.geometry, need)
        return (*grads, None, None, None)
