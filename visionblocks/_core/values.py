"""The switch for checks that read tensor values (private; re-exported by ``visionblocks``).

Type, dtype, shape and device checks cost nothing and always run. Checks of *values* (finite
target boxes with ``x2 > x1``, labels in range, binary masks, positive normalizers) read the
data once, which on a hot path costs time and, for CUDA tensors, a host synchronisation. They
are on by default, so a mistake gives a clear error instead of a silently wrong loss; a
training loop that has validated its data can turn them off with
``visionblocks.set_value_checks(False)``, ``with visionblocks.value_checks(False):`` or the
environment variable ``VISIONBLOCKS_VALUE_CHECKS=0``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENV_VALUE_CHECKS", "set_value_checks", "value_checks", "value_checks_enabled"]

ENV_VALUE_CHECKS = "VISIONBLOCKS_VALUE_CHECKS"

_state = threading.local()
_default: list[bool | None] = [None]  # set_value_checks; None: from the environment


def _from_environment() -> bool:
    raw = os.environ.get(ENV_VALUE_CHECKS, "1").strip().lower()
    if raw in ("1", "true", "yes", "on", ""):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_VALUE_CHECKS} must be 0 or 1 (or true/false), got {raw!r}")


def value_checks_enabled() -> bool:
    """Whether checks that read tensor values run (innermost `value_checks`, then
    `set_value_checks`, then ``VISIONBLOCKS_VALUE_CHECKS``, then True)."""
    stack = getattr(_state, "stack", None)
    if stack:
        return stack[-1]
    if _default[0] is not None:
        return _default[0]
    return _from_environment()


def _check_bool(enabled: object) -> bool:
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be bool, got {type(enabled).__name__} ({enabled!r})")
    return enabled


def set_value_checks(enabled: bool) -> None:
    """Turn the checks that read tensor values on or off for the whole process.

    Shape, dtype and device checks always run. Value checks (finite boxes with ``x2 > x1``,
    labels in range, binary targets, positive normalizers...) read the data: on by default;
    turn them off in a loop whose data you have validated, to save that pass (and, on CUDA,
    a host synchronisation).

    Args:
        enabled: True to run them (the default), False to skip them.

    Raises:
        TypeError: ``enabled`` is not a bool.

    Examples:
        >>> import visionblocks
        >>> visionblocks.set_value_checks(False)
        >>> visionblocks.value_checks_enabled()
        False
        >>> visionblocks.set_value_checks(True)
    """
    _default[0] = _check_bool(enabled)


@contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """Context manager turning value checks on or off in this thread; restores on exit.

    Args:
        enabled: True to run them, False to skip them.

    Raises:
        TypeError: ``enabled`` is not a bool.

    Examples:
        >>> import visionblocks
        >>> with visionblocks.value_checks(False):
        ...     visionblocks.value_checks_enabled()
        False
    """
    _check_bool(enabled)
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(enabled)
    try:
        yield
    finally:
        stack.pop()
