"""Input validation shared by every public function.

One vocabulary for errors: each helper raises ``ValueError`` or ``TypeError`` whose message
names the argument, what was expected and what was received. Never use ``assert`` on user
input (it disappears under ``python -O``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "check_choice",
    "check_finite",
    "check_int",
    "check_number",
    "check_positive_int",
    "check_positive_ints",
    "check_range",
    "check_type",
    "format_shape",
    "is_finite",
]


def _type_names(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__


def check_type(name: str, value: Any, types: type | tuple[type, ...]) -> None:
    """Raise ``TypeError`` unless ``value`` is an instance of ``types``.

    Examples:
        >>> check_type("size", 3, int)
        >>> check_type("size", "3", int)
        Traceback (most recent call last):
        ...
        TypeError: size must be int, got str ('3')
        >>> check_type("size", True, int)
        Traceback (most recent call last):
        ...
        TypeError: size must be int, got bool (True)
    """
    wanted = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass, but True is no size, count or weight: refused unless asked for.
    sneaked_bool = isinstance(value, bool) and bool not in wanted and object not in wanted
    if sneaked_bool or not isinstance(value, types):
        raise TypeError(
            f"{name} must be {_type_names(types)}, got {type(value).__name__} ({value!r})"
        )


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``.

    Examples:
        >>> check_choice("reduction", "mean", ("none", "mean", "sum"))
        >>> check_choice("reduction", "avg", ("none", "mean", "sum"))
        Traceback (most recent call last):
        ...
        ValueError: reduction must be one of 'none', 'mean', 'sum'; got 'avg'
    """
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` unless ``low <= value <= high`` (bounds optional, inclusivity set).

    Examples:
        >>> check_range("alpha", 0.25, 0.0, 1.0)
        >>> check_range("alpha", 1.5, 0.0, 1.0)
        Traceback (most recent call last):
        ...
        ValueError: alpha must be in [0.0, 1.0], got 1.5
    """
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high or value != value:  # NaN fails every comparison: reject it too
        left = "[" if low_inclusive and low is not None else "("
        right = "]" if high_inclusive and high is not None else ")"
        lo = "-inf" if low is None else repr(low)
        hi = "inf" if high is None else repr(high)
        raise ValueError(f"{name} must be in {left}{lo}, {hi}{right}, got {value!r}")


def format_shape(shape: Sequence[int]) -> str:
    """Format a shape as a plain tuple string: ``(2, 3)``."""
    return str(tuple(int(s) for s in shape))


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """Raise unless ``value`` is an int (not a bool) in ``[low, high]`` (type first); return it.

    Examples:
        >>> check_int("num_convs", 4, 0, 32)
        4
        >>> check_int("num_convs", 10**9, 0, 32)
        Traceback (most recent call last):
        ...
        ValueError: num_convs must be in [0, 32], got 1000000000
        >>> check_int("num_convs", 2.0, 0, 32)
        Traceback (most recent call last):
        ...
        TypeError: num_convs must be int, got float (2.0)
    """
    check_type(name, value, int)
    check_range(name, value, low, high)
    return value


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    """Raise unless ``value`` is a real number (not a bool, not NaN) in range; return a float.

    Examples:
        >>> check_number("score_thresh", 0.05, 0.0, 1.0)
        0.05
        >>> check_number("score_thresh", None, 0.0, 1.0)
        Traceback (most recent call last):
        ...
        TypeError: score_thresh must be int or float, got NoneType (None)
        >>> check_number("eps", -1, 0.0, low_inclusive=False)
        Traceback (most recent call last):
        ...
        ValueError: eps must be in (0.0, inf), got -1
    """
    check_type(name, value, (int, float))
    check_range(name, value, low, high, low_inclusive=low_inclusive, high_inclusive=high_inclusive)
    return float(value)


def is_finite(value: float) -> bool:
    """``math.isfinite`` that ``torch.compile`` traces (``value`` may be symbolic).

    Examples:
        >>> is_finite(1e308), is_finite(float("inf")), is_finite(float("nan"))
        (True, False, False)
    """
    return value - value == 0  # inf - inf and NaN - NaN are NaN


def check_finite(name: str, value: float) -> float:
    """Raise ``ValueError`` unless the number ``value`` is finite (already type-checked).

    Examples:
        >>> check_finite("fill", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: fill must be a finite number, got inf
    """
    if not is_finite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def check_positive_int(name: str, value: Any, high: int | None = None) -> int:
    """Raise unless ``value`` is an int (not a bool) in ``[1, high]``; return it.

    Examples:
        >>> check_positive_int("groups", 4)
        4
        >>> check_positive_int("groups", 0)
        Traceback (most recent call last):
        ...
        ValueError: groups must be in [1, inf), got 0
    """
    return check_int(name, value, 1, high)


def check_positive_ints(
    name: str, values: Any, length: int | None = None, high: int | None = None
) -> tuple[int, ...]:
    """Raise unless ``values`` is a non-empty list or tuple of ``length`` ints in ``[1, high]``.

    Examples:
        >>> check_positive_ints("strides", [8, 16, 32])
        (8, 16, 32)
        >>> check_positive_ints("widths", (16, 0), length=2)
        Traceback (most recent call last):
        ...
        ValueError: widths[1] must be in [1, inf), got 0
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of ints, got {values!r}")
    if not values:
        raise ValueError(f"{name} is empty; give at least one int")
    if length is not None and len(values) != length:
        raise ValueError(f"{name} must have {length} entries, got {len(values)}: {values!r}")
    return tuple(check_positive_int(f"{name}[{i}]", v, high) for i, v in enumerate(values))
