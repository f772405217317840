"""visionblocks: correct, tested, fast PyTorch building blocks for detection and segmentation.

Submodules (``visionblocks.losses``, ``visionblocks.ops``, ...) are imported lazily on first
attribute access, so ``import visionblocks`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from visionblocks._core.dispatch import (
    get_impl,
    set_impl,
    set_value_checks,
    use_impl,
    value_checks,
    value_checks_enabled,
)
from visionblocks._core.version import __version__

_SUBMODULES = (
    "backbones",
    "data",
    "deploy",
    "distributed",
    "features",
    "init",
    "kernels",
    "losses",
    "models",
    "nn",
    "ops",
    "registry",
    "transforms",
    "weights",
)

__all__ = [
    "__version__",
    "get_impl",
    "set_impl",
    "set_value_checks",
    "use_impl",
    "value_checks",
    "value_checks_enabled",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'visionblocks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*__all__, *_SUBMODULES})
