"""Launching triton kernels: grid limits, argument checks, specialisation records, failures.

Every kernel of this package is launched through `launch`, which

- checks the grid against CUDA's limits (``2**31 - 1`` programs on axis 0, 65,535 on axes 1
  and 2) and every scalar against the range of its annotated type (``n: tl.int64``,
  ``C: tl.int32``): a value that does not fit is an error, never a silent wrap;
- checks every tensor argument: one device, a strided layout, a supported dtype and a
  16-byte aligned start (launchers pass tensors through `prepare`, which copies the rare
  misaligned view), so the compiled specialisation never depends on where a view starts;
- records the launch's *specialisation* (`Spec`: pointer dtypes, scalar types, constexpr
  values, ``num_warps``) while `record_launches` is active: `visionblocks.kernels._compile`
  compiles exactly the recorded specialisations for real GPU targets;
- turns any error of triton's compiler, loader or launcher into a `KernelFailure` naming
  the op and the kernel, which `visionblocks._core.dispatch` (forward) and
  `visionblocks.kernels._fallback` (backward) turn into a one-time warning and the torch
  path (unless ``impl="triton"`` was forced).

Kernel parameters follow one convention, which `specialization` enforces: tensors are
``*_ptr`` parameters, every other runtime scalar carries a type annotation
(``tl.int32``, ``tl.int64``, ``tl.float32``) and is listed in ``do_not_specialize``, so a
specialisation is fixed by the tensors' dtypes and the constexpr values alone and does not
change with a size that happens to equal 1 or be a multiple of 16.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ALIGNMENT",
    "GRID_LIMITS",
    "KernelFailure",
    "LaunchLimitError",
    "Spec",
    "cdiv",
    "check_grid",
    "check_plane",
    "jit",
    "launch",
    "prepare",
    "record_launches",
    "specialization",
]

GRID_LIMITS: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
"""CUDA's maximum number of programs (blocks) on grid axes 0, 1 and 2."""

ALIGNMENT = 16
"""Byte alignment every tensor argument starts at (triton's ``tt.divisibility = 16``)."""

_SCALAR_RANGES = {
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
}
_POINTER_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
}
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


class Spec(NamedTuple):
    """One compiled specialisation of a kernel, as triton's JIT would key it.

    Attributes:
        kernel: ``"module:function"`` of the ``@triton.jit`` function.
        signature: ``(parameter, type)`` pairs in order: ``"*fp16"`` for a tensor,
            ``"i32"``/``"i64"``/``"fp32"`` for a scalar, ``"constexpr"`` for a constexpr.
        constexprs: ``(parameter, value)`` pairs; dtypes are written ``"tl.float32"``.
        num_warps: Warps per program (triton's default is 4).
    """

    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int = 4

    def describe(self) -> str:
        """A short label: the kernel's name, the pointer dtypes and the constexpr values."""
        ptrs = ",".join(t[1:] for _, t in self.signature if t.startswith("*"))
        consts = ",".join(f"{k}={str(v).removeprefix('tl.')}" for k, v in self.constexprs)
        return f"{self.kernel.rpartition(':')[2]}[{ptrs}|{consts}|w{self.num_warps}]"


@functools.cache
def _parameters(fn: Callable) -> tuple[tuple[str, str | None], ...]:
    """``(name, kind)`` of the kernel's parameters: ``"constexpr"``, a scalar type, or None
    for a tensor (``*_ptr``). Raises if a parameter breaks the convention."""
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


def _kernel_id(kernel: Any) -> str:
    fn = kernel.fn
    return f"{fn.__module__}:{fn.__name__}"


def _encode(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    name = getattr(value, "name", None)  # a triton dtype
    if isinstance(name, str):
        return f"tl.{_TL_NAMES.get(name, name)}"
    raise TypeError(f"unsupported constexpr value {value!r}")


_TL_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


def prepare(t: Tensor) -> Tensor:
    """``t`` contiguous and starting at a 16-byte aligned address (copied only if needed).

    Examples:
        >>> import torch
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
        ValueError: An axis is not a positive int or exceeds CUDA's limit; the message names
            the op, the axis, the size and the limit.

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


def specialization(kernel: Any, args: Mapping[str, Any], num_warps: int = 4) -> Spec:
    """The `Spec` a launch of ``kernel`` with ``args`` compiles to; checks the arguments.

    Raises:
        ValueError: A tensor on another device, with a non-strided layout, an unsupported
            dtype or a misaligned start; a scalar outside its annotated type's range; a
            missing or unexpected argument.
        TypeError: A scalar of the wrong kind.
    """
    params = _parameters(kernel.fn)
    name = _kernel_id(kernel)
    unknown = set(args) - {p for p, _ in params}
    if unknown:
        raise ValueError(f"{name}: unexpected arguments {sorted(unknown)}")
    signature, constexprs = [], []
    device = None
    for param, kind in params:
        if param not in args:
            raise ValueError(f"{name}: missing argument {param!r}")
        value = args[param]
        if kind is None:
            if not isinstance(value, Tensor):
                raise TypeError(f"{name}: {param} must be a tensor, got {type(value).__name__}")
            if value.layout != torch.strided:
                raise ValueError(f"{name}: {param} must be a strided tensor, got {value.layout}")
            if value.dtype not in _POINTER_TYPES:
                raise ValueError(f"{name}: {param} has unsupported dtype {value.dtype}")
            device = value.device if device is None else device
            if value.device != device:
                raise ValueError(
                    f"{name}: {param} is on {value.device}, the other tensors on {device}"
                )
            if value.data_ptr() % ALIGNMENT:
                raise ValueError(f"{name}: {param} must start {ALIGNMENT}-byte aligned (prepare)")
            signature.append((param, "*" + _POINTER_TYPES[value.dtype]))
        elif kind == "constexpr":
            signature.append((param, "constexpr"))
            constexprs.append((param, _encode(value)))
        else:
            if kind == "fp32":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError(f"{name}: {param} must be a float, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name}: {param} must be an int, got {value!r}")
                low, high = _SCALAR_RANGES[kind]
                if not low <= value <= high:
                    raise ValueError(
                        f"{name}: {param} = {value} does not fit its type {kind} ([{low}, {high}])"
                    )
            signature.append((param, kind))
    return Spec(name, tuple(signature), tuple(constexprs), num_warps)


_recorders: list[tuple[set[Spec], bool]] = []
_recorders_lock = threading.Lock()


@contextmanager
def record_launches(execute: bool = True) -> Iterator[set[Spec]]:
    """Collect the `Spec` of every launch in the block (also launches that then fail).

    Args:
        execute: False for a dry run: launches are checked and recorded but not run (their
            outputs hold garbage), which is how `visionblocks.cli._kernel_specs` enumerates the
            specialisations of the whole op matrix in seconds.

    Examples:
        >>> with record_launches() as specs:
        ...     pass
        >>> specs
        set()
    """
    entry: tuple[set[Spec], bool] = (set(), execute)
    with _recorders_lock:
        _recorders.append(entry)
    try:
        yield entry[0]
    finally:
        with _recorders_lock:
            _recorders.remove(entry)


def launch(op: str, kernel: Any, grid: Sequence[int], num_warps: int = 4, **args: Any) -> None:
    """Check and launch ``kernel[grid](**args)`` for ``op``.

    Raises:
        ValueError, TypeError: From `check_grid` and `specialization` (bugs in a launcher).
        KernelFailure: If triton fails to compile, load or launch the kernel.
    """
    grid = check_grid(op, grid)
    spec = specialization(kernel, args, num_warps)
    execute = True
    for specs, run in list(_recorders):
        specs.add(spec)
        execute = execute and run
    if not execute:
        return
    try:
        kernel[grid](**args, num_warps=num_warps)
    except Exception as exc:
        raise KernelFailure(op, spec.kernel, exc) from exc


def jit(fn: Callable) -> Any:
    """``triton.jit(fn)`` for a launched kernel, with every scalar in ``do_not_specialize``.

    Also checks the parameter convention (tensors ``*_ptr``, scalars annotated).
    """
    import triton

    scalars = [name for name, kind in _parameters(fn) if kind not in (None, "constexpr")]
    return triton.jit(fn, do_not_specialize=scalars)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


class LaunchLimitError(KernelFailure):
    """A shape beyond what a kernel's indexing supports (the op runs the torch path)."""


def check_plane(height: int, width: int, op: str = "local op") -> None:
    """Raise `LaunchLimitError` if a ``height x width`` plane has ``2**31`` pixels or more.

    The local-op kernels index pixels inside one plane with int32 (channel and batch offsets
    are int64), which covers planes up to 46,340 x 46,340.
    """
    if height * width > 2**31 - 1:
        raise LaunchLimitError(
            op,
            "pixel indexing",
            ValueError(f"a {height}x{width} plane has more than 2**31 - 1 pixels"),
        )
