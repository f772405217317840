"""How an op runs: the Triton kernel or the torch formula (`use_triton`), and value checks.

Implementations. Ops with a fused kernel take ``impl: str = "auto"``:

- ``"torch"``: the torch formula (also the CPU path). Always available.
- ``"triton"``: the fused Triton kernel, on CUDA tensors (on CPU tensors when ``TRITON_INTERPRET=1``
  was set before triton was imported). Where it cannot run, the op raises and says why.
- ``"auto"``: the process default (`set_impl` / `use_impl`, then ``VISIONBLOCKS_IMPL``,
  then ``"auto"``); when that is ``"auto"`` too, the kernel for real CUDA tensors in eager
  code when triton is installed, the GPU and the dtypes are supported and the kernel has not
  failed on that device before; the formula otherwise, and always while torch records the
  call (``torch.compile``, ``torch.export``, ``torch.jit.trace``; ``impl="triton"`` records
  a kernel). ``VISIONBLOCKS_DISABLE_TRITON=1`` leaves the formula only.

A kernel that fails to compile, load or launch warns once per op and device, and that op runs
the formula on that device from then on (`note_failure`, recorded by
`visionblocks.kernels._launch`); with ``"triton"`` forced, the failure is raised.

Value checks (finite boxes, labels in range, positive normalizers...) read tensor values.
They are on by default (`set_value_checks` / `value_checks`, ``VISIONBLOCKS_VALUE_CHECKS=0``
turns them off): on CPU they read the values and raise at once (`reads_values`); on CUDA
nothing is read on the host: a check is a device-side assert (`asserts_on_device`,
`assert_on_device`; a failure is a CUDA error at the next synchronisation) or skipped, as
each function says. Meta and fake tensors and recorded calls skip them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

__all__ = [
    "IMPLS",
    "assert_on_device",
    "asserts_on_device",
    "capability_reason",
    "forced_triton",
    "get_impl",
    "has_values",
    "note_failure",
    "reads_values",
    "recording",
    "set_impl",
    "set_value_checks",
    "triton_version",
    "use_impl",
    "use_triton",
    "validate_impl",
    "value_checks",
    "value_checks_enabled",
]

IMPLS: tuple[str, ...] = ("auto", "torch", "triton")
ENV_IMPL = "VISIONBLOCKS_IMPL"
ENV_DISABLE = "VISIONBLOCKS_DISABLE_TRITON"
ENV_VALUE_CHECKS = "VISIONBLOCKS_VALUE_CHECKS"
REPORT_URL = "https://github.com/visionblocks/visionblocks/issues"
_ENV_KEYS: dict[str, object] = {}
if hasattr(os.environ, "encodekey"):  # CPython's os._Environ: the keys of its private dict
    _ENV_KEYS = {name: os.environ.encodekey(name) for name in (ENV_IMPL, ENV_VALUE_CHECKS)}

MIN_CAPABILITY: tuple[int, int] = (7, 5)
"""Oldest CUDA compute capability the kernels are compiled and checked for (Turing)."""

OLD_TRITON_DTYPE_MIN_CAPABILITY: dict[tuple[int, int], dict[torch.dtype, tuple[int, int]]] = {
    (3, 3): {torch.bfloat16: (8, 0)},
}
"""Triton releases older than a key ``(major, minor)`` → dtypes that need a newer GPU than
`MIN_CAPABILITY` with them: triton 3.0 to 3.2 convert bfloat16 with ``cvt.f32.bf16``, which
``ptxas`` accepts from ``sm_80`` only (the kernels page lists the releases checked)."""


class _ThreadState(threading.local):
    """This thread's `use_impl` and `value_checks` stacks, empty in a new thread (an attribute
    that always exists: a missing one costs every op a caught AttributeError)."""

    def __init__(self) -> None:
        self.impl: list[str] = []
        self.checks: list[bool] = []


_state = _ThreadState()
_defaults: dict[str, object] = {"impl": None, "checks": None}  # set_impl, set_value_checks
_failures: dict[tuple[str, str], str] = {}
_failures_lock = threading.Lock()


def _env(name: str) -> str | None:
    """``os.environ.get(name)``, read live on every call (a test or a user may set it after the
    import) but as one lookup in CPython's own dict of it: ``os.environ``'s mapping methods
    encode the key and cost a microsecond, which every op call would pay twice."""
    environ = os.environ
    try:
        raw = environ._data.get(_ENV_KEYS[name])  # type: ignore[attr-defined]
    except (AttributeError, KeyError):  # another mapping put in its place, or another name
        return environ.get(name)
    return None if raw is None else environ.decodevalue(raw)  # type: ignore[attr-defined]


def _truthy(name: str) -> bool:
    return (_env(name) or "").strip().lower() in ("1", "true", "yes", "on")


def _stack(name: str) -> list:
    stack = getattr(_state, name, None)
    if stack is None:
        stack = []
        setattr(_state, name, stack)
    return stack


@contextmanager
def _pushed(name: str, value: object) -> Iterator[None]:
    stack = _stack(name)
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


# ------------------------------------------------------------------ which implementation


def validate_impl(name: object, what: str = "impl") -> str:
    """Return ``name`` if it is one of `IMPLS`; raise the boundary error otherwise.

    Examples:
        >>> validate_impl("torch")
        'torch'
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, one of {IMPLS}; got {type(name).__name__}")
    if name not in IMPLS:
        raise ValueError(f"{what} must be one of 'auto', 'torch', 'triton'; got {name!r}")
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
    stack = _state.impl
    if stack:
        return stack[-1]
    if _defaults["impl"] is not None:
        return _defaults["impl"]  # type: ignore[return-value]
    env = _env(ENV_IMPL)
    env = env.strip() if env else ""
    return validate_impl(env, ENV_IMPL) if env else "auto"


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
    _defaults["impl"] = None if name is None else validate_impl(name)


def use_impl(name: str) -> AbstractContextManager[None]:
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
    return _pushed("impl", validate_impl(name))


def forced_triton(impl: str) -> bool:
    """Whether ``impl`` (an op's argument) forces the kernel, directly or by the default.

    Examples:
        >>> forced_triton("torch")
        False
    """
    return impl == "triton" or (impl == "auto" and get_impl() == "triton")


@functools.cache
def _triton_missing() -> str:
    """Why triton cannot run here ("" when it is installed); never imports it."""
    if _truthy(ENV_DISABLE):
        return f"disabled by {ENV_DISABLE}=1"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install visionblocks[triton])"
    return ""


@functools.cache
def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the imported triton, else of the installed one; ``None``
    without triton or for a version that does not parse. Never imports triton.

    Examples:
        >>> triton_version() is None or len(triton_version()) == 2
        True
    """
    text = getattr(sys.modules.get("triton"), "__version__", None)
    if not isinstance(text, str):
        try:
            text = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            return None
    return _parse_version(text)


def capability_reason(
    capability: tuple[int, int],
    dtypes: Iterable[torch.dtype],
    triton: tuple[int, int] | None = None,
) -> str:
    """Why the kernels cannot run on a GPU of ``capability`` for ``dtypes`` ("" if they can).

    Args:
        capability: The GPU's compute capability ``(major, minor)``.
        dtypes: The dtypes of the kernel's tensors.
        triton: The triton release ``(major, minor)`` that would compile the kernels
            (default: `triton_version`).

    Examples:
        >>> capability_reason((7, 0), [torch.float32])
        'the kernels need compute capability 7.5 or newer; this GPU has 7.0'
        >>> capability_reason((7, 5), [torch.bfloat16], triton=(3, 2))
        'torch.bfloat16 needs compute capability 8.0 or newer with triton 3.2 (3.3 or newer: 7.5); this GPU has 7.5'
    """
    have = f"{capability[0]}.{capability[1]}"
    if tuple(capability) < MIN_CAPABILITY:
        need = f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
        return f"the kernels need compute capability {need} or newer; this GPU has {have}"
    version = triton if triton is not None else triton_version()
    if version is None:
        return ""
    for fixed, table in OLD_TRITON_DTYPE_MIN_CAPABILITY.items():
        for dtype in dict.fromkeys(dtypes):
            need = table.get(dtype)
            if version < fixed and need is not None and tuple(capability) < need:
                return (
                    f"{dtype} needs compute capability {need[0]}.{need[1]} or newer with "
                    f"triton {version[0]}.{version[1]} ({fixed[0]}.{fixed[1]} or newer: "
                    f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}); this GPU has {have}"
                )
    return ""


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def note_failure(op: str, device: torch.device, exc: BaseException) -> None:
    """Remember that ``op``'s kernel failed on ``device``: warn once, then the formula."""
    key = (op, str(device))
    with _failures_lock:
        first = key not in _failures
        _failures[key] = f"{type(exc).__name__}: {exc}"
    if first:
        warnings.warn(
            f"visionblocks: the triton kernel of {op!r} failed on {device} ({exc}); {op!r} "
            f"uses the torch path on {device} from now on in this process. Please report this "
            f"at {REPORT_URL} with the output of `visionblocks list kernels`.",
            RuntimeWarning,
            stacklevel=3,
        )


def _why_not(op: str, tensors: tuple[Tensor, ...]) -> str:
    """Why ``op``'s kernel cannot run on ``tensors`` now ("" if it can)."""
    cuda = all(t.is_cuda for t in tensors)
    if cuda and not torch.compiler.is_compiling() and not all(has_values(t) for t in tensors):
        return "these are fake tensors (shape inference), where no kernel can run"
    missing = _triton_missing()
    if missing:
        return f"triton is unavailable: {missing}"
    if not cuda:
        if _truthy("TRITON_INTERPRET"):
            return ""
        return (
            "it needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported to run "
            "kernels on CPU tensors"
        )
    device = tensors[0].device
    failed = _failures.get((op, str(device)))
    if failed:
        return f"its kernel failed earlier on {device} ({failed})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return capability_reason(_capability(index), (t.dtype for t in tensors))


def use_triton(op: str, impl: str, *tensors: Tensor, auto: bool = True) -> bool:
    """The one decision: does this call of ``op`` run its Triton kernel?

    Args:
        op: The op's name (failures are remembered per op and device).
        impl: The op's ``impl`` argument.
        *tensors: The call's tensor inputs.
        auto: False for an op whose ``"auto"`` keeps the formula until its kernel is
            verified on hardware (only ``"triton"`` runs it).

    Returns:
        bool: True for the kernel, False for the torch formula.

    Raises:
        TypeError, ValueError: An ``impl`` that is not one of `IMPLS`.
        RuntimeError: ``"triton"`` forced where the kernel cannot run; says why.

    Examples:
        >>> use_triton("sigmoid_focal_loss", "auto", torch.zeros(3))  # CPU tensors
        False
    """
    if impl != "auto" and impl != "torch" and impl != "triton":
        validate_impl(impl)
    if impl == "auto":
        cuda = tensors[0].is_cuda
        if not cuda and get_impl() == "auto":  # the common CPU call: nothing else to ask
            return False
        if recording():  # torch fuses the formula itself; the default does not apply
            return False
        impl = get_impl()
        if impl == "auto":
            if not (auto and cuda) or not all(t.is_cuda for t in tensors):
                return False
            return not _why_not(op, tensors)
    if impl == "torch":
        return False
    reason = _why_not(op, tensors)
    if reason:
        raise RuntimeError(f"impl='triton' was requested for {op!r} but {reason}")
    return True


# ------------------------------------------------------------------------- value checks


def value_checks_enabled() -> bool:
    """Whether checks that read tensor values run (innermost `value_checks`, then
    `set_value_checks`, then ``VISIONBLOCKS_VALUE_CHECKS``, then True).

    Examples:
        >>> value_checks_enabled()
        True
    """
    stack = _state.checks
    if stack:
        return stack[-1]
    if _defaults["checks"] is not None:
        return _defaults["checks"]  # type: ignore[return-value]
    raw = _env(ENV_VALUE_CHECKS)
    if raw is None:
        return True
    raw = raw.strip().lower()
    if raw in ("1", "true", "yes", "on", ""):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_VALUE_CHECKS} must be 0 or 1 (or true/false), got {raw!r}")


def _check_bool(enabled: object) -> bool:
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be bool, got {type(enabled).__name__} ({enabled!r})")
    return enabled


def set_value_checks(enabled: bool) -> None:
    """Turn value checks on or off for the whole process (shape/dtype/device checks always run).

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
    _defaults["checks"] = _check_bool(enabled)


def value_checks(enabled: bool) -> AbstractContextManager[None]:
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
    return _pushed("checks", _check_bool(enabled))


def recording() -> bool:
    """True under ``torch.export``, ``torch.compile``, ``torch.jit.trace`` or ``torch.fx``
    symbolic tracing: torch records the call instead of only running it.

    Examples:
        >>> recording()
        False
    """
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing() or is_fx_symbolic_tracing())


def has_values(value: Tensor) -> bool:
    """Whether ``value`` holds data: False for meta and fake tensors (shape inference).

    Examples:
        >>> has_values(torch.zeros(1)), has_values(torch.zeros(1, device="meta"))
        (True, False)
    """
    return value.device.type != "meta" and not is_fake(value)


def _checks_off() -> bool:
    """Compiling is tested first: the other tests are Python state dynamo need not trace."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or not value_checks_enabled()


def reads_values(*tensors: Tensor | None) -> bool:
    """Whether a check may read these tensors' values on the host now: value checks on,
    nothing recorded, and every tensor a real CPU tensor.

    Examples:
        >>> reads_values(torch.zeros(1)), reads_values(torch.zeros(1, device="meta"))
        (True, False)
    """
    if _checks_off():
        return False
    for t in tensors:  # a plain CPU tensor (fake tensors are a subclass) needs no other test
        if t is None or (type(t) is Tensor and t.is_cpu):
            continue
        if not (t.device.type == "cpu" and not is_fake(t)):
            return False
    return True


def asserts_on_device(*tensors: Tensor | None) -> bool:
    """Whether a value check of these tensors runs as a device-side assert: value checks on,
    nothing recorded, no meta tensor and one on CUDA (fake ones too: nothing is read). A
    failure leaves the CUDA context unusable, as an out-of-range index in ``F.cross_entropy``.

    Examples:
        >>> asserts_on_device(torch.zeros(1))  # CPU: `reads_values` instead
        False
    """
    if _checks_off():
        return False
    given = [t for t in tensors if t is not None]
    return all(t.device.type != "meta" for t in given) and any(t.is_cuda for t in given)


def assert_on_device(ok: Tensor, message: str) -> None:
    """Assert on the device that every element of the boolean ``ok`` is True
    (``torch._assert_async``: no host synchronisation); ``message`` names the rule."""
    torch._assert_async(ok.all(), message)
