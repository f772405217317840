"""After a kernel failure: one warning per op and device, and the torch path from then on.

`visionblocks._core.dispatch.run_fused` handles a `KernelFailure` raised in forward; the kernels'
autograd Functions call `reference_grads` for one raised in backward. Both record the failure
here, so `visionblocks.kernels._support.unsupported_reason` routes later calls of the op on
that device to the torch path.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks.kernels._launch import KernelFailure

__all__ = ["REPORT_URL", "failed_reason", "note_failure", "reference_grads", "reset_failures"]

REPORT_URL = "https://github.com/visionblocks/visionblocks/issues"

_failures: dict[tuple[str, str], str] = {}
_failures_lock = threading.Lock()


def note_failure(op: str, device: torch.device, exc: BaseException) -> None:
    """Remember that ``op``'s kernel failed on ``device``, warning once per op and device."""
    key = (op, str(device))
    with _failures_lock:
        first = key not in _failures
        _failures[key] = f"{type(exc).__name__}: {exc}"
    if first:
        warnings.warn(
            f"visionblocks: the triton kernel of {op!r} failed on {device} ({exc}); {op!r} "
            f"uses the torch path on {device} from now on in this process. Please report this "
            f"at {REPORT_URL} with the output of `visionblocks list kernels`.",
            RuntimeWarning,
            stacklevel=3,
        )


def failed_reason(op: str, device: torch.device) -> str | None:
    """Why ``op``'s kernel is off on ``device`` after a failure, or None."""
    return _failures.get((op, str(device)))


def reset_failures() -> None:
    """Forget recorded failures (the kernels are tried again)."""
    with _failures_lock:
        _failures.clear()


def reference_grads(
    op: str,
    exc: KernelFailure,
    reference: Callable[..., Any] | None,
    args: Sequence[Any],
    needs: Sequence[bool],
    grad_outputs: Sequence[Tensor | None],
) -> tuple[Tensor | None, ...]:
    """Gradients of ``reference(*args)`` for a fused backward that failed.

    Used by the kernels' autograd Functions: after a `KernelFailure` in backward, the op's
    torch path is run again on the saved inputs and differentiated, so training goes on.

    Args:
        op: The op name (for the warning).
        exc: The failure; re-raised when ``reference`` is None (``impl="triton"`` forced).
        reference: The torch path, taking the same positional arguments as the kernel entry.
        args: Those arguments (tensors as saved in forward).
        needs: ``ctx.needs_input_grad`` (one flag per argument).
        grad_outputs: The gradients of the forward's outputs (None where undefined).

    Returns:
        tuple: One gradient (or None) per argument.
    """
    if reference is None:
        raise exc
    device = next(a.device for a in args if isinstance(a, Tensor))
    note_failure(op, device, exc)
    leaves = [
        a.detach().requires_grad_(need) if isinstance(a, Tensor) and need else a
        for a, need in zip(args, needs)
    ]
    with torch.enable_grad():
        outputs = reference(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
    wanted = [leaf for leaf, need in zip(leaves, needs) if need and isinstance(leaf, Tensor)]
    grads = iter(
        torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        if pairs and wanted
        else [None] * len(wanted)
    )
    return tuple(
        next(grads) if need and isinstance(a, Tensor) else None for a, need in zip(args, needs)
    )
