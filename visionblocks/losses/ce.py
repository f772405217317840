"""Cross entropy with class weights, ``ignore_index``, label smoothing and OHEM (``top_k``).

`cross_entropy` is `torch.nn.functional.cross_entropy` (same signature, values, gradients and
dtypes) plus online hard example mining (``top_k``), the one thing segmentation training
needs beyond it, and clear errors. The private helpers here (target checks, weighted mean,
OHEM selection) are shared with `visionblocks.losses.softmax_focal`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.losses._ce_checks import (
    check_class_indices,
    check_class_weight,
    check_devices,
    check_logits_target,
    check_options,
    check_top_k,
)
from visionblocks.losses._reduce import check_target_range, reduce_loss
from visionblocks.losses._torch_compat import TorchValueError, autocast_enabled, legacy_reduction

__all__ = ["CrossEntropyLoss", "cross_entropy"]
__dir__ = public_dir(__name__, __all__)

Reduction = Literal["none", "mean", "sum"]

# A product top_k * n_valid within this of an integer counts as that integer (0.07 * 100 is
# 7.000000000000001 in float64; the user means 7).
_K_EPS = 1e-6


# ------------------------------------------------------------------------------- reduction
def _ohem_keep(
    loss: Tensor, valid: Tensor | None, top_k: float, *, use_sort: bool | None = None
) -> Tensor:
    """Mask of the ``ceil(top_k * n_valid)`` valid elements with the largest ``loss``: ``topk``
    on CPU, where reading the count is free; a sort elsewhere (no host sync). ``use_sort``
    forces one way (the tests check both)."""
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
        # topk selects in linear time on CPU, where reading the count costs no sync.
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
    """`reduce_loss` with ``F.cross_entropy``'s weighted mean: ``"mean"`` divides by the sum
    of ``elem_weight`` (``weight[target]``) over the counted elements, or their number; with
    ``top_k`` (OHEM) only the kept elements are summed and counted."""
    if top_k is not None and top_k < 1.0:
        valid = _ohem_keep(loss, valid, top_k)
        loss = loss.masked_fill(~valid, 0.0)
    count = None if valid is None else valid.sum()
    if elem_weight is not None and reduction == "mean":
        count = (elem_weight if valid is None else elem_weight.masked_fill(~valid, 0.0)).sum()
    return reduce_loss(loss, reduction, input_dtype, count)


# -------------------------------------------------------------------------------- function
def cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: Reduction = "mean",
    label_smoothing: float = 0.0,
    *,
    top_k: float | None = None,
) -> Tensor:
    """Cross entropy over logits, with online hard example mining (OHEM) as an option.

    With ``top_k=None`` this *is* `torch.nn.functional.cross_entropy`, after input checks:
    same positional signature (``size_average``/``reduce`` are PyTorch's deprecated
    arguments), values, gradients and dtypes, for class-index and probability targets,
    including its weighted mean (with ``weight``, ``"mean"`` divides the summed loss by the sum
    of the *target classes'* weights over the non-ignored elements, not by their number) and
    its NaN when ``"mean"`` counts nothing (every element ignored or of a class of weight 0,
    an empty batch). The differences are only for calls PyTorch rejects: any integer dtype of
    class indices (``ignore_index`` compared exactly: a ``uint8`` target never equals -100), a
    ``weight`` of another floating dtype than ``logits`` (cast to it), a ``weight`` with a
    negative, non-finite or no nonzero entry, and clear errors.
    Bad values raise ``ValueError``; where PyTorch raises ``RuntimeError`` or ``IndexError``
    for the same input, the error is also that type. The first argument is named ``logits``
    (PyTorch: ``input``).

    OHEM (``top_k`` in ``(0, 1]``, keyword-only): of the ``n_valid`` non-ignored elements
    (samples for ``(N, C)`` logits, pixels across the whole batch for ``(N, C, H, W)``), keep
    the ``k = ceil(top_k * n_valid)`` with the largest loss (at least one; a product within
    1e-6 of an integer counts as that integer, so 0.07 of 100 keeps 7) and drop the rest. The
    loss that ranks them is the element-wise loss ``reduction="none"`` returns without
    ``top_k``, so class weights and label smoothing take part. Exactly ``k`` are kept (among
    equal losses at the boundary, which ones is unspecified). Then ``"none"`` returns the
    element-wise loss with dropped elements set to zero, ``"sum"`` sums the kept ones, and
    ``"mean"`` divides that sum by the kept count, or by the sum of the kept elements'
    target-class weights when ``weight`` is given. With ``top_k`` (``1.0`` included), a
    ``"mean"`` that counts nothing is a zero that stays connected to the graph instead of NaN,
    so a crop with every pixel ignored cannot derail training. Sums are accumulated in float32
    for half inputs and returned in PyTorch's dtype.

    Dtypes are PyTorch's: the logits' dtype for class-index targets, the promoted dtype of
    logits and targets for probabilities (float32 under autocast), for every ``reduction``.

    Under ``torch.autocast``: PyTorch computes cross entropy in float32, so every ``reduction``
    returns float32, ``top_k`` included. Outside it, half logits give PyTorch's half-precision
    loss (pass ``logits.float()`` for a float32 one).

    Args:
        logits (Tensor[N, C, ...]): Unnormalised scores; class dimension 1 (or ``Tensor[C]``).
        target (Tensor[N, ...]): Class indices in ``[0, C)`` or ``ignore_index`` (integer
            dtype); or class probabilities of ``logits``' shape (floating dtype).
        weight (Tensor[C], optional): Per-class weight, as in ``F.cross_entropy``.
        size_average: PyTorch's deprecated argument (``None`` or a bool; warns).
        ignore_index: Target value excluded from the loss and from ``"mean"`` (class-index
            targets only; probability targets require the default -100, as in PyTorch).
        reduce: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        label_smoothing: In ``[0, 1]``; mixes the target with the uniform distribution,
            ``(1 - s) * target + s / C``, exactly as ``F.cross_entropy``.
        top_k: ``None`` (no mining) or the fraction in ``(0, 1]`` of valid elements to keep.

    Returns:
        Tensor: ``"none"``: ``Tensor[N, ...]``; otherwise a scalar. In PyTorch's dtype (see
        above).

    Raises:
        TypeError: Non-floating ``logits``, a boolean target, options of the wrong type, or a
            ``size_average``/``reduce`` that is not ``None`` or a bool.
        ValueError: Mismatched shapes or devices, a ``weight`` not of shape ``(C,)``,
            ``label_smoothing`` outside ``[0, 1]``, ``top_k`` outside ``(0, 1]``, an unknown
            ``reduction``, a non-default ``ignore_index`` with probability targets, or (value
            checks, see `visionblocks.set_value_checks`) a class index outside ``[0, C)``
            (also an ``IndexError``, as in PyTorch) or a probability outside ``[0, 1]``. With
            value checks off, a bad index triggers the same device-side assert (CUDA) or
            ``IndexError`` (CPU) as ``F.cross_entropy``.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
        >>> target = torch.tensor([0, 1, 1])
        >>> cross_entropy(logits, target)
        tensor(0.7936)
        >>> cross_entropy(logits, target, top_k=0.3)  # only the hardest sample (the third)
        tensor(2.1269)
        >>> cross_entropy(logits, torch.full((3,), -100))  # everything ignored: as PyTorch
        tensor(nan)
        >>> cross_entropy(logits, torch.full((3,), -100), top_k=1.0)  # with OHEM: 0
        tensor(0.)

    References:
        Shrivastava et al., "Training Region-based Object Detectors with Online Hard Example
        Mining", CVPR 2016. https://arxiv.org/abs/1604.03540
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    is_prob = check_logits_target(logits, target, allow_probs=True)
    check_options(ignore_index, label_smoothing, reduction, smoothing_up_to_1=True)
    check_top_k(top_k)
    num_classes = logits.shape[0 if logits.dim() == 1 else 1]
    check_class_weight("weight", weight, num_classes)
    check_devices(logits, target, weight=weight)
    if is_prob and ignore_index != -100:
        raise TorchValueError(
            "ignore_index is not supported for probability targets, "
            f"got ignore_index={ignore_index}"
        )
    w = weight
    if w is not None and w.dtype != logits.dtype and not autocast_enabled(logits):
        w = w.to(logits.dtype)  # PyTorch requires the logits' dtype
    if is_prob:
        check_target_range("target", target, 0.0, 1.0, hint=" (class probabilities)")
    else:
        check_class_indices(target, num_classes, ignore_index)
        target = target.long()
    options = {"weight": w, "ignore_index": ignore_index, "label_smoothing": label_smoothing}
    if top_k is None:
        return F.cross_entropy(logits, target, reduction=reduction, **options)

    loss = F.cross_entropy(logits, target, reduction="none", **options)
    out_dtype = loss.dtype
    loss = loss.to(compute_dtype(out_dtype))
    if is_prob:
        reduced = _reduce_class_loss(
            loss, reduction, input_dtype=out_dtype, valid=None, elem_weight=None, top_k=top_k
        )
        return reduced.to(out_dtype)
    valid = target != ignore_index
    elem_weight = None
    if w is not None and reduction == "mean":
        safe = target.masked_fill(~valid, 0)
        elem_weight = w.to(loss.dtype)[safe].masked_fill(~valid, 0.0)
    reduced = _reduce_class_loss(
        loss, reduction, input_dtype=out_dtype, valid=valid, elem_weight=elem_weight, top_k=top_k
    )
    return reduced.to(out_dtype)


# ---------------------------------------------------------------------------------- module
@LOSSES.register(name="ce")
class CrossEntropyLoss(nn.Module):
    """Module form of `cross_entropy`; registered in ``LOSSES`` as ``"ce"``.

    ``torch.nn.CrossEntropyLoss`` with OHEM: the same positional arguments (``size_average``
    and ``reduce`` are PyTorch's deprecated ones), ``weight`` kept as a buffer (so it follows
    ``.to(device)`` and is in the state dict under the same key), the same attributes, and
    ``top_k`` keyword-only after them. With ``top_k=None`` its results are PyTorch's.

    Args:
        weight (Tensor[C], optional): Per-class weight (a buffer).
        size_average: PyTorch's deprecated argument (``None`` or a bool; warns).
        ignore_index: Target value excluded from the loss and from ``"mean"``.
        reduce: PyTorch's deprecated argument (``None`` or a bool; warns).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        label_smoothing: In ``[0, 1]``.
        top_k: ``None`` or the OHEM fraction in ``(0, 1]``.


    Examples:
        >>> import torch
        >>> loss_fn = CrossEntropyLoss(top_k=0.5, ignore_index=255)
        >>> loss_fn
        CrossEntropyLoss(ignore_index=255, label_smoothing=0.0, reduction='mean', top_k=0.5)
        >>> logits, target = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
        >>> loss_fn(logits, target).shape
        torch.Size([])
        >>> CrossEntropyLoss(torch.tensor([1.0, 2.0, 0.5])).weight  # weight first, as in torch
        tensor([1.0000, 2.0000, 0.5000])
    """

    weight: Tensor | None

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: Reduction = "mean",
        label_smoothing: float = 0.0,
        *,
        top_k: float | None = None,
    ) -> None:
        super().__init__()
        reduction = legacy_reduction(size_average, reduce, reduction)
        check_options(ignore_index, label_smoothing, reduction, smoothing_up_to_1=True)
        check_top_k(top_k)
        check_class_weight("weight", weight, None)
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
