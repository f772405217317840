"""The torch path of `visionblocks.ops.local_attention.local_attention2d` (window views).

The ``B*heads`` planes ``(D, H, W)`` are cut into parts (`visionblocks.ops._local_parts.Grid`).
A part copies its key and value rows, with ``h = d*(k//2)`` rows and columns of zero padding,
into per-thread scratch buffers, viewed without a copy as ``(D, k, k, rows, W)`` windows
(`visionblocks.ops._local_parts.windows`). Each step is one op per channel or per tap:

    logits = sum_D (scale * q) * windows(k)     (taps outside the image then -inf)
    lse = logsumexp_t logits;   attn = exp(logits - lse)
    out = sum_t attn[t] * windows(v)[:, t]

Backward recomputes ``attn`` from the saved log-sum-exp (nothing of size ``k*k`` is kept)
with ``delta = sum_D grad_out * out``:

    dattn = sum_D grad_out * windows(v);   ds = attn * (dattn - delta)
    dq = scale * sum_t ds[t] * windows(k)[:, t]
    windows(dv)[:, t] += attn[t] * grad_out;   windows(dk)[:, t] += ds[t] * scale * q

``dk`` and ``dv`` are scattered into a zero-initialised padded block, then copied (whole
planes) or added (even row blocks, then odd ones) into the gradients. Half inputs are
computed in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.ops._local_parts import Grid, planar, scratch, windows

__all__ = ["LocalAttentionFunction", "local_attention_backward", "local_attention_forward"]

# Logits per part: large against per-op overhead, with several parts per thread.
_TILE = 1 << 19

Buffers = Callable[[str], Tensor]


def _target(x: Tensor) -> int:
    """Logits per part: `_TILE` on CPU; larger on CUDA, bounding its scratch buffers."""
    return _TILE if x.device.type == "cpu" else max(_TILE, 1 << 22)


def head_scale(channels: int, num_heads: int) -> float:
    """``1 / sqrt(C / heads)`` (1 for zero channels)."""
    return 1.0 / math.sqrt(max(channels // num_heads, 1))


def _heads(x: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
    """``(B, C, H, W)`` as contiguous ``(B*heads, D, H, W)`` planes in ``dtype``."""
    b, c, h, w = x.shape
    return planar(x, dtype).view(b * num_heads, c // num_heads, h, w)


def _outside(k: int, d: int, r0: int, r1: int, height: int, width: int) -> list[tuple]:
    """Indices of ``logits (P, k, k, r1 - r0, W)`` whose key lies outside the image."""
    half, index = k // 2, []
    for i in range(k):
        off = (i - half) * d
        for lo, hi in ((r0, min(r1, -off)), (max(r0, height - off), r1)):
            if lo < hi:
                index.append((slice(None), i, slice(None), slice(lo - r0, hi - r0)))
    for j in range(k):
        off = (j - half) * d
        for lo, hi in ((0, min(width, -off)), (max(0, width - off), width)):
            if lo < hi:
                index.append((slice(None), slice(None), j, slice(None), slice(lo, hi)))
    return index


def _shapes(planes: int, rows: int, depth: int, width: int, k: int, halo: int) -> dict:
    """Scratch buffer shapes of a part of ``planes`` planes and ``rows`` rows."""
    padded = (planes, depth, rows + 2 * halo, width + 2 * halo)
    return {
        "kpad": padded,
        "vpad": padded,
        "q": (planes, depth, rows, width),
        "prod": (planes, depth, rows, width),
        "logits": (planes, k, k, rows, width),
        "dattn": (planes, k, k, rows, width),
        "dk": padded,
        "dv": padded,
        "peak": (planes, 1, 1, rows, width),
        "total": (planes, 1, 1, rows, width),
    }


def _scratch(grid: Grid, like: Tensor, k: int, halo: int) -> Callable[[slice, int], Buffers]:
    """``buffers(ps, rows)(name)``: the part's scratch buffer ``name`` (see `_shapes`)."""
    depth, _, width = like.shape[1:]
    caps = {
        name: math.prod(shape)
        for name, shape in _shapes(grid.max_planes, grid.max_rows, depth, width, k, halo).items()
    }

    def buffers(ps: slice, rows: int) -> Buffers:
        shapes = _shapes(ps.stop - ps.start, rows, depth, width, k, halo)
        return lambda name: scratch(f"la.{name}", shapes[name], caps[name], like)

    return buffers


def _padded(x: Tensor, ps: slice, r0: int, r1: int, halo: int, buf: Tensor) -> Tensor:
    """Rows ``[r0 - halo, r1 + halo)`` of planes ``ps`` of ``x`` in ``buf``, zero outside."""
    lo, hi = max(0, r0 - halo), min(x.shape[2], r1 + halo)
    buf.zero_()
    buf[:, :, lo - r0 + halo : hi - r0 + halo, halo : halo + x.shape[3]].copy_(x[ps, :, lo:hi])
    return buf


def _logits(
    q: Tensor, k_win: Tensor, ps: slice, r0: int, r1: int, scale: float,
    geometry: tuple[int, int, int, int], buf: Buffers,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(scaled queries (P, D, R, W), logits (P, k, k, R, W))`` of a part, masked."""
    size, dil, height, width = geometry
    qs = torch.mul(q[ps, :, r0:r1], scale, out=buf("q"))
    logits = buf("logits")
    if qs.shape[1] == 0:
        logits.zero_()
    for ch, (kc, qc) in enumerate(
        zip(k_win.unbind(1), qs[:, :, None, None].unbind(1), strict=True)
    ):
        if ch == 0:
            torch.mul(kc, qc, out=logits)
        else:
            logits.addcmul_(kc, qc)
    for index in _outside(size, dil, r0, r1, height, width):
        logits[index] = -math.inf
    return qs, logits


def _per_tap(x: Tensor, dim: int) -> list[Tensor]:
    """The ``k*k`` views ``x[..., i, j, ...]`` of a tensor with tap axes ``(dim, dim + 1)``."""
    return [tap for row in x.unbind(dim) for tap in row.unbind(dim)]


def _weighted_sum(weights: Tensor, win: Tensor, out: Tensor) -> Tensor:
    """``out (P, D, R, W) = sum_t weights[:, t] * win[:, :, t]``, one op per tap."""
    pairs = list(zip(_per_tap(weights.unsqueeze(1), 2), _per_tap(win, 2), strict=True))
    centre = pairs.pop(len(pairs) // 2)  # first: it covers every pixel (no zeros needed)
    torch.mul(*centre, out=out)
    for weight, value in pairs:
        out.addcmul_(weight, value)
    return out


def local_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    """``(out (B, C, H, W) in the compute dtype, lse (B*heads, H, W))`` of checked inputs."""
    cdt = compute_dtype(q.dtype)
    qh, kh, vh = (_heads(x, num_heads, cdt) for x in (q, k, v))
    planes, _, height, width = qh.shape
    size, halo = kernel_size, dilation * (kernel_size // 2)
    scale = head_scale(q.shape[1], num_heads)
    out, lse = torch.empty_like(qh), qh.new_empty(planes, height, width)
    grid = Grid(planes, height, size * size * width, _target(q), device=q.device)
    buffers = _scratch(grid, qh, size, halo)
    geometry = (size, dilation, height, width)

    def segment(ps: slice, r0: int, r1: int) -> None:
        buf = buffers(ps, r1 - r0)
        k_win, v_win = (
            windows(_padded(x, ps, r0, r1, halo, buf(name)), size, dilation, 1, r1 - r0, width)
            for x, name in ((kh, "kpad"), (vh, "vpad"))
        )
        _, logits = _logits(qh, k_win, ps, r0, r1, scale, geometry, buf)
        flat, peak, total = logits.flatten(1, 2), buf("peak"), buf("total")
        torch.amax(flat, 1, keepdim=True, out=peak.flatten(1, 2))  # the centre tap is finite
        flat.sub_(peak.flatten(1, 2)).exp_()
        torch.sum(flat, 1, keepdim=True, out=total.flatten(1, 2))
        torch.log(total, out=lse[ps, None, None, r0:r1]).add_(peak)
        _weighted_sum(logits.div_(total), v_win, out[ps, :, r0:r1])

    grid.run(segment)
    return out.view(q.shape), lse


def local_attention_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    kernel_size: int, dilation: int, num_heads: int, need: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """``(grad_q, grad_k, grad_v)`` in the inputs' dtype (``None`` where not ``need``ed),
    from the forward's ``out`` (compute dtype) and ``lse``."""
    cdt = compute_dtype(q.dtype)
    qh, kh, vh, gh, oh = (_heads(x, num_heads, cdt) for x in (q, k, v, grad_out, out))
    planes, depth, height, width = qh.shape
    size, halo = kernel_size, dilation * (kernel_size // 2)
    scale = head_scale(q.shape[1], num_heads)
    grid = Grid(planes, height, size * size * width, _target(q), 2 * halo, device=q.device)
    # Whole planes per part: every part writes its planes' dk, dv once (no zeros, no adds).
    whole = len(grid.blocks) == 1
    dq = torch.empty_like(qh) if need[0] else None
    dk, dv = (
        None if not n else torch.empty_like(qh) if whole else torch.zeros_like(qh) for n in need[1:]
    )
    buffers = _scratch(grid, qh, size, halo)
    geometry = (size, dilation, height, width)

    def take_back(weights: Tensor, factors: Tensor, dst: Tensor, name: str, buf: Buffers,
                  ps: slice, r0: int) -> None:  # fmt: skip
        """``dst[ps, :, key rows] += sum_t weights[:, t] * factors`` scattered to the keys."""
        rows = weights.shape[-2]
        block = buf(name)  # key rows [r0 - h, r1 + h), columns [-h, W + h)
        block.zero_()
        wins = _per_tap(windows(block, size, dilation, 1, rows, width), 2)
        for weight, win in zip(_per_tap(weights.unsqueeze(1), 2), wins, strict=True):
            win.addcmul_(weight, factors)
        lo, hi = max(0, r0 - halo), min(height, r0 + rows + halo)
        rows_in = block[:, :, lo - r0 + halo : hi - r0 + halo, halo : halo + width]
        if whole:
            dst[ps].copy_(rows_in)
        else:
            dst[ps, :, lo:hi].add_(rows_in)

    def segment(ps: slice, r0: int, r1: int) -> None:
        buf = buffers(ps, r1 - r0)
        k_win, v_win = (
            windows(_padded(x, ps, r0, r1, halo, buf(name)), size, dilation, 1, r1 - r0, width)
            for x, name in ((kh, "kpad"), (vh, "vpad"))
        )
        qs, logits = _logits(qh, k_win, ps, r0, r1, scale, geometry, buf)
        attn = logits.sub_(lse[ps, None, None, r0:r1]).exp_()
        g = gh[ps, :, r0:r1]
        if dv is not None:
            take_back(attn, g, dv, "dv", buf, ps, r0)
        if dq is None and dk is None:
            return
        ds = buf("dattn")  # dattn = sum_D grad_out * windows(v); masked taps read zeros
        for ch, (vc, gc) in enumerate(
            zip(v_win.unbind(1), g[:, :, None, None].unbind(1), strict=True)
        ):
            if ch == 0:
                torch.mul(vc, gc, out=ds)
            else:
                ds.addcmul_(vc, gc)
        if depth == 0:
            ds.zero_()
        delta = buf("total")
        prod = torch.mul(g, oh[ps, :, r0:r1], out=buf("prod"))
        torch.sum(prod, 1, keepdim=True, out=delta.flatten(1, 2))
        ds.sub_(delta).mul_(attn)
        if dq is not None:
            _weighted_sum(ds, k_win, dq[ps, :, r0:r1]).mul_(scale)
        if dk is not None:
            take_back(ds, qs, dk, "dk", buf, ps, r0)

    grid.run(segment, parity=0)
    grid.run(segment, parity=1)
    return tuple(None if x is None else x.view(q.shape).to(q.dtype) for x in (dq, dk, dv))  # type: ignore[return-value]


class LocalAttentionFunction(torch.autograd.Function):
    """``local_attention2d`` with the all-taps forward and backward (no double backward)."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
    ) -> Tensor:  # type: ignore[override]
        out, lse = local_attention_forward(q, k, v, kernel_size, dilation, num_heads)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geometry = (kernel_size, dilation, num_heads)
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        need = tuple(ctx.needs_input_grad[:3])
        grads = local_attention_backward(grad_out, q, k, v, out, lse, *ctx.geometry, need)
        return (*grads, None, None, None)
