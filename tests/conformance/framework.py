"""The bad-input conformance suite's machinery: specs, mutations and the verdict on each.

A `Spec` says how to make one *valid* call of a public callable (a function, a class's
constructor, or a module's ``forward``) and describes its arguments (`Arg`). From it the
suite generates, per argument, the mistakes careless users make (`MUTATIONS`: wrong types,
dtypes, ranks, devices, NaN/inf, empty, absurd sizes) and checks each outcome:

- a mutation the argument does not legitimately accept must raise ``ValueError`` or
  ``TypeError`` (or a subclass, or one of the spec's ``errors``) whose message names the
  argument;
- an accepted or "tolerant" mutation (NaN, empty, huge sizes) may pass or raise such an
  error, but never a raw error from inside torch/NumPy, and never hang;
- equivalences (non-contiguous, channels-last, half precision) give the same result as the
  plain float32 call.

``tests/conformance/test_coverage.py`` fails for any public name without a spec (or an
exemption with a reason), so the suite cannot fall behind the API.
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "EQUIVALENCES",
    "MUTATIONS",
    "Arg",
    "Outcome",
    "Spec",
    "call",
    "compare",
    "forward",
    "mutate",
    "run_call",
    "time_limit",
]

# kind -> {mutation: must_reject}. must_reject=False: "tolerant" (may pass, may raise clearly).
MUTATIONS: dict[str, dict[str, bool]] = {
    "tensor": {
        "list": True, "str": True, "none": True, "dtype": True, "rank_up": True,
        "rank_down": True, "meta": True, "nan": False, "inf": False, "empty": False,
    },
    "int_tensor": {
        "list": True, "str": True, "none": True, "dtype": True, "rank_up": True,
        "rank_down": True, "meta": True, "negative": False, "empty": False,
    },
    "int": {
        "float": True, "str": True, "none": True, "bool": True, "negative": True,
        "zero": False, "huge": False,
    },
    "float": {"str": True, "none": True, "nan": True, "inf": False, "negative": True},
    "bool": {"int": True, "str": True, "none": True},
    "choice": {"unknown": True, "int": True, "none": True},
    "sequence": {"str": True, "none": True, "int": True, "longer": True, "nan_item": True},
    "module": {"str": True, "none": True, "int": True},
    "path": {"missing": True, "int": True, "none": True},
    "callable": {"str": True, "int": True},
    "mapping": {"str": True, "int": True, "list": True},
}  # fmt: skip
"""For each argument kind, the mutations generated and whether they must be rejected."""

EQUIVALENCES = ("noncontiguous", "channels_last", "half", "bfloat16")


@dataclass(frozen=True)
class Arg:
    """One argument of a spec'd call.

    Attributes:
        name: The keyword the call takes it by; error messages must name it (or an alias).
        kind: A key of `MUTATIONS`.
        optional: ``None`` is a legitimate value (the "none" mutation is then accepted).
        accept: Mutations this argument legitimately accepts (no error required).
        aliases: Other strings that count as naming it (``"targets[0]['boxes']"``, ``"x"``).
        skip: Mutations not to generate (with a comment in the spec saying why).
    """

    name: str
    kind: str
    optional: bool = False
    accept: frozenset[str] | set[str] = frozenset()
    aliases: tuple[str, ...] = ()
    skip: frozenset[str] | set[str] = frozenset()


@dataclass
class Spec:
    """A valid call of one public callable and what its arguments are.

    Attributes:
        obj: The public object (function or class) this spec covers; for a module's
            ``forward``, the class, with ``forward=True``.
        build: ``build() -> (call, kwargs)``: ``call(**kwargs)`` is a valid call. Built once
            per test, so a module's random weights are the same for every variant.
        args: The arguments to mutate (a subset of ``kwargs``'s keys).
        forward: The spec covers ``obj.forward`` rather than calling ``obj`` itself.
        equivalences: Which of `EQUIVALENCES` must give the same result.
        errors: Further exception types that count as clear (``FileNotFoundError``,
            ``KeyError`` for a registry, ``LoadError``...).
        tolerance: ``(rtol, atol)`` for the half-precision equivalences.
        label: Extra id text when one object has several specs.
    """

    obj: Any
    build: Callable[[], tuple[Callable[..., Any], dict[str, Any]]]
    args: Sequence[Arg] = ()
    forward: bool = False
    equivalences: Sequence[str] = ()
    errors: tuple[type[BaseException], ...] = ()
    tolerance: tuple[float, float] = (2e-2, 2e-2)
    label: str = ""

    @property
    def id(self) -> str:
        name = f"{self.obj.__module__}.{getattr(self.obj, '__qualname__', self.obj)}"
        return (
            name + (".forward" if self.forward else "") + (f"[{self.label}]" if self.label else "")
        )


def call(fn: Callable[..., Any], **kwargs: Any) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A `Spec` ``build`` for ``fn(**kwargs)``: a callable value is called on every build, so
    each test gets fresh tensors (pass a class or function itself through a lambda)."""

    def build() -> tuple[Any, dict[str, Any]]:
        return fn, {k: v() if callable(v) else v for k, v in kwargs.items()}

    return build


def forward(cls: type, ctor: dict[str, Any], **kwargs: Any) -> Callable[[], tuple[Any, dict]]:
    """A `Spec` ``build`` for ``cls(**ctor).forward(**kwargs)`` (kwargs as in `call`)."""

    def build() -> tuple[Any, dict[str, Any]]:
        return cls(**ctor).forward, {k: v() if callable(v) else v for k, v in kwargs.items()}

    return build


@dataclass
class Outcome:
    """What one call did: its result, or the exception it raised."""

    result: Any = None
    error: BaseException | None = None
    timed_out: bool = False


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `_Timeout` in the main thread after ``seconds`` (SIGALRM; Linux/macOS)."""

    def fire(signum: int, frame: Any) -> None:
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_call(call: Callable[..., Any], kwargs: Mapping[str, Any], seconds: float = 20) -> Outcome:
    """Call ``call(**kwargs)`` under a time limit and record what happened."""
    try:
        with time_limit(seconds):
            return Outcome(result=call(**kwargs))
    except _Timeout:
        return Outcome(timed_out=True)
    except Exception as exc:  # the verdict is the caller's
        return Outcome(error=exc)


def _non_finite(value: Any, fill: float) -> Any:
    if value.is_floating_point() and value.numel():
        out = value.clone()
        out.view(-1)[0] = fill
        return out
    return value


def mutate(kind: str, mutation: str, value: Any) -> Any:
    """``value`` with one careless-user mistake of ``mutation`` applied."""
    if mutation == "none":
        return None
    if mutation == "str":
        return "abc"
    if kind in ("tensor", "int_tensor"):
        return _mutate_tensor(mutation, value)
    table: dict[str, Any] = {
        "float": 1.5, "bool": True, "negative": -1 if kind == "int" else -1.0, "zero": 0,
        "huge": 10**9, "nan": math.nan, "inf": math.inf, "int": 3, "unknown": "no-such-choice",
        "missing": "/nonexistent/visionblocks-conformance.file", "list": [1, 2],
    }  # fmt: skip
    if mutation == "longer":
        return [*value, value[-1]] if len(value) else [0]
    if mutation == "nan_item":
        return [math.nan, *list(value)[1:]] if len(value) else [math.nan]
    return table[mutation]


def _mutate_tensor(mutation: str, value: torch.Tensor) -> Any:
    if mutation == "list":
        return value.tolist()
    if mutation == "dtype":
        return value.to(torch.int64) if value.is_floating_point() else value.to(torch.float32)
    if mutation == "rank_up":
        return value.unsqueeze(0)
    if mutation == "rank_down":
        return (
            value.reshape(-1)
            if value.dim() > 1
            else value.reshape(())
            if value.numel() == 1
            else value[0]
        )
    if mutation == "meta":
        return value.to("meta")
    if mutation == "nan":
        return _non_finite(value, math.nan)
    if mutation == "inf":
        return _non_finite(value, math.inf)
    if mutation == "negative":
        return value - value.abs().max() - 2 if value.numel() else value
    if mutation == "empty":
        return value[:0] if value.dim() else value
    raise KeyError(mutation)


def equivalent(name: str, value: Any) -> Any:
    """``value`` in the layout or precision of equivalence ``name`` (same numbers)."""
    if not isinstance(value, torch.Tensor):
        return value
    if name == "noncontiguous" and value.dim() >= 1 and value.numel() > 1:
        return torch.stack([value, value], dim=-1)[..., 0]
    if name == "channels_last" and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    if name in ("half", "bfloat16") and value.dtype == torch.float32:
        return value.to(torch.float16 if name == "half" else torch.bfloat16)
    return value


def compare(actual: Any, expected: Any, rtol: float, atol: float, where: str = "result") -> None:
    """Assert two results (tensors, or containers of them) hold the same numbers."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual).__name__}, not a tensor"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        torch.testing.assert_close(
            actual.float(), expected.float(), rtol=rtol, atol=atol, equal_nan=True, msg=where
        )
    elif isinstance(expected, Mapping):
        assert set(actual) == set(expected), f"{where}: keys {set(actual)} != {set(expected)}"
        for key in expected:
            compare(actual[key], expected[key], rtol, atol, f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, rtol, atol, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol) or (
            math.isnan(actual) and math.isnan(expected)
        ), f"{where}: {actual} != {expected}"


@dataclass
class Generated:
    """One generated test: a spec, an argument (or None for an equivalence) and a mutation."""

    spec: Spec
    arg: Arg | None
    mutation: str
    must_reject: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        what = self.arg.name if self.arg is not None else "equivalence"
        return f"{self.spec.id}:{what}:{self.mutation}"


def generate(specs: Sequence[Spec]) -> list[Generated]:
    """Every (spec, argument, mutation) and (spec, equivalence) to test."""
    out: list[Generated] = []
    for spec in specs:
        for arg in spec.args:
            for mutation, must_reject in MUTATIONS[arg.kind].items():
                if mutation in arg.skip:
                    continue
                accepted = mutation in arg.accept or (mutation == "none" and arg.optional)
                out.append(Generated(spec, arg, mutation, must_reject and not accepted))
        out.extend(Generated(spec, None, name) for name in spec.equivalences)
    return out


CLEAR_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError)


def verdict(case: Generated) -> None:
    """Run one generated case and assert the contract (see the module docstring)."""
    spec, arg = case.spec, case.arg
    call, kwargs = spec.build()
    clear = CLEAR_ERRORS + tuple(spec.errors)
    if arg is None:  # an equivalence
        reference = run_call(call, kwargs)
        assert reference.error is None, f"the valid call failed: {reference.error!r}"
        variant = {k: equivalent(case.mutation, v) for k, v in kwargs.items()}
        if case.mutation in ("half", "bfloat16"):
            call, variant = _half_call(spec, call, kwargs, case.mutation)
        outcome = run_call(call, variant)
        assert not outcome.timed_out, "hang"
        if outcome.error is not None:
            assert isinstance(outcome.error, clear) and case.mutation in ("half", "bfloat16"), (
                f"{case.mutation}: raw error {type(outcome.error).__name__}: {outcome.error}"
            )
            return
        rtol, atol = spec.tolerance if case.mutation in ("half", "bfloat16") else (1e-5, 1e-6)
        compare(outcome.result, reference.result, rtol, atol)
        return
    kwargs = dict(kwargs)
    kwargs[arg.name] = mutate(arg.kind, case.mutation, kwargs[arg.name])
    outcome = run_call(call, kwargs)
    assert not outcome.timed_out, f"{arg.name}={case.mutation}: hangs"
    error = outcome.error
    if error is None:
        assert not case.must_reject, f"{arg.name}={case.mutation}: accepted silently"
        return
    assert isinstance(error, clear), (
        f"{arg.name}={case.mutation}: raw {type(error).__name__}: {str(error)[:300]}"
    )
    text = str(error)
    names = (arg.name, *arg.aliases)
    assert any(n in text for n in names), (
        f"{arg.name}={case.mutation}: {type(error).__name__} does not name the argument "
        f"{names}: {text[:300]}"
    )


def _half_call(
    spec: Spec, call: Callable[..., Any], kwargs: Mapping[str, Any], mutation: str
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The call in half precision: tensors cast; a module's parameters too (a copy)."""
    dtype = torch.float16 if mutation == "half" else torch.bfloat16
    variant = {k: equivalent(mutation, v) for k, v in kwargs.items()}
    import copy

    if isinstance(call, torch.nn.Module):  # build() returned the module itself
        return copy.deepcopy(call).to(dtype), variant
    module = getattr(call, "__self__", None)
    if isinstance(module, torch.nn.Module):
        return getattr(copy.deepcopy(module).to(dtype), call.__name__), variant
    return call, variant
