"""The lean torch path of `visionblocks.losses.focal.sigmoid_focal_loss`.

One ``torch.autograd.Function``: forward computes the loss *and* its analytic gradient in one
sweep, saves only the gradient, and backward is one multiplication by the incoming gradient
(none when that gradient is 1, as after a summed loss).

Exact forms. With ``p = sigmoid(x)`` and ``q = sigmoid(-x)`` (both computed directly, never
``1 - p``), ``l = log1p(exp(-|x|)) = -log1p(-min(p, q))``, a target ``t`` in ``[0, 1]`` and
``a_t = alpha t + (1 - alpha)(1 - t)`` (times the weight, times 0 where ignored):

    ce       = lerp(max(x, 0), max(-x, 0), t) + l          (BCE with logits)
    m        = lerp(p, q, t)                               (= 1 - p_t)
    p - t    = lerp(p, -q, t)
    loss     = a_t ce m^g
    dloss/dx = a_t [(p - t) m^g + g (1 - 2t) ce p q m^(g-1)]

``lerp(a, b, t)`` evaluates ``b - (b - a)(1 - t)`` for ``t >= 1/2`` (``1 - t`` exact there), so
no term is formed by cancellation: for binary targets every quantity has a relative error of
a few float eps whatever the logit (e.g. ``x = 14.7, t = 1``: ``m = 4.1e-7`` and
``loss = 1.9e-20`` to float32 precision, where ``1 - p_t`` by subtraction gives ``5.4e-20``).
For ``g < 1``, ``m^(g-1)`` is formed as ``m^g / m`` (0 where ``m = 0``, where ``p q = 0`` too).

Class-index targets: every element is first computed as a negative (``t = 0``:
``loss = (1-alpha) p^g ce``, ``grad = (1-alpha) p^g (p + g ce q)`` with ``ce = max(x, 0) + l``,
no one-hot tensor), then each row's positive element is patched with one gather and one
scatter of ``N`` elements.

Float32 CPU calls without a weight (and ``gamma`` a multiple of 1/2) run the same formulas
in one C loop instead (`visionblocks.losses._focal_native`); what follows is the sweep for
every other case, and the fallback when no C compiler is available.

Speed on CPU: the rows are cut into parts that `visionblocks._core.parallel.parallel_for` spreads
over threads running torch with one intra-op thread each (one fork/join per call, so a busy
neighbour delays one part instead of every op); each part runs its ops on chunks of about
``_CHUNK`` elements held in per-thread `visionblocks._core.parallel.workspace` buffers
(cache-resident, allocated once). Summed losses add per-part sums in part order, so results do
not depend on the thread count. On GPUs the sweep is one chunk of whole-tensor ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from visionblocks._core.parallel import parallel_for, workspace
from visionblocks._core.reduce import compute_dtype
from visionblocks.losses import _focal_native

__all__ = ["SigmoidFocalFunction"]

_CHUNK = 1 << 17  # elements per chunk: fits L2 with the buffers (bench focal_loss_4m*)
_CHUNKS_PER_PART = 2  # parts of 2 chunks balance two threads without much per-part cost
_MAX_WORKSPACE = 1 << 20  # larger chunks (one huge row) use fresh buffers, not kept ones
_ONE = torch.ones(())
_NAMES = ("x", "t", "p", "q", "l", "ce", "d", "e", "m", "at", "u", "um", "k", "keep", "acc")


def _buffers(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> dict:
    """Chunk-sized scratch buffers: per-thread workspace on CPU, fresh tensors otherwise."""
    shape = (rows, cols)
    if device.type == "cpu" and rows * cols <= _MAX_WORKSPACE:
        return {n: workspace(f"focal.{n}", shape, dtype, device) for n in _NAMES}
    return {n: torch.empty(shape, dtype=dtype, device=device) for n in _NAMES}


def _pow(m: Tensor, g: float, out: Tensor) -> Tensor:
    """``m ** g`` for ``g > 0``; small integer and half-integer exponents avoid slow ``pow``."""
    if g == 1:
        return m
    if g == 2:
        return torch.mul(m, m, out=out)
    if g == 3:
        return torch.mul(m, m, out=out).mul_(m)
    if g == 0.5:
        return torch.sqrt(m, out=out)
    if g == 1.5:
        return torch.sqrt(m, out=out).mul_(m)
    return torch.pow(m, g, out=out)


def _sigmoids(x: Tensor, b: dict) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(p, q, -l, -x)``: ``sigmoid(x)``, ``sigmoid(-x)``, ``-log1p(exp(-|x|))`` and ``-x``."""
    nx = torch.neg(x, out=b["d"])
    p = torch.sigmoid(x, out=b["p"])
    q = torch.sigmoid(nx, out=b["q"])
    neg_l = torch.minimum(p, q, out=b["l"]).neg_().log1p_()  # log(max(p, q)) = -l
    return p, q, neg_l, nx


def _emit(a: Tensor, b: Tensor | None, out: Tensor, accumulate: bool) -> None:
    """``out = a * b``, or ``out += a * b`` when accumulating a summed loss (``b`` None: 1)."""
    if accumulate:
        out.add_(a) if b is None else out.addcmul_(a, b)
    else:
        out.copy_(a) if b is None else torch.mul(a, b, out=out)


def _m_factor(m: Tensor, um: Tensor, g: float, at: Tensor | None, b: dict) -> Tensor | None:
    """``a_t m^(g-1)`` (None for 1), given ``um = a_t m^g``; bounded for ``g < 1`` as ``um / m``."""
    if g == 1:
        return at
    if g < 1:
        tiny = torch.finfo(m.dtype).tiny
        return torch.div(um, torch.clamp_min(m, tiny, out=b["u"]), out=b["u"])
    v = m if g == 2 else _pow(m, g - 1.0, b["u"])
    return v if at is None else torch.mul(v, at, out=b["u"])


def _float_chunk(x, t, at, g: float, b: dict, loss_out, acc: bool, grad_out) -> None:
    """Float targets: loss into ``loss_out`` (or added to it), gradient into ``grad_out``."""
    p, q, neg_l, nx = _sigmoids(x, b)
    relu_nx = torch.clamp_min(nx, 0, out=b["e"])
    ce = torch.lerp(torch.clamp_min(x, 0, out=b["ce"]), relu_nx, t, out=b["ce"]).sub_(neg_l)
    if g == 0:
        _emit(ce, at, loss_out, acc)
        if grad_out is not None:
            d = torch.lerp(p, q.neg_(), t, out=grad_out)
            if at is not None:
                d.mul_(at)
        return
    m = torch.lerp(p, q, t, out=b["m"])
    mg = _pow(m, g, b["um"])
    um = mg if at is None else torch.mul(mg, at, out=b["um"])
    _emit(ce, um, loss_out, acc)
    if grad_out is None:
        return
    v = _m_factor(m, um, g, at, b)
    e = torch.mul(p, q, out=b["e"]).mul_(ce)
    e.mul_(torch.add(torch.full((), g, dtype=x.dtype), t, alpha=-2.0 * g, out=b["k"]))
    if v is not None:
        e.mul_(v)
    d = torch.lerp(p, q.neg_(), t, out=b["d"])
    torch.addcmul(e, d, um, out=grad_out)


def _negative_chunk(x, factors, scale: float, g: float, b, loss_out, acc: bool, grad_out):
    """Class-index targets, every element as a negative (``t = 0``); see the module docstring."""
    # t = 0: where 1 - p cancels (p near 1) q only enters next to larger terms, so the
    # subtraction keeps every value exact to a few eps and saves a second sigmoid.
    p = torch.sigmoid(x, out=b["p"])
    q = torch.add(_ONE, p, alpha=-1.0, out=b["q"])
    neg_l = torch.minimum(p, q, out=b["l"]).neg_().log1p_()
    ce = torch.clamp_min(x, 0, out=b["ce"]).sub_(neg_l)
    pg = _pow(p, g, b["m"]) if g > 0 else None
    if pg is p:
        pg = torch.mul(p, scale, out=b["m"])
    elif pg is None:
        pg = b["m"].fill_(scale)
    elif scale != 1.0:
        pg.mul_(scale)
    for f in factors:
        pg.mul_(f)
    _emit(ce, pg, loss_out, acc)
    if grad_out is not None:
        tmp = torch.mul(ce, q, out=b["e"])
        torch.add(p, tmp, alpha=g, out=tmp)  # p + g ce (1 - p)
        torch.mul(tmp, pg, out=grad_out)


def _patch_positives(x, labels, w, alpha, g, ignore, loss, grad) -> Tensor | None:
    """Replace each row's ``t = 0`` value at its positive class by the ``t = 1`` value.

    Returns the change of the summed loss when ``loss`` is None (summed mode).
    """
    num_classes = x.shape[1]
    cdt = compute_dtype(x.dtype)
    pos = (labels >= 0) & (labels < num_classes)
    if ignore is not None:
        pos &= labels != ignore
    pos = pos.unsqueeze(1)
    col = labels.clamp(0, num_classes - 1).long().unsqueeze(1)
    xp = x.gather(1, col).to(cdt)
    factor = pos.to(cdt) if w is None else pos * w.gather(1, col)
    p, q = torch.sigmoid(xp), torch.sigmoid(-xp)
    ce1 = F.softplus(-xp)  # log1p(exp(-x)) where it matters: accurate for confident logits
    a1, a0 = (1.0, 1.0) if alpha is None else (alpha, 1.0 - alpha)
    qg = q.pow(g)
    loss1 = a1 * qg * ce1 * factor
    if grad is not None:
        grad1 = -a1 * qg * (q + g * ce1 * p) * factor
        grad.scatter_(1, col, torch.where(pos, grad1, grad.gather(1, col)))
    if loss is not None:
        loss.scatter_(1, col, torch.where(pos, loss1.to(loss.dtype), loss.gather(1, col)))
        return None
    return (loss1 - a0 * p.pow(g) * F.softplus(xp) * factor).sum()


def _sweep(x, targets, w, alpha, g, ignore, reduce_sum, out_dtype, need_grad):
    """Loss (element-wise or its sum), gradient (or None) and count of non-ignored elements."""
    native = _focal_native.sweep(x, targets, w, alpha, g, ignore, reduce_sum, out_dtype, need_grad)
    if native is not None:  # float32 on CPU: the C kernel
        return native
    rows, num_classes = x.shape
    cdt, dev = compute_dtype(x.dtype), x.device
    index = targets.dim() == 1
    loss = None if reduce_sum else torch.empty((rows, num_classes), dtype=out_dtype, device=dev)
    grad = torch.empty((rows, num_classes), dtype=cdt, device=dev) if need_grad else None
    step = rows if dev.type != "cpu" else max(1, min(rows, _CHUNK // max(num_classes, 1)))
    wc = None if w is None else w.to(cdt)
    scale = 1.0 if alpha is None else 1.0 - alpha
    scale_t = torch.full((), scale, dtype=cdt)  # a 0-d CPU tensor broadcasts on any device

    def part(lo: int, hi: int) -> tuple:
        full = _buffers(min(step, hi - lo), num_classes, cdt, dev)
        acc = full["acc"].zero_() if loss is None else None
        counts, deltas = [], []  # deltas: summed mode, the change made by the positives
        for start in range(lo, hi, step):
            stop = min(hi, start + step)
            n = stop - start
            b = full if n == full["x"].shape[0] else {k: v[:n] for k, v in full.items()}
            xc, tc = x[start:stop], targets[start:stop]
            xc = xc if xc.dtype == cdt else b["x"].copy_(xc)
            loss_out = b["acc"] if loss is None else loss[start:stop]
            grad_out = None if grad is None else grad[start:stop]
            if index:
                factors = [] if wc is None else [wc[start:stop]]
                if ignore is not None:
                    keep = tc != ignore
                    counts.append(keep.sum() * num_classes)
                    factors.append(keep.unsqueeze(1))
                _negative_chunk(xc, factors, scale, g, b, loss_out, loss is None, grad_out)
                wp = None if wc is None else wc[start:stop]
                lp = None if loss is None else loss[start:stop]
                deltas.append(
                    _patch_positives(x[start:stop], tc, wp, alpha, g, ignore, lp, grad_out)
                )
                continue
            tc = tc if tc.dtype == cdt else b["t"].copy_(tc)
            at = None
            if alpha is not None:
                at = torch.add(scale_t, tc, alpha=2.0 * alpha - 1.0, out=b["at"])
            if wc is not None:
                at = wc[start:stop] if at is None else at.mul_(wc[start:stop])
            if ignore is not None:
                keep = torch.ne(tc, ignore, out=b["keep"])
                counts.append(keep.sum())
                tc = torch.mul(tc, keep, out=b["t"])
                at = keep if at is None else torch.mul(at, keep, out=b["at"])  # at: maybe w
            _float_chunk(xc, tc, at, g, b, loss_out, loss is None, grad_out)
        total = None if acc is None else acc.sum()
        if total is not None and deltas:
            total = total + torch.stack(deltas).sum()
        return total, (torch.stack(counts).sum() if counts else None)

    grain = step * _CHUNKS_PER_PART if dev.type == "cpu" else max(rows, 1)
    results = parallel_for(part, rows, grain)
    if ignore is None or not results:
        count = torch.tensor(rows * num_classes if ignore is None else 0, device=dev)
    else:
        count = torch.stack([c for _, c in results]).sum()
    if loss is None:
        loss = torch.zeros((), dtype=cdt, device=dev)
        if results:
            loss = torch.stack([s for s, _ in results]).sum()
    return loss, grad, count


class SigmoidFocalFunction(torch.autograd.Function):
    """Lean torch path: forward computes loss and gradient together, backward one multiply.

    Inputs: ``x (Tensor[R, C])``, ``targets`` (``Tensor[R, C]`` floating or bool, or
    ``Tensor[R]`` integer class indices), ``w (Tensor[R, C])`` or None (a broadcast view is
    fine), ``alpha`` (float or None), ``gamma``, ``ignore`` (number or None), ``reduce_sum``
    (return the 0-d sum instead of the element-wise loss) and ``out_dtype`` (of the
    element-wise loss). Outputs: the loss, in the compute dtype when summed, and the number of
    non-ignored elements (a non-differentiable int64 tensor). No double backward.
    """

    @staticmethod
    def forward(ctx, x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype):
        need_grad = ctx.needs_input_grad[0]
        loss, grad, count = _sweep(
            x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype, need_grad
        )
        ctx.save_for_backward(grad)
        ctx.input_dtype = x.dtype
        ctx.mark_non_differentiable(count)
        return loss, count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_count):
        (grad,) = ctx.saved_tensors
        unit = grad_loss.dim() == 0 and grad_loss.device.type == "cpu" and grad_loss.item() == 1
        if unit and grad.dtype == ctx.input_dtype:  # after a plain sum: the gradient itself
            return grad, None, None, None, None, None, None, None
        out = torch.empty(grad.shape, dtype=ctx.input_dtype, device=grad.device)
        torch.mul(grad, grad_loss, out=out)
        return out, None, None, None, None, None, None, None
