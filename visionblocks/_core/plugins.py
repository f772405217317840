"""Plugin discovery: the ``visionblocks.plugins`` entry-point group (see `visionblocks.registry`)."""

from __future__ import annotations

import threading
import warnings
from importlib import metadata

__all__ = ["PLUGIN_GROUP", "load_plugins"]

PLUGIN_GROUP = "visionblocks.plugins"
"""Entry-point group scanned for third-party plugins."""

_plugin_lock = threading.RLock()
_plugins_loaded = False


def _entry_points(group: str) -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=group))


def load_plugins(*, force: bool = False) -> list[str]:
    """Load every entry point of the ``visionblocks.plugins`` group (once per process).

    Args:
        force: Load again even if plugins were already loaded.

    Returns:
        list[str]: Names of the entry points that loaded successfully on this call.

    Examples:
        >>> names = load_plugins()  # usually called for you by the registries
        >>> isinstance(names, list)
        True
    """
    global _plugins_loaded
    if not isinstance(force, bool):
        raise TypeError(f"force must be bool, got {type(force).__name__} ({force!r})")
    with _plugin_lock:
        if _plugins_loaded and not force:
            return []
        # Set first: a plugin that looks names up while loading must not recurse.
        _plugins_loaded = True
        loaded = []
        for ep in _entry_points(PLUGIN_GROUP):
            try:
                target = ep.load()
                if callable(target):
                    target()
            except Exception as exc:
                warnings.warn(
                    f"visionblocks plugin {ep.name!r} ({ep.value}) failed to load and was "
                    f"skipped: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            else:
                loaded.append(ep.name)
        return loaded
