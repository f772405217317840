"""Fused Triton kernels for the sigmoid focal loss: one pass forward, one pass backward.

Called by `visionblocks.losses.focal.sigmoid_focal_loss` (after validation) as
``sigmoid_focal_loss_triton(x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype,
reference=...)``; ``reference`` is that module's torch formula with the same arguments, run
instead if a kernel fails, and what the kernels are tested against (forward and backward).

Layout: the logits are viewed as ``(R, C)`` and processed flat, ``BLOCK`` elements per
program. Class-index targets are read as one integer per row, ``t = (label == column)``, so
no one-hot tensor is built and a label outside ``[0, C)`` never matches. A weight is read
through its ``(row, column)`` strides, so per-class and per-anchor weights stay
un-expanded. Only the target kind, the reduction and the compute dtype are constexprs, and
`canonical_inputs` casts the operands to a few dtypes: a handful of specialisations covers
every call, each compiled for real GPU targets in the tests. Forward writes the element-wise
loss, or one partial sum (and count) per program, which torch adds up; backward recomputes
the element terms and writes ``dloss/dx * grad_out`` in one pass (saving ``dloss/dx`` would
move as many bytes and hold an ``(R, C)`` buffer).

Numerics, in float32 (float64 for float64 inputs), with ``e = exp(-|x|)``: ``p`` and
``q = 1 - p`` are each formed from ``e`` without cancellation,
``ce = log1p(e) + (1 - t) max(x, 0) + t max(-x, 0)`` and ``m = 1 - p_t = t q + (1 - t) p``:

    loss     = a_t ce m^g
    dloss/dx = a_t m^g [(1 - t) p - t q + g (1 - 2t) ce (p q / m)]

``p q / m <= 1``, so the gradient never forms ``m^(g - 1)`` and stays finite for ``g < 1``
and saturated logits; ``m^g = exp2(g log2 m)`` with ``0^g = 0`` (``0^0 = 1``).
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

__all__ = ["sigmoid_focal_loss_triton"]
__dir__ = public_dir(__name__, __all__)

_NUM_WARPS = 8
_BLOCKS = {torch.float64: 512}  # elements per program: 4 per thread, 2 for float64 (registers)
_BLOCK = 1024
_TINY = tl.constexpr(1.1754943508222875e-38)  # float32 tiny: clamp before log2 and division


@triton.jit
def _focal_terms(
    x_ptr, t_ptr, w_ptr, offs, mask, C, w_sr, w_sc, alpha, gamma, zero_pow,
    has_alpha, has_ignore, ignore_i, ignore_f, INDEX: tl.constexpr, CDT: tl.constexpr,
):  # fmt: skip
    """Loss, dloss/dx and the keep mask of the elements at ``offs``."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(CDT)
    row = offs // C
    col = offs - row * C
    if INDEX:
        label = tl.load(t_ptr + row, mask=mask, other=-1)
        t = (label == col).to(CDT)
        keep = mask & ((has_ignore == 0) | (label != ignore_i))
    else:
        t = tl.load(t_ptr + offs, mask=mask, other=0).to(CDT)
        keep = mask & ((has_ignore == 0) | (t != ignore_f))
        t = tl.where(keep, t, 0.0)
    e = tl.exp(-tl.abs(x))
    d = 1.0 + e
    inv = 1.0 / d
    nonneg = x >= 0
    p = tl.where(nonneg, inv, e * inv)
    q = tl.where(nonneg, e * inv, inv)
    # log1p(e) = log(d) * e / (d - 1), exact where d rounds to 1 (then log1p(e) = e).
    l1p = tl.where(d == 1.0, e, tl.log(d) * e / tl.where(d == 1.0, 1.0, d - 1.0))
    ce = l1p + (1.0 - t) * tl.maximum(x, 0.0) + t * tl.maximum(-x, 0.0)  # no cancellation
    m = t * q + (1.0 - t) * p
    safe_m = tl.maximum(m, _TINY)
    mg = tl.where(m > 0, tl.exp2(gamma * tl.log2(safe_m)), zero_pow)
    at = tl.where(keep, 1.0, 0.0).to(CDT)
    at = tl.where(has_alpha != 0, at * (alpha * t + (1.0 - alpha) * (1.0 - t)), at)
    # No weight: a single 1 read through zero strides (one cached load per program).
    at = at * tl.load(w_ptr + row * w_sr + col * w_sc, mask=mask, other=0.0).to(CDT)
    loss = at * ce * mg
    ratio = (p * q) / safe_m
    dloss = at * mg * ((1.0 - t) * p - t * q + gamma * (1.0 - 2.0 * t) * ce * ratio)
    return loss, dloss, keep


@jit
def _focal_fwd_kernel(
    x_ptr, t_ptr, w_ptr, loss_ptr, part_ptr, count_ptr,
    n: tl.int64, C: tl.int32, w_sr: tl.int64, w_sc: tl.int64,
    alpha: tl.float32, gamma: tl.float32, zero_pow: tl.float32,
    has_alpha: tl.int32, has_ignore: tl.int32, ignore_i: tl.int64, ignore_f: tl.float32,
    INDEX: tl.constexpr, REDUCE: tl.constexpr, CDT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    loss, _, keep = _focal_terms(
        x_ptr, t_ptr, w_ptr, offs, mask, C, w_sr, w_sc, alpha, gamma, zero_pow,
        has_alpha, has_ignore, ignore_i, ignore_f, INDEX, CDT,
    )  # fmt: skip
    if REDUCE:
        tl.store(part_ptr + pid, tl.sum(tl.where(mask, loss, 0.0), axis=0))
        tl.store(count_ptr + pid, tl.sum(keep.to(tl.int32), axis=0))
    else:
        tl.store(loss_ptr + offs, loss.to(loss_ptr.dtype.element_ty), mask=mask)


@jit
def _focal_bwd_kernel(
    x_ptr, t_ptr, w_ptr, go_ptr, grad_ptr,
    n: tl.int64, C: tl.int32, w_sr: tl.int64, w_sc: tl.int64,
    alpha: tl.float32, gamma: tl.float32, zero_pow: tl.float32,
    has_alpha: tl.int32, has_ignore: tl.int32, ignore_i: tl.int64, ignore_f: tl.float32,
    INDEX: tl.constexpr, GO_SCALAR: tl.constexpr, CDT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _, dloss, _ = _focal_terms(
        x_ptr, t_ptr, w_ptr, offs, mask, C, w_sr, w_sc, alpha, gamma, zero_pow,
        has_alpha, has_ignore, ignore_i, ignore_f, INDEX, CDT,
    )  # fmt: skip
    if GO_SCALAR:
        go = tl.load(go_ptr).to(CDT)
    else:
        go = tl.load(go_ptr + offs, mask=mask, other=0.0).to(CDT)
    tl.store(grad_ptr + offs, (dloss * go).to(grad_ptr.dtype.element_ty), mask=mask)


def _cdt(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _block(dtype: torch.dtype) -> int:
    return _BLOCKS.get(dtype, _BLOCK)


def canonical_inputs(
    x: Tensor, targets: Tensor, w: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """The kernels' operands: ``x``, targets, weight base and the weight's row/column strides.

    Only a few dtypes reach the kernels, so every launchable specialisation is compiled and
    checked ahead of time (`visionblocks.kernels._compile`): class indices as int64, bool
    targets as uint8, float targets in ``x``'s dtype or the compute dtype (cast otherwise),
    and the weight in the compute dtype, read through its strides (a broadcast weight stays
    un-expanded; no weight is a single 1 read with zero strides).
    """
    cdt = _cdt(x.dtype)
    x = prepare(x)
    if targets.dtype == torch.bool:
        targets = targets.view(torch.uint8)
    elif not targets.is_floating_point():
        targets = targets.to(torch.int64)
    elif targets.dtype not in (x.dtype, cdt):
        targets = targets.to(cdt)
    targets = prepare(targets)
    if w is None:
        return x, targets, torch.ones(1, dtype=cdt, device=x.device), 0, 0
    # The distinct values only: broadcast (stride 0) axes collapse to size 1.
    base = w[tuple(slice(0, 1) if s == 0 else slice(None) for s in w.stride())]
    base = prepare(base.to(cdt))
    return (
        x,
        targets,
        base,
        base.stride(0) if base.shape[0] > 1 else 0,
        base.stride(1) if base.shape[1] > 1 else 0,
    )


def _scalars(x: Tensor, targets: Tensor, w_sr: int, w_sc: int, alpha, gamma, ignore) -> dict:
    """Arguments shared by both kernels besides the tensors."""
    index = targets.dtype == torch.int64
    return {
        "n": x.numel(),
        "C": x.shape[1],
        "w_sr": w_sr,
        "w_sc": w_sc,
        "alpha": 0.0 if alpha is None else float(alpha),
        "gamma": float(gamma),
        "zero_pow": 1.0 if gamma == 0 else 0.0,
        "has_alpha": int(alpha is not None),
        "has_ignore": int(ignore is not None),
        "ignore_i": int(ignore) if index and ignore is not None else 0,
        "ignore_f": float(ignore) if not index and ignore is not None else 0.0,
        "INDEX": index,
        "CDT": tl.float64 if x.dtype == torch.float64 else tl.float32,
        "BLOCK": _block(x.dtype),
    }


class _SigmoidFocalTriton(torch.autograd.Function):
    """Autograd glue: the entry point's arguments; outputs the loss and the count."""

    @staticmethod
    def forward(ctx, x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype, reference):
        xk, tk, wk, w_sr, w_sc = canonical_inputs(x, targets, w)
        # For a fallback backward: the torch path's own arguments (x as the kernel read it).
        ctx.args = (xk, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype)
        ctx.reference = reference
        cdt = _cdt(x.dtype)
        n = xk.numel()
        grid = (max(1, triton.cdiv(n, _block(x.dtype))),)
        scalars = _scalars(xk, tk, w_sr, w_sc, alpha, gamma, ignore)
        tensors = {"x_ptr": xk, "t_ptr": tk, "w_ptr": wk}
        if reduce_sum:
            parts = torch.zeros(grid[0], dtype=cdt, device=x.device)
            counts = torch.zeros(grid[0], dtype=torch.int32, device=x.device)
            if n:
                launch(
                    "sigmoid_focal_loss", _focal_fwd_kernel, grid, _NUM_WARPS, **tensors, loss_ptr=parts,
                    part_ptr=parts, count_ptr=counts, REDUCE=True, **scalars,
                )  # fmt: skip
            loss = parts.sum()
            count = counts.sum() if ignore is not None else torch.tensor(n, device=x.device)
        else:
            loss = torch.empty(x.shape, dtype=out_dtype, device=x.device)
            if n:
                launch(
                    "sigmoid_focal_loss", _focal_fwd_kernel, grid, _NUM_WARPS, **tensors, loss_ptr=loss,
                    part_ptr=torch.empty(1, dtype=cdt, device=x.device),
                    count_ptr=torch.empty(1, dtype=torch.int32, device=x.device),
                    REDUCE=False, **scalars,
                )  # fmt: skip
            count = torch.tensor(n, device=x.device)
        ctx.save_for_backward(xk, tk, wk)
        ctx.strides = (w_sr, w_sc)
        ctx.mark_non_differentiable(count)
        return loss, count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_count):
        x, targets, w = ctx.saved_tensors
        grad = torch.empty_like(x)
        n = x.numel()
        _, _, _, alpha, gamma, ignore, _, _ = ctx.args
        try:
            if n:
                go = prepare(grad_loss)
                launch(
                    "sigmoid_focal_loss", _focal_bwd_kernel, (triton.cdiv(n, _block(x.dtype)),),
                    _NUM_WARPS,
                    x_ptr=x, t_ptr=targets, w_ptr=w, go_ptr=go, grad_ptr=grad,
                    GO_SCALAR=go.numel() == 1 and go.dim() == 0,
                    **_scalars(x, targets, *ctx.strides, alpha, gamma, ignore),
                )  # fmt: skip
        except KernelFailure as exc:
            grads = reference_grads(
                "sigmoid_focal_loss", exc, ctx.reference, ctx.args,
                ctx.needs_input_grad[:8], (grad_loss, None),
            )  # fmt: skip
            return (*grads, None)
        return grad, None, None, None, None, None, None, None, None


@with_fallback("sigmoid_focal_loss")
def sigmoid_focal_loss_triton(
    x: Tensor,
    targets: Tensor,
    w: Tensor | None,
    alpha: float | None,
    gamma: float,
    ignore: float | None,
    reduce_sum: bool,
    out_dtype: torch.dtype,
    reference: Callable[..., tuple[Tensor, Tensor]] | None = None,
) -> tuple[Tensor, Tensor]:
    """Fused sigmoid focal loss on ``x (Tensor[R, C])``; inputs already validated.

    Args:
        x (Tensor[R, C]): Logits (float16, bfloat16, float32 or float64).
        targets (Tensor[R, C] or Tensor[R]): Float (or bool) targets, or integer class indices.
        w (Tensor[R, C], optional): Element weight; any strides (broadcast views welcome).
        alpha: Positive weight in ``[0, 1]``, or None for no alpha weighting.
        gamma: Focusing parameter ``>= 0``.
        ignore: Target value to ignore (rows for class indices), or None.
        reduce_sum: Return the 0-d sum (compute dtype) instead of the element-wise loss.
        out_dtype: Dtype of the element-wise loss.
        reference: The torch formula with the same first eight arguments and outputs; run
            instead if a kernel fails (None: raise instead).

    Returns:
        tuple: The loss, and the number of non-ignored elements (int64, not differentiable).

    Raises:
        KernelFailure: If a kernel fails to compile, load or launch and ``reference`` is None.

    Examples:
        >>> x = torch.zeros(2, 3, device="cuda")  # doctest: +SKIP
        >>> labels = torch.tensor([0, 3], device="cuda")  # doctest: +SKIP
        >>> loss, count = sigmoid_focal_loss_triton(  # doctest: +SKIP
        ...     x, labels, None, 0.25, 2.0, None, True, torch.float32)
        >>> loss, count  # doctest: +SKIP
        (tensor(0.6931, device='cuda:0'), tensor(6, device='cuda:0'))
    """
    return _SigmoidFocalTriton.apply(
        x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype, reference
    )
