"""Triton kernels for `visionblocks.ops.rotated_roi_align.rotated_roi_align`.

Called by the op (after validation) as ``rotated_roi_align_triton(input, frames,
output_size, grid, reference)``: ``input (N, C, H, W)``, ``frames (K, 12)`` the per-RoI
table of `visionblocks.ops.rotated_roi_align._frames` (batch, shifted centre, cos, sin,
start corner, bin sizes, sample points per bin side ``gw``/``gh``, their count) in the
compute dtype (float32, or float64 for float64 inputs); ``grid`` serves the formula only.
The result ``(K, C, ph, pw)`` is in ``input``'s dtype, differentiable with respect to
``input``. The sample points and the bilinear rules are the formula's
(`visionblocks.ops.rotated_roi_align._rotated_roi_align`), which the tests compare them
with; the launcher adds the steps between points and the reciprocals of the counts to the
table (`_table`), so no kernel divides (the points differ from the formula's by rounding
only). The per-RoI sample counts are read on the device (loop bounds), never on the host.

- ``_rroi_fwd_kernel``: a program owns one RoI, a block of bins and a block of channels
  and loops over the RoI's ``gh x gw`` points, gathering four taps per point and bin.
- ``_rroi_bwd_kernel``: no atomics. A program owns one image, a ``TILE x TILE`` block of
  its pixels and a block of channels, and gathers: for every RoI of that image whose
  sampled rectangle comes within reach of the tile, it maps the tile (grown by the pixel a
  bilinear tap reaches) into the RoI's frame, runs over the sample points of that window
  (one point per step, its weight on every pixel of the tile) and adds
  ``grad_out / count`` times that weight. Each pixel's sum runs over RoIs, then points, in
  a fixed order: the gradient is bitwise reproducible. The work per tile grows with the
  RoIs of its image (each is tested against the tile) and with the points in reach.
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
    jit,
    launch,
    prepare,
    reference_grads,
    with_fallback,
)

__all__ = ["rotated_roi_align_triton"]
__dir__ = public_dir(__name__, __all__)

_TILE = 8
_NUM_WARPS = 4


@triton.jit
def _frame(t_ptr, k, CDT: tl.constexpr):
    """RoI ``k``'s (int64) row of the kernels' table (`_table`): its image, centre, cos,
    sin and start corner (the rest is read where it is used)."""
    row = t_ptr + k * 16
    batch = tl.load(row).to(tl.int32)
    cx = tl.load(row + 1).to(CDT)
    cy = tl.load(row + 2).to(CDT)
    cos = tl.load(row + 3).to(CDT)
    sin = tl.load(row + 4).to(CDT)
    return batch, cx, cy, cos, sin, tl.load(row + 5).to(CDT), tl.load(row + 6).to(CDT)


@triton.jit
def _col(t_ptr, k, column: tl.constexpr, CDT: tl.constexpr):
    """Column ``column`` of RoI ``k``'s row: 7, 8 bin sizes, 9, 10 points per bin side,
    11 ``1 / count``, 12, 13 steps between points, 14, 15 their reciprocals."""
    return tl.load(t_ptr + k * 16 + column).to(CDT)


@triton.jit
def _axis(p, size):
    """A coordinate's low and high taps, the high tap's weight and whether it is inside
    ``[-1, size]``: clamped to ``[0, size - 1]`` first (the references' rules)."""
    inside = (p >= -1.0) & (p <= size)
    pc = tl.minimum(tl.maximum(tl.where(inside, p, 0.0), 0.0), size - 1.0)
    low = pc.to(tl.int32)
    frac = pc - low
    high = tl.minimum(low + 1, size - 1)
    return low, high, frac, inside


@jit
def _rroi_fwd_kernel(
    x_ptr, t_ptr, o_ptr,
    N: tl.int32, C: tl.int32, H: tl.int32, W: tl.int32, PH: tl.int32, PW: tl.int32,
    N_CB: tl.int32, N_BB: tl.int32,
    CDT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # (RoI, bin block, channel block)
    k = (pid // (N_CB * N_BB)).to(tl.int64)
    pid = pid % (N_CB * N_BB)
    offs_c = (pid % N_CB) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_b = (pid // N_CB) * BLOCK_B + tl.arange(0, BLOCK_B)
    c_mask = offs_c < C
    b_mask = offs_b < PH * PW
    batch, cx, cy, cos, sin, start_w, start_h = _frame(t_ptr, k, CDT)
    bin_w, bin_h = _col(t_ptr, k, 7, CDT), _col(t_ptr, k, 8, CDT)
    step_w, step_h = _col(t_ptr, k, 12, CDT), _col(t_ptr, k, 13, CDT)
    b_mask = b_mask & (batch >= 0) & (batch < N)
    row = (offs_b // PW).to(CDT)
    col = (offs_b % PW).to(CDT)
    plane = (batch.to(tl.int64) * C + offs_c) * H * W
    acc = tl.zeros((BLOCK_C, BLOCK_B), CDT)
    for iy in range(0, _col(t_ptr, k, 10, tl.int32)):
        yy = start_h + row * bin_h + (iy + 0.5) * step_h
        for ix in range(0, _col(t_ptr, k, 9, tl.int32)):
            xx = start_w + col * bin_w + (ix + 0.5) * step_w
            y0, y1, ly, in_y = _axis(yy * cos - xx * sin + cy, H)
            x0, x1, lx, in_x = _axis(yy * sin + xx * cos + cx, W)
            hy = 1.0 - ly
            hx = 1.0 - lx
            keep = b_mask & in_y & in_x
            mask = c_mask[:, None] & keep[None, :]
            src = x_ptr + plane[:, None]
            v1 = tl.load(src + (y0 * W + x0)[None, :], mask=mask, other=0.0).to(CDT)
            v2 = tl.load(src + (y0 * W + x1)[None, :], mask=mask, other=0.0).to(CDT)
            v3 = tl.load(src + (y1 * W + x0)[None, :], mask=mask, other=0.0).to(CDT)
            v4 = tl.load(src + (y1 * W + x1)[None, :], mask=mask, other=0.0).to(CDT)
            val = (hy * hx)[None, :] * v1 + (hy * lx)[None, :] * v2
            val += (ly * hx)[None, :] * v3 + (ly * lx)[None, :] * v4
            acc += tl.where(keep[None, :], val, 0.0)
    out = acc * _col(t_ptr, k, 11, CDT)
    dst = o_ptr + (k * C + offs_c[:, None]) * (PH * PW) + offs_b[None, :]
    tl.store(dst, out.to(o_ptr.dtype.element_ty), mask=c_mask[:, None] & b_mask[None, :])


@triton.jit
def _window(lo, hi, start, inv_step, points):
    """The sample indices ``j`` (``start + (j + 0.5) * step`` in ``[lo, hi]``), widened by
    one on each side against rounding and clipped to ``[0, points - 1]``; all of them when
    ``inv_step`` is 0 (a RoI of zero side: every point at ``start``)."""
    first = tl.floor(tl.maximum((lo - start) * inv_step - 0.5, -2.0)) - 1.0
    last = tl.ceil(tl.minimum((hi - start) * inv_step - 0.5, points + 1.0)) + 1.0
    first = tl.where(inv_step > 0, tl.maximum(first, 0.0), 0.0)
    last = tl.where(inv_step > 0, tl.minimum(last, points - 1.0), points - 1.0)
    return first.to(tl.int32), last.to(tl.int32)


@jit
def _rroi_bwd_kernel(
    go_ptr, t_ptr, gi_ptr,
    K: tl.int32, C: tl.int32, H: tl.int32, W: tl.int32, PH: tl.int32, PW: tl.int32,
    N_TH: tl.int32, N_TW: tl.int32, N_CB: tl.int32,
    CDT: tl.constexpr, BLOCK_C: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # (image, tile row, tile column, channel block)
    offs_c = (pid % N_CB) * BLOCK_C + tl.arange(0, BLOCK_C)
    pid = pid // N_CB
    n = pid // (N_TH * N_TW)
    th = (pid // N_TW) % N_TH
    tw = pid % N_TW
    c_mask = offs_c < C
    offs_p = tl.arange(0, TILE * TILE)
    h = th * TILE + offs_p // TILE
    w = tw * TILE + offs_p % TILE
    p_mask = (h < H) & (w < W)
    # Points whose taps reach the tile lie in [top, bottom] x [left, right] (unclamped: the
    # band [-1, 0) reads row 0, (H - 1, H] row H - 1); half a pixel more against rounding.
    top = (th * TILE - 1.5).to(CDT)
    bottom = (tl.minimum(th * TILE + TILE, H) + 0.5).to(CDT)
    left = (tw * TILE - 1.5).to(CDT)
    right = (tl.minimum(tw * TILE + TILE, W) + 0.5).to(CDT)
    acc = tl.zeros((BLOCK_C, TILE * TILE), CDT)
    for k32 in range(0, K):
        k = tl.full((), 0, tl.int64) + k32
        batch, cx, cy, cos, sin, start_w, start_h = _frame(t_ptr, k, CDT)
        gw, gh = _col(t_ptr, k, 9, tl.int32), _col(t_ptr, k, 10, tl.int32)
        reach_y = tl.abs(start_h * cos) + tl.abs(start_w * sin)
        reach_x = tl.abs(start_h * sin) + tl.abs(start_w * cos)
        near = (cy + reach_y >= top) & (cy - reach_y <= bottom)
        near = near & (cx + reach_x >= left) & (cx - reach_x <= right)
        if (batch == n) & near & (gh > 0) & (gw > 0):
            # The tile's box in the RoI's frame: yy = cos dy + sin dx, xx = cos dx - sin dy.
            dy0 = top - cy
            dy1 = bottom - cy
            dx0 = left - cx
            dx1 = right - cx
            yy_lo = tl.minimum(cos * dy0, cos * dy1) + tl.minimum(sin * dx0, sin * dx1)
            yy_hi = tl.maximum(cos * dy0, cos * dy1) + tl.maximum(sin * dx0, sin * dx1)
            xx_lo = tl.minimum(cos * dx0, cos * dx1) - tl.maximum(sin * dy0, sin * dy1)
            xx_hi = tl.maximum(cos * dx0, cos * dx1) - tl.minimum(sin * dy0, sin * dy1)
            jy0, jy1 = _window(yy_lo, yy_hi, start_h, _col(t_ptr, k, 15, CDT), PH * gh)
            jx0, jx1 = _window(xx_lo, xx_hi, start_w, _col(t_ptr, k, 14, CDT), PW * gw)
            bin_w, bin_h = _col(t_ptr, k, 7, CDT), _col(t_ptr, k, 8, CDT)
            step_w, step_h = _col(t_ptr, k, 12, CDT), _col(t_ptr, k, 13, CDT)
            inv_count = _col(t_ptr, k, 11, CDT)
            g_row = go_ptr + (k * C + offs_c) * (PH * PW)
            for jy in range(jy0, jy1 + 1):
                row = jy // gh
                iy = jy - row * gh
                yy = start_h + row * bin_h + (iy + 0.5) * step_h
                for jx in range(jx0, jx1 + 1):
                    col = jx // gw
                    ix = jx - col * gw
                    xx = start_w + col * bin_w + (ix + 0.5) * step_w
                    y0, y1, ly, in_y = _axis(yy * cos - xx * sin + cy, H)
                    x0, x1, lx, in_x = _axis(yy * sin + xx * cos + cx, W)
                    wy = tl.where(h == y0, 1.0 - ly, 0.0) + tl.where(h == y1, ly, 0.0)
                    wx = tl.where(w == x0, 1.0 - lx, 0.0) + tl.where(w == x1, lx, 0.0)
                    weight = tl.where(in_y & in_x, wy * wx, 0.0)
                    g = tl.load(g_row + row * PW + col, mask=c_mask, other=0.0).to(CDT)
                    acc += (g * inv_count)[:, None] * weight[None, :]
    dst = gi_ptr + (n.to(tl.int64) * C + offs_c[:, None]) * (H * W) + (h * W + w)[None, :]
    tl.store(dst, acc.to(gi_ptr.dtype.element_ty), mask=c_mask[:, None] & p_mask[None, :])


def _table(frames: Tensor) -> Tensor:
    """The kernels' ``(K, 16)`` table: the op's columns 0 to 10 (batch to ``gh``), then
    ``1 / count``, the steps between points ``bin / g`` and their reciprocals (0 for no
    points or a zero side), so that no kernel divides."""
    bins, grid = frames[:, 7:9], frames[:, 9:11]
    step = torch.where(grid > 0, bins / grid.clamp(min=1), 0)
    inverse = torch.where(bins > 0, grid / torch.where(bins > 0, bins, 1), 0)
    return torch.cat([frames[:, :11], 1 / frames[:, 11:12], step, inverse], 1).contiguous()


def _cdt(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def plan(channels: int, bins: int, float64: bool = False) -> dict[str, int]:
    """Channel and bin blocks: ``BLOCK_C`` 16 or 32 channels (16 in float64), ``BLOCK_B`` up
    to 64 bins (32 in float64); the backward's tiles are ``8 x 8`` pixels by ``BLOCK_C``
    channels. Registers stay bounded (no spills) at any size.

    Examples:
        >>> plan(256, 49)
        {'BLOCK_C': 32, 'BLOCK_B': 64, 'N_CB': 8, 'N_BB': 1}
        >>> plan(256, 49, float64=True)
        {'BLOCK_C': 16, 'BLOCK_B': 32, 'N_CB': 16, 'N_BB': 2}
    """
    block_c = 16 if channels <= 16 or float64 else 32
    block_b = min(max(triton.next_power_of_2(bins), 16), 32 if float64 else 64)
    return {
        "BLOCK_C": block_c,
        "BLOCK_B": block_b,
        "N_CB": triton.cdiv(channels, block_c),
        "N_BB": triton.cdiv(bins, block_b),
    }


class _RotatedRoIAlignTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, input: Tensor, frames: Tensor, output_size: tuple[int, int], grid: tuple[int, int],
        reference,
    ) -> Tensor:  # type: ignore[override]  # fmt: skip
        x, table = prepare(input), _table(frames)
        n, c, height, width = x.shape
        ph, pw = output_size
        out = x.new_empty(frames.shape[0], c, ph, pw)
        p = plan(c, ph * pw, frames.dtype == torch.float64)
        if out.numel():
            grid_size = frames.shape[0] * p["N_CB"] * p["N_BB"]
            launch(
                "rotated_roi_align", _rroi_fwd_kernel, (grid_size,), _NUM_WARPS, x_ptr=x,
                t_ptr=table, o_ptr=out, N=n, C=c, H=height, W=width, PH=ph, PW=pw,
                N_CB=p["N_CB"], N_BB=p["N_BB"], CDT=_cdt(frames.dtype), BLOCK_C=p["BLOCK_C"],
                BLOCK_B=p["BLOCK_B"],
            )  # fmt: skip
        ctx.save_for_backward(frames, table)
        ctx.shape, ctx.dtype, ctx.input = x.shape, x.dtype, input.detach()
        ctx.geometry, ctx.reference = (output_size, grid), reference
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        frames, table = ctx.saved_tensors
        n, c, height, width = ctx.shape
        ph, pw = ctx.geometry[0]
        grad = grad_out.new_empty(ctx.shape, dtype=ctx.dtype)
        try:
            if grad.numel():
                p = plan(c, ph * pw, frames.dtype == torch.float64)
                n_th, n_tw = triton.cdiv(height, _TILE), triton.cdiv(width, _TILE)
                programs = (n * n_th * n_tw * p["N_CB"],)
                launch(
                    "rotated_roi_align", _rroi_bwd_kernel, programs, _NUM_WARPS,
                    go_ptr=prepare(grad_out), t_ptr=table, gi_ptr=grad, K=frames.shape[0],
                    C=c, H=height, W=width, PH=ph, PW=pw, N_TH=n_th, N_TW=n_tw, N_CB=p["N_CB"],
                    CDT=_cdt(frames.dtype), BLOCK_C=p["BLOCK_C"], TILE=_TILE,
                )  # fmt: skip
        except KernelFailure as exc:
            grads = reference_grads(
                "rotated_roi_align", exc, ctx.reference, (ctx.input, frames, *ctx.geometry),
                (True, False, False, False), (grad_out,),
            )  # fmt: skip
            return (*grads, None)
        return grad, None, None, None, None


@with_fallback("rotated_roi_align")
def rotated_roi_align_triton(
    input: Tensor,
    frames: Tensor,
    output_size: tuple[int, int],
    grid: tuple[int, int],
    reference: Callable[..., Tensor] | None = None,
) -> Tensor:
    """Fused `visionblocks.ops.rotated_roi_align.rotated_roi_align`; inputs already validated.

    Reached through dispatch (``rotated_roi_align(..., impl="triton")``), not called directly.

    Args:
        input (Tensor[N, C, H, W]): Feature maps, float16, bfloat16, float32 or float64.
        frames (Tensor[K, 12]): The op's per-RoI table, in the compute dtype.
        output_size: ``(ph, pw)``.
        grid: The formula's sample points per bin side (unused by the kernels).
        reference: The torch formula with the same first four arguments; used for the
            gradients if the backward kernel fails (None: raise instead).

    Returns:
        Tensor[K, C, ph, pw]: In ``input``'s dtype, differentiable with respect to ``input``.

    Raises:
        KernelFailure: If a kernel fails to compile, load or launch.

    Examples:
        >>> import torch
        >>> from visionblocks.ops import rotated_roi_align
        >>> x = torch.randn(1, 8, 16, 16, device="cuda")  # doctest: +SKIP
        >>> rois = torch.tensor([[0, 8.0, 8.0, 6.0, 4.0, 30.0]], device="cuda")  # doctest: +SKIP
        >>> rotated_roi_align(x, rois, 7, impl="triton").shape  # doctest: +SKIP
        torch.Size([1, 8, 7, 7])
    """
    return _RotatedRoIAlignTriton.apply(input, frames, output_size, grid, reference)
