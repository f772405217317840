"""The reduction every loss ends with, and the checks of its arguments (private).

Dtype policy: losses compute float16/bfloat16 inputs in float32; ``reduction="none"``
returns the input dtype, ``"sum"``/``"mean"`` the compute dtype (a half-precision sum of
many elements overflows). ``"mean"`` divides the sum by the number (or total weight) of the
counted elements; nothing counted gives a zero connected to the graph. ``normalizer``
replaces that denominator for ``"mean"`` and divides ``"sum"`` and ``"none"`` too, so
``loss(reduction="none").sum()`` always equals ``loss(reduction="sum")``.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.tensor_checks import exact_ignore

__all__ = ["REDUCTIONS", "check_normalizer", "check_reduction", "check_target_range", "reduce_loss"]

REDUCTIONS = ("none", "mean", "sum")


def reduce_loss(
    loss: Tensor,
    reduction: str,
    input_dtype: torch.dtype,
    count: int | Tensor | None = None,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Reduce an element-wise loss computed in the compute dtype (scriptable).

    Args:
        loss (Tensor[...]): Element-wise loss in the compute dtype (ignored elements hold 0).
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        input_dtype: The caller's input dtype; ``"none"`` returns it.
        count: What ``"mean"`` divides by: a number, or a tensor (a count or a total
            weight; no host read) (default ``loss.numel()``).
        normalizer: Replaces ``count`` for ``"mean"``; also divides ``"sum"`` and ``"none"``.
            A tensor is cast to ``loss``'s dtype first.

    Returns:
        Tensor: ``loss`` in ``input_dtype`` for ``"none"``; a scalar in the compute dtype
        otherwise.

    Raises:
        ValueError: An unknown ``reduction``.

    Examples:
        >>> reduce_loss(torch.ones(4), "mean", torch.float32, count=2)
        tensor(2.)
        >>> reduce_loss(torch.ones(0), "mean", torch.float32)
        tensor(0.)
        >>> reduce_loss(torch.ones(4), "sum", torch.float32, normalizer=torch.tensor(2.0))
        tensor(2.)
    """
    if reduction == "none":
        if normalizer is not None:
            loss = _divide(loss, normalizer)
        return loss.to(input_dtype)
    if reduction != "mean" and reduction != "sum":
        raise ValueError("reduction must be one of 'none', 'mean', 'sum'; got '" + reduction + "'")
    total = loss.sum()
    if normalizer is not None:
        return _divide(total, normalizer)
    if reduction == "sum":
        return total
    if count is None:
        return total * 0.0 if loss.numel() == 0 else total / loss.numel()
    if isinstance(count, Tensor):  # no host read: a zero count divides by 1 (the sum is 0)
        c = count.to(total.dtype)
        return total / torch.where(c == 0, torch.ones_like(c), c)
    return total * 0.0 if count == 0 else total / count


def _divide(x: Tensor, by: float | Tensor) -> Tensor:
    """``x / by``, a tensor ``by`` cast to ``x``'s dtype first (scriptable)."""
    if isinstance(by, Tensor):
        return x / by.reshape(()).to(x.dtype)
    return x / by


def check_reduction(reduction: object) -> None:
    """Raise unless ``reduction`` is ``"none"``, ``"mean"`` or ``"sum"``.

    Examples:
        >>> check_reduction("avg")
        Traceback (most recent call last):
        ...
        ValueError: reduction must be one of 'none', 'mean', 'sum'; got 'avg'
    """
    if not isinstance(reduction, str):
        raise TypeError(f"reduction must be str, got {type(reduction).__name__} ({reduction!r})")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of 'none', 'mean', 'sum'; got {reduction!r}")


def _check_positive(value: float, what: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"normalizer must be a positive finite number, got {what}{value!r}")


def check_normalizer(
    normalizer: float | Tensor | None, device: torch.device | None = None
) -> float | Tensor | None:
    """Validate a loss ``normalizer``; return it as a float, a 0-d tensor or ``None``.

    Positive and finite whatever its type: a Python or NumPy number, or a one-element real
    tensor on ``device`` (a 0-d CPU tensor works anywhere), whose value is a value check
    (read on CPU, a device-side assert on CUDA).

    Examples:
        >>> check_normalizer(torch.tensor([4.0]))
        tensor(4.)
        >>> check_normalizer(torch.tensor(0.0))
        Traceback (most recent call last):
        ...
        ValueError: normalizer must be a positive finite number, got a tensor holding 0.0
    """
    if normalizer is None:
        return None
    if isinstance(normalizer, Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"normalizer must be a number or a one-element tensor, "
                f"got a tensor of shape {tuple(normalizer.shape)}"
            )
        if normalizer.dtype == torch.bool or normalizer.is_complex():
            raise TypeError(f"normalizer must be a real tensor, got dtype {normalizer.dtype}")
        cpu_scalar = normalizer.device.type == "cpu" and normalizer.dim() == 0
        if device is not None and normalizer.device != device and not cpu_scalar:
            raise ValueError(
                f"normalizer must be on the inputs' device {device} (or be a 0-d CPU tensor), "
                f"got {normalizer.device}"
            )
        normalizer = normalizer.reshape(())
        if reads_values(normalizer):
            _check_positive(float(normalizer), "a tensor holding ")
        elif asserts_on_device(normalizer):
            n = normalizer.detach()
            assert_on_device(
                torch.isfinite(n) & (n > 0), "normalizer must be a positive finite number"
            )
        return normalizer
    if isinstance(normalizer, bool) or not isinstance(normalizer, numbers.Real):
        raise TypeError(
            f"normalizer must be a number or a one-element tensor, got "
            f"{type(normalizer).__name__} ({normalizer!r})"
        )
    _check_positive(float(normalizer), "")
    return float(normalizer)


def check_target_range(
    name: str,
    values: Tensor,
    low: float,
    high: float,
    *,
    ignore: float | None = None,
    hint: str = "",
) -> None:
    """Raise ``ValueError`` unless every value is in ``[low, high]`` or equals ``ignore``.

    A value check: one ``aminmax`` pass on CPU (a second, masking ``ignore``, only when the
    first finds values outside); a device-side assert on CUDA, with the same message less the
    values found. NaN fails. ``hint`` is appended to the message.

    Examples:
        >>> check_target_range("targets", torch.tensor([0, 1, 255]), 0, 1, ignore=255)
        >>> check_target_range("targets", torch.tensor([0.0, 1.0, 255.0]), 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: targets must be in [0, 1], got values in [0.0, 255.0]
    """
    if values.dtype == torch.bool or values.numel() == 0:
        return
    if ignore is not None:
        ignore = exact_ignore(values, ignore)  # a uint8 target never equals -100
    if reads_values(values):
        lo_t, hi_t = torch.aminmax(values.detach())
        lo, hi = lo_t.item(), hi_t.item()
        if not (low <= lo and hi <= high) and ignore is not None:
            lo_t, hi_t = torch.aminmax(values.detach().masked_fill(values == ignore, low))
            lo, hi = lo_t.item(), hi_t.item()
        if not (low <= lo and hi <= high):  # also True for NaN
            rule = _rule(name, low, high, ignore)
            raise ValueError(f"{rule}, got values in [{float(lo)!r}, {float(hi)!r}]{hint}")
    elif asserts_on_device(values):
        values = values.detach()
        masked = values if ignore is None else values.masked_fill(values == ignore, low)
        lo_t, hi_t = torch.aminmax(masked)
        ok = (lo_t >= low) & (hi_t <= high)  # NaN fails
        assert_on_device(ok, _rule(name, low, high, ignore) + hint)


def _rule(name: str, low: float, high: float, ignore: float | None) -> str:
    also = "" if ignore is None else f" (or equal ignore_index={ignore})"
    return f"{name} must be in [{low:g}, {high:g}]{also}"
