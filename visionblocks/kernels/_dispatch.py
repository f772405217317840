"""Routing one op call to its triton kernel or its torch path (`resolve_impl`, `run_fused`).

The policy (``impl`` names, the process default, `visionblocks.use_impl`) lives in
`visionblocks._core.dispatch`; this module adds what needs the kernels: whether an op has a
kernel, whether triton and the device can run it, whether the kernel is deterministic when
``torch.use_deterministic_algorithms(True)`` asks for that, and the fallback when a kernel
fails.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from visionblocks._core.dispatch import forced_triton, get_impl, validate_impl
from visionblocks._core.tensor_checks import has_values
from visionblocks.kernels._support import (
    capability_reason,
    nondeterministic_reason,
    unsupported_reason,
)

T = TypeVar("T")

__all__ = ["resolve_impl", "run_fused"]


def resolve_impl(impl: str, op: str, *tensors: torch.Tensor) -> str:
    """Resolve ``impl`` for one call of ``op`` on ``tensors`` to ``"torch"`` or ``"triton"``.

    Args:
        impl: The op's ``impl`` argument.
        op: The op name, as listed by ``visionblocks.kernels.available()["ops"]``.
        *tensors: The call's tensor inputs (their devices decide ``"auto"``).

    Returns:
        str: ``"torch"`` or ``"triton"``.

    Deterministic mode (``torch.use_deterministic_algorithms(True)``): a kernel listed in
    `visionblocks.kernels._support.NONDETERMINISTIC` is not picked by ``"auto"`` (the op runs
    its torch path), and forcing it on CUDA tensors raises as torch does for its own
    nondeterministic ops, or warns with ``warn_only=True``. The triton interpreter (CPU
    tensors) runs programs one after the other, so it is not affected.

    Fake CUDA tensors (``FakeTensorMode``, shape inference): ``"auto"`` is ``"torch"``,
    chosen without importing triton or touching the CUDA driver; forcing ``"triton"``
    raises. CPU and meta tensors never touch the driver either.

    Raises:
        ValueError: For an unknown ``impl``.
        RuntimeError: If ``"triton"`` is forced but cannot run here (no triton, no kernel for
            ``op``, CPU tensors without ``TRITON_INTERPRET=1``, fake tensors, or a GPU or
            dtype the kernels do not support), or would run a nondeterministic kernel on
            CUDA in deterministic mode; the message says why.

    Examples:
        >>> import torch
        >>> resolve_impl("torch", "sigmoid_focal_loss", torch.zeros(3))
        'torch'
        >>> resolve_impl("auto", "sigmoid_focal_loss", torch.zeros(3))  # CPU tensors
        'torch'
    """
    from visionblocks import kernels

    validate_impl(impl)
    if impl == "auto":
        impl = get_impl()
    if impl == "torch":
        return "torch"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if on_cuda and _shapes_only(tensors):
        # Shape inference: no kernel runs, so neither triton nor the driver is asked.
        if impl == "auto":
            return "torch"
        raise RuntimeError(
            f"impl='triton' was requested for {op!r} on fake tensors (shape inference), "
            "where no kernel can run; use impl='auto' or 'torch'"
        )
    if impl == "auto":
        if (
            on_cuda
            and kernels.has_kernel(op)
            and kernels.triton_available()
            and not unsupported_reason(op, tensors)
            and not _avoid_for_determinism(op)
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
        if _avoid_for_determinism(op):
            _alert_nondeterministic(op)
    return "triton"


def _shapes_only(tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether these CUDA tensors are fake (``FakeTensorMode``, ``make_fx``): no data, and
    no reason to touch the driver. Under ``torch.compile`` dynamo passes real tensors'
    stand-ins, so the choice is the real one's."""
    return not torch.compiler.is_compiling() and not all(has_values(t) for t in tensors)


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _avoid_for_determinism(op: str) -> bool:
    """Whether deterministic mode is on and ``op``'s kernel is not deterministic on a GPU."""
    return torch.are_deterministic_algorithms_enabled() and bool(nondeterministic_reason(op))


def _alert_nondeterministic(op: str) -> None:
    """Raise, or warn under ``warn_only=True``, as torch does for its nondeterministic ops."""
    message = (
        f"impl='triton' was requested for {op!r}, whose triton kernel is not deterministic "
        f"on a GPU ({nondeterministic_reason(op)}), but you set "
        "'torch.use_deterministic_algorithms(True)'. Pass impl='auto' (which then runs the "
        "torch path) or impl='torch', or use the 'warn_only=True' option, if that's "
        "acceptable for your application."
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=4)
    else:
        raise RuntimeError(message)


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

    fallback = None if forced_triton(impl) else reference
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
