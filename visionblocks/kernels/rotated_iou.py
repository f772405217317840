"""Triton kernel for the pairwise IoU of rotated boxes (forward).

Called by `visionblocks.ops.rotated.rotated_box_iou` (after validation, for the pairwise
case of 2-D inputs) as ``rotated_box_iou_triton(boxes1, boxes2, eps, reference)``:
``boxes1 (N, 5)`` and ``boxes2 (M, 5)`` are ``(cx, cy, w, h, r)`` boxes (degrees) of one
floating dtype; the result is the ``(N, M)`` IoU in float32 (float64 for float64 boxes).
Forward only: the op (the custom op ``visionblocks::rotated_box_iou``) differentiates with
its written-out torch gradient (`visionblocks.ops._rotated_overlap.iou_backward`), which
needs no saved intermediates; ``reference`` (the torch forward) runs if this kernel fails
to compile or launch (`visionblocks.kernels._launch.with_fallback`).

One program handles ``BLOCK`` pairs of the flattened ``N x M`` grid, one pair per row of
``[BLOCK, 16]`` tiles (16 candidate vertices per pair), each box's 5 numbers cast to the
compute dtype as they are loaded. The algorithm is the torch path's,
`visionblocks.ops._rotated_overlap`, step by step: the canonical form (sides ``>= 0``, angle
in ``[-45, 45)``), the frame of the second box, each box's edges clipped to the other
(Liang–Barsky), the 16 end points sorted by a pseudo-angle around their mean, the shoelace
area, the eps rule and exactly 1 for equal boxes. Instead of a sort, each point's rank is
counted (ties by index, as the stable sort) and the shoelace pairs every point with the
point of the next rank. A program whose pairs are all apart along the second box's axes
(most of an image's pairs) skips the polygon: their intersection is empty. Only
``tl.cos``/``tl.sin``/``tl.floor`` from the math library, which the interpreter runs too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from visionblocks._core.namespace import public_dir
from visionblocks.kernels._launch import jit, launch, prepare, with_fallback

__all__ = ["rotated_box_iou_triton"]
__dir__ = public_dir(__name__, __all__)

_BLOCK = 32  # pairs per program (float64: a quarter, so that nothing spills)
_NUM_WARPS = 4
_DEG = tl.constexpr(math.pi / 180.0)


@triton.jit
def _load_box(ptr, row, mask, CDT: tl.constexpr):
    """The canonical ``(cx, cy, w, h, r)`` of the boxes at ``row``: sides made non-negative,
    the angle reduced to ``[-45, 45)`` by quarter turns, the sides swapped on odd ones; no
    step rounds (`visionblocks.ops._rotated_geometry.quarter_turns`)."""
    base = row * 5
    cx = tl.load(ptr + base, mask=mask, other=0.0).to(CDT)
    cy = tl.load(ptr + base + 1, mask=mask, other=0.0).to(CDT)
    w = tl.load(ptr + base + 2, mask=mask, other=1.0).to(CDT)
    h = tl.load(ptr + base + 3, mask=mask, other=1.0).to(CDT)
    r = tl.load(ptr + base + 4, mask=mask, other=0.0).to(CDT)
    w = tl.where(w < 0, -w, w)
    h = tl.where(h < 0, -h, h)
    # quarter turns k (off by one next to +-45, which the wheres mend); every step is exact
    a = tl.abs(r)
    k = tl.floor(a * (1.0 / 90.0) + 0.5)
    t = a - 90.0 * k
    t = tl.where(r < 0, -t, t)
    up = t >= 45.0
    down = t < -45.0
    r = tl.where(up, t - 90.0, tl.where(down, t + 90.0, t))
    odd = ((k - 2.0 * tl.floor(k * 0.5)) == 1.0) ^ up ^ down
    return cx, cy, tl.where(odd, h, w), tl.where(odd, w, h), r


@triton.jit
def _diamond(x, y):
    """A pseudo-angle in ``[0, 4)`` increasing with the angle of ``(x, y)`` (0 at 0)."""
    ax = tl.abs(x)
    ay = tl.abs(y)
    s = ax + ay
    s = tl.where(s > 0, s, 1.0)
    fy = ay / s
    fx = ax / s
    return tl.where(y >= 0, tl.where(x >= 0, fy, 1 + fx), tl.where(x < 0, 2 + fy, 3 + fx))


@triton.jit
def _signs(k):
    """``sigma_k``, ``tau_k`` of corner ``k``: ``(-1, -1), (1, -1), (1, 1), (-1, 1)``."""
    sig = tl.where((k == 1) | (k == 2), 1.0, -1.0)
    tau = tl.where(k >= 2, 1.0, -1.0)
    return sig, tau


@triton.jit
def _clip_side(p, q, t0, t1, bad):
    """One side of Liang-Barsky clipping: the segment ``start + t u`` keeps ``p t <= q``;
    ``[t0, t1]`` narrows, and ``bad`` marks a segment parallel to the side and outside it."""
    r = q / tl.where(p == 0, 1.0, p)
    t0 = tl.maximum(t0, tl.where(p < 0, r, 0.0))
    t1 = tl.minimum(t1, tl.where(p > 0, r, 1.0))
    return t0, t1, bad | ((p == 0) & (q < 0))


@triton.jit
def _area(dx, dy, ca, sa, ex, ey, hw1, hh1, hw2, hh2, CDT: tl.constexpr, BLOCK: tl.constexpr):
    """Intersection area ``[BLOCK]`` of the pairs, in the second box's frame."""
    # candidate c: box (c >= 8: the second box's edges, clipped in the first box's frame),
    # edge k = (c % 8) // 2 from corner k to corner k + 1, its start (c even) or end
    col = tl.arange(0, 16)[None, :]
    is_b = col >= 8
    k = (col % 8) // 2
    is_end = (col % 2) == 1
    sig, tau = _signs(k)
    sig_n, tau_n = _signs((k + 1) % 4)
    px0 = tl.where(is_b, ex[:, None], dx[:, None])
    py0 = tl.where(is_b, ey[:, None], dy[:, None])
    hw = tl.where(is_b, hw2[:, None], hw1[:, None])
    hh = tl.where(is_b, hh2[:, None], hh1[:, None])
    cc = ca[:, None] + tl.zeros_like(px0)
    ss = tl.where(is_b, -sa[:, None], sa[:, None])
    bw = tl.where(is_b, hw1[:, None], hw2[:, None])  # the box clipped to
    bh = tl.where(is_b, hh1[:, None], hh2[:, None])
    a = hw * sig
    b = hh * tau
    x0 = px0 + a * cc + b * ss
    y0 = py0 - a * ss + b * cc
    a = hw * sig_n
    b = hh * tau_n
    x1 = px0 + a * cc + b * ss
    y1 = py0 - a * ss + b * cc
    ux = x1 - x0
    uy = y1 - y0
    t0 = tl.zeros_like(x0)
    t1 = tl.zeros_like(x0) + 1.0
    bad = tl.zeros_like(x0) != 0
    t0, t1, bad = _clip_side(-ux, x0 + bw, t0, t1, bad)  # x >= -bw
    t0, t1, bad = _clip_side(ux, bw - x0, t0, t1, bad)  # x <= bw
    t0, t1, bad = _clip_side(-uy, y0 + bh, t0, t1, bad)  # y >= -bh
    t0, t1, bad = _clip_side(uy, bh - y0, t0, t1, bad)  # y <= bh
    valid = (bad == 0) & (t0 <= t1)
    sx = tl.minimum(tl.maximum(x0 + t0 * ux, -bw), bw)
    sy = tl.minimum(tl.maximum(y0 + t0 * uy, -bh), bh)
    gx = tl.minimum(tl.maximum(x1 - (1 - t1) * ux, -bw), bw)
    gy = tl.minimum(tl.maximum(y1 - (1 - t1) * uy, -bh), bh)
    lx = tl.where(is_end, gx, sx)
    ly = tl.where(is_end, gy, sy)
    cax = ca[:, None]
    sax = sa[:, None]
    px = tl.where(is_b, dx[:, None] + lx * cax + ly * sax, lx)
    py = tl.where(is_b, dy[:, None] - lx * sax + ly * cax, ly)
    # sort by angle around the mean (as ranks: ties by index, as a stable sort)
    count = tl.sum(valid.to(tl.int32), axis=1)
    denom = tl.maximum(count.to(CDT), 1.0)
    mx = tl.sum(tl.where(valid, px, 0.0), axis=1) / denom
    my = tl.sum(tl.where(valid, py, 0.0), axis=1) / denom
    rx = px - mx[:, None]
    ry = py - my[:, None]
    key = tl.where(valid, _diamond(rx, ry), 8.0)
    rank = tl.zeros([BLOCK, 16], dtype=tl.int32)
    for j in tl.static_range(16):
        kj = tl.sum(tl.where(col == j, key, 0.0), axis=1)[:, None]  # one term: exact
        rank += ((kj < key) | ((kj == key) & (j < col))).to(tl.int32)
    nxt = rank + 1
    nxt = tl.where(nxt >= count[:, None], 0, nxt)
    # the shoelace, each point with the point of the next rank
    qx = tl.zeros_like(rx)
    qy = tl.zeros_like(ry)
    for j in tl.static_range(16):
        here = col == j
        rj = tl.sum(tl.where(here, rank, 0), axis=1)[:, None]
        xj = tl.sum(tl.where(here, rx, 0.0), axis=1)[:, None]
        yj = tl.sum(tl.where(here, ry, 0.0), axis=1)[:, None]
        hit = rj == nxt
        qx = tl.where(hit, xj, qx)
        qy = tl.where(hit, yj, qy)
    return 0.5 * tl.sum(tl.where(valid, rx * qy - qx * ry, 0.0), axis=1)


@jit
def _rotated_iou_kernel(
    b1_ptr, b2_ptr, out_ptr, N: tl.int64, M: tl.int64, eps: tl.float32,
    CDT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N * M
    cx1, cy1, w1, h1, r1 = _load_box(b1_ptr, offs // M, mask, CDT)
    cx2, cy2, w2, h2, r2 = _load_box(b2_ptr, offs % M, mask, CDT)
    # the frame of the second box
    alpha = (r1 - r2) * _DEG
    ca = tl.cos(alpha)
    sa = tl.sin(alpha)
    rad2 = r2 * _DEG
    c2 = tl.cos(rad2)
    s2 = tl.sin(rad2)
    ddx = cx1 - cx2
    ddy = cy1 - cy2
    dx = ddx * c2 - ddy * s2
    dy = ddx * s2 + ddy * c2
    ex = -(dx * ca - dy * sa)
    ey = -(dx * sa + dy * ca)
    hw1 = 0.5 * w1
    hh1 = 0.5 * h1
    hw2 = 0.5 * w2
    hh2 = 0.5 * h2
    # pairs apart along the second box's axes have no intersection: a block of them skips
    # the polygon (padded by 2**-20, so rounding never skips an overlapping pair)
    reach_x = (hw2 + hw1 * tl.abs(ca) + hh1 * tl.abs(sa)) * (1 + 2**-20)
    reach_y = (hh2 + hw1 * tl.abs(sa) + hh1 * tl.abs(ca)) * (1 + 2**-20)
    near = mask & (tl.abs(dx) <= reach_x) & (tl.abs(dy) <= reach_y)
    area = tl.zeros([BLOCK], dtype=CDT)
    if tl.max(near.to(tl.int32), axis=0) > 0:
        area = _area(dx, dy, ca, sa, ex, ey, hw1, hh1, hw2, hh2, CDT, BLOCK)
    area = tl.where(near, area, 0.0)
    # IoU: the eps rule, exactly 1 for equal boxes
    area1 = w1 * h1
    area2 = w2 * h2
    inter = tl.minimum(tl.maximum(area, 0.0), tl.minimum(area1, area2))
    union = (area1 + area2) - inter
    union = tl.where(union == 0, eps, union)
    iou = inter / union
    same = (cx1 == cx2) & (cy1 == cy2) & (w1 == w2) & (h1 == h2) & (r1 == r2) & (area1 > 0)
    iou = tl.where(same, 1.0, iou)
    tl.store(out_ptr + offs, iou.to(out_ptr.dtype.element_ty), mask=mask)


@with_fallback("rotated_box_iou")
def rotated_box_iou_triton(
    boxes1: Tensor,
    boxes2: Tensor,
    eps: float,
    reference: Callable[[Tensor, Tensor, float], Tensor] | None = None,
) -> Tensor:
    """Pairwise IoU ``(N, M)`` of ``(N, 5)`` and ``(M, 5)`` cxcywhr boxes of one dtype.

    float32 for float16, bfloat16 and float32 boxes, float64 for float64 ones. No autograd:
    the op's custom op calls this in its forward. ``reference``: the torch forward, run if
    the kernel fails (None: raise).

    Examples:
        >>> boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0, 45.0]], device="cuda")  # doctest: +SKIP
        >>> rotated_box_iou_triton(boxes, boxes, 1e-7)  # doctest: +SKIP
        tensor([[1.]], device='cuda:0')
    """
    del reference  # run by with_fallback
    b1, b2 = prepare(boxes1), prepare(boxes2)
    n, m = b1.shape[0], b2.shape[0]
    double = b1.dtype == torch.float64
    out = torch.empty(n, m, dtype=torch.float64 if double else torch.float32, device=b1.device)
    if n and m:
        if eps > 0:  # a float32 kernel argument: keep a rescaled eps positive and finite
            info = torch.finfo(torch.float32)
            eps = min(max(eps, info.tiny), info.max)
        block = _BLOCK // 4 if double else _BLOCK
        launch(
            "rotated_box_iou", _rotated_iou_kernel, (triton.cdiv(n * m, block),), _NUM_WARPS,
            b1_ptr=b1, b2_ptr=b2, out_ptr=out, N=n, M=m, eps=eps,
            CDT=tl.float64 if double else tl.float32, BLOCK=block,
        )  # fmt: skip
    return out
