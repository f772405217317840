"""Which GPUs and dtypes the kernels support, and which are deterministic (no triton import).

`visionblocks.kernels._dispatch` asks `unsupported_reason` before ``impl="auto"`` picks a kernel, and
raises with the same reason when ``impl="triton"`` is forced where a kernel cannot run. The
table follows what `visionblocks.kernels._compile` checks for every kernel: compiled with
triton's own compiler and ``ptxas`` for ``sm_75``, ``sm_80`` and ``sm_90``.

`NONDETERMINISTIC` lists the kernels that are not bitwise reproducible on a GPU; under
``torch.use_deterministic_algorithms(True)`` `visionblocks.kernels._dispatch.resolve_impl`
does not pick them for ``impl="auto"`` and raises (or warns, with ``warn_only=True``) when
``impl="triton"`` forces one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

__all__ = [
    "DTYPE_MIN_CAPABILITY",
    "MIN_CAPABILITY",
    "NONDETERMINISTIC",
    "capability_reason",
    "nondeterministic_reason",
    "unsupported_reason",
]

MIN_CAPABILITY: tuple[int, int] = (7, 5)
"""Oldest CUDA compute capability the kernels are compiled and checked for (Turing)."""

DTYPE_MIN_CAPABILITY: dict[torch.dtype, tuple[int, int]] = {}
"""Dtypes that need a newer GPU than `MIN_CAPABILITY` (none today: the kernels load and store
bfloat16 but compute in float32, which triton compiles for ``sm_75`` too; the compile test
keeps this table and the compile results consistent both ways)."""


NONDETERMINISTIC: dict[str, str] = {}
"""Op name → why its triton kernel can give different bits from run to run on a GPU (e.g.
``"backward adds with tl.atomic_add"``). Empty today: every kernel writes each output element
from exactly one program, reduces inside a program in a fixed order, and leaves cross-program
sums to torch (``parts.sum()``), with fixed block sizes (no autotuning).
``tests/package/test_determinism_mode.py`` scans the kernel sources for atomics and autotuning and
fails unless the op is listed here."""


def nondeterministic_reason(op: str) -> str:
    """Why ``op``'s kernel is not deterministic on a GPU ("" if it is, or has no kernel).

    Examples:
        >>> nondeterministic_reason("sigmoid_focal_loss")
        ''
    """
    return NONDETERMINISTIC.get(op, "")


def capability_reason(capability: tuple[int, int], dtypes: Iterable[torch.dtype]) -> str:
    """Why the kernels cannot run on a GPU of ``capability`` for ``dtypes`` ("" if they can).

    Examples:
        >>> capability_reason((9, 0), [torch.bfloat16])
        ''
        >>> capability_reason((7, 0), [torch.float32])
        'the kernels need compute capability 7.5 or newer; this GPU has 7.0'
    """
    have = f"{capability[0]}.{capability[1]}"
    if tuple(capability) < MIN_CAPABILITY:
        need = f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
        return f"the kernels need compute capability {need} or newer; this GPU has {have}"
    for dtype in dict.fromkeys(dtypes):
        need_cc = DTYPE_MIN_CAPABILITY.get(dtype)
        if need_cc is not None and tuple(capability) < need_cc:
            return f"{dtype} needs compute capability {need_cc[0]}.{need_cc[1]} or newer; this GPU has {have}"
    return ""


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def unsupported_reason(op: str, tensors: Iterable[torch.Tensor]) -> str:
    """Why ``op``'s kernel should not run on these CUDA tensors ("" if it can).

    Covers the GPU's compute capability and the tensors' dtypes, and an earlier failure of
    the kernel on that device in this process (see `visionblocks.kernels._fallback`).
    """
    from visionblocks.kernels._fallback import failed_reason

    tensors = list(tensors)
    device = tensors[0].device
    failed = failed_reason(op, device)
    if failed:
        return f"its kernel failed earlier on {device} ({failed})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return capability_reason(_capability(index), (t.dtype for t in tensors))
