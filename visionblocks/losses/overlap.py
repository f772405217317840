"""Soft set-overlap losses for segmentation: Dice, Jaccard (IoU) and (focal) Tversky.

Convention: ``pred (N, C, ...)`` holds logits (or probabilities with ``from_logits=False``)
and ``target`` the labels, in segmentation_models_pytorch's (smp's) three modes:
``"multiclass"`` (``target (N, ...)`` of class indices, softmax over ``C``), ``"binary"``
(``pred (N, 1, ...)``, ``target`` of 0/1 with or without that channel, sigmoid) and
``"multilabel"`` (``target`` of ``pred``'s shape, values in ``[0, 1]``, sigmoid). Pixels whose
target equals ``ignore_index`` take no part.

For each class ``c`` (and each image, with ``per_image=True``), over the non-ignored pixels,
with ``p`` the probabilities and ``t`` the targets (one-hot for multiclass)::

    I  = sum(min(p, t))   FP = sum(p) - I   FN = sum(t) - I     (min(p, t) = p * t for 0/1 t)
    score = (I + smooth) / max(I + alpha * FP + beta * FN + smooth, eps)
    loss_c = (1 - score) ** gamma,   or (-log(max(score, eps))) ** gamma with log_loss

Dice is ``alpha = beta = 0.5``, Jaccard ``alpha = beta = 1``, Tversky takes them (and
``gamma``; 1 for the others). ``min(p, t)`` is smp's ``(p + t - |p - t|) / 2``: soft targets
give the soft (semimetric) overlap. The loss is the (``class_weights``-weighted) mean of
``loss_c`` over the classes ``c`` in ``classes`` (and images) whose target is not empty;
nothing counted gives a zero connected to the graph.

Differences from smp 0.6 (elsewhere: equal values and gradients):

- A class (or image) with no target pixel is undefined and left out of the mean. smp sets
  its loss to 0 but still counts it, so its loss shrinks with every absent class, and with
  every class whose pixels are all ``ignore_index`` (smp issue #852).
- Tversky's ``gamma`` applies to each class's loss before the mean (the focal Tversky loss of
  Abraham and Khan); smp raises the mean to ``gamma``, which reweights no class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_number, check_type
from visionblocks._core.dispatch import reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_tensor,
    compute_dtype,
    exact_ignore,
)
from visionblocks.losses._ce_checks import check_class_weight
from visionblocks.losses._reduce import check_target_range

__all__ = ["DiceLoss", "JaccardLoss", "TverskyLoss", "dice_loss", "jaccard_loss", "tversky_loss"]
__dir__ = public_dir(__name__, __all__)

Mode = Literal["binary", "multiclass", "multilabel"]
MODES = ("binary", "multiclass", "multilabel")
ClassWeights = Sequence[float] | Tensor | None
_BOOL = {bool}


# ----------------------------------------------------------------------------- checks
def _check_options(
    mode: object,
    classes: object,
    class_weights: object,
    ignore_index: object,
    **flags: object,
) -> tuple[int, ...] | None:
    """Check the options that do not depend on the inputs; return ``classes`` as a tuple."""
    if (
        type(mode) is str
        and mode in MODES
        and classes is None
        and class_weights is None
        and (ignore_index is None or type(ignore_index) is int)
        and set(map(type, flags.values())) <= _BOOL  # no generator: one C call
    ):  # the usual call
        return None
    check_type("mode", mode, str)
    check_choice("mode", mode, MODES)
    for name, value in flags.items():
        check_type(name, value, bool)
    if ignore_index is not None:
        check_type("ignore_index", ignore_index, int)
    if classes is not None:
        if mode == "binary":
            raise ValueError(
                "classes must be None with mode='binary' (one class), got " + repr(classes)
            )
        if isinstance(classes, Tensor) or not isinstance(classes, Sequence):
            raise TypeError(
                f"classes must be None or a sequence of ints, got {type(classes).__name__}"
            )
        for c in classes:
            check_type("classes entries", c, int)
            if c < 0:
                raise ValueError(f"classes must hold class indices >= 0, got {list(classes)}")
        if len(set(classes)) != len(classes) or not classes:
            raise ValueError(f"classes must be distinct and not empty, got {list(classes)}")
        classes = tuple(classes)
    if class_weights is not None:
        if mode == "binary":
            raise ValueError("class_weights must be None with mode='binary' (one class)")
        if isinstance(class_weights, Tensor):
            check_class_weight("class_weights", class_weights, None)
        elif isinstance(class_weights, Sequence) and class_weights:
            for w in class_weights:
                check_number("class_weights entries", w, 0.0, math.inf, high_inclusive=False)
            if not any(class_weights):
                raise ValueError(
                    f"class_weights must have a nonzero entry, got {list(class_weights)}"
                )
        else:
            raise TypeError(
                "class_weights must be None, a non-empty sequence of floats or a Tensor[C], "
                f"got {class_weights!r}"
            )
    return classes


def _check_score_options(
    smooth: object, eps: object, alpha: object = 1.0, beta: object = 1.0, gamma: object = 1.0
) -> None:
    for name, value in (("smooth", smooth), ("eps", eps), ("alpha", alpha), ("beta", beta)):
        check_number(name, value, 0.0, math.inf, high_inclusive=False)
    if alpha + beta <= 0:  # type: ignore[operator]
        raise ValueError(
            f"alpha + beta must be > 0 (else the loss is constant), got {alpha}, {beta}"
        )
    check_number("gamma", gamma, 0.0, math.inf, low_inclusive=False, high_inclusive=False)


def _prepare_targets(
    pred: Tensor, target: Tensor, mode: str, ignore_index: int | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Check ``pred`` and ``target`` for ``mode``; flatten them and split off the ignored pixels.

    Returns ``(pred, target, valid)``: ``pred (N, C, M)`` in the compute dtype (not activated);
    multiclass: ``target (N, M)`` int64 class indices, ignored pixels set to 0; binary and
    multilabel: ``target (N, C, M)`` in the compute dtype, ignored entries set to 0; ``valid``
    of ``target``'s shape (True where counted), or None without ``ignore_index``. Shared with
    `visionblocks.losses.lovasz` (private).
    """
    if type(pred) is not Tensor or not pred.is_floating_point():  # a plain float tensor: ok
        check_floating("pred", pred)
    if type(target) is not Tensor:
        check_tensor("target", target)
    if not (pred.is_cpu and target.is_cpu):
        check_same_device(pred=pred, target=target)
    if pred.dim() < 2:
        raise ValueError(f"pred must have shape (N, C, ...), got {tuple(pred.shape)}")
    n, c = pred.shape[:2]
    spatial = tuple(pred.shape[2:])
    if mode == "multiclass":
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(
                f"target must hold class indices (an integer dtype) with mode='multiclass', "
                f"got dtype {target.dtype}"
            )
        if tuple(target.shape) != (n, *spatial):
            raise ValueError(
                f"target must have shape {(n, *spatial)} (N, ...) for pred of shape "
                f"{tuple(pred.shape)} with mode='multiclass', got {tuple(target.shape)}"
            )
    else:
        if target.is_complex():
            raise TypeError(f"target must be real, got dtype {target.dtype}")
        if mode == "binary" and c != 1:
            raise ValueError(
                f"pred must have one channel (N, 1, ...) with mode='binary', got {tuple(pred.shape)}"
            )
        shapes = [tuple(pred.shape)] + ([(n, *spatial)] if mode == "binary" else [])
        if tuple(target.shape) not in shapes:
            raise ValueError(
                f"target must have shape {' or '.join(map(str, shapes))} for pred of shape "
                f"{tuple(pred.shape)} with mode={mode!r}, got {tuple(target.shape)}"
            )
    cdt = pred.dtype
    if cdt is not torch.float32 and cdt is not torch.float64:
        cdt = compute_dtype(cdt)
    m = math.prod(spatial)  # not -1: an empty batch has no size to infer
    pred = pred.reshape(n, c, m)
    pred = pred if pred.dtype is cdt else pred.to(cdt)
    target = target.reshape(n, m) if mode == "multiclass" else target.reshape(n, c, m)
    valid = None
    ignore_index = exact_ignore(target, ignore_index)  # a uint8 target never equals -100
    if ignore_index is not None:
        valid = target != ignore_index
        target = torch.where(valid, target, 0)
    # One range check, of the targets with the ignored ones zeroed; on a plain CPU tensor one
    # aminmax read, and the full check (its message) only when it fails.
    high = c - 1 if mode == "multiclass" else 1
    if type(target) is not Tensor or not target.is_cpu or target.dtype is torch.bool:
        _check_labels(target, mode, high, ignore_index)
    elif target.numel() and reads_values():
        lo, hi = torch.aminmax(target)
        if not (lo.item() >= 0 and hi.item() <= high):  # also True for NaN
            _check_labels(target, mode, high, ignore_index)
    if mode == "multiclass":
        return pred, (target if target.dtype is torch.int64 else target.long()), valid
    return pred, (target if target.dtype is cdt else target.to(cdt)), valid


_PROBABILITIES = " (probabilities, as from_logits=False says; pass logits with from_logits=True)"


def _check_labels(target: Tensor, mode: str, high: int, ignore_index: int | None) -> None:
    what = "class indices of pred" if mode == "multiclass" else "labels"
    hint = f" ({what}; ignore_index={ignore_index})"
    check_target_range("target", target, 0, high, hint=hint)


def _class_weights(
    class_weights: ClassWeights,
    classes: tuple[int, ...] | None,
    num_classes: int,
    mode: str,
    like: Tensor,
) -> Tensor | None:
    """Per-column weights of the statistics, or None (all ones): multiclass keeps the ``C``
    columns and gives the classes left out weight 0; multilabel's columns are ``classes``."""
    if classes is not None and max(classes) >= num_classes:
        raise ValueError(
            f"classes must be in [0, {num_classes}) (the classes of pred), got {list(classes)}"
        )
    w = None
    if class_weights is not None:
        if isinstance(class_weights, Tensor):
            check_class_weight("class_weights", class_weights, num_classes)
            check_same_device(pred=like, class_weights=class_weights)
            w = class_weights.to(like.dtype)
        else:
            if len(class_weights) != num_classes:
                raise ValueError(
                    f"class_weights must have {num_classes} entries (one per class of pred), "
                    f"got {len(class_weights)}"
                )
            w = torch.tensor(class_weights, dtype=like.dtype, device=like.device)
    if classes is None:
        return w
    if mode == "multilabel":
        return None if w is None else w[list(classes)]
    keep = torch.zeros(num_classes, dtype=like.dtype, device=like.device)
    keep[list(classes)] = 1.0
    return keep if w is None else w * keep


# ------------------------------------------------------------------------------- core
def _statistics(
    pred: Tensor,
    target: Tensor,
    valid: Tensor | None,
    mode: str,
    from_logits: bool,
    per_image: bool,
    hard: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(I, sum(p), sum(t))``, each ``(C,)`` or, per image, ``(N, C)``; ``hard``: the labels
    are 0/1 (an integer or boolean dtype)."""
    n, c, _ = pred.shape
    dims = (2,) if per_image else (0, 2)
    if mode != "multiclass":
        prob = pred.sigmoid() if from_logits else pred
        if valid is not None:
            prob = prob * valid
        p_sum, t_sum = prob.sum(dims), target.sum(dims)
        if hard:  # 0/1 labels: min(p, t) = p * t
            return (prob * target).sum(dims), p_sum, t_sum
        return p_sum - (prob - target).relu().sum(dims), p_sum, t_sum  # min = p - relu(p - t)
    # Multiclass without a one-hot target: I is the probability of each pixel's class, summed
    # into its class's bin; sum(t) counts the pixels of each class.
    prob = pred.softmax(1) if from_logits else pred
    if valid is None:
        count = torch.ones(target.numel(), dtype=prob.dtype, device=prob.device)
    else:
        count = valid.view(-1).to(prob.dtype)
        prob = prob * count.view(n, 1, -1)  # ignored pixels: 0 everywhere, so in p_true too
    p_true = prob.gather(1, target.unsqueeze(1)).view(-1)
    bins = target
    if per_image:
        bins = target + torch.arange(n, device=target.device).unsqueeze(1) * c
    bins = bins.view(-1)
    zeros = torch.zeros(n * c if per_image else c, dtype=prob.dtype, device=prob.device)
    inter, t_sum = zeros.scatter_add(0, bins, p_true), zeros.scatter_add(0, bins, count)
    if per_image:
        return inter.view(n, c), prob.sum(dims), t_sum.view(n, c)
    return inter, prob.sum(dims), t_sum


def _overlap_loss(
    pred: Tensor,
    target: Tensor,
    mode: str,
    classes: Sequence[int] | None,
    log_loss: bool,
    from_logits: bool,
    smooth: float,
    ignore_index: int | None,
    eps: float,
    class_weights: ClassWeights,
    per_image: bool,
    alpha: float,
    beta: float,
    gamma: float,
) -> Tensor:
    classes = _check_options(
        mode,
        classes,
        class_weights,
        ignore_index,
        log_loss=log_loss,
        from_logits=from_logits,
        per_image=per_image,
    )
    _check_score_options(smooth, eps, alpha, beta, gamma)
    hard = isinstance(target, Tensor) and not target.is_floating_point()
    p, t, valid = _prepare_targets(pred, target, mode, ignore_index)
    if not from_logits:
        check_target_range("pred", p, 0.0, 1.0, hint=_PROBABILITIES)
    w = _class_weights(class_weights, classes, p.shape[1], mode, p)
    if mode == "multilabel" and classes is not None:
        index = torch.tensor(classes, device=p.device)
        p, t = p.index_select(1, index), t.index_select(1, index)
        valid = None if valid is None else valid.index_select(1, index)
    inter, p_sum, t_sum = _statistics(p, t, valid, mode, from_logits, per_image, hard)
    present = t_sum > 0
    counted = present.to(inter.dtype) if w is None else present * w
    # I + alpha FP + beta FN + smooth, in few operations (they dominate small inputs).
    den = (p_sum + t_sum) * alpha if alpha == beta else p_sum * alpha + t_sum * beta
    if alpha + beta != 1:
        den = den + inter * (1 - alpha - beta)
    num = inter
    if smooth:
        num, den = inter + smooth, den + smooth
    if eps == 0:  # no 0 / 0 in the entries left out (a NaN times 0 is NaN)
        den = torch.where(present, den, 1.0)
    score = num / den.clamp_min(eps)
    loss = -score.clamp_min(eps).log() if log_loss else 1.0 - score
    if gamma != 1:
        loss = loss.clamp_min(torch.finfo(loss.dtype).tiny).pow(gamma)
    total = counted.sum().clamp_min(1.0 if w is None else torch.finfo(counted.dtype).tiny)
    return (torch.dot(loss, counted) if loss.dim() == 1 else (loss * counted).sum()) / total


# -------------------------------------------------------------------------- functions
def dice_loss(
    pred: Tensor,
    target: Tensor,
    mode: Mode,
    classes: Sequence[int] | None = None,
    log_loss: bool = False,
    from_logits: bool = True,
    smooth: float = 0.0,
    ignore_index: int | None = None,
    eps: float = 1e-7,
    class_weights: ClassWeights = None,
    *,
    per_image: bool = False,
) -> Tensor:
    """Soft Dice loss, ``1 - (I + smooth) / max((sum(p) + sum(t)) / 2 + smooth, eps)``.

    smp's ``DiceLoss(mode, ...)(pred, target)`` as a function (same arguments, values and
    gradients), except that classes with no target pixel (absent, or all ``ignore_index``)
    are left out of the class mean, where smp counts them as zero loss (see the module
    docstring for the formula).

    Args:
        pred (Tensor[N, C, ...]): Logits, or probabilities with ``from_logits=False``
            (``C = 1`` in binary mode).
        target (Tensor): ``(N, ...)`` class indices (multiclass); ``pred``'s shape (or, binary,
            without the channel) with values in ``[0, 1]`` (binary, multilabel; any real dtype).
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all; not binary).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax (multiclass) or sigmoid (binary, multilabel) to ``pred``.
        smooth: Added to the numerator and the denominator, ``>= 0``.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator (and of ``score`` for ``log_loss``), ``>= 0``.
        class_weights: A weight per class of ``pred`` for the class mean (not binary).
        per_image: Score each image and class apart, then average (default: one score per
            class over the whole batch, as smp).

    Returns:
        Tensor: The scalar loss, in the compute dtype (float32 for half inputs).

    Raises:
        TypeError: A non-floating ``pred``, a target dtype the mode does not take, or options
            of the wrong type.
        ValueError: An unknown ``mode``, shapes that do not fit the mode, ``classes`` out of
            range, repeated or with binary, bad ``class_weights``, a negative ``smooth`` or
            ``eps``, different devices, or (a value check, see
            `visionblocks.set_value_checks`) target values out of range.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[[4.0, -4.0, 4.0, -4.0]]])  # (1, 1, 4)
        >>> dice_loss(logits, torch.tensor([[1, 0, 1, 1]]), "binary")
        tensor(0.2072)
        >>> dice_loss(logits, torch.tensor([[1, 0, 1, 255]]), "binary", ignore_index=255)
        tensor(0.0136)
    """
    return _overlap_loss(
        pred, target, mode, classes, log_loss, from_logits, smooth, ignore_index, eps,
        class_weights, per_image, 0.5, 0.5, 1.0,
    )  # fmt: skip


def jaccard_loss(
    pred: Tensor,
    target: Tensor,
    mode: Mode,
    classes: Sequence[int] | None = None,
    log_loss: bool = False,
    from_logits: bool = True,
    smooth: float = 0.0,
    ignore_index: int | None = None,
    eps: float = 1e-7,
    class_weights: ClassWeights = None,
    *,
    per_image: bool = False,
) -> Tensor:
    """Soft Jaccard (IoU) loss, ``1 - (I + smooth) / max(sum(p) + sum(t) - I + smooth, eps)``.

    smp's ``JaccardLoss(mode, ...)(pred, target)`` as a function, with the one difference of
    `dice_loss` (classes with no target pixel are left out of the mean). Arguments, returns
    and errors: as `dice_loss`.

    Args:
        pred (Tensor[N, C, ...]): Logits, or probabilities with ``from_logits=False``.
        target (Tensor): Class indices (multiclass) or values in ``[0, 1]``.
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all; not binary).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax (multiclass) or sigmoid (binary, multilabel) to ``pred``.
        smooth: Added to the numerator and the denominator, ``>= 0``.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator (and of ``score`` for ``log_loss``), ``>= 0``.
        class_weights: A weight per class of ``pred`` for the class mean (not binary).
        per_image: Score each image and class apart, then average.

    Returns:
        Tensor: The scalar loss, in the compute dtype (float32 for half inputs).

    Raises:
        TypeError: As `dice_loss`.
        ValueError: As `dice_loss`.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[[4.0, -4.0], [-4.0, 4.0]]])  # (1, 2 classes, 2 pixels)
        >>> jaccard_loss(logits, torch.tensor([[0, 0]]), "multiclass")  # class 1 absent (smp: 0.25)
        tensor(0.5000)
    """
    return _overlap_loss(
        pred, target, mode, classes, log_loss, from_logits, smooth, ignore_index, eps,
        class_weights, per_image, 1.0, 1.0, 1.0,
    )  # fmt: skip


def tversky_loss(
    pred: Tensor,
    target: Tensor,
    mode: Mode,
    classes: Sequence[int] | None = None,
    log_loss: bool = False,
    from_logits: bool = True,
    smooth: float = 0.0,
    ignore_index: int | None = None,
    eps: float = 1e-7,
    alpha: float = 0.5,
    beta: float = 0.5,
    gamma: float = 1.0,
    class_weights: ClassWeights = None,
    *,
    per_image: bool = False,
) -> Tensor:
    """(Focal) Tversky loss: ``(1 - (I + smooth) / max(I + alpha FP + beta FN + smooth, eps))
    ** gamma`` per class, then the mean.

    smp's ``TverskyLoss(mode, ...)(pred, target)`` as a function, with `dice_loss`'s
    difference and one more: ``gamma`` raises each class's loss (the focal Tversky loss),
    where smp raises the class mean; the two agree for one class or ``gamma = 1``.
    ``alpha = beta = 0.5`` is `dice_loss`, ``1`` `jaccard_loss`.

    Args:
        pred (Tensor[N, C, ...]): Logits, or probabilities with ``from_logits=False``.
        target (Tensor): Class indices (multiclass) or values in ``[0, 1]``.
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all; not binary).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax (multiclass) or sigmoid (binary, multilabel) to ``pred``.
        smooth: Added to the numerator and the denominator, ``>= 0``.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator (and of ``score`` for ``log_loss``), ``>= 0``.
        alpha: Weight of the false positives, ``>= 0``.
        beta: Weight of the false negatives, ``>= 0`` (``alpha + beta > 0``).
        gamma: Exponent of each class's loss, ``> 0`` (below 1 stresses the hard classes).
        class_weights: A weight per class of ``pred`` for the class mean (not binary).
        per_image: Score each image and class apart, then average.

    Returns:
        Tensor: The scalar loss, in the compute dtype (float32 for half inputs).

    Raises:
        TypeError: As `dice_loss`.
        ValueError: As `dice_loss`, or ``alpha``, ``beta``, ``gamma`` out of range.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[[4.0, -4.0, -4.0, -4.0]]])
        >>> target = torch.tensor([[1, 1, 0, 0]])  # one pixel missed
        >>> tversky_loss(logits, target, "binary", alpha=0.3, beta=0.7)  # misses cost more
        tensor(0.4155)
        >>> tversky_loss(logits, target, "binary", alpha=0.7, beta=0.3)
        tensor(0.2454)
    """
    return _overlap_loss(
        pred, target, mode, classes, log_loss, from_logits, smooth, ignore_index, eps,
        class_weights, per_image, alpha, beta, gamma,
    )  # fmt: skip


# ---------------------------------------------------------------------------- modules
class _OverlapLoss(nn.Module):
    """The modules' shared constructor (`DiceLoss`'s and `JaccardLoss`'s own): smp's
    arguments, ``class_weights`` as a buffer."""

    class_weights: Tensor | None

    def __init__(
        self,
        mode: Mode,
        classes: Sequence[int] | None = None,
        log_loss: bool = False,
        from_logits: bool = True,
        smooth: float = 0.0,
        ignore_index: int | None = None,
        eps: float = 1e-7,
        class_weights: ClassWeights = None,
        *,
        per_image: bool = False,
    ) -> None:
        super().__init__()
        classes = _check_options(
            mode,
            classes,
            class_weights,
            ignore_index,
            log_loss=log_loss,
            from_logits=from_logits,
            per_image=per_image,
        )
        _check_score_options(smooth, eps)
        self.mode = mode
        self.classes = classes
        self.log_loss = log_loss
        self.from_logits = from_logits
        self.smooth = smooth
        self.ignore_index = ignore_index
        self.eps = eps
        self.per_image = per_image
        if class_weights is not None and not isinstance(class_weights, Tensor):
            class_weights = torch.tensor(class_weights, dtype=torch.float32)
        self.register_buffer("class_weights", class_weights)

    def _options(self) -> dict:
        return {
            "classes": self.classes,
            "log_loss": self.log_loss,
            "from_logits": self.from_logits,
            "smooth": self.smooth,
            "ignore_index": self.ignore_index,
            "eps": self.eps,
            "class_weights": self.class_weights,
            "per_image": self.per_image,
        }

    def extra_repr(self) -> str:
        options = {"mode": self.mode, **self._options()}
        options["class_weights"] = None if self.class_weights is None else "Tensor"
        return ", ".join(f"{k}={v!r}" for k, v in options.items() if k == "mode" or v is not None)


@LOSSES.register(name="dice")
class DiceLoss(_OverlapLoss):
    """Module form of `dice_loss`; registered in ``LOSSES`` as ``"dice"``. smp's ``DiceLoss``
    arguments, plus ``per_image``.

    Args:
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax or sigmoid to ``pred``.
        smooth: Added to the numerator and the denominator.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator.
        class_weights: A weight per class for the class mean (a buffer).
        per_image: Score each image and class apart, then average.

    Examples:
        >>> import torch
        >>> loss_fn = DiceLoss("multiclass", ignore_index=255)
        >>> loss_fn
        DiceLoss(mode='multiclass', log_loss=False, from_logits=True, smooth=0.0, ignore_index=255, eps=1e-07, per_image=False)
        >>> loss_fn(torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))).shape
        torch.Size([])
    """

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Apply `dice_loss` with this module's options."""
        return dice_loss(pred, target, self.mode, **self._options())


@LOSSES.register(name="jaccard")
class JaccardLoss(_OverlapLoss):
    """Module form of `jaccard_loss`; registered in ``LOSSES`` as ``"jaccard"``. smp's
    ``JaccardLoss`` arguments, plus ``per_image``.

    Args:
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax or sigmoid to ``pred``.
        smooth: Added to the numerator and the denominator.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator.
        class_weights: A weight per class for the class mean (a buffer).
        per_image: Score each image and class apart, then average.

    Examples:
        >>> import torch
        >>> loss_fn = JaccardLoss("multilabel", classes=[0, 2], per_image=True)
        >>> loss_fn(torch.randn(2, 3, 4, 4), torch.randint(0, 2, (2, 3, 4, 4))).shape
        torch.Size([])
    """

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Apply `jaccard_loss` with this module's options."""
        return jaccard_loss(pred, target, self.mode, **self._options())


@LOSSES.register(name="tversky")
class TverskyLoss(_OverlapLoss):
    """Module form of `tversky_loss`; registered in ``LOSSES`` as ``"tversky"``. smp's
    ``TverskyLoss`` arguments, plus ``per_image``.

    Args:
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        classes: The class indices the loss averages over (default all).
        log_loss: ``-log(score)`` instead of ``1 - score``.
        from_logits: Apply softmax or sigmoid to ``pred``.
        smooth: Added to the numerator and the denominator.
        ignore_index: Target value whose pixels take no part (or None).
        eps: Lower bound of the denominator.
        alpha: Weight of the false positives.
        beta: Weight of the false negatives.
        gamma: Exponent of each class's loss.
        class_weights: A weight per class for the class mean (a buffer).
        per_image: Score each image and class apart, then average.

    Examples:
        >>> import torch
        >>> loss_fn = TverskyLoss("binary", alpha=0.3, beta=0.7, gamma=0.75)
        >>> loss_fn(torch.randn(2, 1, 4, 4), torch.randint(0, 2, (2, 4, 4))).shape
        torch.Size([])
    """

    def __init__(
        self,
        mode: Mode,
        classes: Sequence[int] | None = None,
        log_loss: bool = False,
        from_logits: bool = True,
        smooth: float = 0.0,
        ignore_index: int | None = None,
        eps: float = 1e-7,
        alpha: float = 0.5,
        beta: float = 0.5,
        gamma: float = 1.0,
        class_weights: ClassWeights = None,
        *,
        per_image: bool = False,
    ) -> None:
        super().__init__(
            mode, classes, log_loss, from_logits, smooth, ignore_index, eps, class_weights,
            per_image=per_image,
        )  # fmt: skip
        _check_score_options(smooth, eps, alpha, beta, gamma)
        self.alpha = alpha
        self.beta = beta
        self.gamma = gamma

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Apply `tversky_loss` with this module's options."""
        return tversky_loss(
            pred, target, self.mode, alpha=self.alpha, beta=self.beta, gamma=self.gamma,
            **self._options(),
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, beta={self.beta}, gamma={self.gamma}"
