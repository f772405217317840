"""Stride measurement of `visionblocks.features.feature_info` (private): dry runs, the
ratio of input to output sizes, and the check run that settles ambiguous ratios."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks.features._capture import capture, eval_mode, example_args

__all__ = ["check_run", "measure", "stride"]

_CHECK_MULTIPLE = 256
"""Second dry runs (see `feature_info`) use sizes rounded up to a multiple of this."""


def _is_power_of_two(ratio: float) -> bool:
    return ratio >= 1 and math.log2(ratio).is_integer()


def _snap(size_in: int, size_out: int) -> float:
    """``size_in / size_out``, snapped to a power of two whose rounding gives ``size_out``."""
    ratio = size_in / size_out
    if ratio <= 1 or _is_power_of_two(ratio):
        return ratio
    low = 2 ** math.floor(math.log2(ratio))
    for p in sorted((low, 2 * low), key=lambda p: abs(p - ratio)):
        if size_out in (math.ceil(size_in / p), size_in // p):
            return float(p)
    return ratio


def _axis_stride(size_in: int, size_out: int, check: tuple[int, int] | None) -> float:
    """Stride along one axis from the dry run and, if there was one, the check run's sizes."""
    ratio = size_in / size_out
    if _is_power_of_two(ratio) or ratio < 1:
        return ratio
    if check is None:  # the model accepts no other size (fixed input): snap
        return _snap(size_in, size_out)
    check_in, check_out = check
    exact = check_in % check_out == 0 and _is_power_of_two(check_in / check_out)
    return check_in / check_out if exact else ratio


def stride(
    name: Any,
    size_in: Sequence[int],
    size_out: Sequence[int],
    check: tuple[Sequence[int], Sequence[int]] | None = None,
) -> int | float:
    if min(size_out) < 1:
        raise ValueError(f"feature {name!r} is empty ({tuple(size_out)}) for input {size_in}")
    strides = [
        _axis_stride(i, o, None if check is None else (check[0][a], check[1][a]))
        for a, (i, o) in enumerate(zip(size_in, size_out, strict=True))
    ]
    if strides[0] != strides[1]:
        raise ValueError(
            f"feature {name!r} has different strides in H and W ({strides[0]:g} vs "
            f"{strides[1]:g}: input {tuple(size_in)}, output {tuple(size_out)})"
        )
    return int(strides[0]) if strides[0].is_integer() else strides[0]


def measure(
    model: nn.Module, targets: Mapping[str, nn.Module], size: Sequence[int]
) -> tuple[dict[Any, Any], Any]:
    (x,) = example_args(model, None, size)
    with eval_mode(model), torch.no_grad():
        captured, out = capture(model, targets, (x,), {}, stop=False)
    if isinstance(out, Mapping):
        return dict(out), out
    if isinstance(out, (list, tuple)):
        return dict(enumerate(out)), out
    return captured, out


def check_run(
    model: nn.Module,
    targets: Mapping[str, nn.Module],
    size: tuple[int, ...],
    shapes: Mapping[Any, tuple[int, ...]],
) -> dict[Any, tuple[tuple[int, int], tuple[int, int]]]:
    """``{name: (check input (H, W), check output (H, W))}`` of a second dry run when a
    size ratio is not a power of two (empty when not needed or refused)."""
    ratios = [i / o for shape in shapes.values() for i, o in zip(size[1:], shape[2:])]
    if all(_is_power_of_two(r) or r < 1 for r in ratios):
        return {}
    check = tuple(-(-s // _CHECK_MULTIPLE) * _CHECK_MULTIPLE for s in size[1:])
    try:
        features, _ = measure(model, targets, (size[0], *check))
    except Exception:  # the model accepts no other size
        return {}
    found = {}
    for name in shapes:
        value = features.get(name)
        if isinstance(value, torch.Tensor) and value.dim() == 4 and min(value.shape[2:]) > 0:
            found[name] = (check, tuple(value.shape[2:]))
    return found
