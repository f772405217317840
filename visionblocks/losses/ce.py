"""Cross entropy with class weights, ``ignore_index``, label smoothing and OHEM (``top_k``).

`cross_entropy` is `torch.nn.functional.cross_entropy` plus two things segmentation training
needs: online hard example mining (``top_k``) and a ``"mean"`` that never returns NaN. The
private helpers here (target checks, weighted mean, OHEM selection) are shared with
`visionblocks.losses.softmax_focal`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_range, check_type
from visionblocks._core.reduce import check_reduction, check_target_range, compute_dtype
from visionblocks._core.registry import LOSSES
from visionblocks._core.tensor_checks import (
    check_floating,
    check_same_device,
    check_tensor,
    reads_values,
)

__all__ = ["CrossEntropyLoss", "cross_entropy"]

Reduction = Literal["none", "mean", "sum"]

# A product top_k * n_valid within this of an integer counts as that integer (0.07 * 100 is
# 7.000000000000001 in float64; the user means 7).
_K_EPS = 1e-6


# ---------------------------------------------------------------------------------- checks
def _check_options(ignore_index: int, label_smoothing: float, reduction: str) -> None:
    check_type("ignore_index", ignore_index, int)
    if isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be int, got bool ({ignore_index!r})")
    check_type("label_smoothing", label_smoothing, (int, float))
    check_range("label_smoothing", float(label_smoothing), 0.0, 1.0, high_inclusive=False)
    check_reduction(reduction)


def _check_top_k(top_k: float | None) -> None:
    if top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int | float):
        raise TypeError(f"top_k must be None or a float in (0, 1], got {type(top_k).__name__}")
    check_range("top_k", float(top_k), 0.0, 1.0, low_inclusive=False)


def _check_class_weight(name: str, weight: Tensor | None, num_classes: int | None) -> None:
    """``weight`` is None or a floating ``Tensor[C]`` (any ``C`` when ``num_classes`` is None)."""
    if weight is None:
        return
    check_floating(name, weight)
    if weight.dim() != 1 or (num_classes is not None and weight.shape[0] != num_classes):
        expected = "C" if num_classes is None else num_classes
        raise ValueError(
            f"{name} must have shape ({expected},) (one value per class), got {tuple(weight.shape)}"
        )


def _check_logits_target(logits: Tensor, target: Tensor, *, allow_probs: bool) -> bool:
    """Validate ``logits (N, C, ...)`` and ``target``; return whether ``target`` holds probs."""
    check_floating("logits", logits)
    check_tensor("target", target)
    if logits.dim() == 0:
        raise ValueError("logits must have shape (C,), (N, C) or (N, C, ...), got a 0-d tensor")
    num_classes = logits.shape[0 if logits.dim() == 1 else 1]
    if num_classes == 0:
        raise ValueError(f"logits must have at least one class, got shape {tuple(logits.shape)}")
    index_shape = () if logits.dim() == 1 else (logits.shape[0], *logits.shape[2:])
    if target.is_floating_point():
        if not allow_probs:
            raise TypeError(
                f"target must hold class indices (an integer dtype), got dtype {target.dtype}; "
                "use cross_entropy for probability targets"
            )
        if target.shape != logits.shape:
            raise ValueError(
                f"probability targets must have the logits' shape {tuple(logits.shape)}, "
                f"got {tuple(target.shape)}"
            )
        return True
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"target must hold class indices (an integer dtype), got {target.dtype}")
    if tuple(target.shape) != index_shape:
        raise ValueError(
            f"target of class indices must have shape {index_shape} for logits of shape "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    return False


def _check_target_range(target: Tensor, num_classes: int, ignore_index: int) -> None:
    """Raise ``ValueError`` for class indices outside ``[0, C)`` (other than ``ignore_index``).

    A value check (skipped when `visionblocks.value_checks_enabled` is off): one ``aminmax``,
    and a second one over the targets with ``ignore_index`` masked when the first finds values
    outside ``[0, C)``. With value checks off, an out-of-range index hits the device-side
    assert (CUDA) or the ``IndexError`` (CPU) of ``nll_loss``, exactly as ``F.cross_entropy``.
    """
    if target.numel() == 0 or not reads_values(target):
        return
    for values in (target, None):
        if values is None:
            values = target.masked_fill(target == ignore_index, 0)
        lo, hi = (int(v) for v in torch.aminmax(values))
        if lo >= 0 and hi < num_classes:
            return
    value = lo if lo < 0 else hi
    raise ValueError(
        f"target class indices must be in [0, {num_classes}) or equal ignore_index "
        f"({ignore_index}), got {value}"
    )


def _check_devices(logits: Tensor, target: Tensor, **others: Tensor | float | None) -> None:
    tensors = {k: v for k, v in others.items() if isinstance(v, Tensor)}
    check_same_device(logits=logits, target=target, **tensors)


# ------------------------------------------------------------------------------- reduction
def _safe_mean(total: Tensor, denom: Tensor | int) -> Tensor:
    """``total / denom``, or a zero connected to ``total``'s graph when ``denom`` is zero.

    ``denom`` stays a tensor (no host sync): the division runs on a denominator of 1 where it is
    zero, so neither the value nor the gradient can be NaN.
    """
    if not isinstance(denom, Tensor):
        return total * 0.0 if denom == 0 else total / denom
    denom = denom.to(total.dtype)
    nonzero = denom != 0
    return torch.where(nonzero, total / torch.where(nonzero, denom, 1.0), total * 0.0)


def _ohem_keep(
    loss: Tensor, valid: Tensor | None, top_k: float, *, use_sort: bool | None = None
) -> Tensor:
    """Mask of the ``ceil(top_k * n_valid)`` valid elements with the largest ``loss``.

    Exactly that many are kept (which of equal losses at the boundary is unspecified). On CPU
    the count is read (free) and ``topk`` selects in linear time; elsewhere a sort ranks the
    elements and the count stays a tensor, so there is no host sync. ``use_sort`` forces one
    way (tests check both on CPU).
    """
    key = loss.detach().flatten()
    n = key.numel()
    if n == 0:
        return torch.zeros_like(loss, dtype=torch.bool)
    if valid is None:
        n_valid = torch.tensor(float(n), dtype=torch.float64, device=loss.device)
    else:
        valid = valid.flatten()
        key = key.masked_fill(~valid, -math.inf)
        n_valid = valid.sum(dtype=torch.float64)
    k = torch.ceil(n_valid * top_k - _K_EPS).clamp_min(1)
    if use_sort is None:
        use_sort = key.device.type != "cpu"
    if not use_sort:
        # topk is ~10-25x faster than a full sort on CPU (131k-1M elements, 2 threads).
        kept_idx = torch.topk(key, int(k), sorted=False).indices
        keep = torch.zeros(n, dtype=torch.bool, device=key.device).index_fill_(0, kept_idx, True)
    else:
        order = torch.sort(key, descending=True).indices
        rank_kept = torch.arange(n, device=key.device) < k
        keep = torch.empty_like(rank_kept).scatter_(0, order, rank_kept)
    if valid is not None:
        keep &= valid
    return keep.view(loss.shape)


def _reduce_class_loss(
    loss: Tensor,
    reduction: str,
    *,
    input_dtype: torch.dtype,
    valid: Tensor | None,
    elem_weight: Tensor | None,
    top_k: float | None,
) -> Tensor:
    """Reduce an element-wise loss with ``F.cross_entropy``'s weighted-mean semantics.

    Args:
        loss: Element-wise loss in the compute dtype, zero at ignored elements.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        input_dtype: Returned by ``"none"``.
        valid: Non-ignored elements (``None``: all).
        elem_weight: ``weight[target]`` per element, zero at ignored ones; ``"mean"`` divides
            by its sum over the counted elements (``None``: by their number).
        top_k: OHEM fraction; only the kept elements are summed and counted.
    """
    if top_k is not None and top_k < 1.0:
        valid = _ohem_keep(loss, valid, top_k)
        loss = loss.masked_fill(~valid, 0.0)
    if reduction == "none":
        return loss.to(input_dtype)
    total = loss.sum()
    if reduction == "sum":
        return total
    if elem_weight is not None:
        counted = elem_weight if valid is None else elem_weight.masked_fill(~valid, 0.0)
        return _safe_mean(total, counted.sum())
    return _safe_mean(total, loss.numel() if valid is None else valid.sum())


# -------------------------------------------------------------------------------- function
def cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: Reduction = "mean",
    top_k: float | None = None,
) -> Tensor:
    """Cross entropy over logits, with online hard example mining (OHEM) as an option.

    With ``top_k=None`` (or ``1.0``) this equals `torch.nn.functional.cross_entropy` in value
    and gradient, for class-index and probability targets, including its weighted mean: with
    ``weight``, ``"mean"`` divides the summed loss by the sum of the *target classes'* weights
    over the non-ignored elements, not by their number. Two differences: when nothing is
    counted (an empty batch, every element ignored) ``"mean"`` returns a zero that stays
    connected to the graph instead of NaN, and bad inputs raise ``ValueError``/``TypeError``.

    OHEM (``top_k`` in ``(0, 1]``): of the ``n_valid`` non-ignored elements (samples for
    ``(N, C)`` logits, pixels across the whole batch for ``(N, C, H, W)``), keep the
    ``k = ceil(top_k * n_valid)`` with the largest loss (at least one; a product within 1e-6 of
    an integer counts as that integer, so 0.07 of 100 keeps 7) and drop the rest. The loss that
    ranks them is the element-wise loss ``reduction="none"`` returns without ``top_k``, so class
    weights and label smoothing take part. Exactly ``k`` are kept (among equal losses at the
    boundary, which ones is unspecified). Then ``"none"`` returns the element-wise loss with
    dropped elements set to zero, ``"sum"`` sums the kept ones, and ``"mean"`` divides that sum
    by the kept count, or by the sum of the kept elements' target-class weights when ``weight``
    is given.

    Dtype policy: float16/bfloat16 logits are computed in float32; ``"none"`` returns the
    logits' dtype, ``"sum"``/``"mean"`` return float32 (see `visionblocks._core.reduce`).

    Args:
        logits (Tensor[N, C, ...]): Unnormalised scores; class dimension 1 (or ``Tensor[C]``).
        target (Tensor[N, ...]): Class indices in ``[0, C)`` or ``ignore_index`` (integer
            dtype); or class probabilities of ``logits``' shape (floating dtype).
        weight (Tensor[C], optional): Per-class weight, as in ``F.cross_entropy``.
        ignore_index: Target value excluded from the loss and from ``"mean"`` (class-index
            targets only; probability targets require the default -100, as in PyTorch).
        label_smoothing: In ``[0, 1)``; mixes the target with the uniform distribution,
            ``(1 - s) * target + s / C``, exactly as ``F.cross_entropy``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        top_k: ``None`` (no mining) or the fraction in ``(0, 1]`` of valid elements to keep.

    Returns:
        Tensor: ``"none"``: ``Tensor[N, ...]`` in the logits' dtype; otherwise a scalar in the
        compute dtype (float32 for half inputs).

    Raises:
        TypeError: Non-floating ``logits``, a boolean target, or options of the wrong type.
        ValueError: Mismatched shapes or devices, a ``weight`` not of shape ``(C,)``,
            ``label_smoothing`` outside ``[0, 1)``, ``top_k`` outside ``(0, 1]``, an unknown
            ``reduction``, a non-default ``ignore_index`` with probability targets, or (value
            checks, see `visionblocks.set_value_checks`) a class index outside ``[0, C)`` or a
            probability outside ``[0, 1]``. With value checks off, a bad index triggers the
            same device-side assert (CUDA) or ``IndexError`` (CPU) as ``F.cross_entropy``.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
        >>> target = torch.tensor([0, 1, 1])
        >>> cross_entropy(logits, target)
        tensor(0.7936)
        >>> cross_entropy(logits, target, top_k=0.3)  # only the hardest sample (the third)
        tensor(2.1269)
        >>> cross_entropy(logits, torch.full((3,), -100))  # everything ignored: 0, not NaN
        tensor(0.)

    References:
        Shrivastava et al., "Training Region-based Object Detectors with Online Hard Example
        Mining", CVPR 2016. https://arxiv.org/abs/1604.03540
    """
    is_prob = _check_logits_target(logits, target, allow_probs=True)
    _check_options(ignore_index, label_smoothing, reduction)
    _check_top_k(top_k)
    num_classes = logits.shape[0 if logits.dim() == 1 else 1]
    _check_class_weight("weight", weight, num_classes)
    _check_devices(logits, target, weight=weight)
    if is_prob and ignore_index != -100:
        raise ValueError(
            "ignore_index is not supported for probability targets, "
            f"got ignore_index={ignore_index}"
        )

    cdt = compute_dtype(logits.dtype)
    x = logits.to(cdt)
    w = None if weight is None else weight.to(cdt)
    if is_prob:
        t = target.to(cdt)
        check_target_range("target", t, 0.0, 1.0, hint=" (class probabilities)")
        loss = F.cross_entropy(x, t, weight=w, reduction="none", label_smoothing=label_smoothing)
        return _reduce_class_loss(
            loss, reduction, input_dtype=logits.dtype, valid=None, elem_weight=None, top_k=top_k
        )

    _check_target_range(target, num_classes, ignore_index)
    target = target.long()
    loss = F.cross_entropy(
        x,
        target,
        weight=w,
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=label_smoothing,
    )
    valid = target != ignore_index
    elem_weight = None
    if w is not None and reduction == "mean":
        elem_weight = w[target.masked_fill(~valid, 0)].masked_fill(~valid, 0.0)
    return _reduce_class_loss(
        loss, reduction, input_dtype=logits.dtype, valid=valid, elem_weight=elem_weight, top_k=top_k
    )


# ---------------------------------------------------------------------------------- module
@LOSSES.register(name="ce")
class CrossEntropyLoss(nn.Module):
    """Module form of `cross_entropy`; registered in ``LOSSES`` as ``"ce"``.

    Args:
        weight (Tensor[C], optional): Per-class weight (kept as a buffer, so it follows
            ``.to(device)``).
        ignore_index: Target value excluded from the loss and from ``"mean"``.
        label_smoothing: In ``[0, 1)``.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        top_k: ``None`` or the OHEM fraction in ``(0, 1]``.

    Examples:
        >>> import torch
        >>> loss_fn = CrossEntropyLoss(top_k=0.5, ignore_index=255)
        >>> loss_fn
        CrossEntropyLoss(ignore_index=255, label_smoothing=0.0, reduction='mean', top_k=0.5)
        >>> logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
        >>> loss_fn(logits, target).shape
        torch.Size([])
    """

    weight: Tensor | None

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: Reduction = "mean",
        top_k: float | None = None,
    ) -> None:
        super().__init__()
        _check_options(ignore_index, label_smoothing, reduction)
        _check_top_k(top_k)
        _check_class_weight("weight", weight, None)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.top_k = top_k

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """Apply `cross_entropy` with this module's options."""
        return cross_entropy(
            logits,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
            top_k=self.top_k,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, "
            f"reduction={self.reduction!r}, top_k={self.top_k}"
        )
