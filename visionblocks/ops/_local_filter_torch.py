"""The torch path of `visionblocks.ops.local.local_filter2d` (shift and accumulate, in parts).

With ``x`` viewed as ``(B*G, Cg, H, W)`` planes and the kernels as ``(B*G, k*k, Ho, Wo)``,
the output pixels whose tap ``t = i*k + j`` reads inside the image form one rectangle, so
the forward is one ``addcmul_`` per tap on strided views (the centre tap writes first):

    out[p, :, h, w] (+)= kernels[p, t, h, w] * x[p, :, h*s + (i - k//2)*d, w*s + (j - k//2)*d]

Backward: ``grad_kernels`` takes all ``k*k`` taps of one channel at once on a window view of
a zero-padded copy of the part's rows; ``grad_x`` is gathered, one ``addcmul_`` per tap into
the part's own rows. Parts (`visionblocks.ops._local_parts.Grid`) write disjoint rows. Half
inputs are computed in float32 and the results cast back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.ops._local_parts import Grid, new_output, planar, scratch, windows

__all__ = ["LocalFilterFunction", "local_filter_backward", "local_filter_forward"]

# Output elements per part: large against per-op overhead, with several parts per thread.
_TILE = 1 << 18


def _target(x: Tensor) -> int:
    """Output elements per part: `_TILE` on CPU; on CUDA one part (a few kernels per tap)."""
    return _TILE if x.device.type == "cpu" else 1 << 62


class _View(NamedTuple):
    """A view of a ``(planes, ...)`` tensor minus its plane dimension."""

    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def _at(base: Tensor, ps: slice, view: _View) -> Tensor:
    """``view`` of planes ``ps`` of the contiguous ``base``: one ``as_strided`` call."""
    step = base.stride(0)
    return base.as_strided(
        (ps.stop - ps.start, *view.sizes),
        (step, *view.strides),
        base.storage_offset() + ps.start * step + view.offset,
    )


def _span(out0: int, out1: int, in0: int, in1: int, offset: int, stride: int) -> tuple | None:
    """``(o start, o stop, first input)`` of the outputs ``o`` in ``[out0, out1)`` whose input
    ``o*stride + offset`` is in ``[in0, in1)``, or ``None``."""
    lo = max(out0, -((offset - in0) // stride))  # ceil((in0 - offset) / stride)
    hi = min(out1, -((offset - in1) // stride))
    return (lo, hi, lo * stride + offset) if lo < hi else None


def _taps(
    k: int, d: int, s: int, out_rows: tuple[int, int], in_rows: tuple[int, int],
    out_size: tuple[int, int], in_size: tuple[int, int], channels: int,
) -> Iterator[tuple[int, _View, _View, _View]]:  # fmt: skip
    """Per tap with a non-empty rectangle, centre tap first: ``(t, output, input, kernel)``
    views over the output rows of ``out_rows`` reading input rows in ``in_rows``."""
    (ho, wo), (h, w) = out_size, in_size
    half = k // 2
    centre = half * k + half
    for t in (centre, *(t for t in range(k * k) if t != centre)):
        i, j = divmod(t, k)
        rows = _span(*out_rows, *in_rows, (i - half) * d, s)
        cols = _span(0, wo, 0, w, (j - half) * d, s)
        if rows is None or cols is None:
            continue
        (h0, h1, y0), (w0, w1, x0) = rows, cols
        size = (h1 - h0, w1 - w0)
        yield (
            t,
            _View(h0 * wo + w0, (channels, *size), (ho * wo, wo, 1)),
            _View(y0 * w + x0, (channels, *size), (h * w, s * w, s)),
            _View((t * ho + h0) * wo + w0, (1, *size), (ho * wo, wo, 1)),
        )


def _planes(t: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
    """``(B, C, H, W)`` as contiguous ``(B*groups, C // groups, H, W)`` of ``dtype``."""
    b, c, h, w = t.shape
    return planar(t, dtype).view(b * groups, c // groups, h, w)


def local_filter_forward(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int
) -> Tensor:
    """``out (B, C, Ho, Wo)`` in ``x.dtype``; inputs validated by the caller, same dtype."""
    k, d, s = kernel_size, dilation, stride
    b, c, h, w = x.shape
    ho, wo = kernels.shape[2:]
    g = kernels.shape[1] // (k * k)
    cg, cdt = c // g, compute_dtype(x.dtype)
    xw, kw = _planes(x, g, cdt), _planes(kernels, g, cdt)
    out = xw.new_empty(b * g, cg, ho, wo)
    grid = Grid(b * g, ho, cg * wo, _target(x), device=x.device)
    plans = {
        (r0, r1): list(_taps(k, d, s, (r0, r1), (0, h), (ho, wo), (h, w), cg))
        for r0, r1 in grid.blocks
    }

    def segment(ps: slice, r0: int, r1: int) -> None:
        for n, (_, dst, src, tap) in enumerate(plans[r0, r1]):
            if n == 0:  # the centre tap: every output pixel of the part
                torch.mul(_at(xw, ps, src), _at(kw, ps, tap), out=_at(out, ps, dst))
            else:
                _at(out, ps, dst).addcmul_(_at(xw, ps, src), _at(kw, ps, tap))

    grid.run(segment)
    return out.view(b, c, ho, wo).to(x.dtype)


def local_filter_backward(
    grad_out: Tensor,
    x: Tensor,
    kernels: Tensor,
    kernel_size: int,
    dilation: int,
    stride: int,
    need_x: bool,
    need_kernels: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """``(grad_x, grad_kernels)`` (``None`` where not needed) in the inputs' dtypes."""
    k, d, s = kernel_size, dilation, stride
    b, c, h, w = x.shape
    ho, wo = kernels.shape[2:]
    g, taps = kernels.shape[1] // (k * k), k * k
    cg, halo, cdt = c // g, d * (k // 2), compute_dtype(x.dtype)
    gw, kw = _planes(grad_out, g, cdt), _planes(kernels, g, cdt)
    xw = _planes(x, g, cdt) if need_kernels else None
    gx = gw.new_empty(b * g, cg, h, w) if need_x else None
    gk = new_output((b * g, taps, ho, wo), gw) if need_kernels else None
    grid = Grid(b * g, ho, cg * wo, _target(x), device=x.device)
    # A part of output rows [r0, r1) also owns the input rows [r0*s, r1*s) (to h for the
    # last), so parts write disjoint rows of both gradients.
    in_rows = {(r0, r1): (r0 * s, h if r1 == ho else r1 * s) for r0, r1 in grid.blocks}
    plans = {
        rows: list(_taps(k, d, s, (0, ho), in_rows[rows], (ho, wo), (h, w), cg))
        for rows in grid.blocks
    }
    pad_rows = (grid.max_rows - 1) * s + 2 * halo + 1
    capacity = grid.max_planes * cg * pad_rows * (w + 2 * halo)

    def kernels_grad(ps: slice, r0: int, r1: int) -> None:
        top, rows = r0 * s - halo, (r1 - r0 - 1) * s + 2 * halo + 1
        lo, hi = max(0, top), min(h, top + rows)
        xp = scratch("lf.xpad", (ps.stop - ps.start, cg, rows, w + 2 * halo), capacity, gw)
        xp.zero_()
        xp[:, :, lo - top : hi - top, halo : halo + w].copy_(xw[ps, :, lo:hi])  # type: ignore[index]
        dst = gk[ps, :, r0:r1].unflatten(1, (k, k))  # type: ignore[index]
        if cg == 0:
            dst.zero_()
        # All taps of one channel at once: (P, k, k, rows, Wo) (+)= windows * grad_out.
        wins = windows(xp, k, d, s, r1 - r0, wo).unbind(1)
        grads = gw[ps, :, None, None, r0:r1].unbind(1)
        for ch, (win, grad) in enumerate(zip(wins, grads, strict=True)):
            if ch == 0:
                torch.mul(win, grad, out=dst)
            else:
                dst.addcmul_(win, grad)

    def input_grad(ps: slice, r0: int, r1: int) -> None:
        y0, y1 = in_rows[r0, r1]
        if s > 1:  # the centre tap reaches every s-th input pixel only
            gx[ps, :, y0:y1].zero_()  # type: ignore[index]
        for n, (_, src, dst, tap) in enumerate(plans[r0, r1]):
            if n == 0 and s == 1:  # the centre tap: every input pixel of the part
                torch.mul(_at(gw, ps, src), _at(kw, ps, tap), out=_at(gx, ps, dst))  # type: ignore[arg-type]
            else:
                _at(gx, ps, dst).addcmul_(_at(gw, ps, src), _at(kw, ps, tap))  # type: ignore[arg-type]

    def segment(ps: slice, r0: int, r1: int) -> None:
        if gk is not None:
            kernels_grad(ps, r0, r1)
        if gx is not None:
            input_grad(ps, r0, r1)

    grid.run(segment)
    return (
        None if gx is None else gx.view(b, c, h, w).to(x.dtype),
        None if gk is None else gk.view(kernels.shape).to(kernels.dtype),
    )


class LocalFilterFunction(torch.autograd.Function):
    """``local_filter2d`` with the shift-and-accumulate forward and backward (no double backward)."""

    @staticmethod
    def forward(
        ctx, x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int
    ) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, kernels)
        ctx.geometry = (kernel_size, dilation, stride)
        return local_filter_forward(x, kernels, kernel_size, dilation, stride)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, kernels = ctx.saved_tensors
        grad_x, grad_kernels = local_filter_backward(
            grad_out, x, kernels, *ctx.geometry, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        )
        return grad_x, grad_kernels, None, None, None
