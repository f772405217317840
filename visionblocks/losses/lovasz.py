"""Lovász loss: a convex surrogate of the Jaccard (IoU) loss, the one a segmentation is scored by.

Convention: ``pred`` holds scores ``(N, C, ...)`` (logits, or probabilities with
``from_logits=False``) and ``target`` the labels, in segmentation_models_pytorch's (smp's)
three modes: ``"multiclass"`` (``target (N, ...)`` of class indices), ``"binary"`` (``pred
(N, 1, ...)``, ``target`` of 0/1 with or without that channel) and ``"multilabel"``
(``target`` of 0/1, ``pred``'s shape).

The Lovász extension of the Jaccard loss (Berman et al., CVPR 2018,
https://arxiv.org/abs/1705.08790): sort the ``P`` pixel errors ``e`` in decreasing order and
take ``loss = sum_i e_(i) * g_i`` with ``g_i = J_i - J_(i-1)``, where ``J_i`` is the Jaccard
loss ``1 - |fg \\ top_i| / |fg ∪ top_i|`` of predicting only the ``i`` worst pixels wrong
(``top_i``); with ``F_i`` the foreground count among them and ``G`` the total,
``J_i = i / (G + i - F_i)``.
Multiclass (Lovász-softmax): ``e = |[target == c] - softmax(pred)_c|`` for each class ``c``,
averaged over the classes present in the labels. Binary and multilabel (Lovász-hinge):
``e = relu(1 - pred * (2 target - 1))``, every (class, pixel) of an image pooled into one
set, as smp does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LOSSES
from visionblocks.losses._reduce import check_target_range
from visionblocks.losses.overlap import _PROBABILITIES, Mode, _check_options, _prepare_targets

__all__ = ["LovaszLoss", "lovasz_loss"]
__dir__ = public_dir(__name__, __all__)

# On CPU, a batch of rows this large sorts faster as one 1-D int64 key, which PyTorch radix-sorts.
_RADIX_MIN = 2**15


def _radix_order(errors: Tensor, keep: Tensor | None) -> Tensor:
    """The order of a stable descending sort of each row of ``relu(errors)``, the entries not
    kept last.

    One ascending 1-D int64 key ``row * 2**32 + (inf bits - float bits)`` (the bits of
    non-negative float32 numbers order like the numbers), which PyTorch sorts on CPU with its radix
    sort, stable like a sort of the rows and faster."""
    p = errors.shape[-1]
    key = torch.where(errors > 0, errors, 0.0).view(torch.int32)  # -0.0 and NaN-free: >= +0.0
    key = key.neg_().add_(0x7F800000)  # descending -> ascending, in [0, 0x7F800000]
    if keep is not None:
        key = key.masked_fill_(~keep, 0x7F800001)
    first = torch.arange(key.numel() // p, device=key.device).unsqueeze(1)
    key = key.reshape(-1, p).to(torch.int64).add_(first << 32)
    order = key.view(-1).sort(stable=True).indices.view(key.shape).sub_(first * p)
    return order.view(errors.shape)


def _lovasz_rows(errors: Tensor, fg: Tensor, keep: Tensor | None) -> Tensor:
    """Lovász extension of the Jaccard loss of each row of ``relu(errors) (..., P)`` (``fg``:
    foreground in ``[0, 1]``, 0 where not kept). Pixels not kept sort last with error 0: they
    add nothing, and the rows' counts before them are those of the kept pixels alone. The
    stable sort puts tied errors in pixel order (on CPU, `_radix_order` may order the
    negative ones, which add nothing either, differently)."""
    if keep is not None:
        errors = torch.where(keep, errors, -torch.inf)
    if errors.is_cpu and errors.dtype == torch.float32 and errors.numel() >= _RADIX_MIN:
        order = _radix_order(errors.detach(), keep)
        errors_sorted = errors.gather(-1, order)
    else:
        errors_sorted, order = errors.sort(dim=-1, descending=True, stable=True)
    p = errors.shape[-1]
    # float32 counts are exact up to 2**24; longer rows count in float64.
    cum_dtype = torch.float64 if p > 2**24 else fg.dtype
    fg_sorted = fg.gather(-1, order)
    fg_sorted = fg_sorted if cum_dtype == fg.dtype else fg_sorted.to(cum_dtype)
    fg_seen = fg_sorted.cumsum(-1)  # F_i; the last one is G
    rank = torch.arange(1, p + 1, device=fg.device, dtype=cum_dtype)
    inside = fg_seen.narrow(-1, p - 1, 1) - fg_seen  # G - F_i: the intersection
    union = inside + rank  # G + i - F_i
    # g_i = J_i - J_(i-1) with J_i = i / union_i, as one fraction of sums of non-negative
    # terms, i union_(i-1) - (i - 1) union_i = G - F_i + i fg_i: no cancellation, relative
    # accuracy even where J_i is close to 1. Its only 0 / 0, at i = 1 of a row without
    # foreground (union_0 = G = 0), is made 1 / 1: g_1 = J_1 = 1.
    union_before = (union + fg_sorted).sub_(1.0)
    if fg.requires_grad:
        empty = union_before == 0
        grad = torch.addcmul(inside, rank, fg_sorted).masked_fill_(empty, 1.0) / (
            union * union_before.masked_fill_(empty, 1.0)
        )
    else:  # the same in fewer operations: 0 / 0 is the only NaN (union >= i >= 1)
        grad = (torch.addcmul(inside, rank, fg_sorted) / (union * union_before)).nan_to_num_(1.0)
    grad = grad if cum_dtype == fg.dtype else grad.to(fg.dtype)
    return (errors_sorted.relu() * grad).sum(-1)  # a cascade sum: accurate for long rows


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the last dim where ``mask``; 0 (connected to the graph) where
    nothing is."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1)


def lovasz_loss(
    pred: Tensor,
    target: Tensor,
    mode: Mode,
    per_image: bool = False,
    ignore_index: int | None = None,
    from_logits: bool = True,
    *,
    classes: Sequence[int] | None = None,
) -> Tensor:
    """Lovász-softmax (multiclass) or Lovász-hinge (binary, multilabel) loss.

    smp's ``LovaszLoss`` as a function, equal to it in values and gradients (with the same
    arguments, in the same order), computed for all images and classes at once: one batched
    sort along the pixels, the Lovász gradient from one cumulative sum. No host read of
    tensor values, so it compiles with ``torch.compile(fullgraph=True)`` and never waits on the
    GPU.

    - Multiclass: ``softmax(pred)`` over dim 1 (``pred`` itself with ``from_logits=False``);
      each class's loss over the pixels (of the batch, or of each image with ``per_image``),
      averaged over the classes present in the labels (smp's and Berman's ``"present"``: an
      absent class has no Jaccard index to optimise). ``classes`` keeps those classes only
      (the softmax still runs over all).
    - Binary and multilabel: the hinge errors of the logits, all channels of an image pooled
      (as smp). With ``from_logits=False``, ``pred`` holds probabilities ``p`` and the errors
      are ``|target - p|`` (Berman's Lovász loss of a sigmoid output). ``classes`` keeps those
      channels (multilabel).
    - ``per_image``: the loss of each image, averaged over the images.
    - ``ignore_index``: target value of pixels that take no part (as if removed).

    Where smp differs, this follows the definition: smp ignores ``from_logits`` (it always
    applies softmax in multiclass mode); with every pixel ignored it returns an empty tensor
    (multiclass) where this returns 0; and with ``per_image`` it counts an image with every
    pixel ignored as a 0 in the mean (binary) or returns an empty tensor (multiclass), where
    this averages over the images that have a pixel to score.

    Dtype policy: half inputs are computed in float32; the result is a scalar in the compute
    dtype. The Lovász gradient is a subgradient where errors tie.

    Args:
        pred (Tensor[N, C, ...]): Logits (or probabilities with ``from_logits=False``);
            ``C = 1`` in binary mode.
        target (Tensor): Multiclass: class indices ``(N, ...)`` in ``[0, C)`` (integer).
            Binary: 0/1, ``pred``'s shape or ``(N, ...)``. Multilabel: 0/1, ``pred``'s shape.
            Values equal to ``ignore_index`` are ignored.
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        per_image: Average per-image losses instead of one loss over the batch.
        ignore_index: Target value to ignore, or None.
        from_logits: ``pred`` holds logits (True) or probabilities (False).
        classes: Class indices to average over (multiclass, multilabel), or None for all.

    Returns:
        Tensor: A scalar, in the compute dtype (float32 for half inputs).

    Raises:
        TypeError: Non-tensor or non-floating ``pred``, a floating multiclass ``target``, or
            options of the wrong type.
        ValueError: An unknown ``mode``, mismatched shapes or devices, bad ``classes``, or
            (value checks, see `visionblocks.set_value_checks`) a target outside ``[0, C)``
            (multiclass) or ``[0, 1]`` other than ``ignore_index``.

    Examples:
        >>> import torch
        >>> target = torch.tensor([[[0, 1], [1, 255]]])  # (N, H, W); 255: ignored
        >>> p1 = torch.tensor([[[0.25, 0.5], [1.0, 0.5]]])  # probability of class 1
        >>> lovasz_loss(torch.stack([1 - p1, p1], 1), target, "multiclass", ignore_index=255,
        ...             from_logits=False)
        tensor(0.3333)
        >>> logits = torch.tensor([[[[-2.0, 1.0], [0.5, 3.0]]]])  # (N, 1, H, W)
        >>> lovasz_loss(logits, target, "binary", ignore_index=255)  # hinge errors 0, 0, 0.5
        tensor(0.2500)
    """
    classes = _check_options(
        mode, classes, None, ignore_index, per_image=per_image, from_logits=from_logits
    )
    x, t, keep = _prepare_targets(pred, target, mode, ignore_index)  # x: (N, C, S)
    if not from_logits:
        check_target_range("pred", x, 0.0, 1.0, hint=_PROBABILITIES)
    n, c, _ = x.shape
    if classes is not None and max(classes) >= c:
        raise ValueError(f"classes must be in [0, {c}) (the classes of pred), got {list(classes)}")
    if x.numel() == 0:
        return x.sum() * 0.0
    if mode == "multiclass":  # t: (N, S) class indices, ignored pixels set to 0
        prob = x.softmax(1) if from_logits else x
        if classes is None:
            ids = torch.arange(c, device=x.device)
        else:
            prob, ids = prob[:, list(classes)], torch.tensor(classes, device=x.device)
        k = prob.shape[1]
        fg = t.unsqueeze(1) == ids.view(1, -1, 1)  # (N, K, S)
        if keep is not None:
            keep = keep.unsqueeze(1)
            fg &= keep
        if not per_image:  # one row per class over the batch's pixels: (K, N * S)
            prob, fg = prob.transpose(0, 1).reshape(k, -1), fg.transpose(0, 1).reshape(k, -1)
            keep = None if keep is None else keep.reshape(1, -1)
        present = fg.any(-1)  # (K,) or (N, K)
        # Absent classes are left out of the mean: their errors are masked (a constant row
        # sorts fast) and their loss multiplied by 0.
        keep = present.unsqueeze(-1) if keep is None else keep & present.unsqueeze(-1)
        fg = fg.to(x.dtype)
        loss = _masked_mean(_lovasz_rows((fg - prob).abs(), fg, keep), present)
        return _masked_mean(loss, present.any(-1)) if per_image else loss
    # Binary and multilabel: t (N, C, S) of 0/1 (ignored: 0), every channel of an image pooled.
    if classes is not None:
        x, t = x[:, list(classes)], t[:, list(classes)]
        keep = None if keep is None else keep[:, list(classes)]
    elif x.dtype is pred.dtype:  # x is a view of pred: one view less to backpropagate through
        x = pred
    shape = (n, -1) if per_image else (-1,)
    x, t = x.reshape(shape), t.reshape(shape)
    keep = None if keep is None else keep.reshape(shape)
    # Hinge: 1 - x (2 t - 1) = (1 + x) - 2 x t.
    errors = torch.addcmul(x + 1.0, x, t, value=-2.0) if from_logits else (t - x).abs()
    loss = _lovasz_rows(errors, t, keep)  # () or (N,)
    if not per_image:
        return loss
    return loss.mean() if keep is None else _masked_mean(loss, keep.any(-1))


@LOSSES.register(name="lovasz")
class LovaszLoss(nn.Module):
    """Module form of `lovasz_loss`; registered in ``LOSSES`` as ``"lovasz"``.

    smp's ``LovaszLoss`` constructor (``mode``, ``per_image``, ``ignore_index``,
    ``from_logits``) plus ``classes``; ``forward(pred, target)`` as smp's
    ``forward(y_pred, y_true)``.

    Args:
        mode: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        per_image: Average per-image losses instead of one loss over the batch.
        ignore_index: Target value to ignore, or None.
        from_logits: ``pred`` holds logits (True) or probabilities (False).
        classes: Class indices to average over (multiclass, multilabel), or None for all.

    Examples:
        >>> import torch
        >>> loss_fn = LovaszLoss("multiclass", ignore_index=255)
        >>> loss_fn
        LovaszLoss(mode='multiclass', per_image=False, ignore_index=255, from_logits=True)
        >>> loss_fn(torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))).shape
        torch.Size([])
    """

    def __init__(
        self,
        mode: Mode,
        per_image: bool = False,
        ignore_index: int | None = None,
        from_logits: bool = True,
        *,
        classes: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.classes = _check_options(
            mode, classes, None, ignore_index, per_image=per_image, from_logits=from_logits
        )
        self.mode = mode
        self.per_image = per_image
        self.ignore_index = ignore_index
        self.from_logits = from_logits

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Apply `lovasz_loss` with this module's options."""
        return lovasz_loss(
            pred,
            target,
            self.mode,
            self.per_image,
            self.ignore_index,
            self.from_logits,
            classes=self.classes,
        )

    def extra_repr(self) -> str:
        extra = "" if self.classes is None else f", classes={list(self.classes)}"
        return (
            f"mode={self.mode!r}, per_image={self.per_image}, ignore_index={self.ignore_index}, "
            f"from_logits={self.from_logits}{extra}"
        )
