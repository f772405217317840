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
import importlib.metadata
import re
import sys
from collections.abc import Iterable

import torch

__all__ = [
    "DTYPE_MIN_CAPABILITY",
    "MIN_CAPABILITY",
    "NONDETERMINISTIC",
    "OLD_TRITON_DTYPE_MIN_CAPABILITY",
    "capability_reason",
    "nondeterministic_reason",
    "triton_version",
    "unsupported_reason",
]

MIN_CAPABILITY: tuple[int, int] = (7, 5)
"""Oldest CUDA compute capability the kernels are compiled and checked for (Turing)."""

DTYPE_MIN_CAPABILITY: dict[torch.dtype, tuple[int, int]] = {}
"""Dtypes that need a newer GPU than `MIN_CAPABILITY` (none with triton 3.3 or newer: the
kernels load and store bfloat16 but compute in float32, which triton compiles for ``sm_75``
too; the compile test keeps this table and the compile results consistent both ways)."""

OLD_TRITON_DTYPE_MIN_CAPABILITY: dict[tuple[int, int], dict[torch.dtype, tuple[int, int]]] = {
    (3, 3): {torch.bfloat16: (8, 0)},
}
"""Triton releases older than a key (major, minor) → what they add to `DTYPE_MIN_CAPABILITY`.
Triton 3.0 to 3.2 (torch 2.4 to 2.6) convert bfloat16 with ``cvt.f32.bf16``, an ``sm_80``
instruction that ``ptxas`` refuses for ``sm_75``; from 3.3 on the conversion they emit
assembles for ``sm_75``. Found by compiling every specialisation for ``sm_75``, ``sm_80``
and ``sm_90`` with triton 3.0, 3.2, 3.3, 3.4, 3.5, 3.6, 3.8 and 3.9, and a bfloat16
specialisation with 3.1 (``docs/reference/kernels.md``)."""


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


@functools.cache
def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the triton that is imported, else of the installed one; ``None``
    without triton (then no kernel runs) or for a version that does not parse.

    Reads ``triton.__version__`` when triton is already imported (so a triton shadowing
    the installed one on ``sys.path`` counts), else the installed distribution's metadata:
    this module never imports triton.
    """
    text = getattr(sys.modules.get("triton"), "__version__", None)
    if not isinstance(text, str):
        try:
            text = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            return None
    return _parse_version(text)


@functools.cache
def _dtype_min_capability(version: tuple[int, int] | None) -> dict[torch.dtype, tuple[int, int]]:
    table = dict(DTYPE_MIN_CAPABILITY)
    for before, extra in OLD_TRITON_DTYPE_MIN_CAPABILITY.items():
        if version is not None and version < before:
            for dtype, cc in extra.items():
                table[dtype] = max(table.get(dtype, cc), cc)
    return table


def capability_reason(
    capability: tuple[int, int],
    dtypes: Iterable[torch.dtype],
    triton: tuple[int, int] | None = None,
) -> str:
    """Why the kernels cannot run on a GPU of ``capability`` for ``dtypes`` ("" if they can).

    Args:
        capability: The GPU's compute capability ``(major, minor)``.
        dtypes: The dtypes of the kernel's tensors.
        triton: The triton release ``(major, minor)`` that would compile the kernels
            (default: `triton_version`).

    Examples:
        >>> capability_reason((9, 0), [torch.bfloat16])
        ''
        >>> capability_reason((7, 0), [torch.float32])
        'the kernels need compute capability 7.5 or newer; this GPU has 7.0'
        >>> capability_reason((7, 5), [torch.bfloat16], triton=(3, 2))
        'torch.bfloat16 needs compute capability 8.0 or newer with triton 3.2 (3.3 or newer: 7.5); this GPU has 7.5'
    """
    have = f"{capability[0]}.{capability[1]}"
    if tuple(capability) < MIN_CAPABILITY:
        need = f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
        return f"the kernels need compute capability {need} or newer; this GPU has {have}"
    version = triton if triton is not None else triton_version()
    table = _dtype_min_capability(version)
    for dtype in dict.fromkeys(dtypes):
        need_cc = table.get(dtype)
        if need_cc is None or tuple(capability) >= need_cc:
            continue
        need = f"{need_cc[0]}.{need_cc[1]} or newer"
        base = _dtype_min_capability(None)
        if version is not None and need_cc != base.get(dtype):  # only older tritons need it
            fixed = min(k for k, v in OLD_TRITON_DTYPE_MIN_CAPABILITY.items() if dtype in v)
            newer = base.get(dtype, MIN_CAPABILITY)
            need += (
                f" with triton {version[0]}.{version[1]} ({fixed[0]}.{fixed[1]} or newer: "
                f"{newer[0]}.{newer[1]})"
            )
        return f"{dtype} needs compute capability {need}; this GPU has {have}"
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
