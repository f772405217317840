"""visionblocks: correct, tested, fast PyTorch building blocks for detection and segmentation.

Submodules (``visionblocks.losses``, ``visionblocks.ops``, ...) are imported lazily on first
attribute access, so ``import visionblocks`` stays cheap.
"""

from __future__ import annotations

import importlib
import pkgutil
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

# Every public submodule, as the package directory lists it (a new one cannot be missed); the
# deprecated ``demo`` is reached only by importing it.
_SUBMODULES = frozenset(
    info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
) - {"demo"}

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
