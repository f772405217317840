"""The shared launcher of the Triton kernels: guards, failures and the formula as fallback.

Kernel parameters follow one convention: tensors are ``*_ptr`` parameters, every other
runtime scalar carries a type annotation (``tl.int32``, ``tl.int64``, ``tl.float32``) and is
not specialised (`jit`), so a compiled specialisation is fixed by the tensors' dtypes and the
constexpr values alone. `launch` checks the grid against CUDA's limits and every integer
scalar against its annotated type (a value that does not fit is an error, never a silent
wrap), and turns any error of triton's compiler, loader or launcher into a `KernelFailure`.
An entry point wrapped in `with_fallback` then runs the op's formula instead (warning once
per op and device, `visionblocks._core.dispatch.note_failure`), unless ``impl="triton"``
was forced; a backward that fails takes the formula's gradients (`reference_grads`).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from visionblocks._core.dispatch import note_failure

__all__ = [
    "ALIGNMENT",
    "GRID_LIMITS",
    "INTERPRET",
    "KernelFailure",
    "LaunchLimitError",
    "check_grid",
    "check_plane",
    "jit",
    "launch",
    "parameters",
    "prepare",
    "reference_grads",
    "with_fallback",
]

T = TypeVar("T")

GRID_LIMITS: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
"""CUDA's maximum number of programs (blocks) on grid axes 0, 1 and 2."""

ALIGNMENT = 16
"""Byte alignment every tensor argument starts at (triton's ``tt.divisibility = 16``)."""

INTERPRET = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
"""Whether triton runs the kernels in its interpreter, on CPU tensors (``TRITON_INTERPRET=1``)."""

_RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}
_ANNOTATIONS = {
    "tl.constexpr": "constexpr",
    "tl.int32": "i32",
    "tl.int64": "i64",
    "tl.float32": "fp32",
}


class KernelFailure(RuntimeError):
    """A triton kernel failed to compile, load or launch.

    Attributes:
        op: The op whose kernel failed (e.g. ``"sigmoid_focal_loss"``).
        kernel: The kernel, ``"module:function"``.
        cause: The original exception.
    """

    def __init__(self, op: str, kernel: str, cause: BaseException) -> None:
        self.op, self.kernel, self.cause = op, kernel, cause
        super().__init__(
            f"the triton kernel {kernel} of {op!r} failed: {type(cause).__name__}: {cause}"
        )


class LaunchLimitError(KernelFailure):
    """A shape beyond what a kernel's indexing supports (the op runs the formula)."""


@functools.cache
def parameters(fn: Callable) -> tuple[tuple[str, str | None], ...]:
    """``(name, kind)`` of a kernel's parameters: ``"constexpr"``, a scalar type (``"i32"``,
    ``"i64"``, ``"fp32"``), or None for a tensor (``*_ptr``). Raises if one breaks the
    convention."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        ann = (
            p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        )
        kind = _ANNOTATIONS.get(str(ann).strip()) if ann is not inspect.Parameter.empty else None
        if kind is None and not p.name.endswith("_ptr"):
            raise TypeError(
                f"{fn.__module__}.{fn.__name__}: parameter {p.name!r} needs a tl.constexpr, "
                "tl.int32, tl.int64 or tl.float32 annotation (tensors are named *_ptr)"
            )
        out.append((p.name, kind))
    return tuple(out)


def jit(fn: Callable) -> Any:
    """``triton.jit(fn)`` with every scalar in ``do_not_specialize`` (checks the convention)."""
    import triton

    scalars = [name for name, kind in parameters(fn) if kind not in (None, "constexpr")]
    return triton.jit(fn, do_not_specialize=scalars)


def prepare(t: Tensor) -> Tensor:
    """``t`` contiguous and starting at a 16-byte aligned address (copied only if needed).

    Examples:
        >>> x = torch.arange(10.0)[1:]  # a view starting 4 bytes into its storage
        >>> prepare(x).data_ptr() % ALIGNMENT
        0
    """
    t = t.contiguous()
    if t.data_ptr() % ALIGNMENT:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def check_grid(op: str, grid: Sequence[int]) -> tuple[int, ...]:
    """Return ``grid`` as a tuple after checking it against `GRID_LIMITS`.

    Raises:
        ValueError: An axis is not a positive int or exceeds CUDA's limit.

    Examples:
        >>> check_grid("op", (70000, 2))
        (70000, 2)
    """
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"{op}: a launch grid has 1 to 3 axes, got {tuple(grid)}")
    for axis, (size, limit) in enumerate(zip(grid, GRID_LIMITS)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{op}: grid axis {axis} must be a positive int, got {size!r}")
        if size > limit:
            raise ValueError(
                f"{op}: grid axis {axis} has {size} programs, more than CUDA's limit of {limit}"
            )
    return tuple(grid)


def check_plane(height: int, width: int, op: str = "local op") -> None:
    """Raise `LaunchLimitError` if a ``height x width`` plane has ``2**31`` pixels or more
    (the local-op kernels index pixels inside one plane with int32)."""
    if height * width > 2**31 - 1:
        raise LaunchLimitError(
            op,
            "pixel indexing",
            ValueError(f"a {height}x{width} plane has more than 2**31 - 1 pixels"),
        )


def launch(op: str, kernel: Any, grid: Sequence[int], num_warps: int = 4, **args: Any) -> None:
    """Check and launch ``kernel[grid](**args)`` for ``op``.

    Raises:
        ValueError, TypeError: A grid beyond CUDA's limits, an integer scalar outside its
            annotated type, a missing argument (bugs in a launcher).
        KernelFailure: If triton fails to compile, load or launch the kernel.
    """
    grid = check_grid(op, grid)
    fn = kernel.fn
    for name, kind in parameters(fn):
        if name not in args:
            raise ValueError(f"{fn.__name__}: missing argument {name!r}")
        if kind in _RANGES:
            value, (low, high) = args[name], _RANGES[kind]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{fn.__name__}: {name} must be an int, got {value!r}")
            if not low <= value <= high:
                raise ValueError(
                    f"{fn.__name__}: {name} = {value} does not fit its type {kind} ([{low}, {high}])"
                )
    try:
        kernel[grid](**args, num_warps=num_warps)
    except Exception as exc:
        raise KernelFailure(op, f"{fn.__module__}:{fn.__name__}", exc) from exc


def _device(args: Sequence[Any]) -> torch.device:
    return next(a.device for a in args if isinstance(a, Tensor))


def with_fallback(op: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Wrap a kernel entry point ``entry(*args, reference=None)``: on a `KernelFailure`, run
    ``reference(*args)`` (the op's formula) and route ``op`` to it on that device from then
    on; raise when ``reference`` is None (``impl="triton"`` forced). A `LaunchLimitError`
    concerns one shape only, so it is not remembered."""

    def wrap(entry: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(entry)
        def run(*args: Any, reference: Callable[..., T] | None = None) -> T:
            try:
                return entry(*args, reference=reference)
            except KernelFailure as exc:
                if reference is None:
                    raise
                if not isinstance(exc, LaunchLimitError):
                    note_failure(op, _device(args), exc)
                return reference(*args)

        return run

    return wrap


def reference_grads(
    op: str,
    exc: KernelFailure,
    reference: Callable[..., Any] | None,
    args: Sequence[Any],
    needs: Sequence[bool],
    grad_outputs: Sequence[Tensor | None],
) -> tuple[Tensor | None, ...]:
    """Gradients of ``reference(*args)`` for a fused backward that failed (re-raises ``exc``
    when ``reference`` is None); one gradient (or None) per argument, ``needs`` being
    ``ctx.needs_input_grad``."""
    if reference is None:
        raise exc
    note_failure(op, _device(args), exc)
    leaves = [
        a.detach().requires_grad_(need) if isinstance(a, Tensor) and need else a
        for a, need in zip(args, needs)
    ]
    with torch.enable_grad():
        outputs = reference(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
    wanted = [leaf for leaf, need in zip(leaves, needs) if need and isinstance(leaf, Tensor)]
    grads = iter(
        torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        if pairs and wanted
        else [None] * len(wanted)
    )
    return tuple(
        next(grads) if need and isinstance(a, Tensor) else None for a, need in zip(args, needs)
    )
