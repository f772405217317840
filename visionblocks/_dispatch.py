"""Choosing an implementation for ops that have a fused kernel.

Every such op takes ``impl: str = "auto"``:

- ``"torch"``: the PyTorch reference (also the CPU path). Always available.
- ``"triton"``: the fused Triton kernel. Needs triton; runs on CUDA tensors, or on CPU tensors
  when ``TRITON_INTERPRET=1`` was set before triton was imported (how the tests check kernels).
- ``"auto"``: the process default (see below); when that is also ``"auto"``, triton for CUDA
  tensors when triton imports, the op has a kernel, the GPU's compute capability and the
  dtypes are supported (`visionblocks.kernels._support`) and the kernel has not failed on
  that device before; torch otherwise. If a kernel fails to compile, load or launch, the op
  warns once, runs the torch path and stays on it for that device (`run_fused`).

The process default is, by priority: `set_impl` / `use_impl`, then the environment
variable ``VISIONBLOCKS_IMPL``, then ``"auto"``. ``VISIONBLOCKS_DISABLE_TRITON=1`` makes
triton unavailable (everything runs on the torch path; forcing ``"triton"`` raises).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import torch

from visionblocks._check import check_choice
from visionblocks.kernels._support import capability_reason, unsupported_reason

T = TypeVar("T")

__all__ = ["IMPLS", "get_impl", "resolve_impl", "run_fused", "set_impl", "use_impl"]

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


def resolve_impl(impl: str, op: str, *tensors: torch.Tensor) -> str:
    """Resolve ``impl`` for one call of ``op`` on ``tensors`` to ``"torch"`` or ``"triton"``.

    Args:
        impl: The op's ``impl`` argument.
        op: The op name, as listed by ``visionblocks.kernels.available()["ops"]``.
        *tensors: The call's tensor inputs (their devices decide ``"auto"``).

    Returns:
        str: ``"torch"`` or ``"triton"``.

    Raises:
        ValueError: For an unknown ``impl``.
        RuntimeError: If ``"triton"`` is forced but cannot run here (no triton, no kernel for
            ``op``, CPU tensors without ``TRITON_INTERPRET=1``, or a GPU or dtype the kernels
            do not support); the message says why.

    Examples:
        >>> import torch
        >>> resolve_impl("torch", "sigmoid_focal_loss", torch.zeros(3))
        'torch'
        >>> resolve_impl("auto", "sigmoid_focal_loss", torch.zeros(3))  # CPU tensors
        'torch'
    """
    from visionblocks import kernels

    _validate(impl, "impl")
    if impl == "auto":
        impl = get_impl()
    if impl == "torch":
        return "torch"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if impl == "auto":
        if (
            on_cuda
            and kernels.has_kernel(op)
            and kernels.triton_available()
            and not unsupported_reason(op, tensors)
        ):
            return "triton"
        return "torch"
    # Forced triton: explain precisely why it cannot run rather than silently falling back.
    if not kernels.has_kernel(op):
        raise RuntimeError(f"impl='triton' was requested but {op!r} has no triton kernel")
    if not kernels.triton_available():
        raise RuntimeError(
            f"impl='triton' was requested for {op!r} but triton is unavailable: "
            f"{kernels.triton_unavailable_reason()}"
        )
    if not on_cuda and not kernels.interpret_mode():
        raise RuntimeError(
            f"impl='triton' for {op!r} needs CUDA tensors, or TRITON_INTERPRET=1 set before "
            "triton is imported to run kernels on CPU tensors"
        )
    if on_cuda:
        reason = capability_reason(_capability(tensors[0].device), (t.dtype for t in tensors))
        if reason:
            raise RuntimeError(f"impl='triton' was requested for {op!r} but {reason}")
    return "triton"


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _forced(impl: str) -> bool:
    return impl == "triton" or (impl == "auto" and get_impl() == "triton")


def run_fused(op: str, impl: str, reference: Callable[..., T], *args: Any) -> T:
    """Run ``op``'s triton kernel on ``args``, falling back to ``reference`` if it fails.

    Called by an op once `resolve_impl` chose ``"triton"``. The kernel entry point receives
    ``reference`` too, for its backward. If triton fails to compile, load or launch a kernel
    (`KernelFailure`), ``impl="auto"`` warns once per op and device, runs ``reference`` (the
    torch path, same arguments) and routes the op to torch on that device from then on;
    ``impl="triton"`` raises.

    Args:
        op: The op name (a key of `visionblocks.kernels.KERNEL_OPS`).
        impl: The op's ``impl`` argument.
        reference: The torch path, called as ``reference(*args)``.
        *args: The kernel entry point's arguments.

    Returns:
        The op's result.

    Raises:
        KernelFailure: If the kernel fails and ``impl="triton"`` was forced.
    """
    from visionblocks.kernels import load_kernel
    from visionblocks.kernels._fallback import note_failure
    from visionblocks.kernels._launch import KernelFailure, LaunchLimitError

    fallback = None if _forced(impl) else reference
    try:
        return load_kernel(op)(*args, reference=fallback)
    except KernelFailure as exc:
        if fallback is None:
            raise
        if isinstance(exc, LaunchLimitError):  # this shape only; the kernel is fine
            return reference(*args)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        note_failure(op, device, exc)
        return reference(*args)
