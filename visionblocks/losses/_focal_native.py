"""CPU fast path of the sigmoid focal loss: one C loop for the loss and its gradient.

Why: the torch sweep (`visionblocks.losses._focal_torch`) runs about thirty torch ops per
chunk; each op is a pass over the chunk and holds the GIL between ops, so two threads spend
much of their time queueing for it (measured: 23.5 ms for 4M elements forward and backward on
2 threads, 32 ms on one). ``_focal_kernel.c`` computes the same formulas (its header) in one
pass per element with vectorisable exp and log1p polynomials, and releases the GIL for a whole
part.

How: the rows are cut into parts of about ``_PART`` elements that run on torch's own OpenMP
team, one parallel region per call (`visionblocks._core.native.NativeLibrary.run_parts`; parts
depend only on the shape, so a summed loss adds per-part sums in part order and is independent
of the thread count); the kernel is built by `visionblocks._core.native.NativeLibrary`.

Used for float32 CPU logits without a weight, float32 targets of the same shape or integer
class indices, and ``gamma`` a multiple of 1/2 in ``[0, 7.5]``; `sweep` returns ``None``
otherwise (or when the kernel cannot be built), and the torch sweep runs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from visionblocks._core.native import NativeLibrary, plain

__all__ = ["LIBRARY", "sweep"]

_PART = 1 << 16  # elements per part: ~0.2 ms of work, 64 parts for 4M elements
_I64, _PTR, _F32, _F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_double
LIBRARY = NativeLibrary(
    "focal_kernel",
    Path(__file__).with_name("_focal_kernel.c"),
    {
        "vb_focal_f32_parts": (
            [_PTR, _PTR, _I64, _I64, _I64, _F32, _I64, _I64, _F64, _PTR, _PTR, _I64, _PTR, _PTR]
            + [_I64] * 3,
            _I64,
        )
    },
    parallel=True,
)


def _gamma2(gamma: float) -> int | None:
    g2 = 2.0 * gamma
    return int(g2) if g2 == int(g2) and 0 <= g2 <= 15 else None


def sweep(
    x: Tensor,
    targets: Tensor,
    w: Tensor | None,
    alpha: float | None,
    gamma: float,
    ignore: float | None,
    reduce_sum: bool,
    out_dtype: torch.dtype,
    need_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor] | None:
    """``(loss, grad, count)`` as `visionblocks.losses._focal_torch` computes them, or ``None``
    when the C kernel does not apply (see the module docstring)."""
    index = targets.dim() == 1
    g2 = _gamma2(gamma)
    if (
        w is not None
        or g2 is None
        or x.dtype != torch.float32
        or x.dim() != 2
        or (not reduce_sum and out_dtype != torch.float32)
        or (index and (targets.dtype.is_floating_point or targets.dtype == torch.bool))
        or (not index and targets.dtype != torch.float32)
        or (alpha is not None and not 0.0 <= alpha <= 1.0)
        or not plain([x, targets], grad_ok=True)
    ):
        return None
    lib = LIBRARY.functions()
    if lib is None:
        return None
    fn = lib["vb_focal_f32_parts"]
    rows, cols = x.shape
    xc = x.contiguous()
    tc = targets.to(torch.int64).contiguous() if index else targets.contiguous()
    loss = None if reduce_sum else torch.empty((rows, cols), dtype=torch.float32)
    grad = torch.empty((rows, cols), dtype=torch.float32) if need_grad else None
    a = -1.0 if alpha is None else float(alpha)
    use_ignore = ignore is not None
    grain = max(1, _PART // max(cols, 1))
    n_parts = -(-rows // grain)
    sums = torch.zeros(n_parts, dtype=torch.float64)
    counts = torch.zeros(n_parts, dtype=torch.int64)
    args = (
        xc.data_ptr(), tc.data_ptr(), int(index), rows, cols, a, g2, int(use_ignore),
        float(ignore) if use_ignore else 0.0, None if loss is None else loss.data_ptr(),
        None if grad is None else grad.data_ptr(), grain, sums.data_ptr(), counts.data_ptr(),
    )  # fmt: skip
    LIBRARY.run_parts(fn, args, n_parts)
    count = torch.tensor(int(counts.sum()) if use_ignore else rows * cols)
    if loss is None:
        total = 0.0
        for s in sums.tolist():  # in part order: independent of the thread count
            total += s
        loss = torch.tensor(total, dtype=torch.float32)
    return loss, grad, count
