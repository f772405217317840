"""The reference formula of `visionblocks.losses.focal.sigmoid_focal_loss`, scriptable.

`focal_terms` is the element-wise loss as a plain autograd composition of the library's exact
forms: ``1 - p_t`` mixes ``sigmoid(x)`` and ``sigmoid(-x)`` (never a subtraction) and the BCE
term mixes ``softplus(x)`` and ``softplus(-x)`` (``log1p(exp(-|x|))`` plus a ``relu``), both by
``lerp``. The eager function uses it when float targets or the weight need gradients and under
`torch.jit.trace` (whole-tensor ops, valid for any input size); `script_focal` is what
`torch.jit.script` compiles `sigmoid_focal_loss` down to (the validated fast paths sit under
``if not torch.jit.is_scripting():``, which the compiler skips).

`script_focal` supports everything the eager function does (float and class-index targets,
``alpha``, ``gamma``, every ``reduction``, ``weight``, ``ignore_index``, ``normalizer``), with
the checks that need no host read; it does not check target values (the value checks), nor a
tensor ``normalizer``'s value, runs no Triton kernel (``impl="triton"`` raises) and takes its
gradients by autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["focal_terms", "script_focal"]


def focal_terms(x: Tensor, t: Tensor, alpha: float | None, gamma: float) -> Tensor:
    """Element-wise ``a_t (1 - p_t)^gamma BCE(x, t)`` of compute-dtype logits and targets."""
    ce = torch.lerp(F.softplus(x), F.softplus(-x), t)
    m = torch.lerp(torch.sigmoid(x), torch.sigmoid(-x), t)  # 1 - p_t
    tiny = 2.2250738585072014e-308 if x.dtype == torch.float64 else 1.1754943508222875e-38
    loss = ce if gamma == 0 else ce * m.clamp_min(tiny) ** gamma
    if alpha is not None:
        loss = torch.lerp(torch.full_like(t, 1 - alpha), torch.full_like(t, alpha), t) * loss
    return loss


def _divide(loss: Tensor, normalizer: float | Tensor) -> Tensor:
    """``loss / normalizer``, as `visionblocks._core.reduce.reduce_loss` divides."""
    if isinstance(normalizer, Tensor):
        if normalizer.numel() != 1:
            raise ValueError("normalizer must be a number or a one-element tensor")
        return loss / normalizer.reshape(()).to(loss.dtype)
    if not (normalizer > 0 and normalizer < float("inf")):
        raise ValueError("normalizer must be a positive finite number")
    return loss / normalizer


def script_focal(
    inputs: Tensor,
    targets: Tensor,
    alpha: float | None,
    gamma: float,
    reduction: str,
    weight: Tensor | None,
    ignore_index: float | None,
    normalizer: float | Tensor | None,
    impl: str,
) -> Tensor:
    """`sigmoid_focal_loss` by `focal_terms`."""
    if not inputs.is_floating_point():
        raise TypeError("inputs must be a floating-point tensor")
    if reduction != "none" and reduction != "mean" and reduction != "sum":
        raise ValueError("reduction must be 'none', 'mean' or 'sum', got " + reduction)
    if impl != "auto" and impl != "torch":
        raise ValueError("impl must be 'auto' or 'torch' under TorchScript, got " + impl)
    a_t: float | None = None  # alpha, None when disabled
    if alpha is not None:
        if not alpha <= 1:
            raise ValueError("alpha must be in [0, 1] (negative or None disables it)")
        if alpha >= 0:
            a_t = alpha
    if not (gamma >= 0 and gamma < float("inf")):
        raise ValueError("gamma must be a finite number >= 0")
    cdt = inputs.dtype
    if cdt != torch.float32 and cdt != torch.float64:
        cdt = torch.float32  # visionblocks._core.reduce.compute_dtype
    x = inputs.to(cdt)
    keep: Tensor | None = None
    if targets.is_floating_point() or targets.dtype == torch.bool:
        if targets.shape != inputs.shape:
            raise ValueError("float targets must have the shape of inputs")
        t = targets.to(cdt)
        if ignore_index is not None:
            keep = t != ignore_index
            t = torch.where(keep, t, torch.zeros_like(t))
    else:  # class indices in [-1, C]; -1 and C make the row background
        if inputs.dim() == 0 or targets.shape != inputs.shape[:-1]:
            raise ValueError("integer targets must have shape inputs.shape[:-1]")
        if ignore_index is not None:
            keep = (targets != ignore_index).unsqueeze(-1).expand(inputs.shape)
        classes = torch.arange(inputs.shape[-1], device=inputs.device)
        t = (targets.unsqueeze(-1) == classes).to(cdt)
    loss = focal_terms(x, t, a_t, gamma)
    if weight is not None:
        loss = loss * weight.to(cdt)
        if loss.shape != inputs.shape:
            raise ValueError("weight must broadcast to the shape of inputs")
    if keep is not None:
        loss = loss * keep
    if reduction == "none":
        if normalizer is not None:
            loss = _divide(loss, normalizer)
        return loss.to(inputs.dtype)
    total = loss.sum()
    if normalizer is not None:
        return _divide(total, normalizer)
    if reduction == "sum":
        return total
    if keep is not None:
        return total / keep.sum().to(total.dtype).clamp_min(1)
    return total / loss.numel() if loss.numel() > 0 else total * 0.0
