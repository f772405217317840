"""Fused Triton kernels for `visionblocks.ops.ms_deform_attn.ms_deform_attn`.

Called by ``ms_deform_attn`` (after validation) as ``ms_deform_attn_triton(value,
spatial_shapes, sampling_locations, attention_weights, reference=...)`` with mmcv's layouts:
``value (B, keys, heads, C)`` (levels stacked in order), ``spatial_shapes (levels, 2)``
int64 ``(H, W)`` on the tensors' device, ``sampling_locations (B, Q, heads, levels,
points, 2)`` as ``(x, y)`` in ``[0, 1]`` and ``attention_weights (B, Q, heads, levels,
points)``; the result is ``(B, Q, heads * C)``. Sampling is ``grid_sample``'s bilinear with
``align_corners=False`` and zero padding: pixel ``x * W - 0.5``, corners outside the level
count 0. Levels are found on the device (``spatial_shapes`` is read by the kernels, level
starts are running sums of ``H * W``), so nothing is read on the host. Every load is cast
to float32 (float64 for float64) right away; results are stored in the inputs' dtype.

Nothing of size ``queries x heads x levels x points x C`` is ever formed:

- ``_msda_fwd_kernel``: a program owns a (batch item, head), a block of queries and a block of
  channels, loops over levels and points and accumulates ``weight * bilinear(value)``.
  Memory: the output only.
- ``_msda_sample_kernel``: per sample (query, head, level, point), recomputes the four
  corners and reduces over the channels: ``grad_attention_weights = grad_out . sampled``
  and ``grad_sampling_locations = weight * grad_out . d sampled / d(x, y) * (W, H)``
  (``grad_sampling_locations`` is ``grid_sample``'s: at an integer pixel the corners are
  the floor's). It also writes each sample's *bucket*: the value pixel of its top-left
  corner clamped into the level, ``(b, head, key)``, flattened (samples with no corner
  inside get a bucket past the end).
- ``grad_value`` is a gather, not a scatter: ``torch.sort(buckets, stable=True)`` groups the
  samples by bucket (ties in sample order) and ``torch.searchsorted`` gives each bucket's
  range. Value pixel ``(y, x)`` is a corner only of samples in buckets ``(y - 1 .. y,
  x - 1 .. x)``: two runs of consecutive buckets, so two contiguous ranges of the sorted
  samples. ``_msda_value_kernel`` (a program per (batch item, head), block of keys and block
  of channels) walks them in that fixed order, recomputes each sample's corner weight for
  its own pixel (0 if it is not a corner: clamping puts samples left of or above the
  level in the border buckets) and sums ``weight * bilinear weight * grad_out`` in
  registers. No atomics: ``grad_value`` is bitwise reproducible.

Backward memory beyond the gradients, for ``S = B Q heads levels points`` samples (the
size of ``attention_weights``) and ``M = B keys heads`` value pixels: buckets and their
sorted copy (int32, ``4 S`` bytes each), the permutation (int64, ``8 S``), the sort's
workspace and the ranges (int32, ``4 (M + 1)``, and an ``arange`` as large while they are
computed): no term carries ``C``. Offsets are int32: a call with ``2**31`` elements or more
in ``value``, the output or the locations runs the formula (`LaunchLimitError`).
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
    LaunchLimitError,
    jit,
    launch,
    prepare,
    reference_grads,
    with_fallback,
)

__all__ = ["ms_deform_attn_triton"]
__dir__ = public_dir(__name__, __all__)

_OP = "ms_deform_attn"
_NUM_WARPS = 8
_INT32_MAX = 2**31 - 1


@triton.jit
def _level(shapes_ptr, level):
    """``(H, W)`` of ``level`` (int32), read from ``spatial_shapes`` on the device."""
    height = tl.load(shapes_ptr + 2 * level).to(tl.int32)
    width = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
    return height, width


@triton.jit
def _pixel(loc_ptr, n, mask, height, width, CDT: tl.constexpr):
    """Pixel coordinates ``(px, py)`` of samples ``n`` and whether a corner can be inside
    (``-1 <= p < size``, as ``grid_sample``); outside samples get ``(0, 0)``."""
    px = tl.load(loc_ptr + 2 * n, mask=mask, other=0.0).to(CDT) * width - 0.5
    py = tl.load(loc_ptr + 2 * n + 1, mask=mask, other=0.0).to(CDT) * height - 0.5
    inside = mask & (px >= -1) & (px < width) & (py >= -1) & (py < height)
    return tl.where(inside, px, 0.0), tl.where(inside, py, 0.0), inside


@triton.jit
def _corner(value_ptr, start, x, y, ok, height, width, KEYS, STRIDE, offs_c, c_mask,
            CDT: tl.constexpr):  # fmt: skip
    """``(BLOCK_Q, BLOCK_C)`` values of pixel ``(x, y)`` of the level at key ``start``, 0
    outside the level (zero padding) or past ``KEYS``; ``value_ptr`` points at the head."""
    key = start + y * width + x
    valid = ok & (x >= 0) & (x < width) & (y >= 0) & (y < height) & (key < KEYS)
    ptrs = value_ptr + (key * STRIDE)[:, None] + offs_c[None, :]
    return tl.load(ptrs, mask=valid[:, None] & c_mask[None, :], other=0.0).to(CDT)


@triton.jit
def _program(Q, HEADS, N_QB, N_CB, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr):
    """Batch item, head, queries and channels of this program, decoded from a 1-D grid."""
    pid = tl.program_id(0)
    cb = pid % N_CB
    rest = pid // N_CB
    head = rest % HEADS
    rest = rest // HEADS
    b = rest // N_QB
    offs_q = (rest % N_QB) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    return b, head, offs_q, offs_q < Q, offs_c


@triton.jit
def _floor(p):
    """``(floor(p) as int32, p - floor(p))``."""
    p0 = tl.floor(p)
    return p0.to(tl.int32), p - p0


@jit
def _msda_fwd_kernel(
    value_ptr, shapes_ptr, loc_ptr, attn_ptr, out_ptr,
    Q: tl.int32, KEYS: tl.int32, HEADS: tl.int32, C: tl.int32, L: tl.int32, P: tl.int32,
    N_QB: tl.int32, N_CB: tl.int32,
    CDT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b, head, offs_q, q_mask, offs_c = _program(Q, HEADS, N_QB, N_CB, BLOCK_Q, BLOCK_C)
    c_mask = offs_c < C
    row = (b * Q + offs_q) * HEADS + head  # flat (b, q, head)
    value_ptr += (b * KEYS * HEADS + head) * C
    acc = tl.zeros((BLOCK_Q, BLOCK_C), CDT)
    start = tl.full((), 0, tl.int32)
    for level in range(0, L):
        height, width = _level(shapes_ptr, level)
        for point in range(0, P):
            n = row * (L * P) + level * P + point
            px, py, inside = _pixel(loc_ptr, n, q_mask, height, width, CDT)
            x0, fx = _floor(px)
            y0, fy = _floor(py)
            a = tl.load(attn_ptr + n, mask=q_mask, other=0.0).to(CDT)
            a_top = a * (1.0 - fy)
            a_bottom = a * fy
            # One corner at a time: four (BLOCK_Q, BLOCK_C) loads, one live.
            acc += (a_top * (1.0 - fx))[:, None] * _corner(
                value_ptr, start, x0, y0, inside, height, width, KEYS, HEADS * C, offs_c,
                c_mask, CDT)  # fmt: skip
            acc += (a_top * fx)[:, None] * _corner(
                value_ptr, start, x0 + 1, y0, inside, height, width, KEYS, HEADS * C, offs_c,
                c_mask, CDT)  # fmt: skip
            acc += (a_bottom * (1.0 - fx))[:, None] * _corner(
                value_ptr, start, x0, y0 + 1, inside, height, width, KEYS, HEADS * C, offs_c,
                c_mask, CDT)  # fmt: skip
            acc += (a_bottom * fx)[:, None] * _corner(
                value_ptr, start, x0 + 1, y0 + 1, inside, height, width, KEYS, HEADS * C,
                offs_c, c_mask, CDT)  # fmt: skip
        start += height * width
    dst = out_ptr + (row * C)[:, None] + offs_c[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])


@triton.jit
def _dot_corner(go, value_ptr, start, x, y, ok, height, width, KEYS, STRIDE, offs_c, c_mask,
                CDT: tl.constexpr):  # fmt: skip
    """Per query, ``grad_out . value`` at pixel ``(x, y)`` over the block of channels."""
    v = _corner(value_ptr, start, x, y, ok, height, width, KEYS, STRIDE, offs_c, c_mask, CDT)
    return tl.sum(go * v, 1)


@jit
def _msda_sample_kernel(
    value_ptr, shapes_ptr, loc_ptr, attn_ptr, go_ptr, grad_loc_ptr, grad_attn_ptr, bucket_ptr,
    Q: tl.int32, KEYS: tl.int32, HEADS: tl.int32, C: tl.int32, L: tl.int32, P: tl.int32,
    N_QB: tl.int32,
    GRADS: tl.constexpr, BUCKETS: tl.constexpr, CDT: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    b, head, offs_q, q_mask, _ = _program(Q, HEADS, N_QB, 1, BLOCK_Q, BLOCK_C)
    row = (b * Q + offs_q) * HEADS + head
    value_ptr += (b * KEYS * HEADS + head) * C
    group = (b * HEADS + head) * KEYS  # first bucket of this (b, head)
    start = tl.full((), 0, tl.int32)
    for level in range(0, L):
        height, width = _level(shapes_ptr, level)
        for point in range(0, P):
            n = row * (L * P) + level * P + point
            px, py, inside = _pixel(loc_ptr, n, q_mask, height, width, CDT)
            x0, fx = _floor(px)
            y0, fy = _floor(py)
            if GRADS:
                # Per corner the channel sum r = grad_out . value, then
                # d/d weight = sum_corners w r, d/d fx and d/d fy of the bilinear form.
                g_attn = tl.zeros((BLOCK_Q,), CDT)
                g_x = tl.zeros((BLOCK_Q,), CDT)
                g_y = tl.zeros((BLOCK_Q,), CDT)
                for c0 in range(0, C, BLOCK_C):
                    offs_c = c0 + tl.arange(0, BLOCK_C)
                    c_mask = offs_c < C
                    mask = q_mask[:, None] & c_mask[None, :]
                    go = tl.load(go_ptr + (row * C)[:, None] + offs_c[None, :], mask=mask,
                                 other=0.0).to(CDT)  # fmt: skip
                    r00 = _dot_corner(go, value_ptr, start, x0, y0, inside, height, width, KEYS,
                                      HEADS * C, offs_c, c_mask, CDT)  # fmt: skip
                    r01 = _dot_corner(go, value_ptr, start, x0 + 1, y0, inside, height, width,
                                      KEYS, HEADS * C, offs_c, c_mask, CDT)  # fmt: skip
                    r10 = _dot_corner(go, value_ptr, start, x0, y0 + 1, inside, height, width,
                                      KEYS, HEADS * C, offs_c, c_mask, CDT)  # fmt: skip
                    r11 = _dot_corner(go, value_ptr, start, x0 + 1, y0 + 1, inside, height,
                                      width, KEYS, HEADS * C, offs_c, c_mask, CDT)  # fmt: skip
                    top = r00 + fx * (r01 - r00)
                    bottom = r10 + fx * (r11 - r10)
                    g_attn += top + fy * (bottom - top)
                    g_x += (r01 - r00) + fy * ((r11 - r10) - (r01 - r00))
                    g_y += bottom - top
                a = tl.load(attn_ptr + n, mask=q_mask, other=0.0).to(CDT)
                g_x = a * g_x * width
                g_y = a * g_y * height
                tl.store(grad_attn_ptr + n, g_attn.to(grad_attn_ptr.dtype.element_ty), mask=q_mask)
                tl.store(grad_loc_ptr + 2 * n, g_x.to(grad_loc_ptr.dtype.element_ty), mask=q_mask)
                tl.store(
                    grad_loc_ptr + 2 * n + 1, g_y.to(grad_loc_ptr.dtype.element_ty), mask=q_mask
                )
            if BUCKETS:
                # The top-left corner clamped into the level: every sample with a corner
                # inside lands in a bucket that the pixels it touches visit.
                ax = tl.minimum(tl.maximum(x0, 0), width - 1)
                ay = tl.minimum(tl.maximum(y0, 0), height - 1)
                key = start + ay * width + ax
                bucket = tl.where(inside & (key < KEYS), group + key, 2147483647)  # none: last
                tl.store(bucket_ptr + n, bucket, mask=q_mask)
        start += height * width


@triton.jit
def _weight_1d(p, k):
    """Bilinear weight of integer pixel ``k`` for coordinate ``p``, 0 unless it is a corner
    (the forward's ``1 - f`` and ``f``, computed the same way)."""
    k0, f = _floor(p)
    return tl.where(k == k0, 1.0 - f, tl.where(k == k0 + 1, f, 0.0))


@jit
def _msda_value_kernel(
    loc_ptr, attn_ptr, go_ptr, shapes_ptr, perm_ptr, ranges_ptr, grad_value_ptr,
    KEYS: tl.int32, HEADS: tl.int32, C: tl.int32, L: tl.int32, P: tl.int32, N_KB: tl.int32,
    N_CB: tl.int32,
    CDT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b, head, offs_k, k_mask, offs_c = _program(KEYS, HEADS, N_KB, N_CB, BLOCK_K, BLOCK_C)
    c_mask = offs_c < C
    # The level of each key: a scan over the levels' running starts.
    lvl_start = tl.zeros((BLOCK_K,), tl.int32)
    lvl_w = tl.full((BLOCK_K,), 1, tl.int32)
    lvl_h = tl.zeros((BLOCK_K,), tl.int32)
    found = tl.zeros((BLOCK_K,), tl.int1)
    start = tl.full((), 0, tl.int32)
    for level in range(0, L):
        height, width = _level(shapes_ptr, level)
        here = (offs_k >= start) & (offs_k - start < height * width)
        lvl_start = tl.where(here, start, lvl_start)
        lvl_w = tl.where(here, width, lvl_w)
        lvl_h = tl.where(here, height, lvl_h)
        found = found | here
        start += height * width
    k_mask = k_mask & found
    local = offs_k - lvl_start
    ky = local // lvl_w
    kx = local % lvl_w
    group = (b * HEADS + head) * KEYS + lvl_start
    acc = tl.zeros((BLOCK_K, BLOCK_C), CDT)
    # Buckets (ky - 1, kx - 1 .. kx), then (ky, kx - 1 .. kx): two contiguous ranges.
    for dy in range(0, 2):
        ay = ky - 1 + dy
        ok = k_mask & (ay >= 0)
        lo = tl.load(ranges_ptr + group + ay * lvl_w + tl.maximum(kx - 1, 0), mask=ok, other=0)
        count = tl.load(ranges_ptr + group + ay * lvl_w + kx + 1, mask=ok, other=0) - lo
        for j in range(0, tl.max(count, 0)):
            e_mask = j < count
            n = tl.load(perm_ptr + lo + j, mask=e_mask, other=0).to(tl.int32)
            a = tl.load(attn_ptr + n, mask=e_mask, other=0.0).to(CDT)
            px = tl.load(loc_ptr + 2 * n, mask=e_mask, other=0.0).to(CDT) * lvl_w - 0.5
            py = tl.load(loc_ptr + 2 * n + 1, mask=e_mask, other=0.0).to(CDT) * lvl_h - 0.5
            w = a * _weight_1d(px, kx) * _weight_1d(py, ky)
            go_row = (n // (L * P)) * C  # flat (b, q, head) times C
            mask = e_mask[:, None] & c_mask[None, :]
            go = tl.load(go_ptr + go_row[:, None] + offs_c[None, :], mask=mask, other=0.0)
            acc += w[:, None] * go.to(CDT)
    vrow = ((b * KEYS + offs_k) * HEADS + head) * C
    dst = grad_value_ptr + vrow[:, None] + offs_c[None, :]
    mask = (offs_k < KEYS)[:, None] & c_mask[None, :]
    tl.store(dst, acc.to(grad_value_ptr.dtype.element_ty), mask=mask)


def _cdt(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def plan(channels: int) -> tuple[int, int]:
    """``(BLOCK_C, BLOCK_R)``: channel lanes (the next power of two of ``channels``, 8 to
    64; wider heads take more programs or loop) and rows (queries or keys) per program,
    1024 tile elements over 8 warps (4 per thread), so registers stay bounded at any ``C``.

    Examples:
        >>> plan(32), plan(3), plan(256)
        ((32, 32), (8, 128), (64, 16))
    """
    block_c = min(max(triton.next_power_of_2(channels), 8), 64)
    return block_c, 1024 // block_c


def _check_limits(value: Tensor, attention_weights: Tensor) -> None:
    """`LaunchLimitError` if an offset, a bucket or a sample position would not fit int32
    (the kernels index every tensor with int32)."""
    batch, queries, heads = attention_weights.shape[:3]
    sizes = {
        "value": value.numel(),
        "output": batch * queries * heads * value.shape[3],
        "sampling_locations": 2 * attention_weights.numel(),
    }
    for name, size in sizes.items():
        if size >= _INT32_MAX:
            raise LaunchLimitError(
                _OP, "int32 indexing", ValueError(f"{name} has {size} elements, 2**31 or more")
            )


def _sizes(value: Tensor, attention_weights: Tensor) -> dict[str, int]:
    _, keys, heads, channels = value.shape
    _, queries, _, levels, points = attention_weights.shape
    return {"Q": queries, "KEYS": keys, "HEADS": heads, "C": channels, "L": levels, "P": points}


def _forward(value: Tensor, shapes: Tensor, loc: Tensor, attn: Tensor) -> Tensor:
    batch, _, heads, channels = value.shape
    queries = attn.shape[1]
    out = value.new_empty(batch, queries, heads * channels)
    if not out.numel():
        return out
    block_c, block_q = plan(channels)
    n_qb, n_cb = triton.cdiv(queries, block_q), triton.cdiv(channels, block_c)
    launch(
        _OP, _msda_fwd_kernel, (batch * n_qb * heads * n_cb,), _NUM_WARPS,
        value_ptr=value, shapes_ptr=shapes, loc_ptr=loc, attn_ptr=attn, out_ptr=out,
        **_sizes(value, attn), N_QB=n_qb, N_CB=n_cb,
        CDT=_cdt(value.dtype), BLOCK_Q=block_q, BLOCK_C=block_c,
    )  # fmt: skip
    return out


def _backward(
    value: Tensor, shapes: Tensor, loc: Tensor, attn: Tensor, grad_out: Tensor,
    need_value: bool, need_samples: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    batch, keys, heads, channels = value.shape
    queries = attn.shape[1]
    if not (grad_out.numel() and attn.numel()):  # no samples: zero gradients
        return torch.zeros_like(value), torch.zeros_like(loc), torch.zeros_like(attn)
    # The kernels write every element (grad_value: 0 for keys past the levels).
    grad_value = torch.empty_like(value)
    grad_loc, grad_attn = torch.empty_like(loc), torch.empty_like(attn)
    sizes = _sizes(value, attn)
    cdt = _cdt(value.dtype)
    block_c, block_q = plan(channels)
    n_qb = triton.cdiv(queries, block_q)
    grid = batch * n_qb * heads
    # Samples with no corner inside get bucket 2**31 - 1: sorted last, never visited.
    buckets = torch.empty(attn.shape if need_value else 1, dtype=torch.int32, device=value.device)
    launch(
        _OP, _msda_sample_kernel, (grid,), _NUM_WARPS,
        value_ptr=value, shapes_ptr=shapes, loc_ptr=loc, attn_ptr=attn, go_ptr=grad_out,
        grad_loc_ptr=grad_loc, grad_attn_ptr=grad_attn, bucket_ptr=buckets, **sizes, N_QB=n_qb,
        GRADS=need_samples, BUCKETS=need_value, CDT=cdt, BLOCK_Q=block_q, BLOCK_C=block_c,
    )  # fmt: skip
    if need_value and keys:
        ordered, perm = torch.sort(buckets.view(-1), stable=True)
        del buckets
        cells = batch * heads * keys
        bounds = torch.arange(cells + 1, dtype=torch.int32, device=value.device)
        ranges = torch.searchsorted(ordered, bounds, out_int32=True)
        del ordered, bounds
        block_c, block_k = plan(channels)
        n_kb, n_cb = triton.cdiv(keys, block_k), triton.cdiv(channels, block_c)
        sizes.pop("Q")
        launch(
            _OP, _msda_value_kernel, (batch * n_kb * heads * n_cb,), _NUM_WARPS,
            shapes_ptr=shapes, loc_ptr=loc, attn_ptr=attn, go_ptr=grad_out, perm_ptr=perm,
            ranges_ptr=ranges, grad_value_ptr=grad_value, **sizes, N_KB=n_kb, N_CB=n_cb,
            CDT=cdt, BLOCK_K=block_k, BLOCK_C=block_c,
        )  # fmt: skip
    return grad_value, grad_loc, grad_attn


class _MSDeformAttnTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, value: Tensor, spatial_shapes: Tensor, sampling_locations: Tensor,
        attention_weights: Tensor, reference,
    ) -> Tensor:  # type: ignore[override]  # fmt: skip
        value, loc, attn = prepare(value), prepare(sampling_locations), prepare(attention_weights)
        shapes = prepare(spatial_shapes.long())
        _check_limits(value, attn)
        out = _forward(value, shapes, loc, attn)
        ctx.save_for_backward(value, shapes, loc, attn)
        ctx.reference = reference
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        value, shapes, loc, attn = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        try:
            grad_value, grad_loc, grad_attn = _backward(
                value, shapes, loc, attn, prepare(grad_out), needs[0], needs[2] or needs[3]
            )
        except KernelFailure as exc:
            grads = reference_grads(
                _OP, exc, ctx.reference, (value, shapes, loc, attn), needs, (grad_out,)
            )
            return (*grads, None)
        grads = (grad_value, None, grad_loc, grad_attn)
        return (*(g if need else None for g, need in zip(grads, needs)), None)


@with_fallback(_OP)
def ms_deform_attn_triton(
    value: Tensor,
    spatial_shapes: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    reference: Callable[..., Tensor] | None = None,
) -> Tensor:
    """Fused `visionblocks.ops.ms_deform_attn.ms_deform_attn`; inputs already validated.

    Reached through dispatch (``ms_deform_attn(..., impl="triton")``), not called directly.

    Args:
        value (Tensor[B, keys, heads, C]): Values of every level, stacked in level order;
            float16, bfloat16, float32 or float64, the dtype of the two below.
        spatial_shapes (Tensor[levels, 2]): ``(H, W)`` of each level, int64, on ``value``'s
            device (read there by the kernels).
        sampling_locations (Tensor[B, Q, heads, levels, points, 2]): ``(x, y)`` in
            ``[0, 1]`` (``align_corners=False``); outside, zero padding.
        attention_weights (Tensor[B, Q, heads, levels, points]): Weight of each sample.
        reference: The torch formula with the same first four arguments; used for the
            gradients if a backward kernel fails (None: raise instead).

    Returns:
        Tensor[B, Q, heads * C]: In the inputs' dtype (one floating dtype; computed in
        float32, float64 for float64), differentiable with respect to ``value``,
        ``sampling_locations`` and ``attention_weights`` (fused, deterministic backward).

    Raises:
        KernelFailure: If a kernel fails to compile, load or launch.
        LaunchLimitError: If ``B * keys * heads`` or the number of samples reaches ``2**31``.

    Examples:
        >>> import torch
        >>> shapes = torch.tensor([[4, 4], [2, 2]], device="cuda")  # doctest: +SKIP
        >>> value = torch.randn(1, 20, 2, 8, device="cuda")  # doctest: +SKIP
        >>> loc = torch.rand(1, 5, 2, 2, 3, 2, device="cuda")  # doctest: +SKIP
        >>> weights = torch.rand(1, 5, 2, 2, 3, device="cuda")  # doctest: +SKIP
        >>> ms_deform_attn_triton(value, shapes, loc, weights).shape  # doctest: +SKIP
        torch.Size([1, 5, 16])
    """
    return _MSDeformAttnTriton.apply(
        value, spatial_shapes, sampling_locations, attention_weights, reference
    )
