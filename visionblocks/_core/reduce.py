"""Reduction and dtype policy shared by every loss.

Dtype policy (one rule for all losses):

- Losses compute in ``float32`` for ``float16``/``bfloat16`` inputs and in the input dtype for
  ``float32``/``float64`` (`compute_dtype`).
- ``reduction="none"`` returns the input dtype (element-wise values fit the input's range).
- ``reduction="sum"`` / ``"mean"`` return the compute dtype: ``float32`` for half inputs,
  because a half-precision sum of many elements overflows.

Reductions:

- ``"mean"`` divides the sum by the number of *counted* elements (ignored elements are not
  counted); an empty input or a count of zero gives a zero that stays connected to the graph.
- ``normalizer`` replaces that denominator for ``"mean"`` and divides ``"sum"`` too; with
  ``"none"`` every element is divided by it, so ``loss(reduction="none").sum()`` always equals
  ``loss(reduction="sum")``.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.tensor_checks import assert_on_device, asserts_on_device, reads_values

__all__ = [
    "REDUCTIONS",
    "check_normalizer",
    "check_reduction",
    "check_target_range",
    "compute_dtype",
    "reduce_loss",
]

REDUCTIONS = ("none", "mean", "sum")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype losses and ops compute in for inputs of ``dtype``: float64 stays float64,
    everything else (float16, bfloat16, float32, integers) is computed in float32.

    Examples:
        >>> import torch
        >>> compute_dtype(torch.float16), compute_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_reduction(reduction: str) -> None:
    """Raise ``ValueError`` unless ``reduction`` is ``"none"``, ``"mean"`` or ``"sum"``."""
    check_type("reduction", reduction, str)
    check_choice("reduction", reduction, REDUCTIONS)


def _check_positive(value: float, what: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"normalizer must be a positive finite number, got {what}{value!r}")


def check_normalizer(
    normalizer: float | Tensor | None, device: torch.device | None = None
) -> float | Tensor | None:
    """Validate a loss ``normalizer``; return it as a float, a 0-d tensor or ``None``.

    Positive and finite whatever its type: a Python or NumPy number (checked always), or a
    one-element real tensor on ``device`` (a 0-d CPU tensor works anywhere), whose value is
    checked when `visionblocks.value_checks_enabled`: read on CPU (``ValueError``), a
    device-side assert on CUDA (no host sync; a failure is a CUDA error at the next sync,
    see `visionblocks._core.tensor_checks.asserts_on_device`), skipped while tracing or
    compiling.

    Examples:
        >>> import torch
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

    A value check, skipped unless `visionblocks.value_checks_enabled` (and for meta or bool
    tensors, and while tracing or compiling). On CPU: one ``torch.aminmax`` pass; only when
    it finds values outside the range and an ``ignore`` value is given, a second pass with
    those values masked. On CUDA the values are not read on the host: a device-side assert
    (one ``aminmax``, after masking ``ignore``) with the same message less the values found;
    a failure is a CUDA error at the next synchronisation
    (`visionblocks._core.tensor_checks.asserts_on_device`). NaN fails. ``hint`` is appended
    to the message.

    Examples:
        >>> import torch
        >>> check_target_range("targets", torch.tensor([0, 1, 255]), 0, 1, ignore=255)
        >>> check_target_range("targets", torch.tensor([0.0, 1.0, 255.0]), 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: targets must be in [0, 1], got values in [0.0, 255.0]
    """
    if values.dtype == torch.bool or values.numel() == 0:
        return
    if reads_values(values):
        lo_t, hi_t = torch.aminmax(values.detach())
        lo, hi = lo_t.item(), hi_t.item()
        if not (low <= lo and hi <= high) and ignore is not None:
            masked = values.detach().masked_fill(values == ignore, low)
            lo, hi = (v.item() for v in torch.aminmax(masked))
        if not (low <= lo and hi <= high):  # also True for NaN
            rule = _range_rule(name, low, high, ignore)
            raise ValueError(f"{rule}, got values in [{float(lo)!r}, {float(hi)!r}]{hint}")
    elif asserts_on_device(values):
        values = values.detach()
        masked = values if ignore is None else values.masked_fill(values == ignore, low)
        lo_t, hi_t = torch.aminmax(masked)
        rule = _range_rule(name, low, high, ignore)
        assert_on_device((lo_t >= low) & (hi_t <= high), rule + hint)  # NaN fails


def _range_rule(name: str, low: float, high: float, ignore: float | None) -> str:
    also = "" if ignore is None else f" (or equal ignore_index={ignore})"
    return f"{name} must be in [{low:g}, {high:g}]{also}"


def reduce_loss(
    loss: Tensor,
    reduction: str,
    *,
    input_dtype: torch.dtype,
    count: int | Tensor | None = None,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Reduce an element-wise loss computed in the compute dtype, following the policy above.

    Args:
        loss (Tensor[...]): Element-wise loss in the compute dtype (ignored elements hold 0).
        reduction: ``"none"``, ``"mean"`` or ``"sum"`` (already validated).
        input_dtype: The caller's input dtype; ``"none"`` returns it.
        count: How many elements ``"mean"`` divides by (default ``loss.numel()``).
        normalizer: Replaces ``count`` for ``"mean"``; also divides ``"sum"`` and ``"none"``.
            A tensor is cast to ``loss``'s dtype first, so a float64 normalizer does not
            widen a float32 loss.

    Returns:
        Tensor: ``loss`` in ``input_dtype`` for ``"none"``; a scalar in the compute dtype
        otherwise.

    Examples:
        >>> import torch
        >>> reduce_loss(torch.ones(4), "mean", input_dtype=torch.float32, count=2)
        tensor(2.)
        >>> reduce_loss(torch.ones(0), "mean", input_dtype=torch.float32)
        tensor(0.)
        >>> half = torch.tensor(2.0, dtype=torch.float64)
        >>> reduce_loss(torch.ones(4), "sum", input_dtype=torch.float32, normalizer=half)
        tensor(2.)
    """
    if isinstance(normalizer, Tensor):
        normalizer = normalizer.to(loss.dtype)
    if reduction == "none":
        if normalizer is not None:
            loss = loss / normalizer
        return loss.to(input_dtype)
    total = loss.sum()
    if normalizer is not None:
        return total / normalizer
    if reduction == "sum":
        return total
    if count is None:
        count = loss.numel()
    if isinstance(count, Tensor):
        # No host sync: a zero count gives sum / 1 = 0 (nothing was counted, so sum is 0).
        return total / count.to(total.dtype).clamp_min(1)
    if count == 0:
        return total * 0.0
    return total / count
