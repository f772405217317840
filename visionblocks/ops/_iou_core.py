"""Element-wise core of the IoU family: values and analytic gradients, on planar columns.

Shared by the pairwise ops (`visionblocks.ops._pairwise_iou`: an ``(r, M)`` block of pairs per
call, box ``a`` columns shaped ``(r, 1)`` and box ``b`` columns ``(1, M)``) and the aligned
ops and losses (`visionblocks.ops._iou_loss_torch`: ``n`` pairs, every column ``(n,)``). Boxes
are *planar*: a `Side` holds ``x1, y1, x2, y2`` as the rows of one ``(4, ...)`` tensor, so every
op runs on contiguous memory for both axes at once, and writes into buffers carved from one
`Arena` (a per-thread workspace on CPU), so a call allocates nothing per piece.

Formulas, for one pair (notation of the reference, ``tests/reference/boxes.py``): overlap
sides ``d = min(x2, x2') - max(x1, x1')`` (per axis), intersection ``I = prod(max(d, 0))``,
union ``U = A + A' - I``, enclosing sides ``c = w + w' - d`` (equal to
``max(x2, x2') - min(x1, x1')``), ``C = prod(c)``, ``Q = |c|^2``, ``4 rho^2 = |delta|^2``
with ``delta = (x1 + x2) - (x1' + x2')`` per axis:

    iou  = I / U            giou = iou - (C - U) / C          diou = iou - rho^2 / Q
    ciou = diou - alpha v,  v = K (t' - t)^2,  t = atan(w / h),  K = 4 / pi^2,  alpha = v / (1 - iou + v)

The eps rule (`visionblocks.ops._box_iou`): ``U``, ``C`` and ``Q`` get ``eps`` where they are
exactly zero (`_nonzero`: ``x + eps [x == 0]``, one compare and one ``addcmul``), and only
there; ``alpha``'s denominator is kept above ``tiny`` (``v = 0`` there).

Gradient layout. With ``z`` given, `terms` also writes the measure's gradient coefficients, as
rows ``[gU, M_x, M_y, J_lo_x, J_lo_y, J_hi_x, J_hi_y, D_x, D_y, A]`` (``D`` for DIoU/CIoU,
``A`` for CIoU), each already multiplied by the incoming gradient when one is given, so that
a pairwise caller only has to sum them over the rows or columns of its block:

- ``gU = dm/dU`` through the two areas;
- ``k_I = dm/dI`` times the other intersection side, per axis, 0 where this side is 0 (as
  torchvision's losses mask the intersection); ``k_C`` the same for the enclosing sides
  (``dm/dC`` times the other side for GIoU, ``2 c dm/dQ`` for DIoU/CIoU);
- ``M = k_I + k_C`` and ``J = (k_I - k_C) s``, with ``s = sign(box_a - box_b)`` per
  coordinate (``max``/``min`` select by ``s``; a tie, ``s = 0``, splits the gradient half and
  half, as autograd's ``maximum``/``minimum`` do);
- ``D = delta / Q``: ``dm/d(x1, x2)`` through the centres is ``-D / 2`` for box ``a``;
- ``A = alpha (t' - t)``: ``dm/dt = 2 K A`` (alpha held constant).

`combine` turns them into a box's gradient (``sigma = 1`` for box ``a``, ``-1`` for ``b``):

    W = (h, w) gU + sigma 2 K A (h, -w) / (w^2 + h^2)           (areas, CIoU's angle)
    d/d(x2, y2) = W + M / 2 - sigma (J_hi + D) / 2
    d/d(x1, y1) = -W - M / 2 - sigma (J_lo + D) / 2
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor

from visionblocks._core.parallel import workspace

__all__ = [
    "CIOU",
    "DIOU",
    "GIOU",
    "IOU",
    "Arena",
    "Side",
    "arena",
    "combine",
    "eps_tensor",
    "fold_centre",
    "on_cpu",
    "rows_of_z",
    "side",
    "terms",
]

T = TypeVar("T")
IOU, GIOU, DIOU, CIOU = 0, 1, 2, 3
_K = 4.0 / math.pi**2  # v = K (t' - t)^2


def eps_tensor(
    eps: float, area_scale: Tensor | None, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``eps`` as a 0-d tensor, times ``area_scale`` (the square of a rescaling factor, a
    device tensor) and then kept a positive finite number when positive; on the CPU without
    ``area_scale`` (a 0-d CPU tensor broadcasts on any device)."""
    info = torch.finfo(dtype)
    if area_scale is None:
        return torch.tensor(min(max(eps, info.tiny), info.max) if eps > 0 else 0.0, dtype=dtype)
    scaled = area_scale.to(dtype) * eps
    return scaled.clamp_(info.tiny, info.max) if eps > 0 else scaled


def rows_of_z(kind: int) -> int:
    """Rows of the gradient coefficients ``Z`` for ``kind``."""
    return 10 if kind == CIOU else 9 if kind == DIOU else 7


class Arena:
    """Views carved one after another from a flat buffer (``None``: fresh tensors).

    Pieces of one call request the same sequence of shapes, so the views are kept and handed
    out again after `reset`, and so are views derived from them (`cached`): slicing and
    viewing cost as much as a small op, and hold the GIL that the other threads need.
    """

    def __init__(self, flat: Tensor | None, dtype: torch.dtype, device: torch.device) -> None:
        self.flat, self.dtype, self.device = flat, dtype, device
        self.views: list[tuple[Tensor, int]] = []  # (view, offset after it)
        self.index = self.used = 0
        self._owned: set[int] = set()  # ids of the views above
        self._derived: dict[tuple[int, str], Any] = {}

    def reset(self) -> Arena:
        self.index = self.used = 0
        return self

    def mark(self) -> tuple[int, int]:
        return self.index, self.used

    def release(self, mark: tuple[int, int]) -> None:
        self.index, self.used = mark

    def take(self, *shape: int) -> Tensor:
        if self.flat is None:
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        if self.index < len(self.views):
            view, end = self.views[self.index]
            if view.shape == shape:
                self.index += 1
                self.used = end
                return view
            del self.views[self.index :]
            self._owned = {id(v) for v, _ in self.views}
            self._derived.clear()
        end = self.used + math.prod(shape)
        if end > self.flat.numel():
            raise RuntimeError("internal error: IoU workspace too small")
        view = self.flat[self.used : end].view(shape)
        self.views.append((view, end))
        self._owned.add(id(view))
        self.index += 1
        self.used = end
        return view

    def cached(self, x: Tensor, key: str, make: Callable[[Tensor], T]) -> T:
        """``make(x)`` (views of ``x``), kept for as long as ``x`` is one of the views."""
        if id(x) not in self._owned:
            return make(x)
        found = self._derived.get((id(x), key))
        if found is None:
            found = self._derived[(id(x), key)] = make(x)
        return found

    def rows(self, x: Tensor) -> tuple[Tensor, ...]:
        """``x.unbind(0)``, `cached`."""
        return self.cached(x, "rows", Tensor.unbind)


_arenas = threading.local()


def on_cpu(device: torch.device) -> bool:
    """Whether the CPU layout applies: pieces spread over threads, kept workspaces (tests
    patch it to run the GPU layout, whole-tensor pieces with fresh buffers, on the CPU)."""
    return device.type == "cpu"


def arena(name: str, units: int, elements: int, dtype: torch.dtype, device: torch.device) -> Arena:
    """This thread's `Arena` of ``units`` buffers of ``elements`` (kept across calls on CPU)."""
    if not on_cpu(device):
        return Arena(None, dtype, device)
    flat = workspace(name, (units * elements,), dtype, device)
    cache = getattr(_arenas, "cache", None)
    if cache is None:
        cache = _arenas.cache = {}
    found = cache.get(name)
    if found is None or found.flat is not flat:
        found = cache[name] = Arena(flat, dtype, device)
    return found.reset()


class Side(NamedTuple):
    """Planar columns of one side's boxes, broadcastable against the other side's."""

    box: Tensor  # (4, ...): x1, y1, x2, y2
    lo: Tensor  # (2, ...): x1, y1 (a view of box)
    hi: Tensor  # (2, ...): x2, y2
    wh: Tensor  # (2, ...): w, h
    area: Tensor  # (...)
    angle: Tensor | None  # (...): atan(w / h) (CIoU only)


def side(box: Tensor, kind: int, arena: Arena | None = None) -> Side:
    """`Side` of planar boxes ``(4, ...)``; buffers from ``arena`` (or fresh)."""
    shape = box.shape[1:]
    take = arena.take if arena is not None else lambda *s: box.new_empty(s)
    wh = torch.sub(box[2:], box[:2], out=take(2, *shape))
    area = torch.mul(wh[0], wh[1], out=take(*shape))
    angle = None
    if kind == CIOU:
        angle = torch.div(wh[0], wh[1], out=take(*shape))
        # atan(w / h): +-pi/2 for h = 0, and 0 for a point box (0 / 0), as torchvision's limit.
        angle.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf).atan_()
    return Side(box, box[:2], box[2:], wh, area, angle)


def _nonzero(x: Tensor, eps: Tensor, tmp: Tensor) -> Tensor:
    """The eps rule, in place: ``x + eps`` where ``x == 0``, ``x`` (exactly) elsewhere."""
    return x.addcmul_(torch.eq(x, 0, out=tmp), eps)


def terms(
    a: Side,
    b: Side,
    kind: int,
    eps: Tensor,
    out: Tensor,
    arena: Arena,
    z: Tensor | None = None,
    go: Tensor | None = None,
) -> Tensor | None:
    """Write the measure of every pair into ``out``; with ``z``, its gradient coefficients.

    ``out`` has the broadcast shape of the pairs; ``z`` is ``(rows_of_z(kind), *out.shape)``;
    ``go`` (broadcastable to ``out``) multiplies the coefficients; ``eps`` is a 0-d tensor.
    """
    s = out.shape
    take, rows = arena.take, arena.rows
    tmp = take(*s)
    lo = torch.maximum(a.lo, b.lo, out=take(2, *s))
    ov = torch.minimum(a.hi, b.hi, out=take(2, *s)).sub_(lo)  # overlap sides d
    hull = None if kind == IOU else torch.add(a.wh, b.wh, out=lo).sub_(ov)  # enclosing sides
    ov.clamp_(min=0)  # intersection sides
    ov_x, ov_y = rows(ov)
    hull_x, hull_y = (None, None) if hull is None else rows(hull)
    inter = torch.mul(ov_x, ov_y, out=take(*s))
    union = torch.add(a.area, b.area, out=take(*s)).sub_(inter)
    pen = area_c = diag = None
    if kind == GIOU:
        area_c = torch.mul(hull_x, hull_y, out=take(*s))
        pen = torch.sub(area_c, union, out=take(*s))
        pen.div_(_nonzero(area_c, eps, tmp))  # (C - U) / C
    iou = torch.div(inter, _nonzero(union, eps, tmp), out=out if kind == IOU else inter)
    e = None
    if kind == GIOU:
        torch.sub(iou, pen, out=out)
    elif kind in (DIOU, CIOU):
        diag = torch.mul(hull_x, hull_x, out=take(*s)).addcmul_(hull_y, hull_y)
        _nonzero(diag, eps, tmp)
        e = torch.sub(a.box, b.box, out=take(4, *s))  # kept for the signs of the gradient
        e_lo, e_hi = arena.cached(e, "halves", lambda t: (t[:2], t[2:]))
        delta = torch.add(e_lo, e_hi, out=take(2, *s))  # twice the centre offset
        delta_x, delta_y = rows(delta)
        dist = torch.mul(delta_x, delta_x, out=take(*s)).addcmul_(delta_y, delta_y)
        pen = torch.div(dist, diag, out=dist)  # 4 rho^2 / Q
        torch.sub(iou, pen, alpha=0.25, out=out)
        if kind == CIOU:
            dt = torch.sub(b.angle, a.angle, out=take(*s))  # t' - t
            v = torch.mul(dt, dt, out=take(*s)).mul_(_K)
            alpha = torch.sub(v, iou, out=take(*s)).add_(1.0).clamp_min_(torch.finfo(v.dtype).tiny)
            alpha = torch.div(v, alpha, out=alpha)  # v / (1 - iou + v); 0 where v = 0
            out.addcmul_(alpha, v, value=-1.0)
    if z is None:
        return None
    z_u, z_m, z_j, z_d, z_a = arena.cached(z, "parts", _z_parts)
    # dm/dU through the areas (into z_u) and dm/dI, which also enters U.
    ru = torch.reciprocal(union, out=union)
    g_u = torch.mul(iou, ru, out=z_u)
    if kind == GIOU:
        rc = torch.reciprocal(area_c, out=area_c)
        torch.sub(rc, g_u, out=g_u)
    else:
        g_u.neg_()
    g_i = torch.sub(ru, g_u, out=ru)
    if go is not None:
        g_u.mul_(go)
        g_i.mul_(go)
    k_i = take(2, *s)  # dm/d(intersection sides): dm/dI times the other side, 0 where 0
    k_ix, k_iy = rows(k_i)
    torch.mul(ov_y, g_i, out=k_ix)
    torch.mul(ov_x, g_i, out=k_iy)
    k_i.mul_(ov.sign_())
    k_c, alpha_c = None, 1.0
    if kind == GIOU:
        g_c = pen.sub_(1.0).mul_(rc)  # dm/dC = -(1 - pen) / C
        if go is not None:
            g_c.mul_(go)
        k_c = take(2, *s)  # dm/d(enclosing sides)
        k_cx, k_cy = rows(k_c)
        torch.mul(hull_y, g_c, out=k_cx)
        torch.mul(hull_x, g_c, out=k_cy)
    elif kind in (DIOU, CIOU):
        rq = torch.reciprocal(diag, out=diag)
        if go is not None:
            rq.mul_(go)
        torch.mul(delta, rq, out=z_d)  # D: dm/d(lo or hi) = -D / 2 through the centres
        k_c = torch.mul(hull, pen.mul_(rq), out=hull)  # twice dm/dc = 2 c rho^2 / Q^2
        alpha_c = 0.5
        if kind == CIOU:
            torch.mul(alpha, dt, out=z_a)
            if go is not None:
                z_a.mul_(go)
    if e is None:
        e = torch.sub(a.box, b.box, out=take(4, *s))
    if k_c is None:
        z_m.copy_(k_i)
    else:
        torch.add(k_i, k_c, alpha=alpha_c, out=z_m)
        k_i.sub_(k_c, alpha=alpha_c)
    torch.mul(arena.cached(e, "pairs", _pairs).sign_(), k_i, out=z_j)
    return z


def _pairs(x: Tensor) -> Tensor:
    """``(4, ...)`` as ``(2, 2, ...)``: ``[(x1, y1), (x2, y2)]``."""
    return x.view(2, 2, *x.shape[1:])


def _z_parts(z: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Named blocks of the coefficients: ``gU``, ``M``, ``J`` as ``(2, 2, ...)``, ``D``, ``A``."""
    k = z.shape[0]
    return z[0], z[1:3], _pairs(z[3:7]), z[7:9] if k > 7 else None, z[9] if k > 9 else None


def fold_centre(z: Tensor, kind: int) -> None:
    """Add the centre term ``D`` to both halves of ``J`` (once, before `combine` of each side)."""
    if kind in (DIOU, CIOU):
        _, _, z_j, z_d, _ = _z_parts(z)
        z_j.add_(z_d)


def combine(z: Tensor, wh: Tensor, kind: int, sigma: float, arena: Arena) -> Tensor:
    """Twice the measure's gradient, lo corners negated: ``(4, ...)`` ``[-2 d/dlo, 2 d/dhi]``.

    ``z`` are the coefficients of `terms` (summed over the other side's boxes for pairwise
    problems) after `fold_centre`; ``wh`` this side's sizes ``(2, ...)``; ``sigma`` is 1 for
    box ``a``, -1 for ``b``. The caller multiplies by ``[-1/2, -1/2, 1/2, 1/2]`` (and its own
    factors) while storing, which makes it the gradient.
    """
    t = wh.shape[1:]
    take = arena.take
    z_u, z_m, z_j, _, z_a = arena.cached(z, "parts", _z_parts)
    w, h = arena.rows(wh)
    m_x, m_y = arena.rows(z_m) if z_m is not None else (None, None)
    gx = gy = z_u
    if kind == CIOU:
        nrm = torch.mul(w, w, out=take(*t)).addcmul_(h, h)
        nrm.add_(torch.eq(nrm, 0, out=take(*t)))  # 1 for a point box, whose W is 0 anyway
        cn = torch.div(z_a, nrm, out=nrm)
        gx = torch.add(z_u, cn, alpha=sigma * 2.0 * _K, out=take(*t))
        gy = torch.add(z_u, cn, alpha=-sigma * 2.0 * _K, out=cn)
    y = take(2, *t)  # 2 W + M
    y_x, y_y = arena.rows(y)
    torch.addcmul(m_x, h, gx, value=2.0, out=y_x)
    torch.addcmul(m_y, w, gy, value=2.0, out=y_y)
    out = take(4, *t)
    out_lo, out_hi = arena.cached(out, "halves", lambda x: (x[:2], x[2:]))
    j_lo, j_hi = arena.rows(z_j)
    torch.add(y, j_lo, alpha=sigma, out=out_lo)
    torch.sub(y, j_hi, alpha=sigma, out=out_hi)
    return out
