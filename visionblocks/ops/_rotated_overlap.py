"""The IoU of rotated boxes: the intersection polygon, its area, and the area's gradient.

Private helpers of `visionblocks.ops.rotated` (whose module docstring holds the convention).

**Intersection**, in the second box's frame: each edge of either box is clipped to the other
box (Liang–Barsky); the 16 clipped end points are the vertices of the convex intersection
polygon, sorted by a pseudo-angle around their mean, and the shoelace formula gives the
area. No step uses a point computed by an earlier one, so rounding cannot cascade.

**Gradient**, written out (`pair_iou_grad`): per polygon edge (length ``L``, outward unit
normal ``n`` of the box edge it lies on, midpoint ``m``) the box's centre gets ``L n``, the
side it bounds ``L / 2``, the angle ``L (m - c) . dn/dr``: products of lengths and unit
vectors, finite for finite boxes (a degenerate polygon gets the one-sided derivative).

Pairs run in tiles (eager CPU calls skip the pairs whose bounds are apart) inside the custom
ops ``visionblocks::rotated_box_iou`` and ``visionblocks::rotated_box_iou_backward``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from visionblocks._core.dispatch import forced_triton, has_values, use_triton
from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.ops._rotated_geometry import DEG, canonical, canonical_backward

__all__ = [
    "PairFrame",
    "iou_backward",
    "iou_torch",
    "pair_iou",
    "pair_iou_grad",
    "rotated_iou",
    "rotated_iou_backward",
]

# Pairs per tile (a tile's temporaries: tens of MB); `CUDA_TILE` times more on CUDA.
FORWARD_PAIRS = 1 << 15
BACKWARD_PAIRS = 1 << 12
CUDA_TILE = 8


def _budget(pairs: int, *tensors: Tensor) -> int:
    return pairs * CUDA_TILE if tensors[0].is_cuda else pairs


class PairFrame(NamedTuple):
    """A pair of canonical boxes in the second box's frame: the first box's centre
    ``dx, dy`` and angle ``ca, sa``; the second's centre ``ex, ey`` in the first's frame;
    half sides; ``c2, s2``: the second box's angle (frame to image)."""

    dx: Tensor
    dy: Tensor
    ca: Tensor
    sa: Tensor
    ex: Tensor
    ey: Tensor
    hw1: Tensor
    hh1: Tensor
    hw2: Tensor
    hh2: Tensor
    c2: Tensor
    s2: Tensor


def _frame(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> PairFrame:
    cx1, cy1, w1, h1, r1, cx2, cy2, w2, h2, r2 = torch.broadcast_tensors(*a, *b)
    alpha = (r1 - r2) * DEG
    ca, sa = torch.cos(alpha), torch.sin(alpha)
    rad2 = r2 * DEG
    c2, s2 = torch.cos(rad2), torch.sin(rad2)
    ddx, ddy = cx1 - cx2, cy1 - cy2
    dx = ddx * c2 - ddy * s2
    dy = ddx * s2 + ddy * c2
    ex = -(dx * ca - dy * sa)
    ey = -(dx * sa + dy * ca)
    return PairFrame(dx, dy, ca, sa, ex, ey, 0.5 * w1, 0.5 * h1, 0.5 * w2, 0.5 * h2, c2, s2)


def _corners(
    px: Tensor, py: Tensor, hw: Tensor, hh: Tensor, c: Tensor, s: Tensor
) -> tuple[Tensor, Tensor]:
    """The 4 corners ``(..., 4)`` of a box centred at ``(px, py)`` with ``u = (c, -s)``,
    ``v = (s, c)``, in positive (shoelace) order."""
    hc, hs, kc, ks = hw * c, hw * s, hh * c, hh * s
    xs = torch.stack((px - hc - ks, px + hc - ks, px + hc + ks, px - hc + ks), -1)
    ys = torch.stack((py + hs - kc, py - hs - kc, py - hs + kc, py + hs + kc), -1)
    return xs, ys


def _clip(
    xs: Tensor, ys: Tensor, hw: Tensor, hh: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Edges ``k -> k + 1`` of a quad ``(..., 4)`` clipped to ``|x| <= hw, |y| <= hh``:
    start and end points and whether anything is left (Liang–Barsky)."""
    hw, hh = hw.unsqueeze(-1), hh.unsqueeze(-1)
    qx, qy = torch.roll(xs, -1, -1), torch.roll(ys, -1, -1)
    ddx, ddy = qx - xs, qy - ys
    t0 = t1 = bad = None
    for p, q in ((-ddx, xs + hw), (ddx, hw - xs), (-ddy, ys + hh), (ddy, hh - ys)):
        flat = p == 0
        r = q / torch.where(flat, 1.0, p)
        lo, hi, off = torch.where(p < 0, r, 0.0), torch.where(p > 0, r, 1.0), flat & (q < 0)
        t0 = lo if t0 is None else torch.maximum(t0, lo)
        t1 = hi if t1 is None else torch.minimum(t1, hi)
        bad = off if bad is None else bad | off
    assert t0 is not None and t1 is not None and bad is not None
    t0, t1 = t0.clamp_min(0), t1.clamp_max(1)
    valid = ~bad & (t0 <= t1)
    sx = torch.clamp(xs + t0 * ddx, -hw, hw)
    sy = torch.clamp(ys + t0 * ddy, -hh, hh)
    ex = torch.clamp(qx - (1 - t1) * ddx, -hw, hw)
    ey = torch.clamp(qy - (1 - t1) * ddy, -hh, hh)
    return sx, sy, ex, ey, valid


def _interleave(s: Tensor, e: Tensor) -> Tensor:
    """``(..., 4)`` starts and ends as ``(..., 8)``: s0, e0, s1, e1, ..."""
    return torch.stack((s, e), dim=-1).flatten(-2)


def _diamond(x: Tensor, y: Tensor) -> Tensor:
    """A pseudo-angle of ``(x, y)`` in ``[0, 4)``, monotonic in the angle, exact at the axes."""
    ax, ay = x.abs(), y.abs()
    s = ax + ay
    s = torch.where(s > 0, s, 1.0)
    fy, fx = ay / s, ax / s
    return torch.where(y >= 0, torch.where(x >= 0, fy, 1 + fx), torch.where(x < 0, 2 + fy, 3 + fx))


def _polygon(f: PairFrame) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The intersection polygon in the second box's frame: ``(..., 16)`` x and y sorted by
    angle (unused slots repeat the first vertex) and the centre ``(...)`` x and y."""
    ax, ay = _corners(f.dx, f.dy, f.hw1, f.hh1, f.ca, f.sa)
    asx, asy, aex, aey, aval = _clip(ax, ay, f.hw2, f.hh2)
    bx, by = _corners(f.ex, f.ey, f.hw2, f.hh2, f.ca, -f.sa)
    bsx, bsy, bex, bey, bval = _clip(bx, by, f.hw1, f.hh1)
    ca, sa = f.ca.unsqueeze(-1), f.sa.unsqueeze(-1)
    lx, ly = _interleave(bsx, bex), _interleave(bsy, bey)  # back to the second box's frame
    px = torch.cat((_interleave(asx, aex), f.dx.unsqueeze(-1) + lx * ca + ly * sa), -1)
    py = torch.cat((_interleave(asy, aey), f.dy.unsqueeze(-1) - lx * sa + ly * ca), -1)
    valid = torch.cat((_interleave(aval, aval), _interleave(bval, bval)), -1)
    count = valid.sum(-1).to(px.dtype).clamp_min(1)
    mx = px.masked_fill(~valid, 0).sum(-1) / count
    my = py.masked_fill(~valid, 0).sum(-1) / count
    key = _diamond(px - mx.unsqueeze(-1), py - my.unsqueeze(-1)).masked_fill(~valid, 8.0)
    order = torch.sort(key, dim=-1, stable=True).indices
    px, py = px.gather(-1, order), py.gather(-1, order)
    valid = valid.gather(-1, order)
    px = torch.where(valid, px, px[..., :1])
    py = torch.where(valid, py, py[..., :1])
    return px, py, mx, my


def _area(px: Tensor, py: Tensor, mx: Tensor, my: Tensor) -> Tensor:
    rx, ry = px - mx.unsqueeze(-1), py - my.unsqueeze(-1)
    cross = rx * torch.roll(ry, -1, -1) - torch.roll(rx, -1, -1) * ry
    return 0.5 * cross.sum(-1)


def _finish(
    inter: Tensor, a: tuple[Tensor, ...], b: tuple[Tensor, ...], eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """IoU, the clamped intersection, the union (eps rule) and where the boxes are equal."""
    area1, area2 = a[2] * a[3], b[2] * b[3]
    inter = torch.minimum(inter.clamp_min(0), torch.minimum(area1, area2))
    union = (area1 + area2) - inter
    union = union.masked_fill(union == 0, eps)
    same = (a[0] == b[0]) & (a[1] == b[1]) & (a[2] == b[2]) & (a[3] == b[3]) & (a[4] == b[4])
    same = same & (area1 > 0)
    iou = torch.where(same, 1.0, inter / union)
    return iou, inter, union, same


def pair_iou(a: tuple[Tensor, ...], b: tuple[Tensor, ...], eps: float) -> Tensor:
    """IoU of canonical boxes given as broadcastable columns ``(cx, cy, w, h, r)``."""
    inter = _area(*_polygon(_frame(a, b)))
    return _finish(inter, a, b, eps)[0]


def pair_iou_grad(
    a: tuple[Tensor, ...], b: tuple[Tensor, ...], eps: float
) -> tuple[Tensor, Tensor]:
    """Gradients ``(..., 5)`` of `pair_iou` for both boxes' canonical parameters (module
    notes; 0 for equal boxes)."""
    f = _frame(a, b)
    px, py, mx, my = _polygon(f)
    _, inter, union, same = _finish(_area(px, py, mx, my), a, b, eps)
    nx_, ny_ = torch.roll(px, -1, -1), torch.roll(py, -1, -1)
    mid_x, mid_y = 0.5 * (px + nx_), 0.5 * (py + ny_)
    out_x, out_y = ny_ - py, px - nx_  # length times the outward normal (positive order)
    zero, one = torch.zeros_like(f.ca), torch.ones_like(f.ca)
    # The 8 box edges: outward unit normal, offset (half side), centre; first box, then second.
    nrm_x = torch.stack((-f.sa, f.ca, f.sa, -f.ca, zero, one, zero, -one), -1)
    nrm_y = torch.stack((-f.ca, -f.sa, f.ca, f.sa, -one, zero, one, zero), -1)
    offset = torch.stack((f.hh1, f.hw1, f.hh1, f.hw1, f.hh2, f.hw2, f.hh2, f.hw2), -1)
    ctr_x = torch.stack((f.dx,) * 4 + (zero,) * 4, -1)
    ctr_y = torch.stack((f.dy,) * 4 + (zero,) * 4, -1)
    # (..., 16 polygon edges, 8 box edges)
    rel_x = mid_x.unsqueeze(-1) - ctr_x.unsqueeze(-2)
    rel_y = mid_y.unsqueeze(-1) - ctr_y.unsqueeze(-2)
    nx, ny = nrm_x.unsqueeze(-2), nrm_y.unsqueeze(-2)
    dist = (offset.unsqueeze(-2) - (rel_x * nx + rel_y * ny)).abs()
    align = out_x.unsqueeze(-1) * nx + out_y.unsqueeze(-1) * ny
    facing = align > 0
    score = dist.masked_fill(~facing, float("inf"))
    label = score.argmin(-1, keepdim=True)
    pick = (torch.arange(8, device=label.device) == label) & facing
    length = align.masked_fill(~pick, 0)
    turn = rel_y * nx - rel_x * ny  # outward speed per radian of the box's angle
    g = length.sum(-2)  # (..., 8)
    rot = (length * turn).sum(-2) * DEG
    gx, gy = g * nrm_x, g * nrm_y
    f_i = (a[2] * a[3] + b[2] * b[3]) / union / union  # dIoU / d intersection
    f_a = -inter / union / union  # dIoU / d (either box's area)
    grads = []
    for lo, box in ((0, a), (4, b)):
        fx, fy = gx[..., lo : lo + 4].sum(-1), gy[..., lo : lo + 4].sum(-1)
        d_cx = fx * f.c2 + fy * f.s2  # frame to image
        d_cy = fy * f.c2 - fx * f.s2
        d_w = 0.5 * (g[..., lo + 1] + g[..., lo + 3])
        d_h = 0.5 * (g[..., lo] + g[..., lo + 2])
        d_r = rot[..., lo : lo + 4].sum(-1)
        # the IoU's gradient: through the intersection, and through the box's own area
        d_w = f_i * d_w + f_a * box[3]
        d_h = f_i * d_h + f_a * box[2]
        d = torch.stack((f_i * d_cx, f_i * d_cy, d_w, d_h, f_i * d_r), -1)
        grads.append(d.masked_fill(same.unsqueeze(-1), 0))
    return grads[0], grads[1]


def _tiles(n: int, m: int, batch: int, budget: int) -> tuple[int, int]:
    """Rows and columns per tile so that ``batch * rows * cols`` stays near ``budget``."""
    if torch.compiler.is_compiling():
        return max(n, 1), max(m, 1)  # one tile: no loop over symbolic sizes
    cols = min(max(m, 1), max(1, budget // max(batch, 1)))
    rows = min(max(n, 1), max(1, budget // (max(batch, 1) * cols)))
    return rows, cols


def _pairwise_inputs(b1: Tensor, b2: Tensor) -> tuple[Tensor, Tensor, int]:
    """Both sets expanded to their common batch dims, and the batch size."""
    batch = torch.broadcast_shapes(b1.shape[:-2], b2.shape[:-2])
    size = 1
    for s in batch:
        size *= s
    return b1.expand(*batch, *b1.shape[-2:]), b2.expand(*batch, *b2.shape[-2:]), size


def _sparse(*tensors: Tensor) -> bool:
    """Whether to skip the pairs whose bounds are apart: eager CPU tensors with values."""
    return not torch.compiler.is_compiling() and all(
        t.device.type == "cpu" and has_values(t) for t in tensors
    )


def _bounds(columns: Tensor) -> tuple[Tensor, ...]:
    """Axis-aligned bounds of canonical boxes (`_columns`), padded so rounding never drops
    a pair."""
    cx, cy, w, h, r = columns.unbind(-1)
    rad = r * DEG
    c, s = torch.cos(rad).abs(), torch.sin(rad).abs()
    ex = (0.5 * (w * c + h * s)) * (1 + 2**-20)
    ey = (0.5 * (w * s + h * c)) * (1 + 2**-20)
    return cx - ex, cy - ey, cx + ex, cy + ey


def _overlapping(c1: Tensor, c2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batch, row and column indices of the pairs of ``(B, N, 5)`` and ``(B, M, 5)``
    canonical boxes whose bounds overlap."""
    x1, y1, x2, y2 = (t.unsqueeze(-1) for t in _bounds(c1))
    u1, v1, u2, v2 = (t.unsqueeze(-2) for t in _bounds(c2))
    near = (x1 <= u2) & (u1 <= x2) & (y1 <= v2) & (v1 <= y2)
    bi, ni, mi = near.nonzero(as_tuple=True)
    return bi, ni, mi


def _flat_pairs(b1: Tensor, b2: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    e1, e2, size = _pairwise_inputs(b1, b2)
    flat = (e.reshape(size, *e.shape[-2:]) for e in (e1, e2))
    return *flat, tuple(e1.shape[:-2])


def _columns(boxes: Tensor) -> Tensor:
    return torch.stack(canonical(boxes), -1)


def iou_torch(b1: Tensor, b2: Tensor, aligned: bool, eps: float) -> Tensor:
    """IoU of raw cxcywhr boxes ``(..., N, 5)``, ``(..., M, 5)`` (pairwise, ``(..., N, M)``)
    or ``(..., 5)`` broadcastable (aligned), in their (float32 or float64) dtype, in tiles."""
    if aligned:
        shape = torch.broadcast_shapes(b1.shape[:-1], b2.shape[:-1])
        x1 = b1.expand(*shape, 5).reshape(-1, 5)
        x2 = b2.expand(*shape, 5).reshape(-1, 5)
        total = x1.shape[0]
        step = total if torch.compiler.is_compiling() else _budget(FORWARD_PAIRS, x1)
        if total <= step:
            return pair_iou(canonical(x1), canonical(x2), eps).reshape(shape)
        out = x1.new_empty(total)
        for start in range(0, total, step):
            stop = start + step
            out[start:stop] = pair_iou(canonical(x1[start:stop]), canonical(x2[start:stop]), eps)
        return out.reshape(shape)
    if _sparse(b1, b2):
        e1, e2, batch = _flat_pairs(b1, b2)
        n, m = e1.shape[-2], e2.shape[-2]
        out = e1.new_zeros(e1.shape[0], n, m)
        c1, c2 = _columns(e1), _columns(e2)
        bi, ni, mi = _overlapping(c1, c2)
        for start in range(0, bi.shape[0], FORWARD_PAIRS):
            b, i, j = (t[start : start + FORWARD_PAIRS] for t in (bi, ni, mi))
            out[b, i, j] = pair_iou(c1[b, i].unbind(-1), c2[b, j].unbind(-1), eps)
        return out.reshape(*batch, n, m)
    b1, b2, size = _pairwise_inputs(b1, b2)
    n, m = b1.shape[-2], b2.shape[-2]
    rows, cols = _tiles(n, m, size, _budget(FORWARD_PAIRS, b1))
    if rows >= n and cols >= m:
        return pair_iou(canonical(b1.unsqueeze(-2)), canonical(b2.unsqueeze(-3)), eps)
    out = b1.new_empty(*b1.shape[:-2], n, m)
    for r0 in range(0, n, rows):
        a = canonical(b1[..., r0 : r0 + rows, :].unsqueeze(-2))
        for c0 in range(0, m, cols):
            b = canonical(b2[..., c0 : c0 + cols, :].unsqueeze(-3))
            out[..., r0 : r0 + rows, c0 : c0 + cols] = pair_iou(a, b, eps)
    return out


def iou_backward(
    b1: Tensor, b2: Tensor, grad: Tensor, aligned: bool, eps: float
) -> tuple[Tensor, Tensor]:
    """Gradients of `iou_torch` (same arguments) for ``grad``, shaped as ``b1`` and ``b2``."""
    if aligned:
        shape = torch.broadcast_shapes(b1.shape[:-1], b2.shape[:-1])
        x1 = b1.expand(*shape, 5).reshape(-1, 5)
        x2 = b2.expand(*shape, 5).reshape(-1, 5)
        g = grad.reshape(-1, 1).to(x1.dtype)
        total = x1.shape[0]
        step = max(total, 1) if torch.compiler.is_compiling() else _budget(BACKWARD_PAIRS, x1)
        parts1, parts2 = [], []
        for start in range(0, max(total, 1), step):
            stop = start + step
            d1, d2 = pair_iou_grad(canonical(x1[start:stop]), canonical(x2[start:stop]), eps)
            parts1.append(g[start:stop] * d1)
            parts2.append(g[start:stop] * d2)
        g1 = canonical_backward(x1, torch.cat(parts1, 0)).reshape(*shape, 5)
        g2 = canonical_backward(x2, torch.cat(parts2, 0)).reshape(*shape, 5)
        return g1.sum_to_size(b1.shape), g2.sum_to_size(b2.shape)
    if _sparse(b1, b2, grad):
        e1, e2, _ = _flat_pairs(b1, b2)
        n, m = e1.shape[-2], e2.shape[-2]
        g = grad.to(e1.dtype).reshape(e1.shape[0], n, m)
        c1, c2 = _columns(e1), _columns(e2)
        bi, ni, mi = _overlapping(c1, c2)
        gc1 = e1.new_zeros(e1.shape[0] * n, 5)
        gc2 = e2.new_zeros(e2.shape[0] * m, 5)
        for start in range(0, bi.shape[0], BACKWARD_PAIRS):
            b, i, j = (t[start : start + BACKWARD_PAIRS] for t in (bi, ni, mi))
            d1, d2 = pair_iou_grad(c1[b, i].unbind(-1), c2[b, j].unbind(-1), eps)
            gk = g[b, i, j].unsqueeze(-1)
            gc1.index_add_(0, b * n + i, gk * d1)
            gc2.index_add_(0, b * m + j, gk * d2)
        g1 = canonical_backward(e1, gc1.view(e1.shape))
        g2 = canonical_backward(e2, gc2.view(e2.shape))
        batch = grad.shape[:-2]
        return (
            g1.reshape(*batch, n, 5).sum_to_size(b1.shape),
            g2.reshape(*batch, m, 5).sum_to_size(b2.shape),
        )
    e1, e2, size = _pairwise_inputs(b1, b2)
    n, m = e1.shape[-2], e2.shape[-2]
    g = grad.to(e1.dtype)
    rows, cols = _tiles(n, m, size, _budget(BACKWARD_PAIRS, e1))
    if rows >= n and cols >= m:
        d1, d2 = pair_iou_grad(canonical(e1.unsqueeze(-2)), canonical(e2.unsqueeze(-3)), eps)
        gc1 = (g.unsqueeze(-1) * d1).sum(-2)
        gc2 = (g.unsqueeze(-1) * d2).sum(-3)
    else:
        gc1, gc2 = torch.zeros_like(e1), torch.zeros_like(e2)
        for r0 in range(0, n, rows):
            a = canonical(e1[..., r0 : r0 + rows, :].unsqueeze(-2))
            for c0 in range(0, m, cols):
                b = canonical(e2[..., c0 : c0 + cols, :].unsqueeze(-3))
                d1, d2 = pair_iou_grad(a, b, eps)
                gt = g[..., r0 : r0 + rows, c0 : c0 + cols].unsqueeze(-1)
                gc1[..., r0 : r0 + rows, :] += (gt * d1).sum(-2)
                gc2[..., c0 : c0 + cols, :] += (gt * d2).sum(-3)
    g1 = canonical_backward(e1, gc1).sum_to_size(b1.shape)
    g2 = canonical_backward(e2, gc2).sum_to_size(b2.shape)
    return g1, g2


def _kernel_reference(b1: Tensor, b2: Tensor, eps: float) -> Tensor:
    """The kernel's torch fallback."""
    dtype = compute_dtype(b1.dtype)
    return iou_torch(b1.to(dtype), b2.to(dtype), False, eps)


def _to_input_dtype(grad: Tensor, dtype: torch.dtype) -> Tensor:
    """A float32/float64 gradient in an input's dtype, clamped to its finite range."""
    if grad.dtype == dtype:
        return grad
    big = torch.finfo(dtype).max
    return grad.clamp(-big, big).to(dtype)


@torch.library.custom_op("visionblocks::rotated_box_iou", mutates_args=())
def rotated_iou(b1: Tensor, b2: Tensor, aligned: bool, eps: float, impl: str) -> Tensor:
    """IoU of raw cxcywhr boxes of one floating dtype, pairwise or aligned, in float32
    (float64): the Triton kernel where `use_triton` picks it, else `iou_torch`;
    differentiable through `iou_backward`."""
    pairwise = not aligned and b1.dim() == 2 and b2.dim() == 2
    if pairwise and use_triton("rotated_box_iou", impl, b1, b2):
        from visionblocks.kernels.rotated_iou import rotated_box_iou_triton

        fallback = None if forced_triton(impl) else _kernel_reference
        return rotated_box_iou_triton(b1, b2, eps, reference=fallback)
    dtype = compute_dtype(b1.dtype)
    return iou_torch(b1.to(dtype), b2.to(dtype), aligned, eps)


@rotated_iou.register_fake
def _(b1: Tensor, b2: Tensor, aligned: bool, eps: float, impl: str) -> Tensor:
    if aligned:
        shape = tuple(torch.broadcast_shapes(b1.shape[:-1], b2.shape[:-1]))
    else:
        batch = torch.broadcast_shapes(b1.shape[:-2], b2.shape[:-2])
        shape = (*batch, b1.shape[-2], b2.shape[-2])
    return b1.new_empty(shape, dtype=compute_dtype(b1.dtype))


@torch.library.custom_op("visionblocks::rotated_box_iou_backward", mutates_args=())
def rotated_iou_backward(
    grad: Tensor, b1: Tensor, b2: Tensor, aligned: bool, eps: float
) -> tuple[Tensor, Tensor]:
    """Gradients of `rotated_iou` for ``b1`` and ``b2``, in their dtypes (clamped)."""
    dtype = compute_dtype(b1.dtype)
    g1, g2 = iou_backward(b1.to(dtype), b2.to(dtype), grad, aligned, eps)
    return _to_input_dtype(g1, b1.dtype), _to_input_dtype(g2, b2.dtype)


@rotated_iou_backward.register_fake
def _(grad: Tensor, b1: Tensor, b2: Tensor, aligned: bool, eps: float) -> tuple[Tensor, Tensor]:
    return b1.new_empty(b1.shape), b2.new_empty(b2.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    b1, b2, aligned, eps = inputs[:4]
    ctx.save_for_backward(b1, b2)
    ctx.aligned, ctx.eps = aligned, eps


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    b1, b2 = ctx.saved_tensors
    g1, g2 = rotated_iou_backward(grad, b1, b2, ctx.aligned, ctx.eps)
    need1, need2 = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    return (g1 if need1 else None, g2 if need2 else None, None, None, None)


rotated_iou.register_autograd(_backward, setup_context=_setup_context)
