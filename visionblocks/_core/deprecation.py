"""Deprecated names: old spellings that keep working for one release and warn once.

A public module lists its renamed names in a dict and serves them from its module-level
``__getattr__`` (PEP 562), so the alias is the very same object as the new name
(``FocalLoss is SigmoidFocalLoss``), stays out of ``__all__`` and ``dir()``, and warns the
first time each old name is looked up in the process:

    _DEPRECATED = {"FocalLoss": ("SigmoidFocalLoss", "0.3")}

    def __getattr__(name):
        return deprecated_attribute(__name__, globals(), _DEPRECATED, name)

A name that moved to another module is given with its new module
(``{"warp_sample": ("visionblocks.transforms.warp_sample", "0.3")}``) and imported by name on
first use: the new module may sit above the old one in the layers.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["deprecated_attribute", "reset_warned"]

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def deprecated_attribute(
    module: str, namespace: Mapping[str, Any], renamed: Mapping[str, tuple[str, str]], name: str
) -> Any:
    """Resolve ``name`` through ``renamed`` (``{old: (new, removed_in)}``; a dotted ``new``
    is a name that moved to that module) for a module's ``__getattr__``, warning once per
    name; ``namespace`` is the module's ``globals()``. An unknown ``name`` raises the usual
    ``AttributeError``."""
    if name not in renamed:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, removed_in = renamed[name]
    key = (module, name)
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in {removed_in}; "
            f"use {new if '.' in new else f'{module}.{new}'} (same object)",
            DeprecationWarning,
            stacklevel=3,
        )
    if "." in new:  # moved: imported by name (not an import statement), on first use
        home, _, attr = new.rpartition(".")
        return getattr(importlib.import_module(home), attr)
    return namespace[new]


def reset_warned() -> None:
    """Forget which deprecated names already warned (for tests)."""
    with _lock:
        _warned.clear()
