"""Streaming semantic-segmentation metrics from one confusion matrix: `SegmentationMetrics`."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_same_device,
    check_tensor,
    exact_ignore,
)
from visionblocks.distributed import get_world_size

__all__ = ["SegmentationMetrics"]
__dir__ = public_dir(__name__, __all__)


def _check_class_indices(name: str, values: Tensor, num_classes: int, ignore: int | None) -> None:
    """Raise ``ValueError`` unless every value of ``values`` is in ``[0, num_classes)`` or
    equals ``ignore``: one ``aminmax`` on CPU, a device-side assert on CUDA."""
    if values.numel() == 0:
        return
    rule = f"{name} must hold class indices in [0, {num_classes - 1}]" + (
        "" if ignore is None else f" (or ignore_index={ignore})"
    )
    if reads_values(values):
        lo, hi = (v.item() for v in torch.aminmax(values))
        if (lo < 0 or hi >= num_classes) and ignore is not None:
            lo, hi = (v.item() for v in torch.aminmax(values.masked_fill(values == ignore, 0)))
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"{rule}, got values in [{lo}, {hi}]")
    elif asserts_on_device(values):
        masked = values if ignore is None else values.masked_fill(values == ignore, 0)
        lo_t, hi_t = torch.aminmax(masked)
        assert_on_device((lo_t >= 0) & (hi_t < num_classes), rule)


def _check_index(
    index: Tensor, target: Tensor, ignored: Tensor | None, k: int, ignore: int | None
) -> None:
    """Raise unless every ``index`` (``target * K + pred``, 0 where ignored) is in
    ``[0, K * K)``: one ``aminmax`` on CPU, a device-side assert on CUDA; the error reads
    ``target`` again to name its values."""
    if index.numel() == 0:
        return
    lo_t, hi_t = torch.aminmax(index)
    if asserts_on_device(index):
        rule = f"target must hold class indices in [0, {k - 1}]" + (
            "" if ignore is None else f" (or ignore_index={ignore})"
        )
        assert_on_device((lo_t >= 0) & (hi_t < k * k), rule)
    elif lo_t.item() < 0 or hi_t.item() >= k * k:
        counted = target if ignored is None else target.masked_fill(ignored, 0)
        _check_class_indices("target", counted, k, ignore)


def _per_class(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` in float32, 0 where ``den`` is 0 (torchmetrics' ``zero_division=0``)."""
    num, den = num.float(), den.float()
    return torch.where(den > 0, num / den.clamp_min(1), torch.zeros_like(num))


class SegmentationMetrics:
    """Per-class IoU, mIoU, per-class and mean F1 (Dice) and pixel accuracy of a stream of
    semantic-segmentation batches, from one confusion matrix.

    `update` adds a batch to a ``(K, K)`` int64 confusion matrix (rows: target class, columns:
    predicted class, as ``torchmetrics``' ``MulticlassConfusionMatrix``) with one scatter-add
    on the inputs' device: no host read of CUDA values (the value checks are device-side
    asserts there), and it compiles with ``torch.compile(fullgraph=True)``. Pixels whose
    target is ``ignore_index`` are added to cell (0, 0) and their count subtracted again, so
    no pixel is selected by a boolean mask. The state follows the inputs: it moves to their device on
    the first `update`.

    `compute` reads the matrix (summed over processes when ``torch.distributed`` is
    initialised: call it on every rank) and returns, in float32:

    - ``iou`` (K): ``tp / (tp + fp + fn)`` per class; ``f1`` (K): ``2 tp / (2 tp + fp + fn)``
      per class, which is the Dice coefficient;
    - ``miou`` and ``mean_f1``: their means over the classes that occur (in the target or
      the prediction) and are not ``ignore_index``;
    - ``accuracy``: the fraction of counted pixels predicted right;
    - ``confusion`` (K, K): the int64 matrix.

    A class that occurs nowhere gets 0 in ``iou`` and ``f1`` (torchmetrics'
    ``zero_division=0``) and is left out of the means, as in ``MulticlassJaccardIndex``.
    ``MulticlassF1Score(average="macro")`` counts a class equal to an in-range
    ``ignore_index`` when it is predicted (as an F1 of 0); ``mean_f1``, like ``miou`` and
    torchmetrics' Jaccard, leaves it out. The means and ``accuracy`` are NaN before any
    pixel is counted.

    Args:
        num_classes: K, the number of classes (>= 1).
        ignore_index: A target value whose pixels are not counted (e.g. 255), or None.

    Raises:
        TypeError: ``num_classes`` or ``ignore_index`` is not an int.
        ValueError: ``num_classes`` < 1, or so large that K * K counts cannot be held.

    Examples:
        >>> metric = SegmentationMetrics(3, ignore_index=255)
        >>> target = torch.tensor([[[0, 0, 1], [2, 2, 255]]])
        >>> metric.update(torch.tensor([[[0, 1, 1], [2, 0, 2]]]), target)
        >>> out = metric.compute()
        >>> out["iou"], out["miou"], out["accuracy"]
        (tensor([0.3333, 0.5000, 0.5000]), tensor(0.4444), tensor(0.6000))
        >>> out["confusion"]
        tensor([[1, 1, 0],
                [0, 1, 0],
                [1, 0, 1]])
    """

    def __init__(self, num_classes: int, ignore_index: int | None = None) -> None:
        self.num_classes = check_int("num_classes", num_classes, 1)
        if ignore_index is not None:
            check_type("ignore_index", ignore_index, int)
        self.ignore_index = ignore_index
        check_allocation("num_classes", (num_classes * num_classes,), torch.int64)
        self._counts = torch.zeros(num_classes * num_classes, dtype=torch.int64)

    @property
    def confusion(self) -> Tensor:
        """Tensor[K, K]: this process's counts so far (a view of the state)."""
        k = self.num_classes
        return self._counts.view(k, k)

    def reset(self) -> None:
        """Forget every batch (the state stays on its device)."""
        self._counts.zero_()

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add one batch.

        Args:
            preds (Tensor[B, *S] or Tensor[B, K, *S]): Predicted class indices (integer), or
                class scores (floating: logits or probabilities; the arg-max is taken over
                dim 1).
            target (Tensor[B, *S]): Integer class indices in ``[0, K)`` or ``ignore_index``.

        Raises:
            TypeError: ``preds`` or ``target`` is not a tensor, or of the wrong dtype.
            ValueError: Shapes that do not fit, tensors on different or meta devices, class
                indices out of range (read on CPU; a device-side assert on CUDA).
        """
        check_tensor("preds", preds)
        check_tensor("target", target)
        check_same_device(preds=preds, target=target)
        if preds.device.type == "meta":
            raise ValueError("preds and target must hold values, got tensors on the meta device")
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(f"target must be an integer tensor, got dtype {target.dtype}")
        k = self.num_classes
        if preds.is_floating_point():
            expected = (*target.shape[:1], k, *target.shape[1:])
            if target.dim() < 1 or tuple(preds.shape) != expected:
                raise ValueError(
                    f"preds of class scores must have shape (B, K={k}, *S) for target of shape "
                    f"(B, *S) = {tuple(target.shape)}, got {tuple(preds.shape)}"
                )
            labels = preds.argmax(1)
        else:
            if preds.is_complex() or preds.dtype == torch.bool:
                raise TypeError(
                    f"preds must be integer class indices or floating class scores, got dtype "
                    f"{preds.dtype}"
                )
            if preds.shape != target.shape or preds.dim() < 1:
                raise ValueError(
                    f"preds of class indices must have target's shape {tuple(target.shape)} "
                    f"(at least 1-D), got {tuple(preds.shape)}"
                )
            _check_class_indices("preds", preds, k, None)
            labels = preds
        if self._counts.device != preds.device:
            self._counts = self._counts.to(preds.device)
        target = target.reshape(-1)
        index = torch.add(labels.reshape(-1).long(), target, alpha=k)  # target * K + pred
        ignored = None
        ignore = exact_ignore(target, self.ignore_index)  # a uint8 target never equals -100
        if ignore is not None:
            ignored = target == ignore
            index.masked_fill_(ignored, 0)  # counted in cell (0, 0), subtracted below
        # Valid predictions (checked above) and targets give every counted pixel an index in
        # [0, K * K), and a target outside [0, K) one outside: one check of the index.
        if reads_values(index) or asserts_on_device(index):
            _check_index(index, target, ignored, k, self.ignore_index)
        ones = torch.ones((), dtype=torch.int64, device=index.device).expand(index.shape)
        self._counts.scatter_add_(0, index, ones)
        if ignored is not None:
            self._counts[0] -= ignored.sum()

    def compute(self) -> dict[str, Tensor]:
        """The metrics of every batch since the last `reset` (of every process, under
        ``torch.distributed``: a collective, call it on every rank).

        Returns:
            dict[str, Tensor]: ``iou`` (K), ``miou``, ``f1`` (K), ``mean_f1``, ``accuracy``
            (float32) and ``confusion`` (K, K, int64), as the class docstring defines them.
        """
        confusion = self.confusion.clone()
        if get_world_size() > 1:
            dist.all_reduce(confusion, op=dist.ReduceOp.SUM)
        tp = confusion.diagonal()
        target_count, pred_count = confusion.sum(1), confusion.sum(0)
        union = target_count + pred_count - tp
        iou = _per_class(tp, union)
        f1 = _per_class(2 * tp, target_count + pred_count)
        counted = union > 0
        if self.ignore_index is not None and 0 <= self.ignore_index < self.num_classes:
            counted[self.ignore_index] = False
        n = counted.sum().float()
        return {
            "iou": iou,
            "miou": (iou * counted).sum() / n,
            "f1": f1,
            "mean_f1": (f1 * counted).sum() / n,
            "accuracy": tp.sum().float() / target_count.sum().float(),
            "confusion": confusion,
        }
