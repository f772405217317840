"""Binary cross entropy on logits, with label smoothing and ``ignore_index``."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_finite, check_range, check_type
from visionblocks._core.reduce import (
    check_reduction,
    check_target_range,
    compute_dtype,
    reduce_loss,
)
from visionblocks._core.registry import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_same_shape,
    check_tensor,
)

__all__ = ["BCEWithLogitsLoss", "binary_cross_entropy_with_logits"]

Reduction = Literal["none", "mean", "sum"]


def _check_options(label_smoothing: float, ignore_index: float | None, reduction: str) -> None:
    check_type("label_smoothing", label_smoothing, (int, float))
    check_range("label_smoothing", float(label_smoothing), 0.0, 1.0, high_inclusive=False)
    if ignore_index is not None:
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int | float):
            raise TypeError(
                f"ignore_index must be None or a number, got {type(ignore_index).__name__}"
            )
        check_finite("ignore_index", ignore_index)
    check_reduction(reduction)


_RANGE_HINT = (
    "; targets are probabilities. If one value marks elements to leave out (255 in a mask, "
    "-1...), pass it as ignore_index"
)


def _check_broadcast(name: str, value: Tensor | None, shape: torch.Size) -> None:
    """``value`` is ``None`` or a floating tensor that broadcasts to ``shape`` (not beyond it)."""
    if value is None:
        return
    check_floating(name, value)
    try:
        ok = torch.broadcast_shapes(value.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} must broadcast to the inputs' shape {tuple(shape)}, got {tuple(value.shape)}"
        )


def binary_cross_entropy_with_logits(
    inputs: Tensor,
    targets: Tensor,
    *,
    weight: Tensor | None = None,
    pos_weight: Tensor | None = None,
    label_smoothing: float = 0.0,
    ignore_index: float | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """Binary cross entropy on logits, with label smoothing and ``ignore_index``.

    With ``label_smoothing=0`` and ``ignore_index=None`` this equals
    ``torch.nn.functional.binary_cross_entropy_with_logits`` in value and gradient (``weight``
    and ``pos_weight`` broadcast the same way), except that an empty ``"mean"`` is a
    graph-connected 0 instead of NaN.

    ``label_smoothing = s`` pulls every target towards 1/2: ``t * (1 - s) + s / 2`` (1 becomes
    ``1 - s/2``, 0 becomes ``s/2``), the per-element binary form of ``F.cross_entropy``'s
    smoothing with ``C = 2``.

    ``ignore_index``: elements whose target equals it contribute 0 and are not counted by
    ``"mean"`` (which divides by the number of remaining elements). The comparison uses the
    targets as passed, *before* smoothing, so pass raw targets (e.g. a ``uint8`` mask with 255
    for "don't care", or float targets with -1). Integer and boolean targets are accepted and
    converted to the compute dtype. Every other target must be in ``[0, 1]``: a 0/255 mask
    without ``ignore_index=255`` raises instead of giving a negative loss (a value check, one
    pass over the targets; see `visionblocks.set_value_checks`).

    Dtype policy: float16/bfloat16 inputs are computed in float32; ``"none"`` returns the
    inputs' dtype, ``"sum"``/``"mean"`` return float32 (see `visionblocks._core.reduce`).

    Args:
        inputs (Tensor[...]): Logits, any shape.
        targets (Tensor[...]): Targets in ``[0, 1]`` (binary or soft), ``inputs``' shape; or
            ``ignore_index``.
        weight (Tensor[...], optional): Element weight broadcastable to ``inputs``.
        pos_weight (Tensor[...], optional): Weight of the positive term, broadcastable to
            ``inputs`` (typically ``Tensor[C]`` for ``Tensor[N, C]`` inputs).
        label_smoothing: In ``[0, 1)``.
        ignore_index: ``None`` or the target value to exclude.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.

    Returns:
        Tensor: ``"none"``: ``inputs``' shape and dtype; otherwise a scalar in the compute
        dtype (float32 for half inputs).

    Raises:
        TypeError: Non-floating ``inputs``/``weight``/``pos_weight``, a non-tensor ``targets``,
            or options of the wrong type.
        ValueError: ``targets`` of another shape, ``weight``/``pos_weight`` not broadcastable
            to ``inputs``, tensors on different devices, ``label_smoothing`` outside
            ``[0, 1)``, a non-finite ``ignore_index``, an unknown ``reduction``, or (value
            check) targets outside ``[0, 1]`` other than ``ignore_index``.

    Examples:
        >>> import torch
        >>> inputs = torch.tensor([2.0, -1.0, 0.5])
        >>> binary_cross_entropy_with_logits(inputs, torch.tensor([1.0, 0.0, 1.0]))
        tensor(0.3048)
        >>> binary_cross_entropy_with_logits(inputs, torch.tensor([1, 0, 255]), ignore_index=255)
        tensor(0.2201)
        >>> binary_cross_entropy_with_logits(inputs, torch.tensor([1.0, 0.0, 1.0]),
        ...                                  label_smoothing=0.1, reduction="none")
        tensor([0.2269, 0.3633, 0.4991])
    """
    check_floating("inputs", inputs)
    check_tensor("targets", targets)
    check_same_shape("inputs", inputs, "targets", targets)
    if targets.is_complex():
        raise TypeError(f"targets must be real, got dtype {targets.dtype}")
    _check_broadcast("weight", weight, inputs.shape)
    _check_broadcast("pos_weight", pos_weight, inputs.shape)
    check_same_device(inputs=inputs, targets=targets, weight=weight, pos_weight=pos_weight)
    _check_options(label_smoothing, ignore_index, reduction)

    cdt = compute_dtype(inputs.dtype)
    t = targets.to(cdt)
    valid = None
    if ignore_index is not None:
        valid = targets != ignore_index
        t = t.masked_fill(~valid, 0.0)  # any value in [0, 1]: the element is dropped below
    if ignore_index is None:  # ignored elements hold 0 in t: checked with the rest
        check_target_range("targets", t, 0.0, 1.0, hint=_RANGE_HINT)
    else:
        check_target_range("targets", t, 0.0, 1.0, hint=f" (ignore_index={ignore_index})")
    if label_smoothing > 0:
        t = t * (1.0 - label_smoothing) + label_smoothing / 2
    loss = F.binary_cross_entropy_with_logits(
        inputs.to(cdt),
        t,
        weight=None if weight is None else weight.to(cdt),
        pos_weight=None if pos_weight is None else pos_weight.to(cdt),
        reduction="none",
    )
    if valid is None:
        return reduce_loss(loss, reduction, input_dtype=inputs.dtype)
    loss = loss.masked_fill(~valid, 0.0)
    return reduce_loss(loss, reduction, input_dtype=inputs.dtype, count=valid.sum())


@LOSSES.register(name="bce")
class BCEWithLogitsLoss(nn.Module):
    """Module form of `binary_cross_entropy_with_logits`; registered in ``LOSSES`` as ``"bce"``.

    Args:
        weight (Tensor[...], optional): Element weight (a buffer, so it follows ``.to()``).
        pos_weight (Tensor[...], optional): Positive-term weight (a buffer).
        label_smoothing: In ``[0, 1)``.
        ignore_index: ``None`` or the target value to exclude.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.

    Examples:
        >>> import torch
        >>> loss_fn = BCEWithLogitsLoss(label_smoothing=0.1, ignore_index=-1)
        >>> loss_fn
        BCEWithLogitsLoss(label_smoothing=0.1, ignore_index=-1, reduction='mean')
        >>> loss_fn(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]]))
        tensor(0.6931)
    """

    weight: Tensor | None
    pos_weight: Tensor | None

    def __init__(
        self,
        weight: Tensor | None = None,
        pos_weight: Tensor | None = None,
        label_smoothing: float = 0.0,
        ignore_index: float | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        _check_options(label_smoothing, ignore_index, reduction)
        for name, value in (("weight", weight), ("pos_weight", pos_weight)):
            if value is not None:
                check_floating(name, value)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.label_smoothing = label_smoothing
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Apply `binary_cross_entropy_with_logits` with this module's options."""
        return binary_cross_entropy_with_logits(
            inputs,
            targets,
            weight=self.weight,
            pos_weight=self.pos_weight,
            label_smoothing=self.label_smoothing,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index}, "
            f"reduction={self.reduction!r}"
        )
