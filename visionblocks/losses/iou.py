"""GIoU, DIoU and CIoU losses of aligned box pairs (``1 -`` the IoU variant, plus penalties).

Each loss is a function (served by `visionblocks.ops` too, where torchvision users look for
it) and a module of the same stem, registered in ``LOSSES``: `GeneralizedBoxIoULoss`
(``"giou"``), `DistanceBoxIoULoss` (``"diou"``), `CompleteBoxIoULoss` (``"ciou"``);
``GIoULoss``, ``DIoULoss`` and ``CIoULoss`` are deprecated aliases (removed in 0.3). One torch
formula, `visionblocks.ops.boxes`'s `_measure`, and for CUDA tensors the fused Triton kernels
(`visionblocks.kernels.iou`), tested against it. The functions script with
``torch.jit.script`` (``impl`` ``"auto"`` or ``"torch"``; no input checks, gradients to half
boxes not clamped) and compile with ``torch.compile(fullgraph=True)``. A non-finite
coordinate gives a NaN loss, as in torchvision. Value check (`visionblocks.set_value_checks`):
on CPU, finite coordinates beyond the box ops' Range (``2**61`` in magnitude in float32, where
an area or squared distance overflows and torchvision's loss is NaN; float64 boxes hold every
finite float32 box) raise a ``ValueError`` naming ``pred`` or ``target``; CUDA tensors are not
checked (no host read, no extra kernels).

Convention:
    The box ops' (`visionblocks.ops.boxes`: ``"xyxy"``, no ``+1``, the eps rule, zero-area
    and inverted boxes, the range of exact results); pairs are element-wise (``pred[i]``
    with ``target[i]``) and every loss is symmetric in ``pred`` and ``target``. Identical
    boxes give loss 0 at any size, a degenerate pair loss 1. Values and gradients are finite
    and, wherever torchvision's are finite, equal to torchvision's up to its ``eps``; only
    CIoU's angle term differs: ``atan2(w, h)`` instead of ``atan(w / h)`` (NaN gradients at
    ``h = 0`` in torchvision), with no gradient for a point box. Gradients can reach about
    ``1 / eps`` for two collinear zero-width boxes, as in torchvision.

Dtype policy: float16/bfloat16 are computed in float32; ``"none"`` returns the inputs'
dtype, ``"sum"``/``"mean"`` the compute dtype; gradients of half inputs are clamped to the
half dtype's finite range. Mixed dtypes are promoted first; ``torch.autocast`` changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import forced_triton, use_triton, validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_same_shape,
    compute_dtype,
)
from visionblocks.losses._reduce import REDUCTIONS, check_reduction, reduce_loss
from visionblocks.ops.boxes import _columns, _measure, _upcast, check_eps, check_range

__all__ = [
    "CompleteBoxIoULoss",
    "DistanceBoxIoULoss",
    "GeneralizedBoxIoULoss",
    "complete_box_iou_loss",
    "distance_box_iou_loss",
    "generalized_box_iou_loss",
]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]
_OPS = {1: "generalized_box_iou_loss", 2: "distance_box_iou_loss", 3: "complete_box_iou_loss"}


def _pair_losses(pred: Tensor, target: Tensor, kind: int, eps: float) -> Tensor:
    """``1 -`` `_measure` ``kind`` of ``(..., 4)`` pairs, in float32 (float64) (scriptable)."""
    dtype = compute_dtype(torch.promote_types(pred.dtype, target.dtype))
    p = _columns(_upcast(pred, dtype), False)
    g = _columns(_upcast(target, dtype), False)
    return torch.rsub(_measure(p, g, kind, eps), 1.0)  # 1 - measure


def _check_loss_inputs(pred: Tensor, target: Tensor, reduction: str, eps: float) -> None:
    """Shapes, dtypes, devices and options (no values)."""
    for name, boxes in (("pred", pred), ("target", target)):
        if not isinstance(boxes, Tensor) or not boxes.is_floating_point():
            check_floating(name, boxes)
        if boxes.shape[-1:] != (4,):
            raise ValueError(
                f"{name} must have shape (..., 4) (x1, y1, x2, y2), got {tuple(boxes.shape)}"
            )
    if pred.shape != target.shape:
        check_same_shape("pred", pred, "target", target)
    if pred.device != target.device:
        check_same_device(pred=pred, target=target)
    if reduction not in REDUCTIONS:
        check_reduction(reduction)
    check_eps(eps)
    check_range(pred, target, ("pred", "target"))


def _box_iou_loss(
    pred: Tensor, target: Tensor, kind: int, reduction: str, eps: float, impl: str
) -> Tensor:
    """The three losses: checks, then the Triton kernel or the formula, reduced."""
    if not torch.jit.is_scripting():
        _check_loss_inputs(pred, target, reduction, eps)
        if use_triton(_OPS[kind], impl, pred, target):
            return _fused_loss(pred, target, kind, reduction, eps, impl)
    elif impl == "triton":
        raise ValueError("impl must be 'auto' or 'torch' under TorchScript, got 'triton'")
    input_dtype = torch.promote_types(pred.dtype, target.dtype)
    return reduce_loss(_pair_losses(pred, target, kind, eps), reduction, input_dtype)


def _fused_loss(
    pred: Tensor, target: Tensor, kind: int, reduction: str, eps: float, impl: str
) -> Tensor:
    """The Triton kernel on ``(N, 4)`` views, `_pair_losses` as its fallback."""
    from visionblocks.kernels import iou

    def reference(p: Tensor, g: Tensor, eps: float) -> Tensor:
        return _pair_losses(p, g, kind, eps)

    entry = (iou.generalized_box_iou_loss_triton, iou.distance_box_iou_loss_triton,
             iou.complete_box_iou_loss_triton)[kind - 1]  # fmt: skip
    input_dtype = torch.promote_types(pred.dtype, target.dtype)
    p, g = pred.reshape(-1, 4).to(input_dtype), target.reshape(-1, 4).to(input_dtype)
    fallback = None if forced_triton(impl) else reference
    loss = entry(p, g, float(eps), reference=fallback).view(pred.shape[:-1])
    return reduce_loss(loss, reduction, input_dtype)


def generalized_box_iou_loss(
    pred: Tensor,
    target: Tensor,
    reduction: str = "none",
    eps: float = 1e-7,
    impl: str = "auto",
) -> Tensor:
    """Generalized IoU loss: ``1 - IoU`` plus the empty share of the smallest enclosing box.

    ``loss = 1 - I / U + (C - U) / C`` with ``I``, ``U`` the intersection and union areas
    and ``C`` the area of the smallest box enclosing both (``eps`` replaces a zero ``U`` or
    ``C``). Equals torchvision's ``generalized_box_iou_loss`` (values and gradients, for
    ``pred`` and ``target``) up to its ``eps``; degenerate boxes: see the module notes.

    Args:
        pred (Tensor[..., 4]): Predicted boxes, xyxy, floating point.
        target (Tensor[..., 4]): Target boxes of ``pred``'s shape.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero (see the
            module notes); it never changes a loss whose denominators are positive.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (fused kernel, `visionblocks.kernels.iou`).

    Returns:
        Tensor: ``"none"``: ``Tensor[...]`` (``pred.shape[:-1]``) in the inputs' dtype;
        otherwise a scalar in the compute dtype (float32 for half inputs). The ``"mean"`` of
        an empty input is a zero still connected to the graph.

    Raises:
        TypeError: Non-floating (e.g. integer) boxes, or an ``eps`` that is not a number.
        ValueError: A last dimension other than 4, ``pred``/``target`` shapes or devices that
            differ, a negative ``eps``, an unknown ``reduction`` or ``impl``, or (CPU value
            check) coordinates beyond the box ops' Range.
        RuntimeError: ``impl="triton"`` where the kernel cannot run; says why.

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> generalized_box_iou_loss(pred, target)
        tensor([1.0794, 1.3333])
        >>> generalized_box_iou_loss(pred, target, reduction="mean")
        tensor(1.2063)
        >>> tiny = torch.tensor([[0.3, 0.3, 0.3002, 0.3002]])
        >>> generalized_box_iou_loss(tiny, tiny)  # identical boxes: 0 at any size
        tensor([0.])

    References:
        Rezatofighi et al., "Generalized Intersection over Union: A Metric and a Loss for
        Bounding Box Regression", CVPR 2019. https://arxiv.org/abs/1902.09630
    """
    return _box_iou_loss(pred, target, 1, reduction, eps, impl)


def distance_box_iou_loss(
    pred: Tensor,
    target: Tensor,
    reduction: str = "none",
    eps: float = 1e-7,
    impl: str = "auto",
) -> Tensor:
    """Distance IoU loss: ``1 - IoU`` plus the normalised squared distance of the centres.

    ``loss = 1 - I / U + d^2 / c^2`` with ``d`` the distance between the box centres and
    ``c`` the diagonal of the smallest box enclosing both (``eps`` replaces a zero ``U`` or
    ``c^2``). Equals torchvision's ``distance_box_iou_loss`` (values and gradients, for
    ``pred`` and ``target``) up to its ``eps``; degenerate boxes: see the module notes.

    Args:
        pred (Tensor[..., 4]): Predicted boxes, xyxy, floating point.
        target (Tensor[..., 4]): Target boxes of ``pred``'s shape.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        eps: As `generalized_box_iou_loss`.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Returns:
        Tensor: As `generalized_box_iou_loss`.

    Raises:
        TypeError, ValueError, RuntimeError: As `generalized_box_iou_loss`.

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> distance_box_iou_loss(pred, target)
        tensor([0.9683, 1.4000])

    References:
        Zheng et al., "Distance-IoU Loss: Faster and Better Learning for Bounding Box
        Regression", AAAI 2020. https://arxiv.org/abs/1911.08287
    """
    return _box_iou_loss(pred, target, 2, reduction, eps, impl)


def complete_box_iou_loss(
    pred: Tensor,
    target: Tensor,
    reduction: str = "none",
    eps: float = 1e-7,
    impl: str = "auto",
) -> Tensor:
    """Complete IoU loss: the DIoU loss plus an aspect-ratio consistency term.

    ``loss = diou_loss + alpha v`` with ``v = (4 / pi^2) (atan(wg / hg) - atan(w / h))^2`` and
    ``alpha = v / (1 - IoU + v)`` (0 where ``v = 0``), held constant in the gradient
    (torchvision computes it under ``torch.no_grad()``). Equals torchvision's
    ``complete_box_iou_loss`` (values and gradients, for ``pred`` and ``target``) up to its
    ``eps``. Degenerate boxes, where torchvision gives NaN: see the module notes.

    Args:
        pred (Tensor[..., 4]): Predicted boxes, xyxy, floating point.
        target (Tensor[..., 4]): Target boxes of ``pred``'s shape.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        eps: As `generalized_box_iou_loss`.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    Returns:
        Tensor: As `generalized_box_iou_loss`.

    Raises:
        TypeError, ValueError, RuntimeError: As `generalized_box_iou_loss`.

    Examples:
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 1.0, 2.0]])
        >>> complete_box_iou_loss(pred, target)
        tensor([0.9683, 0.7629])
        >>> point_and_line = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 0.0]])
        >>> complete_box_iou_loss(pred, point_and_line)  # zero-area targets: finite
        tensor([1.0500, 1.0570])

    References:
        Zheng et al., "Distance-IoU Loss: Faster and Better Learning for Bounding Box
        Regression", AAAI 2020. https://arxiv.org/abs/1911.08287
    """
    return _box_iou_loss(pred, target, 3, reduction, eps, impl)


class _BoxIoULoss(nn.Module):
    """Shared options and forward of the three box losses."""

    _fn: Callable[..., Tensor]

    def __init__(self, reduction: Reduction = "mean", eps: float = 1e-7, impl: str = "auto"):
        super().__init__()
        check_reduction(reduction)
        validate_impl(impl)
        self.reduction = reduction
        self.eps = check_eps(eps)
        self.impl = impl

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Loss of aligned ``(..., 4)`` xyxy box pairs, with this module's options."""
        return type(self)._fn(pred, target, self.reduction, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, eps={self.eps}"


@LOSSES.register(name="giou", aliases=("generalized_box_iou",))
class GeneralizedBoxIoULoss(_BoxIoULoss):
    """Module form of `generalized_box_iou_loss`.

    Registered in ``LOSSES`` as ``"giou"`` (alias ``"generalized_box_iou"``). ``GIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"`` like torch's
            loss modules (the function's default, ``"none"``, is torchvision's).
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.


    Examples:
        >>> loss_fn = GeneralizedBoxIoULoss()
        >>> loss_fn
        GeneralizedBoxIoULoss(reduction='mean', eps=1e-07)
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> loss_fn(pred, target)
        tensor(1.2063)
    """

    _fn = staticmethod(generalized_box_iou_loss)


@LOSSES.register(name="diou", aliases=("distance_box_iou",))
class DistanceBoxIoULoss(_BoxIoULoss):
    """Module form of `distance_box_iou_loss`.

    Registered in ``LOSSES`` as ``"diou"`` (alias ``"distance_box_iou"``). ``DIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.


    Examples:
        >>> loss_fn = DistanceBoxIoULoss(reduction="none")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]]))
        tensor([0.9683])
    """

    _fn = staticmethod(distance_box_iou_loss)


@LOSSES.register(name="ciou", aliases=("complete_box_iou",))
class CompleteBoxIoULoss(_BoxIoULoss):
    """Module form of `complete_box_iou_loss`.

    Registered in ``LOSSES`` as ``"ciou"`` (alias ``"complete_box_iou"``). ``CIoULoss`` is a
    deprecated alias of this class (removed in 0.3).

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``; defaults to ``"mean"``.
        eps: Number ``>= 0`` used in place of a denominator that is exactly zero.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.


    Examples:
        >>> loss_fn = CompleteBoxIoULoss(reduction="sum")
        >>> loss_fn(torch.tensor([[0.0, 0.0, 2.0, 1.0]]), torch.tensor([[0.0, 0.0, 1.0, 2.0]]))
        tensor(0.7629)
    """

    _fn = staticmethod(complete_box_iou_loss)


_DEPRECATED = {
    "GIoULoss": ("GeneralizedBoxIoULoss", "0.3"),
    "DIoULoss": ("DistanceBoxIoULoss", "0.3"),
    "CIoULoss": ("CompleteBoxIoULoss", "0.3"),
}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
