"""Shared numerics helpers for the test suite: one tolerance table, one comparison, one gradcheck."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pytest
import torch

#: Per-dtype (rtol, atol) used by every numerical comparison in the suite.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def tolerance(dtype: torch.dtype, scale: float = 1.0) -> dict[str, float]:
    """``rtol``/``atol`` keyword arguments for ``dtype``, optionally scaled up."""
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return {"rtol": rtol * scale, "atol": atol * scale}


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    scale: float = 1.0,
    check_dtype: bool = True,
    msg: str | None = None,
) -> None:
    """``torch.testing.assert_close`` with tolerances from :data:`TOLERANCES`.

    The tolerance is picked from ``dtype`` (default: the lower-precision dtype of the two).
    """
    if dtype is None:
        dtypes = [actual.dtype, expected.dtype]
        known = [d for d in dtypes if d in TOLERANCES]
        dtype = max(known, key=lambda d: TOLERANCES[d][0]) if known else actual.dtype
    torch.testing.assert_close(
        actual,
        expected,
        check_dtype=check_dtype,
        msg=msg,
        equal_nan=False,
        **tolerance(dtype, scale),
    )


def gradcheck(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    fast_mode: bool = False,
) -> bool:
    """Float64 ``torch.autograd.gradcheck`` of ``fn`` at ``inputs`` (cast to float64).

    Floating inputs are cast to float64 and made to require grad; other inputs pass through.
    Returns True, or raises with gradcheck's report. ``fast_mode``: gradcheck's check of
    random projections of the Jacobian instead of every entry (for slow functions).
    """
    prepared = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.detach().to(torch.float64).requires_grad_(True)
        prepared.append(x)
    return torch.autograd.gradcheck(
        fn, tuple(prepared), eps=eps, atol=atol, rtol=rtol, fast_mode=fast_mode
    )


def cpu_and_cuda() -> list:
    """Parameters for ``@pytest.mark.parametrize("device", cpu_and_cuda())``; CUDA skips cleanly."""
    return [
        pytest.param(torch.device("cpu"), id="cpu"),
        pytest.param(
            torch.device("cuda"),
            id="cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
        ),
    ]


def cuda_autocast_dtypes(reason: str) -> list:
    """Parameters ``fp16`` and ``bf16`` for CUDA autocast tests, each skipped with ``reason``
    without a GPU (bf16 also without bfloat16 support)."""
    cuda = torch.cuda.is_available()
    return [
        pytest.param(torch.float16, marks=pytest.mark.skipif(not cuda, reason=reason), id="fp16"),
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(
                not (cuda and torch.cuda.is_bf16_supported()), reason=reason + " with bfloat16"
            ),
            id="bf16",
        ),
    ]


def same_tensors(a: Sequence[torch.Tensor | None], b: Sequence[torch.Tensor | None]) -> bool:
    """Whether two lists of tensors (gradients, ``None`` where absent) are bitwise equal."""
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b)
    )


def same_buffers(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two modules' buffers (BatchNorm running statistics…) are bitwise equal."""
    return all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers(), strict=True))


def write_marker(path: str) -> None:
    """What `MaliciousPickle` runs when unpickled: a file whose existence proves it ran."""
    with open(path, "w") as f:
        f.write("pwned")


class MaliciousPickle:
    """An object whose unpickling calls `write_marker` (a stand-in for arbitrary code)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (write_marker, (self.path,))


def resident_file_kib(path) -> int:
    """Resident KiB of this process's memory mappings of the file ``path`` (from
    ``/proc/self/smaps``): how much of a memory-mapped checkpoint has been read."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                inside = len(fields) == 6 and fields[5] == os.path.realpath(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total
