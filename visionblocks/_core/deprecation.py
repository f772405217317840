"""Deprecated names: old spellings that keep working for one release and warn once.

A public module lists its renamed names in a dict and serves them from its module-level
``__getattr__`` (PEP 562), so the alias is the very same object as the new name
(``FocalLoss is SigmoidFocalLoss``), stays out of ``__all__`` and ``dir()``, and warns the
first time each old name is looked up in the process:

    _DEPRECATED = {"FocalLoss": ("SigmoidFocalLoss", "0.3")}

    def __getattr__(name):
        return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
"""

from __future__ import annotations

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
    """Resolve ``name`` through ``renamed`` (``{old: (new, removed_in)}``) for a module's ``__getattr__``.

    Args:
        module: The module's ``__name__`` (for the messages).
        namespace: The module's ``globals()``, holding the new names.
        renamed: Old name → (new name, version that removes the old one).
        name: The attribute looked up.

    Returns:
        The object bound to the new name.

    Raises:
        AttributeError: If ``name`` is neither a deprecated name nor defined (the normal
            message for a missing module attribute).

    Examples:
        >>> ns = {"new_fn": len}
        >>> deprecated_attribute("pkg", ns, {"old_fn": ("new_fn", "0.3")}, "old_fn") is len
        True
    """
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
            f"use {module}.{new} (same object)",
            DeprecationWarning,
            stacklevel=3,
        )
    return namespace[new]


def reset_warned() -> None:
    """Forget which deprecated names already warned (for tests).

    Examples:
        >>> reset_warned()
    """
    with _lock:
        _warned.clear()
