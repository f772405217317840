"""Sigmoid focal loss (RetinaNet): binary cross entropy down-weighted on easy elements.

Two fast paths behind one validated function: the lean torch path
(`visionblocks.losses._focal_torch`: loss and analytic gradient in one chunked sweep) and the
fused Triton kernel (`visionblocks.kernels.focal`). A plain autograd composition of the same
exact forms serves when float targets or the weight need gradients.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import IMPLS
from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import (
    check_normalizer,
    check_reduction,
    check_target_range,
    compute_dtype,
    reduce_loss,
)
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import check_floating, check_same_device, check_tensor
from visionblocks.kernels._dispatch import resolve_impl, run_fused
from visionblocks.losses._focal_script import focal_terms, script_focal
from visionblocks.losses._focal_torch import SigmoidFocalFunction

__all__ = ["SigmoidFocalLoss", "sigmoid_focal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def _check_args(inputs, targets, alpha, gamma, weight, ignore_index) -> tuple[bool, float | None]:
    """Validate; return ``(index_targets, alpha or None when disabled)``."""
    check_floating("inputs", inputs)
    check_tensor("targets", targets)
    if targets.is_complex():
        raise TypeError(f"targets must be a real tensor, got dtype {targets.dtype}")
    index = not (targets.is_floating_point() or targets.dtype == torch.bool)
    if index:
        if inputs.dim() == 0 or targets.shape != inputs.shape[:-1]:
            raise ValueError(
                "integer targets are class indices and must have shape inputs.shape[:-1] = "
                f"{tuple(inputs.shape[:-1])}, got {tuple(targets.shape)}"
            )
    elif targets.shape != inputs.shape:
        raise ValueError(
            f"float targets must have the shape of inputs {tuple(inputs.shape)}, got "
            f"{tuple(targets.shape)} (class-index targets: an integer tensor of shape "
            "inputs.shape[:-1])"
        )
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise TypeError(f"alpha must be a float or None, got {type(alpha).__name__}")
        if math.isnan(alpha) or alpha > 1:
            raise ValueError(f"alpha must be in [0, 1] (negative or None disables it), got {alpha}")
        alpha = None if alpha < 0 else float(alpha)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        raise TypeError(f"gamma must be a non-negative float, got {type(gamma).__name__}")
    check_range("gamma", float(gamma), 0.0, math.inf, high_inclusive=False)
    if weight is not None:
        check_floating("weight", weight)
        try:
            ok = torch.broadcast_shapes(weight.shape, inputs.shape) == inputs.shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"weight must broadcast to the shape of inputs {tuple(inputs.shape)}, "
                f"got {tuple(weight.shape)}"
            )
    if ignore_index is not None:
        kinds = int if index else (int, float)
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, kinds):
            what = "an int (class-index targets)" if index else "a number"
            raise TypeError(
                f"ignore_index must be {what} or None, got {type(ignore_index).__name__}"
            )
        if not math.isfinite(ignore_index):
            raise ValueError(f"ignore_index must be finite, got {ignore_index}")
    check_same_device(inputs=inputs, targets=targets, weight=weight)
    return index, alpha


def _check_target_values(targets: Tensor, index: bool, num_classes: int, ignore) -> None:
    """Value check: float targets in ``[0, 1]``, class indices in ``[-1, C]``."""
    if index:
        low, high, hint = (
            -1,
            num_classes,
            f" (class indices; -1 and C = {num_classes} mean background)",
        )
    else:
        low, high = 0, 1
        hint = (
            ""
            if ignore is not None
            else ("; if one value marks elements to ignore (-1...), pass it as ignore_index")
        )
    check_target_range("targets", targets, low, high, ignore=ignore, hint=hint)


def _focal_reference(x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype):
    """Plain autograd composition, used when targets or weight need gradients. Same arguments
    and outputs as `SigmoidFocalFunction`, and its exact forms: ``1 - p_t`` mixes
    ``sigmoid(x)`` and ``sigmoid(-x)``, BCE mixes ``softplus(x)`` and ``softplus(-x)``."""
    cdt = compute_dtype(x.dtype)
    keep = None
    if targets.dim() == 1:  # class indices
        if ignore is not None:
            keep = (targets != ignore).unsqueeze(1).expand(x.shape)
        classes = torch.arange(x.shape[1], device=x.device)
        t = (targets.unsqueeze(1) == classes).to(cdt)
    else:
        t = targets.to(cdt)
        if ignore is not None:
            keep = t != ignore
            t = torch.where(keep, t, 0.0)
    loss = focal_terms(x.to(cdt), t, alpha, gamma)
    if w is not None:
        loss = loss * w.to(cdt)
    if keep is not None:
        loss = loss * keep
    count = torch.tensor(loss.numel(), device=x.device) if keep is None else keep.sum()
    return (loss.sum() if reduce_sum else loss.to(out_dtype)), count


def sigmoid_focal_loss(
    inputs: Tensor,
    targets: Tensor,
    alpha: float | None = 0.25,
    gamma: float = 2.0,
    reduction: str = "none",
    weight: Tensor | None = None,
    ignore_index: float | None = None,
    normalizer: float | Tensor | None = None,
    impl: str = "auto",
) -> Tensor:
    """Sigmoid focal loss: per-element binary cross entropy scaled by ``(1 - p_t) ** gamma``.

    With ``p = sigmoid(inputs)``, ``p_t = p t + (1 - p)(1 - t)`` and
    ``a_t = alpha t + (1 - alpha)(1 - t)``:

        loss = weight * a_t * (1 - p_t) ** gamma * BCEWithLogits(inputs, t)

    Float ``targets`` (binary or soft, ``inputs``' shape) give exactly torchvision's
    ``sigmoid_focal_loss`` (values and gradients; its ``"mean"`` is over all elements).
    Integer ``targets`` of shape ``inputs.shape[:-1]`` are class indices, as in mmcv: a value in
    ``[0, C)`` makes that class positive and the others negative; ``C`` (mmdet) or ``-1``
    makes the whole row background. The result equals passing the equivalent one-hot float
    targets, without building them.

    ``ignore_index``: for class-index targets, rows whose target equals it are ignored (all
    ``C`` elements); for float targets, elements whose target equals it are ignored (e.g.
    RetinaNet marks ignored anchors with ``-1``). Ignored elements give loss 0 and gradient 0,
    and are not counted by ``"mean"``.

    ``"mean"`` divides the summed loss by the number of non-ignored elements (``weight`` does
    not change that count, as in ``F.binary_cross_entropy_with_logits``). ``normalizer``
    replaces that denominator and also divides ``"sum"`` and ``"none"`` (e.g. the number of
    positive anchors), following `visionblocks._core.reduce.reduce_loss`. It must be positive and
    finite, whatever its type (Python or NumPy number, one-element tensor).

    Value checks (see `visionblocks.set_value_checks`; on by default): float targets must be
    in ``[0, 1]`` and class indices in ``[-1, C]``, ``ignore_index`` excepted (one
    ``aminmax`` over the targets, a second one when ignored values are present), and a tensor
    ``normalizer`` positive and finite (one element read).

    Dtype policy: float16/bfloat16 inputs are computed in float32; ``"none"`` returns the
    inputs' dtype (with a ``normalizer`` too: it divides before the cast), ``"sum"``/``"mean"``
    return float32. Logits of any magnitude (+-1e4) give finite values and gradients, also for
    ``0 <= gamma < 1`` (where torchvision's formula can give NaN gradients for saturated
    logits).

    Under ``torch.autocast``: the same rule, from the logits' dtype (autocast changes no
    result): float32 logits give float32, half logits are computed in float32. Targets,
    ``weight`` and a tensor ``normalizer`` of any dtype are cast to the compute dtype;
    gradients come back in each input's own dtype.

    Exact numerics: ``1 - p_t`` is computed as ``sigmoid(-x)`` / ``sigmoid(x)`` (never by
    subtraction) and the BCE term from ``log1p(exp(-|x|))``, in every path. For binary and
    class-index targets the loss has a relative error below ``1e-5`` wherever it exceeds
    ``1e-30`` (float32, logits in ``[-30, 30]``), also for confident logits where
    ``1 - p_t`` by subtraction is wrong by 190% (``x = 14.7, t = 1``). With ``gamma = 0`` the
    loss never exceeds BCE.

    Gradients flow to ``inputs``; both fast paths compute them analytically (no double
    backward). When float ``targets`` or ``weight`` require grad, a plain autograd composition
    of the same formula runs instead, so that they receive gradients too.

    Scriptable with ``torch.jit.script``: the scripted function runs the plain reference
    formula (every option above; ``impl`` ``"auto"`` or ``"torch"``; no value checks; values
    equal up to rounding; see `visionblocks.losses._focal_script`). Under ``torch.jit.trace``
    the eager function also runs it, so a traced call is right for any input size.

    Args:
        inputs (Tensor[..., C]): Logits, any shape (floating point).
        targets (Tensor[..., C] or Tensor[...]): Float targets in ``[0, 1]`` of ``inputs``'
            shape (bool works too), or integer class indices in ``[-1, C]`` of shape
            ``inputs.shape[:-1]``; or ``ignore_index``.
        alpha: Weight of positives in ``[0, 1]`` (negatives get ``1 - alpha``); ``None`` or a
            negative value disables it.
        gamma: Focusing parameter ``>= 0``; 0 gives (alpha-weighted) BCE.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        weight (Tensor, optional): Element-wise weight broadcastable to ``inputs``: per class
            ``(C,)``, per anchor ``(N, 1)``, or full.
        ignore_index: Target value to ignore (see above); ``None`` ignores nothing.
        normalizer (float or Tensor, optional): Divides the summed loss instead of the count;
            positive and finite (a tensor: one element, on ``inputs``' device or 0-d on CPU).
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (fused kernel, see
            `visionblocks.kernels.focal`).

    Returns:
        Tensor: ``"none"``: the inputs' shape, in the inputs' dtype; otherwise a scalar in the
        compute dtype (float32 for half inputs).

    Raises:
        TypeError: Non-floating ``inputs``, complex ``targets``, arguments of the wrong type.
        ValueError: Mismatched shapes or devices, ``alpha > 1``, ``gamma < 0``, a ``weight``
            that does not broadcast, a ``normalizer`` that is not positive and finite, an
            unknown ``reduction`` or ``impl``, or (value checks) targets out of range.
        RuntimeError: ``impl="triton"`` where triton cannot run (triton missing, or a CPU
            tensor without ``TRITON_INTERPRET=1``).

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[2.0, -1.0, 0.0], [-3.0, 0.5, 4.0]])
        >>> onehot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        >>> sigmoid_focal_loss(logits, onehot, reduction="sum")
        tensor(0.4306)
        >>> sigmoid_focal_loss(logits, torch.tensor([0, 2]), reduction="sum")  # class indices
        tensor(0.4306)
        >>> sigmoid_focal_loss(logits, torch.tensor([0, -1]), ignore_index=-1, reduction="mean")
        tensor(0.0491)

    References:
        Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017.
        https://arxiv.org/abs/1708.02002
    """
    if not torch.jit.is_scripting():
        return _focal_eager(
            inputs, targets, alpha, gamma, reduction, weight, ignore_index, normalizer, impl
        )
    return script_focal(
        inputs, targets, alpha, gamma, reduction, weight, ignore_index, normalizer, impl
    )


def _focal_eager(inputs, targets, alpha, gamma, reduction, weight, ignore_index, normalizer, impl):
    """`sigmoid_focal_loss` outside TorchScript: validate, then dispatch to a fast path."""
    index, alpha = _check_args(inputs, targets, alpha, gamma, weight, ignore_index)
    check_reduction(reduction)
    normalizer = check_normalizer(normalizer, inputs.device)
    which = resolve_impl(impl, "sigmoid_focal_loss", inputs)
    gamma = float(gamma)

    num_classes = inputs.shape[-1] if inputs.dim() else 1
    _check_target_values(targets, index, num_classes, ignore_index)
    rows = inputs.numel() // num_classes if num_classes else math.prod(inputs.shape[:-1])
    x = inputs.reshape(rows, num_classes)
    t = targets.reshape(rows) if index else targets.reshape(rows, num_classes)
    w = None
    if weight is not None:
        w = weight.expand(inputs.shape).reshape(rows, num_classes)
    reduce_sum = reduction != "none"
    out_dtype = inputs.dtype if normalizer is None else compute_dtype(inputs.dtype)
    args = (x, t, w, alpha, gamma, ignore_index, reduce_sum, out_dtype)
    grad_needed = torch.is_grad_enabled() and (
        (targets.requires_grad and not index) or (weight is not None and weight.requires_grad)
    )
    tracing = torch.jit.is_tracing()
    if grad_needed or tracing:  # a trace records whole-tensor ops, right for any input size
        loss, count = _focal_reference(*args)
    elif which == "triton":
        loss, count = run_fused("sigmoid_focal_loss", impl, SigmoidFocalFunction.apply, *args)
    else:
        loss, count = SigmoidFocalFunction.apply(*args)
    if not reduce_sum:
        loss = loss.reshape(inputs.shape)
    if ignore_index is None and not tracing:
        count = inputs.numel()  # exact, and what torchvision's "mean" divides by
    return reduce_loss(
        loss, reduction, input_dtype=inputs.dtype, count=count, normalizer=normalizer
    )


@LOSSES.register(name="focal", aliases=("sigmoid_focal",))
class SigmoidFocalLoss(nn.Module):
    """Module form of `sigmoid_focal_loss`; registered in ``LOSSES`` as ``"focal"``.

    Also registered as ``"sigmoid_focal"``. ``FocalLoss`` is a deprecated alias of this
    class (removed in 0.3).

    Args:
        alpha: Weight of positives in ``[0, 1]``; ``None`` or negative disables it.
        gamma: Focusing parameter ``>= 0``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        ignore_index: Target value to ignore, or ``None``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``.

    ``weight`` and ``normalizer`` vary per batch, so they are arguments of ``forward``.
    ``reduction`` defaults to ``"mean"`` like torch's loss modules (the function's default,
    ``"none"``, is torchvision's).

    Under ``torch.autocast``: as `sigmoid_focal_loss` (half logits computed in float32;
    ``"sum"``/``"mean"`` float32, ``"none"`` the logits' dtype).

    Examples:
        >>> import torch
        >>> loss_fn = SigmoidFocalLoss(reduction="sum", ignore_index=-1)
        >>> loss_fn
        SigmoidFocalLoss(alpha=0.25, gamma=2.0, reduction='sum', ignore_index=-1)
        >>> logits, labels = torch.zeros(4, 3), torch.tensor([0, 2, 3, -1])
        >>> loss_fn(logits, labels, normalizer=2.0)  # the sum over 3 rows, divided by 2
        tensor(0.4982)
    """

    def __init__(
        self,
        alpha: float | None = 0.25,
        gamma: float = 2.0,
        reduction: Reduction = "mean",
        ignore_index: float | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        _check_args(torch.zeros(1), torch.zeros(1), alpha, gamma, None, ignore_index)
        check_reduction(reduction)
        check_type("impl", impl, str)
        check_choice("impl", impl, IMPLS)
        self.alpha = alpha
        self.gamma = gamma
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.impl = impl

    def forward(
        self,
        inputs: Tensor,
        targets: Tensor,
        weight: Tensor | None = None,
        normalizer: float | Tensor | None = None,
    ) -> Tensor:
        """Apply `sigmoid_focal_loss` with this module's options."""
        return sigmoid_focal_loss(
            inputs,
            targets,
            self.alpha,
            self.gamma,
            self.reduction,
            weight=weight,
            ignore_index=self.ignore_index,
            normalizer=normalizer,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, gamma={self.gamma}, reduction={self.reduction!r}, "
            f"ignore_index={self.ignore_index}"
        )


_DEPRECATED = {"FocalLoss": ("SigmoidFocalLoss", "0.3")}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
