"""Softmax (multi-class) focal loss: cross entropy down-weighted on well-classified elements."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_range
from visionblocks._core.dispatch import forced_triton, validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.losses._ce_checks import (
    check_class_indices,
    check_class_weight,
    check_devices,
    check_logits_target,
    check_options,
)
from visionblocks.losses._torch_compat import autocast_enabled
from visionblocks.losses.ce import _reduce_class_loss

__all__ = ["SoftmaxFocalLoss", "softmax_focal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def _check_focal_options(gamma: float, alpha: float | Tensor | None) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        raise TypeError(f"gamma must be a non-negative float, got {type(gamma).__name__}")
    check_range("gamma", float(gamma), 0.0, math.inf, high_inclusive=False)
    if alpha is None:
        return
    if isinstance(alpha, Tensor):
        check_class_weight("alpha", alpha, None)
        return
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise TypeError(
            f"alpha must be None, a float in [0, 1] or a Tensor[C], got {type(alpha).__name__}"
        )
    check_range("alpha", float(alpha), 0.0, 1.0)


def _class_matmul(w: Tensor, flat: Tensor) -> Tensor:
    """``w @ flat`` in the operands' dtype: autocast would run this matmul in half precision."""
    if not autocast_enabled(flat):
        return torch.matmul(w, flat)
    with torch.autocast(flat.device.type, enabled=False):
        return torch.matmul(w, flat)


def softmax_focal_loss(
    logits: Tensor,
    target: Tensor,
    gamma: float = 2.0,
    alpha: float | Tensor | None = None,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: Reduction = "mean",
    impl: str = "auto",
) -> Tensor:
    """Multi-class focal loss over softmax probabilities, a drop-in for ``F.cross_entropy``.

    For an element with target class ``y`` (a sample of ``(N, C)`` logits, a pixel of
    ``(N, C, H, W)``), with ``p = softmax(logits)`` over the class dimension:

        ce    = (1 - s) * w[y] * -log p[y]  +  (s / C) * sum_c w[c] * -log p[c]
        loss  = a[y] * (1 - p[y]) ** gamma * ce

    ``ce`` is exactly what ``F.cross_entropy(..., reduction="none")`` returns for that element
    (``s = label_smoothing``, ``w = weight`` or all ones). The focal factor uses ``p[y]``, the
    model's probability of the *target* class, and scales the element's whole smoothed cross
    entropy: a confidently right element is down-weighted, smoothing term included. (It is not
    ``exp(-ce)``, the shortcut some code uses, which differs from ``p[y]`` as soon as ``weight``
    or label smoothing is used.) Ignored elements contribute 0.

    ``"mean"`` follows ``F.cross_entropy``: the summed loss divided by the sum of ``w[y]`` over
    the non-ignored elements (their number without ``weight``). ``alpha`` is a plain factor and
    is **not** part of that denominator. So with ``gamma=0`` and ``alpha=None`` this equals
    ``F.cross_entropy`` (values and gradients) for every ``weight``, ``ignore_index``,
    ``label_smoothing`` and ``reduction``, except that a mean over nothing (empty input, all
    elements ignored) is a graph-connected 0 rather than NaN, and the dtype (below).

    ``alpha``:

    - ``None``: ``a[y] = 1``.
    - a float in ``[0, 1]``: ``a[y] = alpha`` for every class, i.e. the loss is scaled by it.
      Softmax has no positive/negative split, so there is no ``1 - alpha`` branch, and no class
      is treated as background. (kornia's ``focal_loss`` applies ``[1 - alpha, alpha, alpha,
      ...]``, making class 0 implicitly background; pass that tensor explicitly to match it.)
    - a ``Tensor[C]``: ``a[y] = alpha[y]``, a per-class factor applied after the modulation.
      Unlike ``weight``, it does not enter the ``"mean"`` denominator nor the smoothing term.

    Dtype policy: float16/bfloat16 logits are computed in float32; ``"none"`` returns the
    logits' dtype, ``"sum"``/``"mean"`` return float32.

    Under ``torch.autocast``: the same rule, from the logits' dtype (autocast changes no
    result; the label-smoothing class sum runs in float32 too). ``gamma=0`` keeps this rule
    rather than `cross_entropy`'s: the dtype never depends on ``gamma``.

    Args:
        logits (Tensor[N, C, ...]): Unnormalised scores; class dimension 1 (or ``Tensor[C]``).
        target (Tensor[N, ...]): Class indices in ``[0, C)`` or ``ignore_index`` (integer
            dtype). Probability targets are not supported (``p[y]`` is undefined for them).
        gamma: Focusing parameter ``>= 0``; 0 disables the modulation.
        alpha: ``None``, a float in ``[0, 1]`` or a ``Tensor[C]`` (see above).
        weight (Tensor[C], optional): Per-class weight, as in ``F.cross_entropy``.
        ignore_index: Target value excluded from the loss and from ``"mean"``.
        label_smoothing: In ``[0, 1)``; as in ``F.cross_entropy``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``. There is no triton kernel for this loss:
            ``"auto"`` runs the torch path, a forced ``"triton"`` raises ``RuntimeError``.

    Returns:
        Tensor: ``"none"``: ``Tensor[N, ...]`` in the logits' dtype; otherwise a scalar in the
        compute dtype (float32 for half inputs).

    Raises:
        TypeError: Non-floating ``logits``, non-integer ``target``, or options of the wrong type.
        ValueError: Mismatched shapes, ``weight``/``alpha`` tensors not of shape ``(C,)``,
            ``gamma < 0``, ``alpha`` outside ``[0, 1]``, ``label_smoothing`` outside ``[0, 1)``,
            tensors on different devices, an unknown ``reduction`` or ``impl``, or (a value
            check, see `visionblocks.set_value_checks`) a class index outside ``[0, C)`` other
            than ``ignore_index``; with value checks off, such an index triggers a device-side
            assert (CUDA) or an ``IndexError`` (CPU).
        RuntimeError: ``impl="triton"``.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 0.5]])
        >>> target = torch.tensor([0, 2])
        >>> softmax_focal_loss(logits, target, gamma=0.0)  # equals F.cross_entropy
        tensor(0.4446)
        >>> softmax_focal_loss(logits, target, reduction="none")  # the easy sample barely counts
        tensor([0.0008, 0.2387])

    References:
        Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017.
        https://arxiv.org/abs/1708.02002
    """
    check_logits_target(logits, target, allow_probs=False)
    check_options(ignore_index, label_smoothing, reduction)
    _check_focal_options(gamma, alpha)
    unbatched = logits.dim() == 1
    num_classes = logits.shape[0 if unbatched else 1]
    check_class_weight("weight", weight, num_classes)
    if isinstance(alpha, Tensor):
        check_class_weight("alpha", alpha, num_classes)
    check_devices(logits, target, weight=weight, alpha=alpha)
    if forced_triton(validate_impl(impl)):
        raise RuntimeError(
            "impl='triton' was requested but 'softmax_focal_loss' has no triton kernel"
        )
    check_class_indices(target, num_classes, ignore_index)

    if unbatched:
        logits, target = logits.unsqueeze(0), target.unsqueeze(0)
    cdt = compute_dtype(logits.dtype)
    w = None if weight is None else weight.to(cdt)
    target = target.long()
    valid = target != ignore_index
    safe_target = target.masked_fill(~valid, 0)

    log_p = F.log_softmax(logits.to(cdt), dim=1)
    loss = F.nll_loss(log_p, target, weight=w, ignore_index=ignore_index, reduction="none")
    if label_smoothing > 0:
        # (N, C, M) view: the weighted class sum is a matmul, with no (N, C, M) temporary.
        flat = log_p.reshape(*log_p.shape[:2], math.prod(log_p.shape[2:]))
        smooth = -(flat.sum(1) if w is None else _class_matmul(w, flat)).view(target.shape)
        smooth = smooth.masked_fill(~valid, 0.0)
        loss = (1.0 - label_smoothing) * loss + (label_smoothing / num_classes) * smooth
    if gamma != 0:
        log_pt = log_p.gather(1, safe_target.unsqueeze(1)).squeeze(1)
        # 1 - p[y] as -expm1(log p[y]): exact near p[y] = 1. The clamp keeps pow's gradient
        # finite for gamma < 1 when p[y] rounds to exactly 1 (extreme logits).
        one_minus_pt = (-torch.expm1(log_pt)).clamp_min(torch.finfo(cdt).tiny)
        loss = loss * one_minus_pt.pow(gamma)
    if isinstance(alpha, Tensor):
        loss = loss * alpha.to(cdt)[safe_target]
    elif alpha is not None:
        loss = loss * float(alpha)

    elem_weight = None
    if w is not None and reduction == "mean":
        elem_weight = w[safe_target].masked_fill(~valid, 0.0)
    if unbatched:
        loss, valid = loss.squeeze(0), valid.squeeze(0)
        elem_weight = None if elem_weight is None else elem_weight.squeeze(0)
    return _reduce_class_loss(
        loss, reduction, input_dtype=logits.dtype, valid=valid, elem_weight=elem_weight, top_k=None
    )


@LOSSES.register(name="softmax_focal")
class SoftmaxFocalLoss(nn.Module):
    """Module form of `softmax_focal_loss`; registered in ``LOSSES`` as ``"softmax_focal"``.

    Args:
        gamma: Focusing parameter ``>= 0``.
        alpha: ``None``, a float in ``[0, 1]`` or a ``Tensor[C]`` (a buffer when a tensor).
        weight (Tensor[C], optional): Per-class weight (a buffer, so it follows ``.to()``).
        ignore_index: Target value excluded from the loss and from ``"mean"``.
        label_smoothing: In ``[0, 1)``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (no kernel: ``"triton"`` raises).


    Examples:
        >>> import torch
        >>> loss_fn = SoftmaxFocalLoss(gamma=2.0, ignore_index=255)
        >>> loss_fn
        SoftmaxFocalLoss(gamma=2.0, alpha=None, ignore_index=255, label_smoothing=0.0,
                         reduction='mean')
        >>> logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
        >>> loss_fn(logits, target).shape
        torch.Size([])
    """

    weight: Tensor | None

    def __init__(
        self,
        gamma: float = 2.0,
        alpha: float | Tensor | None = None,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: Reduction = "mean",
        impl: str = "auto",
    ) -> None:
        super().__init__()
        _check_focal_options(gamma, alpha)
        check_options(ignore_index, label_smoothing, reduction)
        check_class_weight("weight", weight, None)
        validate_impl(impl)
        self.gamma = gamma
        if isinstance(alpha, Tensor):
            self.register_buffer("alpha", alpha)
        else:
            self.alpha = alpha
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.impl = impl

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """Apply `softmax_focal_loss` with this module's options."""
        return softmax_focal_loss(
            logits,
            target,
            self.gamma,
            self.alpha,
            weight=self.weight,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        alpha = "Tensor" if isinstance(self.alpha, Tensor) else self.alpha
        return (
            f"gamma={self.gamma}, alpha={alpha}, ignore_index={self.ignore_index}, "
            f"label_smoothing={self.label_smoothing}, reduction={self.reduction!r}"
        )
