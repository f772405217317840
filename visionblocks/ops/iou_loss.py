"""GIoU, DIoU and CIoU losses of aligned box pairs (``1 -`` the IoU variant, plus penalties).

Two fast paths behind one validated function: the lean torch path
(`visionblocks.ops._iou_loss_torch`: loss and analytic gradient in one sweep over pieces of
pairs, spread over the CPU threads) and the fused Triton kernels (`visionblocks.kernels.iou`).
Both follow the numerics of `visionblocks.ops.boxes` (one eps rule for every box op and loss).

Convention:
    Boxes are ``(x1, y1, x2, y2)`` corners (``"xyxy"``) in any one unit (pixels or normalised),
    with ``x1 <= x2`` and ``y1 <= y2``; pairs are element-wise: ``pred[i]`` goes with
    ``target[i]``. Width and height are ``x2 - x1`` and ``y2 - y1`` (no ``+1``). Every loss is
    symmetric in ``pred`` and ``target``.

The eps rule: ``eps`` is used only in place of a denominator that is exactly zero (the union,
the enclosing box's area or squared diagonal of a degenerate pair), where the numerator is
zero too. Everywhere else the losses are exact, with no ``eps``: identical boxes give loss 0
at any size (torchvision's ``U + eps`` gives 0.71 for two identical 2e-4-wide boxes), and
valid boxes give torchvision's values and gradients up to its ``eps``.

Degenerate boxes (zero width and/or height): values and gradients are finite and, wherever
torchvision's are finite, equal to torchvision's. A zero-area box has IoU 0, so a degenerate
pair, even two identical points, has loss 1 (torchvision issue #7746 keeps this too). Only
CIoU's angle term differs: torchvision's ``atan(w / h)`` gives NaN gradients at ``h = 0``
(and a NaN value for a point box); here the angle is ``atan(w / h)`` for ``h != 0``, its limit
``+-pi/2`` for ``h = 0``, and ``0`` for a point box, with gradient ``(h, -w) / (w^2 + h^2)``
(the true derivative wherever ``w^2 + h^2 > 0``) and ``0`` for a point box. Gradients stay
finite but can reach about ``1 / eps`` for two collinear zero-width (or zero-height) boxes,
as in torchvision: their enclosing box has zero area. ``eps = 0`` gives NaN for those
degenerate pairs.

Dtype policy: float16/bfloat16 are computed in float32; ``"none"`` returns the inputs'
dtype, ``"sum"``/``"mean"`` return the compute dtype (`visionblocks._core.reduce`). Gradients of
half inputs are computed in float32 and clamped to the half dtype's finite range (the ~1/eps
gradients above stay finite). ``pred`` and ``target`` of different floating dtypes are
promoted first. On CPU, ``"sum"`` and ``"mean"`` add partial sums in a fixed order: the
result does not depend on the number of threads. ``torch.autocast`` changes none of this (the
same results inside it as outside).

Value checks (`visionblocks.set_value_checks`, on by default) cost one ``aminmax`` over
``pred`` and one over ``target`` (and a host sync on CUDA): ``target`` must hold finite
coordinates (``pred`` may not: under mixed precision an overflowing prediction is the
gradient scaler's business), and when the largest finite ``|coordinate|`` reaches
``2**28`` or stays below 0.5, both are multiplied by the power of two that brings it below
``2**28`` or into ``[0.5, 1)`` (every loss is scale invariant; ``eps`` is scaled by its
square), so any finite boxes, ``1e-30`` or ``3e38`` included, give exact values and
gradients. With value checks off, coordinates must stay below about ``2**28`` for exact
gradients (``2**60`` for finite values, float32).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import check_reduction, compute_dtype, reduce_loss
from visionblocks._core.tensor_checks import (
    check_floating,
    check_last_dim,
    check_same_device,
    check_same_shape,
    reads_values,
)
from visionblocks.kernels._dispatch import resolve_impl, run_fused
from visionblocks.ops._box_iou import cast_clamped, scale_shift
from visionblocks.ops._boxes_script import script_iou_loss
from visionblocks.ops._iou_core import eps_tensor
from visionblocks.ops._iou_loss_torch import CIOU, DIOU, GIOU, AlignedIoUFunction

__all__ = ["complete_box_iou_loss", "distance_box_iou_loss", "generalized_box_iou_loss"]
__dir__ = public_dir(__name__, __all__)


def check_eps(eps: float) -> float:
    """Validate a loss ``eps``: a finite real number ``>= 0``; return it as a float."""
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"eps must be a float, got {type(eps).__name__} ({eps!r})")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _rescaled(pred: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor, float]:
    """The value checks of the module notes: finite ``target``; huge or tiny boxes rescaled."""
    if not reads_values(pred, target) or pred.numel() == 0:
        return pred, target, eps
    extremes = torch.stack([*torch.aminmax(pred.detach()), *torch.aminmax(target.detach())])
    p_lo, p_hi, g_lo, g_hi = extremes.double().tolist()  # one host read
    if not (math.isfinite(g_lo) and math.isfinite(g_hi)):
        raise ValueError(f"target must hold finite box coordinates, got values in [{g_lo}, {g_hi}]")
    largest = max(-g_lo, g_hi, *(v for v in (-p_lo, p_hi) if math.isfinite(v)))
    dtype = compute_dtype(torch.promote_types(pred.dtype, target.dtype))
    shift = scale_shift(largest, dtype)
    if shift == 0:
        return pred, target, eps
    scale = math.ldexp(1.0, -shift)  # exact: a power of two
    area_eps = max(eps * scale * scale, torch.finfo(torch.float64).tiny) if eps > 0 else 0.0
    return pred * scale, target * scale, area_eps


def _box_iou_loss(
    op: str, mode: int, pred: Tensor, target: Tensor, reduction: str, eps: float, impl: str
) -> Tensor:
    check_floating("pred", pred)
    check_floating("target", target)
    check_last_dim("pred", pred, 4, what="(x1, y1, x2, y2)")
    check_last_dim("target", target, 4, what="(x1, y1, x2, y2)")
    check_same_shape("pred", pred, "target", target)
    check_same_device(pred=pred, target=target)
    check_reduction(reduction)
    eps = check_eps(eps)
    which = resolve_impl(impl, op, pred, target)
    input_dtype = torch.promote_types(pred.dtype, target.dtype)
    cdt = compute_dtype(input_dtype)
    pred, target, eps = _rescaled(pred, target, eps)
    p, g = pred.reshape(-1, 4), target.reshape(-1, 4)

    def reference(p: Tensor, g: Tensor, eps: float, reduce_sum: bool = False) -> Tensor:
        eps_t = eps_tensor(eps, None, cdt, p.device)
        p, g = cast_clamped(p, cdt), cast_clamped(g, cdt)
        return AlignedIoUFunction.apply(p, g, mode, eps_t, True, reduce_sum)

    if which == "triton":
        loss = run_fused(op, impl, reference, p.to(input_dtype), g.to(input_dtype), eps)
        return reduce_loss(loss.view(pred.shape[:-1]), reduction, input_dtype=input_dtype)
    if reduction == "none":
        return reference(p, g, eps).view(pred.shape[:-1]).to(input_dtype)
    total = reference(p, g, eps, reduce_sum=True)  # per-part sums added in part order
    if reduction == "sum":
        return total
    return total / p.shape[0] if p.shape[0] else total * 0.0


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
    Gradients are analytic (no double backward).

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formula (``impl`` ``"auto"`` or ``"torch"``; values equal up to rounding,
    gradients by autograd, no value checks; see `visionblocks.ops._boxes_script`).

    Under ``torch.autocast``: the dtype policy of the module notes, from ``pred`` and
    ``target`` promoted (autocast changes no result): half boxes are computed in float32, and
    gradients come back in each input's dtype.

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
            differ, a negative ``eps``, an unknown ``reduction`` or ``impl``, or (a value
            check) a non-finite ``target`` coordinate.
        RuntimeError: ``impl="triton"`` where triton cannot run (triton missing, or a CPU
            tensor without ``TRITON_INTERPRET=1``).

    Examples:
        >>> import torch
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
    if not torch.jit.is_scripting():
        return _box_iou_loss("generalized_box_iou_loss", GIOU, pred, target, reduction, eps, impl)
    return script_iou_loss(pred, target, 1, reduction, eps, impl)


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
    Gradients are analytic (no double backward).

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formula (``impl`` ``"auto"`` or ``"torch"``; values equal up to rounding,
    gradients by autograd, no value checks; see `visionblocks.ops._boxes_script`).

    Under ``torch.autocast``: the dtype policy of the module notes, from ``pred`` and
    ``target`` promoted (autocast changes no result): half boxes are computed in float32, and
    gradients come back in each input's dtype.

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
            differ, a negative ``eps``, an unknown ``reduction`` or ``impl``, or (a value
            check) a non-finite ``target`` coordinate.
        RuntimeError: ``impl="triton"`` where triton cannot run (triton missing, or a CPU
            tensor without ``TRITON_INTERPRET=1``).

    Examples:
        >>> import torch
        >>> pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
        >>> target = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0]])
        >>> distance_box_iou_loss(pred, target)
        tensor([0.9683, 1.4000])

    References:
        Zheng et al., "Distance-IoU Loss: Faster and Better Learning for Bounding Box
        Regression", AAAI 2020. https://arxiv.org/abs/1911.08287
    """
    if not torch.jit.is_scripting():
        return _box_iou_loss("distance_box_iou_loss", DIOU, pred, target, reduction, eps, impl)
    return script_iou_loss(pred, target, 2, reduction, eps, impl)


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
    ``eps``. Degenerate boxes, where torchvision gives NaN: see the module notes. Gradients
    are analytic (no double backward).

    Scriptable with ``torch.jit.script``: the scripted function runs a plain whole-tensor form
    of the same formula (``impl`` ``"auto"`` or ``"torch"``; values equal up to rounding,
    gradients by autograd, no value checks; see `visionblocks.ops._boxes_script`).

    Under ``torch.autocast``: the dtype policy of the module notes, from ``pred`` and
    ``target`` promoted (autocast changes no result): half boxes are computed in float32, and
    gradients come back in each input's dtype.

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
            differ, a negative ``eps``, an unknown ``reduction`` or ``impl``, or (a value
            check) a non-finite ``target`` coordinate.
        RuntimeError: ``impl="triton"`` where triton cannot run (triton missing, or a CPU
            tensor without ``TRITON_INTERPRET=1``).

    Examples:
        >>> import torch
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
    if not torch.jit.is_scripting():
        return _box_iou_loss("complete_box_iou_loss", CIOU, pred, target, reduction, eps, impl)
    return script_iou_loss(pred, target, 3, reduction, eps, impl)
