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

import torch
from torch import Tensor

from visionblocks._check import check_choice, check_range, check_type

__all__ = ["REDUCTIONS", "check_reduction", "compute_dtype", "reduce_loss"]

REDUCTIONS = ("none", "mean", "sum")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype losses compute in for inputs of ``dtype``.

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


def check_normalizer(normalizer: float | Tensor | None) -> None:
    """Validate a loss ``normalizer``: ``None``, a positive number or a tensor with one element."""
    if normalizer is None:
        return
    if isinstance(normalizer, Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"normalizer must be a number or a one-element tensor, "
                f"got a tensor of shape {tuple(normalizer.shape)}"
            )
        return
    if isinstance(normalizer, bool) or not isinstance(normalizer, int | float):
        raise TypeError(
            f"normalizer must be a number or a one-element tensor, got {type(normalizer).__name__}"
        )
    check_range("normalizer", float(normalizer), 0.0, None, low_inclusive=False)


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

    Returns:
        Tensor: ``loss`` in ``input_dtype`` for ``"none"``; a scalar in the compute dtype
        otherwise.

    Examples:
        >>> import torch
        >>> reduce_loss(torch.ones(4), "mean", input_dtype=torch.float32, count=2)
        tensor(2.)
        >>> reduce_loss(torch.ones(0), "mean", input_dtype=torch.float32)
        tensor(0.)
    """
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
