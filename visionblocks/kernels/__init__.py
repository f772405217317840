"""Triton kernels: one module per op, holding its kernels, launcher and ``autograd.Function``.

An op imports its kernel module directly, inside the branch where
`visionblocks._core.dispatch.use_triton` chose the kernel, so importing visionblocks never
imports triton; only this package does. `visionblocks.kernels._launch` is the shared
launcher (guards, failures, the formula as fallback).
"""

from __future__ import annotations

import pkgutil
from typing import Any

from visionblocks._core.namespace import public_dir

__all__ = ["available"]
__dir__ = public_dir(__name__, __all__)


def available() -> dict[str, Any]:
    """A small report on the fused fast paths in this process (``visionblocks list kernels``).

    Returns:
        dict: ``triton`` (the installed version, or None), ``reason`` (why not, or ""), ``interpret`` (``TRITON_INTERPRET=1``), ``cuda`` (device name or None),
        ``default_impl`` and ``kernels`` (the kernel modules, one per op family).

    Examples:
        >>> sorted(available())
        ['cuda', 'default_impl', 'interpret', 'kernels', 'reason', 'triton']
    """
    import importlib.metadata

    import torch

    from visionblocks._core import dispatch

    try:
        version: str | None = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        version = None
    reason = dispatch._triton_missing()
    return {
        "triton": None if reason else version,
        "reason": reason,
        "interpret": dispatch._truthy("TRITON_INTERPRET"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "default_impl": dispatch.get_impl(),
        "kernels": sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name[0] != "_"),
    }
