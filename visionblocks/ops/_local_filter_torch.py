"""The lean torch path of `visionblocks.ops.local.local_filter` (shift and accumulate).

The ``k*k``-times unfolded tensor is never built. ``x`` is zero-padded once (in the compute
dtype) and viewed as ``(B, G, Cg, H + 2r, W + 2r)``; every tap ``t = i*k + j`` then is one
strided slice of it, and the output accumulates tap by tap::

    out[b, g, :, h, w] += kernels[b, g, t, h, w] * xpad[b, g, :, h*s + i*d, w*s + j*d]

one ``addcmul_`` per tap, the kernel tap broadcast over the ``Cg`` channels of its group.
Backward runs the same loop transposed:

- ``grad_x``: ``grad_out * kernel tap`` is added into the tap's slice of a zero-padded
  gradient buffer (a scatter), whose centre is ``grad_x``;
- ``grad_kernels[tap] = sum over the group's channels of grad_out * x slice``: one ``mul``
  then ``Cg - 1`` ``addcmul_`` (faster than ``mul`` + ``sum`` or ``linalg.vecdot`` for every
  ``Cg`` measured, 1 to 16).

Work is split into tiles of about ``_TILE`` output elements (whole batch items and groups
when they fit, else blocks of rows), each running all its taps, so one tile's slices stay in
cache on large inputs. On the benchmark size (``local_filter_*``: 2 x 64 x 128 x 128, k = 7)
tiles of 256K to 1M elements and no tiling at all are within noise of each other; smaller
tiles lose to per-op overhead. On CUDA one tile covers everything.

Peak memory: forward holds the padded input and the output; backward the padded gradient
buffer, ``grad_kernels`` and one group-tile of cast copies. Half inputs are computed in
float32 (tiles of kernels and ``grad_out`` are cast as they are used) and cast back.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["LocalFilterFunction", "local_filter_backward", "local_filter_forward"]

_TILE = 1 << 20  # output elements per tile (see the module notes)
_Tile = tuple[slice, slice, int, int]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _tiles(
    batch: int, groups: int, plane: int, rows: int, row_size: int, target: int
) -> Iterator[_Tile]:
    """``(batch slice, group slice, row start, row stop)`` tiles of about ``target`` elements.

    ``plane`` is one (batch item, group)'s output elements, ``row_size`` one output row's.
    """
    if batch * groups * plane == 0:
        return
    if plane >= target:  # blocks of rows of one (batch item, group)
        n_rows, n_groups, n_batch = max(1, target // row_size), 1, 1
    else:
        n_rows = rows
        n_groups = min(groups, target // plane)
        n_batch = 1 if n_groups < groups else max(1, target // (groups * plane))
    for b0 in range(0, batch, n_batch):
        for g0 in range(0, groups, n_groups):
            for r0 in range(0, rows, n_rows):
                yield (
                    slice(b0, b0 + n_batch),
                    slice(g0, g0 + n_groups),
                    r0,
                    min(rows, r0 + n_rows),
                )


def _geometry(x: Tensor, kernels: Tensor, kernel_size: int) -> tuple[int, ...]:
    batch, channels, height, width = x.shape
    groups = kernels.shape[1] // (kernel_size * kernel_size)
    return batch, channels, height, width, groups, channels // groups, *kernels.shape[2:]


def _tile_target(x: Tensor) -> int:
    return 1 << 62 if x.is_cuda else _TILE


def _padded(x: Tensor, pad: int, dtype: torch.dtype) -> Tensor:
    batch, channels, height, width = x.shape
    xp = x.new_zeros(batch, channels, height + 2 * pad, width + 2 * pad, dtype=dtype)
    xp[:, :, pad : pad + height, pad : pad + width] = x
    return xp


def local_filter_forward(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int
) -> Tensor:
    """``out (B, C, Ho, Wo)`` in ``x.dtype``; inputs validated by the caller, same dtype."""
    b, c, h, w, g, cg, ho, wo = _geometry(x, kernels, kernel_size)
    cdt = compute_dtype(x.dtype)
    k, d, s = kernel_size, dilation, stride
    pad = d * (k // 2)
    xp = _padded(x, pad, cdt).view(b, g, cg, h + 2 * pad, w + 2 * pad)
    kv = kernels.unflatten(1, (g, k * k))
    out = x.new_zeros(b, g, cg, ho, wo, dtype=cdt)
    w_span = (wo - 1) * s + 1
    for bs, gs, r0, r1 in _tiles(b, g, cg * ho * wo, ho, cg * wo, _tile_target(x)):
        o = out[bs, gs, :, r0:r1]
        kt = kv[bs, gs, :, r0:r1].to(cdt)
        h_span = (r1 - r0 - 1) * s + 1
        for i in range(k):
            top = r0 * s + i * d
            x_rows = xp[bs, gs, :, top : top + h_span : s]
            for j in range(k):
                t = i * k + j
                o.addcmul_(x_rows[..., j * d : j * d + w_span : s], kt[:, :, t : t + 1])
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
    b, c, h, w, g, cg, ho, wo = _geometry(x, kernels, kernel_size)
    cdt = compute_dtype(x.dtype)
    k, d, s = kernel_size, dilation, stride
    pad = d * (k // 2)
    hp, wp = h + 2 * pad, w + 2 * pad
    kv = kernels.unflatten(1, (g, k * k))
    go = grad_out.unflatten(1, (g, cg))
    xp = _padded(x, pad, cdt).view(b, g, cg, hp, wp) if need_kernels else None
    gxp = x.new_zeros(b, g, cg, hp, wp, dtype=cdt) if need_x else None
    gk = kernels.new_empty(b, g, k * k, ho, wo, dtype=cdt) if need_kernels else None
    w_span = (wo - 1) * s + 1
    for bs, gs, r0, r1 in _tiles(b, g, cg * ho * wo, ho, cg * wo, _tile_target(x)):
        gt = go[bs, gs, :, r0:r1].to(cdt)
        kt = kv[bs, gs, :, r0:r1].to(cdt) if need_x else None
        h_span = (r1 - r0 - 1) * s + 1
        for i in range(k):
            top = r0 * s + i * d
            for j in range(k):
                t = i * k + j
                cols = slice(j * d, j * d + w_span, s)
                if gxp is not None and kt is not None:
                    gxp[bs, gs, :, top : top + h_span : s, cols].addcmul_(gt, kt[:, :, t : t + 1])
                if gk is not None and xp is not None:
                    xs = xp[bs, gs, :, top : top + h_span : s, cols]
                    acc = gk[bs, gs, t, r0:r1]
                    torch.mul(gt[:, :, 0], xs[:, :, 0], out=acc)
                    for ch in range(1, cg):
                        acc.addcmul_(gt[:, :, ch], xs[:, :, ch])
    grad_x = grad_kernels = None
    if gxp is not None:
        grad_x = gxp[..., pad : pad + h, pad : pad + w].reshape(b, c, h, w).to(x.dtype)
    if gk is not None:
        if cg == 0:  # no channel contributes: the loop above never ran for these taps
            gk.zero_()
        grad_kernels = gk.view(kernels.shape).to(kernels.dtype)
    return grad_x, grad_kernels


class LocalFilterFunction(torch.autograd.Function):
    """``local_filter`` with the shift-and-accumulate forward and backward (no double backward)."""

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
