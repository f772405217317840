"""Input checks of `cross_entropy` and `softmax_focal_loss` (private; shared by both)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from visionblocks._core.checks import check_range, check_type
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_tensor,
    exact_ignore,
)
from visionblocks.losses._reduce import check_reduction
from visionblocks.losses._torch_compat import TorchIndexError, TorchValueError

__all__ = [
    "check_class_indices",
    "check_class_weight",
    "check_devices",
    "check_logits_target",
    "check_options",
    "check_top_k",
]


def check_options(
    ignore_index: int, label_smoothing: float, reduction: str, *, smoothing_up_to_1: bool = False
) -> None:
    """Option checks; ``smoothing_up_to_1`` allows ``label_smoothing=1`` (as PyTorch does)."""
    check_type("ignore_index", ignore_index, int)
    if isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be int, got bool ({ignore_index!r})")
    check_range("ignore_index", ignore_index, -(2**63), 2**63 - 1)  # an int64, as targets
    check_type("label_smoothing", label_smoothing, (int, float))
    if smoothing_up_to_1:
        if not 0.0 <= label_smoothing <= 1.0:  # NaN fails too; PyTorch: RuntimeError
            raise TorchValueError(f"label_smoothing must be in [0.0, 1.0], got {label_smoothing}")
    else:
        check_range("label_smoothing", float(label_smoothing), 0.0, 1.0, high_inclusive=False)
    check_reduction(reduction)


def check_top_k(top_k: float | None) -> None:
    if top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int | float):
        raise TypeError(f"top_k must be None or a float in (0, 1], got {type(top_k).__name__}")
    check_range("top_k", float(top_k), 0.0, 1.0, low_inclusive=False)


def check_class_weight(name: str, weight: Tensor | None, num_classes: int | None) -> None:
    """``weight`` is None or a floating ``Tensor[C]`` (any ``C`` when ``num_classes`` is None)
    of finite entries ``>= 0``, one of them nonzero: a negative weight makes the loss
    unbounded below, and all zero, every element weighs 0 and a ``"mean"`` is 0 / 0
    (PyTorch: NaN). A value check (read on CPU, a device-side assert on CUDA)."""
    if weight is None:
        return
    check_floating(name, weight)
    if weight.dim() != 1 or (num_classes is not None and weight.shape[0] != num_classes):
        expected = "C" if num_classes is None else num_classes
        raise TorchValueError(
            f"{name} must have shape ({expected},) (one value per class), got {tuple(weight.shape)}"
        )
    rule = f"{name} must be finite and >= 0 with a nonzero entry (all zero, a mean is 0 / 0)"
    if weight.numel() == 0:
        raise ValueError(f"{rule}, got an empty tensor")
    if reads_values(weight):
        lo, hi = torch.aminmax(weight.detach())
        low, high = lo.item(), hi.item()
        if not (low >= 0 and 0 < high < math.inf):  # also False for NaN
            raise ValueError(f"{rule}, got values in [{low}, {high}]")
    elif asserts_on_device(weight):
        lo, hi = torch.aminmax(weight.detach())
        assert_on_device((lo >= 0) & (hi > 0) & (hi < math.inf), rule)


def check_logits_target(logits: Tensor, target: Tensor, *, allow_probs: bool) -> bool:
    """Validate ``logits (N, C, ...)`` and ``target``; return whether ``target`` holds probs."""
    check_floating("logits", logits)
    check_tensor("target", target)
    if logits.dim() == 0:
        raise TorchValueError(
            "logits must have shape (C,), (N, C) or (N, C, ...), got a 0-d tensor"
        )
    num_classes = logits.shape[0 if logits.dim() == 1 else 1]
    if num_classes == 0:
        raise TorchIndexError(
            f"logits must have at least one class, got shape {tuple(logits.shape)}"
        )
    index_shape = () if logits.dim() == 1 else (logits.shape[0], *logits.shape[2:])
    if target.is_floating_point():
        if not allow_probs:
            raise TypeError(
                f"target must hold class indices (an integer dtype), got dtype {target.dtype}; "
                "use cross_entropy for probability targets"
            )
        if target.shape != logits.shape:
            raise TorchValueError(
                f"probability targets must have the logits' shape {tuple(logits.shape)}, "
                f"got {tuple(target.shape)}"
            )
        return True
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"target must hold class indices (an integer dtype), got {target.dtype}")
    if tuple(target.shape) != index_shape:
        raise TorchValueError(
            f"target of class indices must have shape {index_shape} for logits of shape "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    return False


def check_class_indices(target: Tensor, num_classes: int, ignore_index: int) -> None:
    """Raise for class indices outside ``[0, C)`` (other than ``ignore_index``).

    The error is a ``ValueError`` and an ``IndexError`` (what ``F.cross_entropy`` raises on
    CPU).

    A value check of CPU tensors (skipped when `visionblocks.value_checks_enabled` is off):
    one ``aminmax``, and a second one over the targets with ``ignore_index`` masked when the
    first finds values outside ``[0, C)``. Skipped on CUDA (no host read): there, and with
    value checks off, an out-of-range index hits the device-side assert (CUDA) or the
    ``IndexError`` (CPU) of ``nll_loss``/``gather``, exactly as ``F.cross_entropy``.
    """
    if target.numel() == 0 or not reads_values(target):
        return
    ignore = exact_ignore(target, ignore_index)  # a uint8 target never equals -100
    for values in (target, None):
        if values is None:
            values = target if ignore is None else target.masked_fill(target == ignore, 0)
        lo, hi = (int(v) for v in torch.aminmax(values))
        if lo >= 0 and hi < num_classes:
            return
    value = lo if lo < 0 else hi
    raise TorchIndexError(
        f"target class indices must be in [0, {num_classes}) or equal ignore_index "
        f"({ignore_index}), got {value}"
    )


def check_devices(logits: Tensor, target: Tensor, **others: Tensor | float | None) -> None:
    tensors = {k: v for k, v in others.items() if isinstance(v, Tensor)}
    check_same_device(logits=logits, target=target, **tensors)
