"""Binary cross entropy on logits, with label smoothing and ``ignore_index``.

`binary_cross_entropy_with_logits` is `torch.nn.functional.binary_cross_entropy_with_logits`
(same signature, values, gradients and dtypes) plus two keyword-only extras after PyTorch's
arguments: ``label_smoothing`` and ``ignore_index``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_finite, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_same_shape,
    check_tensor,
    compute_dtype,
    exact_ignore,
)
from visionblocks.losses._reduce import check_reduction, check_target_range, reduce_loss
from visionblocks.losses._torch_compat import TorchValueError, autocast_enabled, legacy_reduction

__all__ = ["BCEWithLogitsLoss", "binary_cross_entropy_with_logits"]
__dir__ = public_dir(__name__, __all__)

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
        if isinstance(ignore_index, int):  # targets hold at most int64
            check_range("ignore_index", ignore_index, -(2**63), 2**63 - 1)
    check_reduction(reduction)


_RANGE_HINT = (
    "; targets are probabilities. If one value marks elements to leave out (255 in a mask, "
    "-1...), pass it as ignore_index"
)


def _check_real(name: str, value: Tensor | None) -> None:
    """``value`` is ``None`` or a real (not complex, not bool) tensor: PyTorch multiplies by
    it."""
    if value is None:
        return
    check_tensor(name, value)
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(
            f"{name} must be a real tensor (not complex or bool), got dtype {value.dtype}"
        )


def _check_broadcast(name: str, value: Tensor | None, shape: torch.Size) -> None:
    """``value`` is ``None`` or a real tensor that broadcasts to ``shape`` (not beyond it)."""
    if value is None:
        return
    _check_real(name, value)
    try:
        ok = torch.broadcast_shapes(value.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:  # PyTorch: RuntimeError
        raise TorchValueError(
            f"{name} must broadcast to the inputs' shape {tuple(shape)}, got {tuple(value.shape)}"
        )


def binary_cross_entropy_with_logits(
    inputs: Tensor,
    targets: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: Reduction = "mean",
    pos_weight: Tensor | None = None,
    *,
    label_smoothing: float = 0.0,
    ignore_index: float | None = None,
) -> Tensor:
    """Binary cross entropy on logits, with label smoothing and ``ignore_index``.

    With ``label_smoothing=0`` and ``ignore_index=None`` this *is*
    ``torch.nn.functional.binary_cross_entropy_with_logits``, after input checks: same
    positional signature (``size_average``/``reduce`` are PyTorch's deprecated arguments),
    values, gradients and dtypes (the targets' dtype, float32 under autocast), ``weight``
    and ``pos_weight`` broadcast the same way, and ``"mean"`` of an empty input is NaN. The
    differences are only for calls PyTorch rejects (integer and boolean targets are accepted
    and converted to the inputs' dtype) and clear errors: ``ValueError``/``TypeError``, also a
    ``RuntimeError`` where PyTorch raises one for the same input. The first two arguments are
    named ``inputs`` and ``targets`` (PyTorch: ``input``, ``target``).

    ``label_smoothing = s`` (keyword-only) pulls every target towards 1/2: ``t * (1 - s) +
    s / 2`` (1 becomes ``1 - s/2``, 0 becomes ``s/2``), the per-element binary form of
    ``F.cross_entropy``'s smoothing with ``C = 2``.

    ``ignore_index`` (keyword-only): elements whose target equals it contribute 0 and are not
    counted by ``"mean"`` (which divides by the number of remaining elements). The comparison
    uses the targets as passed, *before* smoothing, so pass raw targets (e.g. a ``uint8`` mask
    with 255 for "don't care", or float targets with -1). Every other target must be in
    ``[0, 1]`` (PyTorch's documented range): a 0/255 mask without ``ignore_index=255`` raises
    instead of giving a negative loss (a value check, one pass over the targets; see
    `visionblocks.set_value_checks`).

    With either extra on, sums are accumulated in float32 for half inputs (and returned in
    PyTorch's dtype), and a ``"mean"`` that counts nothing (an empty input, every element
    ignored) is a zero that stays connected to the graph instead of NaN.

    Under ``torch.autocast``: PyTorch computes it in float32, so every ``reduction`` returns
    float32, also for half inputs and targets (smoothed in float32). Outside it, half inputs
    and targets give PyTorch's half-precision loss.

    Args:
        inputs (Tensor[...]): Logits, any shape.
        targets (Tensor[...]): Targets in ``[0, 1]`` (binary or soft), ``inputs``' shape; or
            ``ignore_index``.
        weight (Tensor[...], optional): Element weight broadcastable to ``inputs``.
        size_average: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduce: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        pos_weight (Tensor[...], optional): Weight of the positive term, broadcastable to
            ``inputs`` (typically ``Tensor[C]`` for ``Tensor[N, C]`` inputs).
        label_smoothing: In ``[0, 1)``.
        ignore_index: ``None`` or the target value to exclude.

    Returns:
        Tensor: ``"none"``: ``inputs``' shape; otherwise a scalar. In PyTorch's dtype: the
        targets' (the inputs' for integer or boolean targets).

    Raises:
        TypeError: Non-floating ``inputs``, a non-tensor or complex ``targets``/``weight``/
            ``pos_weight``, options of the wrong type, or a ``size_average``/``reduce`` that
            is not ``None`` or a bool.
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
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_floating("inputs", inputs)
    check_tensor("targets", targets)
    check_same_shape("inputs", inputs, "targets", targets)
    if targets.is_complex():
        raise TypeError(f"targets must be real, got dtype {targets.dtype}")
    _check_broadcast("weight", weight, inputs.shape)
    _check_broadcast("pos_weight", pos_weight, inputs.shape)
    check_same_device(inputs=inputs, targets=targets, weight=weight, pos_weight=pos_weight)
    _check_options(label_smoothing, ignore_index, reduction)

    if ignore_index is None:
        check_target_range("targets", targets, 0.0, 1.0, hint=_RANGE_HINT)
    else:
        hint = f" (ignore_index={ignore_index})"
        check_target_range("targets", targets, 0.0, 1.0, ignore=ignore_index, hint=hint)
    t = targets if targets.is_floating_point() else targets.to(inputs.dtype)
    options = {"weight": weight, "pos_weight": pos_weight}
    if ignore_index is None and label_smoothing == 0:
        return F.binary_cross_entropy_with_logits(inputs, t, reduction=reduction, **options)

    valid = None
    ignore_index = exact_ignore(targets, ignore_index)  # a uint8 target never equals -1
    if ignore_index is not None:
        valid = targets != ignore_index
        t = t.masked_fill(~valid, 0.0)  # any value in [0, 1]: the element is dropped below
    if label_smoothing > 0:
        if t.dtype in (torch.float16, torch.bfloat16) and autocast_enabled(inputs):
            t = t.float()  # autocast computes the loss in float32: smooth the targets in it too
        t = t * (1.0 - label_smoothing) + label_smoothing / 2
    loss = F.binary_cross_entropy_with_logits(inputs, t, reduction="none", **options)
    out_dtype = loss.dtype
    loss = loss.to(compute_dtype(out_dtype))
    if valid is None:
        return reduce_loss(loss, reduction, out_dtype).to(out_dtype)
    loss = loss.masked_fill(~valid, 0.0)
    return reduce_loss(loss, reduction, out_dtype, valid.sum()).to(out_dtype)


@LOSSES.register(name="bce")
class BCEWithLogitsLoss(nn.Module):
    """Module form of `binary_cross_entropy_with_logits`; registered in ``LOSSES`` as ``"bce"``.

    ``torch.nn.BCEWithLogitsLoss`` with label smoothing and ``ignore_index``: the same
    positional arguments (``size_average`` and ``reduce`` are PyTorch's deprecated ones),
    ``weight`` and ``pos_weight`` kept as buffers (so they follow ``.to()`` and are in the
    state dict under the same keys), and the extras keyword-only after them. With the extras
    off its results are PyTorch's.

    Args:
        weight (Tensor[...], optional): Element weight (a buffer).
        size_average: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduce: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        pos_weight (Tensor[...], optional): Positive-term weight (a buffer).
        label_smoothing: In ``[0, 1)``.
        ignore_index: ``None`` or the target value to exclude.


    Examples:
        >>> import torch
        >>> loss_fn = BCEWithLogitsLoss(label_smoothing=0.1, ignore_index=-1)
        >>> loss_fn
        BCEWithLogitsLoss(label_smoothing=0.1, ignore_index=-1, reduction='mean')
        >>> loss_fn(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]]))
        tensor(0.6931)
        >>> BCEWithLogitsLoss(pos_weight=torch.tensor([3.0])).pos_weight
        tensor([3.])
    """

    weight: Tensor | None
    pos_weight: Tensor | None

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: Reduction = "mean",
        pos_weight: Tensor | None = None,
        *,
        label_smoothing: float = 0.0,
        ignore_index: float | None = None,
    ) -> None:
        super().__init__()
        reduction = legacy_reduction(size_average, reduce, reduction)
        _check_options(label_smoothing, ignore_index, reduction)
        _check_real("weight", weight)
        _check_real("pos_weight", pos_weight)
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
