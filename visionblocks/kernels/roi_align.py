"""Deterministic Triton backward of the RoI pooling family (`visionblocks.ops.roi_align`).

Called by the ops (after validation) as ``roi_pool_triton(op, input, rois, spatial_scale,
PH, PW, *options, forced=...)`` with ``op`` one of ``"roi_align"``, ``"ps_roi_align"``,
``"roi_pool"``, ``"ps_roi_pool"``: the forward is torchvision's kernel, the backward is
``_roi_pool_bwd_kernel``. ``input`` is float32 or float64, ``rois`` ``(K, 5)`` of its dtype.

torchvision's backward kernels scatter: a thread per output bin adds its gradient to the
input pixels its samples touch, with atomics, so the order of the additions (and the
rounding) changes from run to run. ``_roi_pool_bwd_kernel`` gathers instead: a program owns one
image, a tile of ``TY x TX`` pixels and a block of channels (and, position-sensitive, one
bin), and walks the boxes of its image in index order (stably sorted by batch index, the
segments found by ``searchsorted``: nothing read on the host), adding each bin's share to
its own accumulator, then stores every gradient element once. No atomics: the sums are
the same, in the same order, on every run.

A box's share on a tile, per bin ``(i, j)``:

- RoI Align: the bin's samples are a ``gh x gw`` grid and bilinear weights are products of
  a row weight and a column weight, so the weight of pixel ``(y, x)`` is
  ``ay[y] * ax[x] / count`` with ``ay[y] = sum over the sample rows of the weight of row y``
  (torchvision's clamps: a sample in ``[-1, 0]`` reads row 0, one in ``[H - 1, H]`` row
  ``H - 1``, one outside ``[-1, H]`` nothing). Only the samples within a pixel of the tile
  are visited (a range computed per bin, widened by one sample each side).
- RoI pool (max): the gradient goes to the pixel torchvision's forward recorded (argmax).
- PS RoI pool (average): ``1 / area`` on the bin's whole-pixel rectangle (clipped to the
  map, as torchvision's backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.dispatch import note_failure
from visionblocks._core.namespace import public_dir
from visionblocks.kernels._launch import KernelFailure, jit, launch, prepare

__all__ = ["roi_pool_triton"]
__dir__ = public_dir(__name__, __all__)

MODES: dict[str, int] = {"roi_align": 0, "ps_roi_align": 1, "roi_pool": 2, "ps_roi_pool": 3}
"""The kernel's ``MODE`` of each op."""


@triton.jit
def _round(v):
    """C's ``round``: halves away from zero (``v - floor(v)`` is exact)."""
    a = tl.abs(v)
    r = tl.floor(a)
    r = tl.where(a - r >= 0.5, r + 1.0, r)
    return tl.where(v < 0, -r, r)


@triton.jit
def _axis_weight(y, rows, H):
    """Bilinear weight of each of ``rows`` for a sample at coordinate ``y`` (torchvision's
    ``bilinear_interpolate_gradient`` along one axis)."""
    inside = (y >= -1.0) & (y <= H)
    yc = tl.maximum(y, 0.0)
    low = yc.to(tl.int32)
    edge = low >= H - 1
    low = tl.where(edge, H - 1, low)
    high = tl.where(edge, H - 1, low + 1)
    yc = tl.where(edge, low.to(yc.dtype), yc)
    ly = yc - low
    w = tl.where(rows == low, 1.0 - ly, 0.0) + tl.where(rows == high, ly, 0.0)
    return tl.where(inside, w, 0.0)


@triton.jit
def _axis_share(start, size, n_bins, grid, bin_idx, lo, hi, rows, H, CDT: tl.constexpr):
    """``sum over the bin's samples of _axis_weight`` for rows ``rows`` (tile rows
    ``[lo, hi]``); samples farther than one pixel from the tile are skipped."""
    bin_size = size / n_bins
    first = start + bin_idx * bin_size
    step = bin_size / grid
    s_lo = grid * 0
    s_hi = grid
    if step > 0:
        a = tl.minimum(tl.maximum((lo - 1.0 - first) / step - 1.5, 0.0), grid * 1.0)
        b = tl.minimum(tl.maximum((hi + 1.0 - first) / step + 1.5, 0.0), grid * 1.0)
        s_lo = a.to(tl.int32)
        s_hi = tl.minimum(b.to(tl.int32) + 1, grid)
    acc = tl.zeros(rows.shape, CDT)
    for s in range(s_lo, s_hi):
        y = first + (s + 0.5) * bin_size / grid
        acc += _axis_weight(y, rows, H)
    return acc


@triton.jit
def _pool_range(start, bin_size, idx, H):
    """``[begin, end)`` pixels of whole-pixel bin ``idx`` (torchvision's roi_pool bins)."""
    begin = tl.floor(idx * bin_size).to(tl.int32) + start
    end = tl.ceil((idx + 1) * bin_size).to(tl.int32) + start
    return tl.minimum(tl.maximum(begin, 0), H), tl.minimum(tl.maximum(end, 0), H)


@jit
def _roi_pool_bwd_kernel(
    grad_ptr, rois_ptr, order_ptr, seg_ptr, argmax_ptr, scale_ptr, out_ptr,
    C: tl.int32, CIN: tl.int32, H: tl.int32, W: tl.int32, PH: tl.int32, PW: tl.int32,
    N_TX: tl.int32, N_TILES: tl.int32, SR: tl.int32,
    MODE: tl.constexpr, ALIGNED: tl.constexpr, CDT: tl.constexpr,
    BLOCK_C: tl.constexpr, TY: tl.constexpr, TX: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = pid // N_TILES
    tile = pid % N_TILES
    y0 = (tile // N_TX) * TY
    x0 = (tile % N_TX) * TX
    offs_p = tl.arange(0, TY * TX)
    rows = y0 + offs_p // TX
    cols = x0 + offs_p % TX
    p_mask = (rows < H) & (cols < W)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = offs_c < C
    PS: tl.constexpr = MODE % 2 == 1
    bin_id = tl.program_id(2)
    i_lo = 0
    i_hi = PH
    j_lo = 0
    j_hi = PW
    if PS:
        i_lo = bin_id // PW
        i_hi = i_lo + 1
        j_lo = bin_id % PW
        j_hi = j_lo + 1
    scale = tl.load(scale_ptr).to(CDT)
    y_hi = y0 + TY - 1.0  # the tile's last row and column (possibly past the map)
    x_hi = x0 + TX - 1.0
    acc = tl.zeros((BLOCK_C, TY * TX), CDT)
    for n in range(tl.load(seg_ptr + b), tl.load(seg_ptr + b + 1)):
        k = tl.load(order_ptr + n).to(tl.int64)
        x1 = tl.load(rois_ptr + k * 5 + 1).to(CDT) * scale
        y1 = tl.load(rois_ptr + k * 5 + 2).to(CDT) * scale
        x2 = tl.load(rois_ptr + k * 5 + 3).to(CDT) * scale
        y2 = tl.load(rois_ptr + k * 5 + 4).to(CDT) * scale
        g_row = (k * C + offs_c) * (PH * PW)
        if MODE < 2:
            if ALIGNED:
                x1 -= 0.5
                y1 -= 0.5
                x2 -= 0.5
                y2 -= 0.5
            rw = x2 - x1
            rh = y2 - y1
            if not ALIGNED:  # roi_align's legacy mode: at least one pixel
                rw = tl.maximum(rw, 1.0)
                rh = tl.maximum(rh, 1.0)
            gh = SR
            gw = SR
            if SR <= 0:
                gh = tl.ceil(rh / PH).to(tl.int32)
                gw = tl.ceil(rw / PW).to(tl.int32)
            # samples lie in [y1, y1 + rh] (either order); skip boxes a pixel away from the tile
            near = (tl.minimum(y1, y1 + rh) <= y_hi + 1.0) & (tl.maximum(y1, y1 + rh) >= y0 - 1.0)
            near = near & (tl.minimum(x1, x1 + rw) <= x_hi + 1.0)
            near = near & (tl.maximum(x1, x1 + rw) >= x0 - 1.0)
            if near & (gh > 0) & (gw > 0):
                count = (gh * gw).to(CDT)
                for i in range(i_lo, i_hi):
                    ay = _axis_share(y1, rh, PH, gh, i, y0, y_hi, rows, H, CDT)
                    for j in range(j_lo, j_hi):
                        ax = _axis_share(x1, rw, PW, gw, j, x0, x_hi, cols, W, CDT)
                        g = tl.load(grad_ptr + g_row + i * PW + j, mask=c_mask, other=0.0)
                        acc += g.to(CDT)[:, None] * (ay * ax / count)[None, :]
        else:
            sx = _round(x1).to(tl.int32)
            sy = _round(y1).to(tl.int32)
            ex = _round(x2).to(tl.int32)
            ey = _round(y2).to(tl.int32)
            rw = tl.maximum(ex - sx, 1)
            rh = tl.maximum(ey - sy, 1)
            if MODE == 2:  # roi_pool counts the end pixel in
                rw = tl.maximum(ex - sx + 1, 1)
                rh = tl.maximum(ey - sy + 1, 1)
            bh = rh.to(CDT) / PH
            bw = rw.to(CDT) / PW
            for i in range(i_lo, i_hi):
                h0, h1 = _pool_range(sy, bh, i, H)
                if (h0 <= y0 + TY) & (h1 >= y0):
                    for j in range(j_lo, j_hi):
                        w0, w1 = _pool_range(sx, bw, j, W)
                        if (w0 <= x0 + TX) & (w1 >= x0):
                            g = tl.load(grad_ptr + g_row + i * PW + j, mask=c_mask, other=0.0)
                            g = g.to(CDT)
                            if MODE == 2:
                                am = tl.load(argmax_ptr + g_row + i * PW + j, mask=c_mask, other=-1)
                                hit = am[:, None] == (rows * W + cols)[None, :]
                                acc += tl.where(hit, g[:, None], 0.0)
                            elif (h1 > h0) & (w1 > w0):
                                area = ((h1 - h0) * (w1 - w0)).to(CDT)
                                inside = (rows >= h0) & (rows < h1) & (cols >= w0) & (cols < w1)
                                acc += tl.where(inside[None, :], (g / area)[:, None], 0.0)
    chan = offs_c
    if PS:
        chan = (offs_c * PH + i_lo) * PW + j_lo
    dst = out_ptr + ((b.to(tl.int64) * CIN + chan) * H)[:, None] * W + (rows * W + cols)[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=c_mask[:, None] & p_mask[None, :])


def plan(op: str, shape: tuple[int, int, int, int], output_size: tuple[int, int]) -> dict:
    """Grid and tile sizes of the backward for an ``input`` of ``shape`` ``(N, C, H, W)``.

    Tiles of ``8 x 16`` pixels and blocks of 16 channels of the gradient (the output
    channels for the position-sensitive ops, with one bin per program on grid axis 2), 8
    warps: 8 accumulator elements per thread, no spills on sm_75/80/90.

    Examples:
        >>> plan("roi_align", (2, 256, 50, 68), (7, 7))
        {'grid': (70, 16, 1), 'N_TX': 5, 'N_TILES': 35, 'BLOCK_C': 16, 'TY': 8, 'TX': 16}
    """
    n, c, h, w = shape
    ps = op.startswith("ps_")
    bins = output_size[0] * output_size[1]
    channels = c // bins if ps else c
    ty, tx = 8, 16
    n_tx, n_ty = triton.cdiv(w, tx), triton.cdiv(h, ty)
    block_c = 16
    grid = (n * n_tx * n_ty, triton.cdiv(channels, block_c), bins if ps else 1)
    return {
        "grid": grid,
        "N_TX": n_tx,
        "N_TILES": n_tx * n_ty,
        "BLOCK_C": block_c,
        "TY": ty,
        "TX": tx,
    }


def _backward(op: str, grad: Tensor, rois: Tensor, argmax: Tensor | None, shape, args) -> Tensor:
    """The input's gradient (``shape``) for ``grad`` of torchvision's output."""
    n, c, h, w = shape
    spatial_scale, ph, pw = args[:3]
    out = grad.new_empty(shape)
    if out.numel() == 0:
        return out
    if rois.shape[0] == 0:
        return out.zero_()
    batch = rois[:, 0].to(torch.int64)  # torchvision truncates the index too
    order = torch.argsort(batch, stable=True)
    seg = torch.searchsorted(batch[order], torch.arange(n + 1, device=grad.device))
    order = order.to(torch.int32)
    p = plan(op, shape, (ph, pw))
    mode = MODES[op]
    launch(
        op, _roi_pool_bwd_kernel, p["grid"], 8,
        grad_ptr=prepare(grad), rois_ptr=prepare(rois), order_ptr=order,
        seg_ptr=seg.to(torch.int32), argmax_ptr=argmax if argmax is not None else order,
        scale_ptr=torch.full((1,), spatial_scale, dtype=grad.dtype, device=grad.device),
        out_ptr=out, C=c // (ph * pw) if mode in (1, 3) else c, CIN=c, H=h, W=w, PH=ph, PW=pw,
        N_TX=p["N_TX"], N_TILES=p["N_TILES"], SR=args[3] if mode < 2 else 0, MODE=mode,
        ALIGNED=mode == 1 or (mode == 0 and bool(args[4])),
        CDT=tl.float64 if grad.dtype == torch.float64 else tl.float32,
        BLOCK_C=p["BLOCK_C"], TY=p["TY"], TX=p["TX"],
    )  # fmt: skip
    return out


def _forward(op: str, input: Tensor, rois: Tensor, args) -> tuple[Tensor, Tensor | None]:
    import torchvision.ops  # noqa: F401  (registers torch.ops.torchvision)

    out = getattr(torch.ops.torchvision, op)(input, rois, *args)
    return (out, None) if op == "roi_align" else (out[0], out[1] if op == "roi_pool" else None)


def _reference(op: str):
    """torchvision's public function (its own deterministic rule) for a failed backward."""
    import torchvision.ops

    fn = getattr(torchvision.ops, op)
    return lambda x, rois, scale, ph, pw, *rest: fn(x, rois, (ph, pw), scale, *rest)


class _RoIPoolTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: Tensor, rois: Tensor, op: str, forced: bool, *args) -> Tensor:  # type: ignore[override]
        out, argmax = _forward(op, input, rois, args)
        ctx.save_for_backward(rois, argmax)
        ctx.op, ctx.forced, ctx.args, ctx.shape = op, forced, args, tuple(input.shape)
        ctx.mark_non_differentiable(rois)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        rois, argmax = ctx.saved_tensors
        none = (None,) * (3 + len(ctx.args))
        if not ctx.needs_input_grad[0]:
            return (None, *none)
        try:
            return (_backward(ctx.op, grad, rois, argmax, ctx.shape, ctx.args), *none)
        except KernelFailure as exc:
            if ctx.forced:
                raise
            note_failure(ctx.op, grad.device, exc)
            x = grad.new_zeros(ctx.shape).requires_grad_(True)  # the op is linear in input
            with torch.enable_grad():
                out = _reference(ctx.op)(x, rois, *ctx.args)
            return (torch.autograd.grad(out, x, grad)[0], *none)


def roi_pool_triton(
    op: str, input: Tensor, rois: Tensor, *args: object, forced: bool = False
) -> Tensor:
    """torchvision's forward of ``op`` with the deterministic Triton backward; inputs
    already validated (``input`` float32 or float64, ``rois`` ``(K, 5)`` of its dtype).

    Reached through dispatch (``roi_align(..., impl="triton")``), not called directly.

    Args:
        op: ``"roi_align"``, ``"ps_roi_align"``, ``"roi_pool"`` or ``"ps_roi_pool"``.
        input (Tensor[N, C, H, W]): Feature maps.
        rois (Tensor[K, 5]): ``(batch index, x1, y1, x2, y2)`` rows.
        *args: torchvision's remaining arguments of ``op``: ``spatial_scale``,
            ``pooled_height``, ``pooled_width`` (then ``sampling_ratio``, ``aligned``).
        forced: Raise a backward kernel's failure (``impl="triton"``) instead of taking
            torchvision's gradients.

    Returns:
        Tensor: torchvision's output, differentiable with respect to ``input``.

    Raises:
        KernelFailure: If the backward kernel fails and ``forced``.

    Examples:
        >>> import torch
        >>> x = torch.randn(1, 4, 8, 8, device="cuda", requires_grad=True)  # doctest: +SKIP
        >>> rois = torch.tensor([[0.0, 1, 1, 6, 6]], device="cuda")  # doctest: +SKIP
        >>> roi_pool_triton("roi_align", x, rois, 1.0, 2, 2, -1, True).shape  # doctest: +SKIP
        torch.Size([1, 4, 2, 2])
    """
    return _RoIPoolTriton.apply(input, rois, op, forced, *args)
