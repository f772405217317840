"""Choosing an implementation for ops that have a fused kernel.

Every such op takes ``impl: str = "auto"``:

- ``"torch"``: the PyTorch reference (also the CPU path). Always available.
- ``"triton"``: the fused Triton kernel. Needs triton; runs on CUDA tensors, or on CPU tensors
  when ``TRITON_INTERPRET=1`` was set before triton was imported (how the tests check kernels).
- ``"auto"``: the process default (see below); when that is also ``"auto"``, triton for CUDA
  tensors when triton imports, the op has a kernel, the GPU's compute capability and the
  dtypes are supported (`visionblocks.kernels._support`) and the kernel has not failed on
  that device before; torch otherwise. If a kernel fails to compile, load or launch, the op
  warns once, runs the torch path and stays on it for that device (`visionblocks.kernels._dispatch.run_fused`).

Deterministic mode (``torch.use_deterministic_algorithms(True)``, e.g. from
``seed_everything(seed, deterministic=True)``): ``"auto"`` never picks a kernel listed in
`visionblocks.kernels._support.NONDETERMINISTIC` (none today: every kernel gives the same bits
from run to run), and forcing ``"triton"`` for one on CUDA raises like torch's own
nondeterministic ops (warns with ``warn_only=True``).

The process default is, by priority: `set_impl` / `use_impl`, then the environment
variable ``VISIONBLOCKS_IMPL``, then ``"auto"``. ``VISIONBLOCKS_DISABLE_TRITON=1`` makes
triton unavailable (everything runs on the torch path; forcing ``"triton"`` raises).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from visionblocks._core.checks import check_choice

__all__ = ["IMPLS", "forced_triton", "get_impl", "set_impl", "use_impl", "validate_impl"]

Impl = Literal["auto", "torch", "triton"]
IMPLS: tuple[str, ...] = ("auto", "torch", "triton")
ENV_IMPL = "VISIONBLOCKS_IMPL"

_state = threading.local()
_global_default: list[str | None] = [None]


def _validate(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, one of {IMPLS}; got {type(name).__name__}")
    check_choice(what, name, IMPLS)
    return name


def get_impl() -> str:
    """The current default implementation name.

    Returns:
        str: ``"auto"``, ``"torch"`` or ``"triton"``.

    Raises:
        ValueError: If ``VISIONBLOCKS_IMPL`` holds an unknown name.

    Examples:
        >>> import visionblocks
        >>> with visionblocks.use_impl("torch"):
        ...     visionblocks.get_impl()
        'torch'
    """
    local = getattr(_state, "stack", None)
    if local:
        return local[-1]
    if _global_default[0] is not None:
        return _global_default[0]
    env = os.environ.get(ENV_IMPL, "").strip()
    if env:
        return _validate(env, ENV_IMPL)
    return "auto"


def set_impl(name: str | None) -> None:
    """Set the process-wide default implementation (``None`` restores env/``"auto"``).

    Args:
        name: ``"auto"``, ``"torch"``, ``"triton"`` or ``None``.

    Raises:
        ValueError: For an unknown name, listing the valid ones.

    Examples:
        >>> import visionblocks
        >>> visionblocks.set_impl("torch")
        >>> visionblocks.get_impl()
        'torch'
        >>> visionblocks.set_impl(None)
    """
    _global_default[0] = None if name is None else _validate(name, "impl")


@contextmanager
def use_impl(name: str) -> Iterator[None]:
    """Context manager setting the default implementation in this thread; restores on exit.

    Args:
        name: ``"auto"``, ``"torch"`` or ``"triton"``.

    Raises:
        ValueError: For an unknown name.

    Examples:
        >>> import visionblocks
        >>> with visionblocks.use_impl("torch"):
        ...     pass
    """
    _validate(name, "impl")
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def validate_impl(name: object, what: str = "impl") -> str:
    """Return ``name`` if it is one of `IMPLS`; raise the boundary error otherwise."""
    return _validate(name, what)


def forced_triton(impl: str) -> bool:
    """Whether ``impl`` (an op's argument) forces the triton path, directly or by default."""
    return impl == "triton" or (impl == "auto" and get_impl() == "triton")
