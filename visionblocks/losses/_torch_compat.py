"""What `cross_entropy` and `binary_cross_entropy_with_logits` share to stand in for PyTorch's.

Private. Both keep PyTorch's positional signatures, so PyTorch's deprecated ``size_average``
/ ``reduce`` arguments (and ``reduction="elementwise_mean"``) are accepted and mean what they
mean in PyTorch, with PyTorch's warning. Where PyTorch raises a ``RuntimeError`` or an
``IndexError`` for a bad input, these raise an error that is both that and the
``ValueError`` the rest of visionblocks raises, so ``except`` clauses written for either work.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["TorchIndexError", "TorchValueError", "autocast_enabled", "legacy_reduction"]


class TorchValueError(ValueError, RuntimeError):
    """A bad value that PyTorch's own function reports as a ``RuntimeError``."""


class TorchIndexError(ValueError, IndexError):
    """A class index out of range: PyTorch raises ``IndexError`` (CPU) for it."""


def autocast_enabled(t: Tensor) -> bool:
    """Whether ``torch.autocast`` is on for ``t``'s device (PyTorch then casts the inputs of
    ``F.cross_entropy`` / ``F.binary_cross_entropy_with_logits`` to float32 itself).

    Examples:
        >>> import torch
        >>> autocast_enabled(torch.zeros(1))
        False
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     autocast_enabled(torch.zeros(1))
        True
    """
    try:
        return torch.is_autocast_enabled(t.device.type)
    except RuntimeError:  # a device type without autocast (meta, ...)
        return False


def legacy_reduction(size_average: Any, reduce: Any, reduction: Any) -> Any:
    """``reduction`` after PyTorch's deprecated ``size_average``/``reduce`` and aliases.

    As ``torch.nn._reduction``: either of ``size_average``/``reduce`` given decides the
    reduction (``reduce=False``: ``"none"``; else ``size_average=False``: ``"sum"``; else
    ``"mean"``) and warns; ``"elementwise_mean"`` is ``"mean"``, with a warning. Both must be
    ``None`` or a bool: a number there is almost always an option of visionblocks' older
    signatures passed by position.

    Examples:
        >>> legacy_reduction(None, None, "sum")
        'sum'
    """
    for name, value in (("size_average", size_average), ("reduce", reduce)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(
                f"{name} must be None or a bool (PyTorch's deprecated argument, at the same "
                f"position as in PyTorch), got {type(value).__name__} ({value!r}); pass the "
                "other options by keyword"
            )
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "mean" if size_average and reduce else "sum" if reduce else "none"
        warnings.warn(
            "size_average and reduce args will be deprecated, please use "
            f"reduction='{reduction}' instead.",
            UserWarning,
            stacklevel=3,
        )
    elif isinstance(reduction, str) and reduction == "elementwise_mean":
        warnings.warn(
            "reduction='elementwise_mean' is deprecated. Please use reduction='mean' instead.",
            UserWarning,
            stacklevel=3,
        )
        reduction = "mean"
    return reduction
