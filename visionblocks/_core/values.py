"""The switch for checks that read tensor values (private; re-exported by ``visionblocks``).

Type, dtype, shape and device checks cost nothing and always run. Checks of *values* (finite
target boxes with ``x2 > x1``, labels in range, binary masks, positive normalizers) make one
pass over the data. They are on by default, so a mistake gives a clear error instead of a
silently wrong loss; a training loop that has validated its data can turn them off with
``visionblocks.set_value_checks(False)``, ``with visionblocks.value_checks(False):`` or the
environment variable ``VISIONBLOCKS_VALUE_CHECKS=0``.

Where they run (`visionblocks._core.tensor_checks.reads_values` and ``asserts_on_device``):

- CPU tensors: the values are read and a mistake raises at once (``ValueError``, quoting the
  bad values).
- CUDA tensors: nothing is read on the host, so nothing waits for the GPU. A check that is
  cheap on the device runs as a device-side assert (``torch._assert_async``): a mistake
  surfaces at the next synchronisation as a CUDA error (``device-side assert triggered``)
  carrying the check's message, and leaves the CUDA context unusable. The other checks are
  skipped on CUDA (each says so in its docstring); to see their clear errors, run one batch
  on CPU.
- Meta and fake tensors (shape inference), ``torch.jit.trace``, ``torch.compile`` and
  ``torch.export``: skipped (a host read would freeze one input's answer into the graph).
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
    labels in range, binary targets, positive normalizers...) make a pass over the data: on
    by default; turn them off in a loop whose data you have validated, to save that pass. On
    CPU they raise at once; on CUDA they never make the host wait: they are device-side
    asserts (a failure is a CUDA error at the next synchronisation) or skipped, as this
    module's docstring describes.

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
