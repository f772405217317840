"""Sigmoid focal loss (RetinaNet): binary cross entropy down-weighted on easy elements.

One torch formula (`_focal_terms`) serves eager calls, ``torch.jit.script``,
``torch.jit.trace`` and ``torch.compile``. Eager calls backpropagate through its derivative
written out (`_FocalGrad`, tested against autograd of the formula); the fused Triton kernel
(`visionblocks.kernels.focal`) is its CUDA fast path, tested against it, and falls back to it.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_range
from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import forced_triton, use_triton, validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_tensor,
    exact_ignore,
)
from visionblocks.losses._reduce import (
    REDUCTIONS,
    check_normalizer,
    check_reduction,
    check_target_range,
    reduce_loss,
)

__all__ = ["SigmoidFocalLoss", "sigmoid_focal_loss"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]


def _focal_terms(
    x: Tensor, t: Tensor, positive: Tensor | None, alpha: float | None, gamma: float
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """The formula on logits ``x`` and targets ``t`` in ``[0, 1]`` (both in the compute
    dtype; ``positive`` is ``t == 1`` where ``t`` is known to be 0 or 1, else None).

    Returns the element-wise loss ``a_t (1 - p_t) ** gamma BCE``, then the BCE term, ``1 - p_t``
    and (soft ``t``) ``sigmoid(x)`` and ``sigmoid(-x)``: what `_FocalGrad`'s backward reuses.
    """
    # Exact forms: at t = 0, BCE = softplus(x) and 1 - p_t = sigmoid(x); at t = 1, softplus(-x)
    # and sigmoid(-x). Never 1 - p, nor softplus(x) - t x: no cancellation. For any t in
    # [0, 1], BCE = softplus(-|x|) + ([x >= 0] - t) x, a sum of two terms >= 0 (1 - t is exact
    # for t >= 1/2), with one softplus: its log1p is most of the cost. 1 - p_t mixes positive
    # terms; lerp gives either end exactly at t = 0 and t = 1.
    s: Tensor | None = None
    sn: Tensor | None = None
    if positive is None:
        nx = -x
        s, sn = torch.sigmoid(x), torch.sigmoid(nx)
        ce = F.softplus(torch.minimum(x, nx)).addcmul_(torch.add(x >= 0, t, alpha=-1), x)
        m = torch.lerp(s, sn, t)
    else:  # t is 0 or 1: the same terms at z = -x where positive, x elsewhere
        z = torch.where(positive, -x, x)
        ce, m = F.softplus(z), torch.sigmoid(z)
    loss = ce
    if gamma != 0:
        mc = m
        if gamma < 1:  # clamp to the smallest normal: 0 ** gamma then has a finite gradient
            tiny = 2.2250738585072014e-308 if x.dtype == torch.float64 else 1.1754943508222875e-38
            mc = m.clamp_min(tiny)
        loss = ce * mc.pow(gamma)
    if alpha is not None and alpha >= 0:  # a_t = alpha t + (1 - alpha)(1 - t)
        a_t = (t * (2 * alpha - 1)).add_(1 - alpha)
        # in place where `loss` is the product above (no backward needs it): one buffer less
        loss = loss.mul_(a_t) if gamma != 0 else loss * a_t
    return loss, ce, m, s, sn


class _FocalGrad(torch.autograd.Function):
    """`_focal_terms`'s loss, with its derivative in ``x`` written out (eager calls only).

    The closed form reuses the forward's terms in fewer passes than autograd through the
    formula (the benchmarks page's focal sweep holds the cases that keep it). With
    ``m = 1 - p_t``, ``ce`` the BCE term, ``s = sigmoid(x)`` and ``sn = sigmoid(-x)``:

        dce/dx = (1 - t) s - t sn        dm/dx = s sn (1 - 2t)
        d loss / dx = a_t m ** (gamma - 1) (gamma ce dm/dx + m dce/dx)

    For binary ``t``, ``z = (1 - 2t) x``: ``dce/dx = (1 - 2t) m``, ``dm/dx = (1 - 2t) m (1 - m)``.
    ``t`` gets no gradient; ``create_graph=True`` differentiates the formula itself.
    """

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, t: Tensor, positive: Tensor | None, alpha: float | None, gamma: float
    ) -> Tensor:
        loss, ce, m, s, sn = _focal_terms(x, t, positive, alpha, gamma)
        ctx.save_for_backward(x, t, positive, ce, m, s, sn)
        ctx.alpha, ctx.gamma = alpha, gamma
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        x, t, positive, ce, m, s, sn = ctx.saved_tensors
        alpha, gamma = ctx.alpha, ctx.gamma
        if torch.is_grad_enabled():  # create_graph=True: autograd through the formula
            loss = _focal_terms(x, t, positive, alpha, gamma)[0]
            dx = torch.autograd.grad(loss, x, grad, create_graph=True)[0]
            return dx, None, None, None, None
        # Fresh buffers only, so the saved tensors stay intact (retain_graph=True).
        sign = t.mul(-2).add_(1)  # 1 - 2t
        if s is None:
            dce = m * sign
            dm = torch.sub(1, m).mul_(m).mul_(sign)
        else:
            dm = sn.neg()
            dce = torch.lerp(s, dm, t)  # exact at t = 0 and 1, like the formula's lerp
            dm = torch.mul(s, sn, out=dm).mul_(sign)
        if gamma == 0:
            dx = dce
        else:
            if gamma < 1:  # the formula's clamp: no gradient through m below it
                tiny = torch.finfo(m.dtype).tiny
                dm = dm.masked_fill_(m < tiny, 0)
                m = m.clamp_min(tiny)
            dx = dm.mul_(ce).mul_(gamma).addcmul_(m, dce)
            if gamma != 1:
                dx = dx.mul_(m if gamma == 2 else m.pow(gamma - 1))
        if alpha is not None and alpha >= 0:
            dx = dx.mul_(torch.mul(t, 2 * alpha - 1, out=sign).add_(1 - alpha))
        return dx.mul_(grad), None, None, None, None


def _focal_elements(
    inputs: Tensor,
    targets: Tensor,
    alpha: float | None,
    gamma: float,
    weight: Tensor | None,
    ignore_index: float | None,
) -> tuple[Tensor, Tensor | None]:
    """The element-wise loss in the compute dtype, and the number of counted elements (None
    when nothing is ignored: all of them)."""
    cdt = torch.float64 if inputs.dtype == torch.float64 else torch.float32  # compute_dtype
    x = inputs if inputs.dtype == cdt else inputs.to(cdt)
    keep: Tensor | None = None
    positive: Tensor | None = None
    if targets.is_floating_point() or targets.dtype == torch.bool:
        t = targets if targets.dtype == cdt else targets.to(cdt)
        if ignore_index is not None:
            keep = t != ignore_index
            t = torch.where(keep, t, 0.0)
    else:  # class indices (-1 and C, background, match no class): t is 0 or 1
        positive = targets.unsqueeze(-1) == torch.arange(x.shape[-1], device=x.device)
        if ignore_index is not None:  # a uint8 target never equals -100
            ignore_index = exact_ignore(targets, ignore_index)
        if ignore_index is not None:
            keep = (targets != ignore_index).unsqueeze(-1)
        t = positive.to(cdt)
    if torch.jit.is_scripting():
        loss = _focal_terms(x, t, positive, alpha, gamma)[0]
    elif _closed_form_grad(x, t):
        loss = _FocalGrad.apply(x, t, positive, alpha, gamma)
    else:
        loss = _focal_terms(x, t, positive, alpha, gamma)[0]
    if weight is not None:
        loss = loss * weight.to(cdt)
    if keep is None:
        return loss, None
    count = keep.sum()
    if keep.shape != loss.shape:  # one flag per row of class indices
        count = count * x.shape[-1]
    return loss * keep, count


def _closed_form_grad(x: Tensor, t: Tensor) -> bool:
    """Whether the call backpropagates through `_FocalGrad`: ``x`` needs a gradient, ``t``
    none, and torch does not record the call (the compiler fuses the formula itself)."""
    return (
        x.requires_grad
        and not t.requires_grad
        and torch.is_grad_enabled()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def _focal_rows(x, targets, w, alpha, gamma, ignore, reduce_sum, out_dtype):
    """The formula with the Triton kernel's arguments and outputs (its fallback)."""
    loss, count = _focal_elements(x, targets, alpha, gamma, w, ignore)
    count = torch.tensor(x.numel(), device=x.device) if count is None else count
    return (loss.sum() if reduce_sum else loss.to(out_dtype)), count


def _check_args(inputs, targets, alpha, gamma, reduction, weight, ignore_index) -> None:
    """Validate the arguments, and the targets' values (value checks)."""
    # dtype properties and `type(...) is float` tests: no function calls on the common path
    if not (isinstance(inputs, Tensor) and inputs.dtype.is_floating_point):
        check_floating("inputs", inputs)
    if not isinstance(targets, Tensor):
        check_tensor("targets", targets)
    if targets.dtype.is_complex:
        raise TypeError(f"targets must be a real tensor, got dtype {targets.dtype}")
    index = not (targets.dtype.is_floating_point or targets.dtype == torch.bool)
    if index:
        if inputs.ndim == 0 or targets.shape != inputs.shape[:-1]:
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
        if type(alpha) is not float and (
            isinstance(alpha, bool) or not isinstance(alpha, int | float)
        ):
            raise TypeError(f"alpha must be a float or None, got {type(alpha).__name__}")
        if not alpha <= 1:  # NaN too
            raise ValueError(f"alpha must be in [0, 1] (negative or None disables it), got {alpha}")
    if type(gamma) is not float and (isinstance(gamma, bool) or not isinstance(gamma, int | float)):
        raise TypeError(f"gamma must be a non-negative float, got {type(gamma).__name__}")
    if not 0 <= gamma < math.inf:
        check_range("gamma", float(gamma), 0.0, math.inf, high_inclusive=False)
    if reduction not in REDUCTIONS:
        check_reduction(reduction)
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
    if targets.device != inputs.device or (weight is not None and weight.device != inputs.device):
        check_same_device(inputs=inputs, targets=targets, weight=weight)
    # Value check: float targets in [0, 1], class indices in [-1, C].
    if index:
        num_classes = inputs.shape[-1]
        hint = f" (class indices; -1 and C = {num_classes} mean background)"
        check_target_range("targets", targets, -1, num_classes, ignore=ignore_index, hint=hint)
    elif targets.dtype != torch.bool:
        hint = "; if one value marks elements to ignore (-1...), pass it as ignore_index"
        hint = "" if ignore_index is not None else hint
        check_target_range("targets", targets, 0, 1, ignore=ignore_index, hint=hint)


def _check_scripted(
    inputs: Tensor, targets: Tensor, alpha: float | None, gamma: float, impl: str
) -> None:
    """The checks of `_check_args` that TorchScript can compile (short messages)."""
    if impl != "auto" and impl != "torch":
        raise ValueError("impl must be 'auto' or 'torch' under TorchScript, got " + impl)
    if alpha is not None and not alpha <= 1:
        raise ValueError("alpha must be in [0, 1] (negative or None disables it)")
    if not (gamma >= 0 and gamma < math.inf):
        raise ValueError("gamma must be a finite number >= 0")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        if targets.shape != inputs.shape:
            raise ValueError("float targets must have the shape of inputs")
    elif inputs.dim() == 0 or targets.shape != inputs.shape[:-1]:
        raise ValueError("integer targets must have shape inputs.shape[:-1]")


def _focal_triton(inputs, targets, alpha, gamma, reduction, weight, ignore_index, normalizer, impl):
    """The fused kernel on ``(R, C)`` views, the formula (`_focal_rows`) as its fallback."""
    num_classes = inputs.shape[-1] if inputs.ndim else 1
    rows = math.prod(inputs.shape[:-1]) if inputs.ndim else 1
    x = inputs.reshape(rows, num_classes)
    index = not (targets.is_floating_point() or targets.dtype == torch.bool)
    t = targets.reshape(rows) if index else targets.reshape(rows, num_classes)
    w = None if weight is None else weight.expand(inputs.shape).reshape(rows, num_classes)
    alpha = None if alpha is None or alpha < 0 else float(alpha)
    # With a normalizer, "none" divides in the compute dtype before the cast.
    cdt = torch.float64 if inputs.dtype == torch.float64 else torch.float32
    out_dtype = inputs.dtype if normalizer is None else cdt
    args = (x, t, w, alpha, float(gamma), ignore_index, reduction != "none", out_dtype)
    from visionblocks.kernels.focal import sigmoid_focal_loss_triton

    fallback = None if forced_triton(impl) else _focal_rows
    loss, count = sigmoid_focal_loss_triton(*args, reference=fallback)
    if reduction == "none":
        loss = loss.reshape(inputs.shape)
    if ignore_index is None:
        count = inputs.numel()  # exact, and what torchvision's "mean" divides by
    return reduce_loss(loss, reduction, inputs.dtype, count, normalizer)


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

    Float ``targets`` (binary or soft, ``inputs``' shape) give torchvision's
    ``sigmoid_focal_loss`` within ``rtol=1e-5, atol=1e-6`` (values, and gradients where
    torchvision's are finite); where the two differ more, this one is the closer to float64
    (torchvision forms ``1 - p_t`` by subtraction; here it comes from ``sigmoid(-x)`` and
    ``sigmoid(x)``, the BCE term from ``softplus``, so confident logits lose no precision).
    Integer ``targets`` of shape ``inputs.shape[:-1]`` are class indices, as in mmcv: a
    value in ``[0, C)`` makes that class positive; ``C`` (mmdet) or ``-1`` makes the row
    background; the result equals the one-hot float targets'.

    ``ignore_index``: rows (class indices) or elements (float targets) whose target equals
    it give loss 0 and gradient 0 and are not counted by ``"mean"`` (all ignored: a zero
    connected to the graph). ``"mean"`` divides by the number of counted elements
    (``weight`` does not change it); ``normalizer`` (e.g. the number of positive anchors)
    replaces that count and divides ``"sum"`` and ``"none"`` too.

    Value checks (`visionblocks.set_value_checks`): float targets in ``[0, 1]``, class
    indices in ``[-1, C]`` (``ignore_index`` excepted), a tensor ``normalizer`` positive and
    finite; read on CPU, device-side asserts on CUDA, skipped while tracing or compiling.

    Dtype policy: float16/bfloat16 inputs are computed in float32; ``"none"`` returns the
    inputs' dtype (with a ``normalizer`` too: it divides before the cast), ``"sum"`` and
    ``"mean"`` float32; the same under ``torch.autocast``. Logits of any magnitude give
    finite values and gradients, also for ``0 <= gamma < 1``.

    Gradients flow to ``inputs``, to float ``targets`` and to ``weight``; in eager calls the
    gradient of ``inputs`` is the formula's derivative written out (equal to autograd's, in
    fewer passes). Scripts with ``torch.jit.script`` (``impl`` ``"auto"`` or ``"torch"``; no
    value checks), traces, and compiles with ``torch.compile(fullgraph=True)``.

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
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (fused CUDA kernel, see
            `visionblocks.kernels.focal`; used when float ``targets`` and ``weight`` need
            no gradient).

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
        _check_args(inputs, targets, alpha, gamma, reduction, weight, ignore_index)
        normalizer = check_normalizer(normalizer, inputs.device)
        # The kernel gives the logits' gradient only: targets or a weight that need one take
        # the formula.
        if use_triton("sigmoid_focal_loss", impl, inputs) and not (
            torch.is_grad_enabled()
            and (targets.requires_grad or (weight is not None and weight.requires_grad))
        ):
            return _focal_triton(
                inputs, targets, alpha, gamma, reduction, weight, ignore_index, normalizer, impl
            )
    else:
        _check_scripted(inputs, targets, alpha, gamma, impl)
    loss, count = _focal_elements(inputs, targets, alpha, gamma, weight, ignore_index)
    return reduce_loss(loss, reduction, inputs.dtype, count, normalizer)


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
        _check_args(torch.zeros(1), torch.zeros(1), alpha, gamma, reduction, None, ignore_index)
        validate_impl(impl)
        self.alpha = alpha
        self.gamma = gamma
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.impl = impl
        # The options as the function's signature types them, for torch.jit.script.
        self._script_options = tuple(
            None if v is None else float(v) for v in (alpha, gamma, ignore_index)
        )

    def forward(
        self,
        inputs: Tensor,
        targets: Tensor,
        weight: Tensor | None = None,
        normalizer: float | Tensor | None = None,
    ) -> Tensor:
        """Apply `sigmoid_focal_loss` with this module's options."""
        alpha, gamma, ignore_index = self.alpha, self.gamma, self.ignore_index
        if torch.jit.is_scripting():  # attributes are typed by value there: -1 is an int
            alpha, gamma, ignore_index = self._script_options
        return sigmoid_focal_loss(
            inputs,
            targets,
            alpha,
            gamma,
            self.reduction,
            weight=weight,
            ignore_index=ignore_index,
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
