"""Input validation shared by every public function.

One vocabulary for errors: each helper raises ``ValueError`` or ``TypeError`` whose message
names the argument, what was expected and what was received. Never use ``assert`` on user
input (it disappears under ``python -O``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "check_choice",
    "check_floating",
    "check_last_dim",
    "check_range",
    "check_same_shape",
    "check_tensor",
    "check_type",
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


def check_tensor(name: str, value: Any) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a ``torch.Tensor``; return it.

    Examples:
        >>> import torch
        >>> check_tensor("x", torch.zeros(1)).shape
        torch.Size([1])
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(name: str, value: Any) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a floating-point tensor; return it.

    Examples:
        >>> import torch
        >>> check_floating("logits", torch.zeros(2, dtype=torch.long))
        Traceback (most recent call last):
        ...
        TypeError: logits must be a floating-point tensor, got dtype torch.int64
    """
    check_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Raise ``ValueError`` unless two tensors have the same shape.

    Examples:
        >>> import torch
        >>> check_same_shape("inputs", torch.zeros(2, 3), "targets", torch.zeros(2, 4))
        Traceback (most recent call last):
        ...
        ValueError: inputs and targets must have the same shape, got (2, 3) and (2, 4)
    """
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_last_dim(name: str, value: torch.Tensor, size: int, *, what: str = "") -> None:
    """Raise ``ValueError`` unless ``value.shape[-1] == size`` (and ``value.dim() >= 1``).

    Examples:
        >>> import torch
        >>> check_last_dim("boxes", torch.zeros(5, 3), 4, what="(x1, y1, x2, y2)")
        Traceback (most recent call last):
        ...
        ValueError: boxes must have shape (..., 4) (x1, y1, x2, y2), got (5, 3)
    """
    if value.dim() == 0 or value.shape[-1] != size:
        suffix = f" {what}" if what else ""
        raise ValueError(f"{name} must have shape (..., {size}){suffix}, got {tuple(value.shape)}")


def check_feature_map(name: str, value: Any, channels: int) -> torch.Tensor:
    """Raise unless ``value`` is a ``(B, channels, H, W)`` floating-point tensor; return it.

    Examples:
        >>> import torch
        >>> check_feature_map("x", torch.zeros(32, 9, 9), 32)
        Traceback (most recent call last):
        ...
        ValueError: x must have shape (B, 32, H, W), got (32, 9, 9)
    """
    check_floating(name, value)
    if value.dim() != 4 or value.shape[1] != channels:
        raise ValueError(f"{name} must have shape (B, {channels}, H, W), got {tuple(value.shape)}")
    return value


def format_shape(shape: Sequence[int]) -> str:
    """Format a shape as a plain tuple string: ``(2, 3)``."""
    return str(tuple(int(s) for s in shape))
