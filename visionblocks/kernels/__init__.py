"""Triton kernels and their autograd glue.

This package is the only place that imports ``triton``; everything else reaches kernels
through `visionblocks.kernels._dispatch` (`resolve_impl`, `run_fused`). Kernel modules are imported lazily, so importing
visionblocks never imports triton.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

from visionblocks._core.namespace import public_dir

__all__ = [
    "KERNEL_OPS",
    "available",
    "has_kernel",
    "interpret_mode",
    "load_kernel",
    "triton_available",
    "triton_unavailable_reason",
]
__dir__ = public_dir(__name__, __all__)

ENV_DISABLE = "VISIONBLOCKS_DISABLE_TRITON"

KERNEL_OPS: dict[str, str] = {
    "sigmoid_focal_loss": "focal:sigmoid_focal_loss_triton",
    "generalized_box_iou_loss": "iou:generalized_box_iou_loss_triton",
    "distance_box_iou_loss": "iou:distance_box_iou_loss_triton",
    "complete_box_iou_loss": "iou:complete_box_iou_loss_triton",
    "local_filter": "local_filter:local_filter_triton",
    "local_attention2d": "local_attention:local_attention2d_triton",
    "rotated_box_iou": "rotated_iou:rotated_box_iou_triton",
    "best_box_iou": "assign:best_box_iou_triton",
    "match_anchors": "assign:box_iou_reaches_triton",
}
"""Op name → ``"module:function"`` of its triton entry point (a module of this package)."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@functools.cache
def _probe_triton() -> tuple[str | None, str]:
    """Import triton once; return ``(version, "")`` or ``(None, reason)``."""
    if _truthy(os.environ.get(ENV_DISABLE)):
        return None, f"disabled by {ENV_DISABLE}=1"
    try:
        import triton
        import triton.language
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return None, f"import failed ({type(exc).__name__}: {exc})"
    return str(getattr(triton, "__version__", "unknown")), ""


def triton_available() -> bool:
    """Whether triton imports (memoised; ``VISIONBLOCKS_DISABLE_TRITON=1`` turns it off).

    Examples:
        >>> isinstance(triton_available(), bool)
        True
    """
    return _probe_triton()[0] is not None


def triton_unavailable_reason() -> str:
    """Why triton is unavailable (empty string when it is available)."""
    return _probe_triton()[1]


def interpret_mode() -> bool:
    """Whether triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), i.e. on CPU."""
    return _truthy(os.environ.get("TRITON_INTERPRET"))


def _check_op(op: Any) -> None:
    if not isinstance(op, str):
        raise TypeError(f"op must be a str (an op name), got {type(op).__name__} ({op!r})")


def has_kernel(op: str) -> bool:
    """Whether ``op`` has a triton kernel in this package.

    Examples:
        >>> has_kernel("no_such_op")
        False
    """
    _check_op(op)
    return op in KERNEL_OPS


def load_kernel(op: str) -> Any:
    """Import and return the triton entry point of ``op`` (imports triton).

    Raises:
        KeyError: If ``op`` has no kernel.
        RuntimeError: If triton is unavailable.
        TypeError: If ``op`` is not a str.
    """
    _check_op(op)
    if op not in KERNEL_OPS:
        raise KeyError(f"{op!r} has no triton kernel; ops with kernels: {sorted(KERNEL_OPS)}")
    if not triton_available():
        raise RuntimeError(f"triton is unavailable: {triton_unavailable_reason()}")
    module, _, name = KERNEL_OPS[op].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def available() -> dict[str, Any]:
    """A small report on the fused fast paths in this process.

    Returns:
        dict: ``triton`` (version or None), ``reason`` (why not, if None), ``interpret``
        (``TRITON_INTERPRET=1``), ``cuda`` (device name or None), ``default_impl`` and
        ``ops`` (sorted names of ops with a triton kernel).

    Examples:
        >>> report = available()
        >>> sorted(report)
        ['cuda', 'default_impl', 'interpret', 'ops', 'reason', 'triton']
    """
    import torch

    from visionblocks._core.dispatch import get_impl

    version, reason = _probe_triton()
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "triton": version,
        "reason": reason,
        "interpret": interpret_mode(),
        "cuda": cuda,
        "default_impl": get_impl(),
        "ops": sorted(KERNEL_OPS),
    }
