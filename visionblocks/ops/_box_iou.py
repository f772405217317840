"""Validation, numerics and dispatch of `box_iou` and its generalised / distance / complete variants.

`overlap` validates, upcasts, rescales and collapses inverted boxes, then hands valid float32
or float64 boxes to one of two fast paths, both with analytic gradients and both built on the
element-wise core `visionblocks.ops._iou_core`: `visionblocks.ops._pairwise_iou` for the
``N×M`` matrix and `visionblocks.ops._iou_loss_torch` (shared with the losses) for aligned
pairs. A plain float64 formulation of every measure, the oracle of the tests, is in
``tests/reference/boxes.py``.

Numerics — the rules every box op, box loss and implementation (torch path and Triton kernel)
follows (`visionblocks.ops.boxes` states them for users):

- **The eps rule.** A denominator that can vanish — the union, the enclosing box's area, its
  squared diagonal — gets ``eps`` only where it is exactly zero. A zero denominator always
  comes with a zero numerator (two zero-area boxes have no intersection; a zero-width enclosing
  box holds two zero-area boxes; a zero diagonal two coincident points), so the value there is
  0, as with torchvision's ``+ eps``, and its gradient is taken with ``eps`` in place of the
  zero (finite, up to about ``1 / eps``). Everywhere else no ``eps`` enters: identical boxes
  give IoU = GIoU = DIoU = CIoU = 1 (loss 0) exactly, for boxes of any size. ``eps = 0``
  gives 0 / 0 = NaN at those zero denominators, as torchvision does. CIoU's constant weight
  ``alpha = v / (1 - IoU + v)`` is 0 where ``v = 0`` (``alpha v`` and its gradient vanish
  there anyway).
- **Dtypes.** Coordinates are computed in `iou_dtype` (float32 for half, bfloat16 and integer
  boxes). Gradients flowing back to half or bfloat16 boxes are clamped to that dtype's finite
  range before the cast (`cast_clamped`): the gradients of degenerate pairs (about ``1 / eps``)
  stay finite.
- **Inverted boxes** (``x2 < x1`` or ``y2 < y1``) are collapsed to a zero-width (height) box
  at ``x1`` (``y1``) before anything else; the gradient of the collapsed corner goes to ``x1``.
- **Scale.** All four measures are scale invariant, so the boxes are multiplied by the power of
  two (`power_of_two_scale`) that brings their largest ``|coordinate|`` below
  ``2**SAFE_EXPONENT`` (huge boxes: areas and their squares stay finite) or, for coordinates
  all below 0.5, into ``[0.5, 1)`` (tiny boxes: areas stay normal numbers); ``eps`` is
  scaled by its square. Exactly the unscaled arithmetic; found on the device (``O(N + M)``,
  no host sync); 1 for ordinary boxes.
- **The angle** of CIoU is ``atan(w / h)`` per box: ``pi / 2`` for ``h = 0`` and 0 for a
  point box, so its value and gradient stay finite.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from visionblocks._core.checks import check_finite, check_range, check_type
from visionblocks._core.tensor_checks import check_last_dim, check_same_device, check_tensor
from visionblocks.ops._iou_core import CIOU, DIOU, GIOU, IOU, eps_tensor
from visionblocks.ops._iou_loss_torch import AlignedIoUFunction
from visionblocks.ops._pairwise_iou import PairwiseIoUFunction

__all__ = [
    "SAFE_EXPONENT",
    "Kind",
    "cast_clamped",
    "iou_dtype",
    "overlap",
    "power_of_two_scale",
]

Kind = Literal["iou", "giou", "diou", "ciou"]
_KINDS = {"iou": IOU, "giou": GIOU, "diou": DIOU, "ciou": CIOU}

#: Boxes are rescaled so that every finite ``|coordinate|`` is below ``2**SAFE_EXPONENT``:
#: areas stay below ``2**58`` and their squares below ``2**116``, inside float32's range.
SAFE_EXPONENT = 28
_MIN_EXPONENT = {torch.float32: -126, torch.float64: -1022}  # of a normal number


def _power_of_two(exponent: Tensor, dtype: torch.dtype) -> Tensor:
    """``2.0 ** -exponent`` in ``dtype``, built from its bits (exact); ``exponent`` must keep
    the result a normal number."""
    if dtype == torch.float64:
        return ((1023 - exponent.to(torch.int64)) << 52).view(torch.float64)
    return ((127 - exponent.to(torch.int32)) << 23).view(torch.float32)


def scale_shift(largest: float, dtype: torch.dtype) -> int:
    """The ``k`` of the factor ``2**-k`` for a largest ``|coordinate|`` (host version)."""
    if not math.isfinite(largest) or largest == 0:
        return 0
    exponent = math.frexp(largest)[1]
    if exponent > SAFE_EXPONENT:
        return exponent - SAFE_EXPONENT
    return max(exponent, _MIN_EXPONENT[dtype]) if exponent < 0 else 0


def power_of_two_scale(*boxes: Tensor) -> Tensor:
    """0-d factor ``2**-k`` bringing the largest finite ``|coordinate|`` of ``boxes`` below
    ``2**SAFE_EXPONENT``, or into ``[0.5, 1)`` when it is below 0.5 (1 for ordinary boxes,
    all-zero boxes, and when some coordinate is not finite).

    ``boxes`` share a float32 or float64 dtype and a device; no host synchronisation.

    Examples:
        >>> float(power_of_two_scale(torch.tensor([[0.0, 0.0, 1e19, 1e19]]))) == 2.0**-36
        True
        >>> power_of_two_scale(torch.tensor([[0.0, 0.0, 640.0, 480.0]]))
        tensor(1.)
        >>> power_of_two_scale(torch.tensor([[0.0, 0.0, 0.001, 0.002]]))
        tensor(256.)
    """
    dtype, device = boxes[0].dtype, boxes[0].device
    extremes = [v for b in boxes if b.numel() for v in torch.aminmax(b.detach())]
    if not extremes:
        return torch.ones((), dtype=dtype, device=device)
    largest = torch.stack(extremes).abs().amax()
    exponent = torch.frexp(largest).exponent
    down = (exponent - SAFE_EXPONENT).clamp_min(0)
    up = exponent.clamp(_MIN_EXPONENT[dtype], 0)
    shift = torch.where(exponent < 0, up, down)
    shift = torch.where(torch.isfinite(largest) & (largest > 0), shift, 0)
    return _power_of_two(shift, dtype)


class _CastClamped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:  # type: ignore[override]
        ctx.input_dtype = x.dtype
        return x.to(dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        big = torch.finfo(ctx.input_dtype).max
        return grad.clamp(-big, big).to(ctx.input_dtype), None


def cast_clamped(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, whose gradient is clamped to ``x.dtype``'s finite range before the cast
    back (so a large float32 gradient becomes ``±65504`` for float16 boxes, not ``inf``).

    Examples:
        >>> x = torch.zeros(2, dtype=torch.float16, requires_grad=True)
        >>> (cast_clamped(x, torch.float32) * 1e6).sum().backward()
        >>> x.grad
        tensor([65504., 65504.], dtype=torch.float16)
    """
    if x.dtype == dtype:
        return x
    narrower = x.is_floating_point() and torch.finfo(x.dtype).max < torch.finfo(dtype).max
    if narrower and x.requires_grad and torch.is_grad_enabled():
        return _CastClamped.apply(x, dtype)
    return x.to(dtype)


def iou_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype IoU values are computed and returned in.

    float64 stays float64, float32 stays float32; float16, bfloat16, integer and bool
    boxes give ``torch.get_default_dtype()`` (float32 unless changed) — the result dtype of
    torchvision's functions, which upcast half boxes to float32 (``_upcast``) and divide
    integer areas with true division.

    Examples:
        >>> iou_dtype(torch.float16)
        torch.float32
        >>> iou_dtype(torch.float32, torch.float64)
        torch.float64
        >>> iou_dtype(torch.int64)
        torch.float32
    """
    dtype = dtypes[0]
    for other in dtypes[1:]:
        dtype = torch.promote_types(dtype, other)
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype.is_complex:
        raise TypeError(f"boxes must be real (floating-point or integer), got dtype {dtype}")
    return torch.get_default_dtype()


def _collapse(boxes: Tensor) -> Tensor:
    """Inverted boxes as zero-width (height) boxes at ``x1`` (``y1``); valid ones unchanged."""
    lo, hi = boxes[..., :2], boxes[..., 2:]
    return torch.cat([lo, torch.where(hi < lo, lo, hi)], dim=-1)


def _check_boxes(name: str, boxes: object, min_dim: int, shape: str) -> Tensor:
    boxes = check_tensor(name, boxes)
    if boxes.dim() < min_dim:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(boxes.shape)}")
    check_last_dim(name, boxes, 4, what="(x1, y1, x2, y2)")
    return boxes


def _broadcast(what: str, shape1: torch.Size, shape2: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(shape1, shape2)
    except RuntimeError:
        raise ValueError(
            f"{what} of boxes1 and boxes2 must be equal or broadcastable, "
            f"got {tuple(shape1)} and {tuple(shape2)}"
        ) from None


def overlap(boxes1: Tensor, boxes2: Tensor, kind: Kind, *, aligned: bool, eps: float) -> Tensor:
    """Validate, upcast, rescale, and compute ``kind`` pairwise or aligned.

    Raises:
        TypeError: Non-tensor boxes, complex boxes, non-bool ``aligned``, non-number ``eps``.
        ValueError: Last dim not 4, too few dims, batch dims that do not broadcast, ``eps < 0``.
    """
    check_type("aligned", aligned, bool)
    if isinstance(eps, bool):
        raise TypeError(f"eps must be float, got bool ({eps!r})")
    check_type("eps", eps, (float, int))
    check_range("eps", eps, 0.0)
    check_finite("eps", eps)
    shape = "(..., 4)" if aligned else "(..., N, 4) with at least 2 dims"
    boxes1 = _check_boxes("boxes1", boxes1, 1 if aligned else 2, shape)
    boxes2 = _check_boxes("boxes2", boxes2, 1 if aligned else 2, shape)
    check_same_device(boxes1=boxes1, boxes2=boxes2)
    dtype = iou_dtype(boxes1.dtype, boxes2.dtype)
    boxes1, boxes2 = cast_clamped(boxes1, dtype), cast_clamped(boxes2, dtype)
    if aligned:
        lead = _broadcast("shapes (all but the last dim)", boxes1.shape[:-1], boxes2.shape[:-1])
    else:
        batch = _broadcast(
            "batch dims (all but the last two)", boxes1.shape[:-2], boxes2.shape[:-2]
        )
    scale = power_of_two_scale(boxes1, boxes2)
    boxes1, boxes2 = _collapse(boxes1 * scale), _collapse(boxes2 * scale)
    eps_t = eps_tensor(float(eps), scale.square(), dtype, boxes1.device)
    code = _KINDS[kind]
    if aligned:
        p = boxes1.expand(*lead, 4).reshape(-1, 4)
        g = boxes2.expand(*lead, 4).reshape(-1, 4)
        return AlignedIoUFunction.apply(p, g, code, eps_t, False, False).view(lead)
    n, m, items = boxes1.shape[-2], boxes2.shape[-2], math.prod(batch)
    b1 = boxes1.expand(*batch, n, 4).reshape(items, n, 4)
    b2 = boxes2.expand(*batch, m, 4).reshape(items, m, 4)
    return PairwiseIoUFunction.apply(b1, b2, code, eps_t).view(*batch, n, m)
