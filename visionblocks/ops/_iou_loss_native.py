"""CPU fast path of the aligned IoU measures and losses: a small C kernel, built on first use.

Why: the torch path (`visionblocks.ops._iou_loss_torch`) runs some 40 column ops per piece of
pairs, each a pass over memory; on 1M pairs that stays near 4x torchvision. One C loop per
pair (``_iou_loss_kernel.c``, next to this file) reads the 8 coordinates once and writes the
value and the gradients, with the formulas and the eps rule of `visionblocks.ops._iou_core`.

How: `visionblocks._core.native.NativeLibrary` builds and loads it (``ctypes`` calls release the
GIL), and parts of ``grain`` pairs run on torch's own OpenMP team, one parallel region per call
(`visionblocks._core.native.NativeLibrary.run_parts`). A summed call adds each part's values in double lanes of a fixed order, then the
parts in part order: the sum depends on ``n`` and ``grain`` only, never on the thread count.

Without a compiler, on Windows, or with ``VISIONBLOCKS_DISABLE_NATIVE=1``, `native_sweep`
returns ``None`` and the torch path runs; `native_unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from visionblocks._core.native import ENV_DISABLE, NativeLibrary, plain

__all__ = ["ENV_DISABLE", "LIBRARY", "native_sweep", "native_unavailable_reason"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURE = [_I64, _PTR, _PTR, _I64, ctypes.c_float, _I64, _PTR, _PTR, _PTR, _I64, _PTR]
LIBRARY = NativeLibrary(
    "iou_loss_kernel",
    Path(__file__).with_name("_iou_loss_kernel.c"),
    {"vb_iou_aligned_f32_parts": (_SIGNATURE + [_I64] * 3, _I64)},
    parallel=True,
)
_BOX = 16  # bytes of one float32 box


def native_unavailable_reason() -> str | None:
    """Why the C kernel is not used (``None`` when it is); builds it on the first call."""
    return LIBRARY.reason()


def native_sweep(
    pred: Tensor,
    target: Tensor,
    kind: int,
    eps: Tensor,
    *,
    loss: bool,
    reduce_sum: bool,
    need_pred: bool,
    need_target: bool,
    grain: int,
) -> tuple[Tensor, Tensor | None, Tensor | None] | None:
    """`visionblocks.ops._iou_loss_torch.aligned_sweep` in C, or ``None`` (use the torch path).

    Runs for float32 ``(N, 4)`` CPU boxes with storage and no trace, compile or forward-mode
    dual to honour (`visionblocks._core.native.plain`), when the kernel is available. ``eps`` is
    the 0-d tensor of the torch path; ``grain`` the pairs per part.
    """
    if (
        pred.dtype != torch.float32
        or target.dtype != torch.float32
        or eps.numel() != 1
        or not plain([pred, target, eps], grad_ok=True)
    ):
        return None
    fns = LIBRARY.functions()
    if fns is None:
        return None
    fn = fns["vb_iou_aligned_f32_parts"]
    n = pred.shape[0]
    p, t = pred.detach().contiguous(), target.detach().contiguous()
    values = None if reduce_sum else torch.empty(n, dtype=torch.float32)
    grads = [torch.empty(n, 4) if need else None for need in (need_pred, need_target)]
    n_parts = -(-n // grain)
    sums = torch.zeros(n_parts, dtype=torch.float64)
    ptrs = [None if x is None else x.data_ptr() for x in (values, *grads)]
    args = (
        n,
        p.data_ptr(),
        t.data_ptr(),
        kind,
        float(eps),
        int(loss),
        *ptrs,
        grain,
        sums.data_ptr(),
    )
    LIBRARY.run_parts(fn, args, n_parts)
    if values is None:
        total = 0.0
        for s in sums.tolist():  # part order
            total += s
        values = torch.tensor(total, dtype=torch.float32)
    return values, grads[0], grads[1]
