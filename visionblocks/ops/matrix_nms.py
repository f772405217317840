"""Matrix NMS (SOLOv2, Wang et al., NeurIPS 2020): every decay at once, no loop.

Each box's (or mask's) score is multiplied by its smallest decay over the higher-scoring
ones, computed from the pairwise IoU matrix in parallel: the formula of mmdetection's
``mask_matrix_nms`` (open-mmlab/mmdetection, ``mmdet/models/layers/matrix_nms.py``), for
masks or ``"xyxy"`` boxes. Soft-NMS's greedy loop (`visionblocks.ops.soft_nms`) is replaced
by an estimate: a box decayed by a higher one is compensated by how much that one was
itself suppressed.

Convention:
    Boxes are sorted by decreasing score (ties in index order); NaN and infinite scores come
    last, in index order, and decay no box (`visionblocks.ops.soft_nms` ignores them too;
    they stay NaN or infinite, or become NaN where their decay is 0). With ``iou[i, j]`` the IoU of ``i`` before ``j`` (same label, when ``labels``
    are given; 0 otherwise) and ``c[i]`` the largest ``iou[k, i]`` over the ``k`` before
    ``i``, box ``j``'s decay is the minimum over every ``i`` of ``f(iou[i, j]) / f(c[i])``,
    with ``f(x) = exp(-sigma * x**2)`` (``"gaussian"``: mmdet's ``sigma``, which multiplies,
    where soft-NMS's divides) or ``f(x) = 1 - x`` (``"linear"``; a zero ``1 - c[i]`` counts
    as the smallest positive number, where mmdet divides by zero); the new score is the
    score times the decay. A ``sigma`` beyond the largest number of the compute dtype counts
    as that number (the limit: each ratio 0, 1 or infinite). Mask IoUs are
    `visionblocks.ops.mask_iou`'s (bool and integer masks binary, floating ones soft; 0 for
    two empty masks); box IoUs `visionblocks.ops.box_iou`'s, within its range (checked on
    CPU, as there). Compiles with
    ``torch.compile(fullgraph=True)`` and reads no CUDA tensor values, unless
    ``score_threshold`` is given (the output's length then depends on the values, as
    `visionblocks.ops.nms`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_finite, check_number
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_real,
    check_same_device,
    check_tensor,
    compute_dtype,
)
from visionblocks.ops.boxes import _overlap, check_range
from visionblocks.ops.masks import _counts, mask_iou

__all__ = ["matrix_nms"]
__dir__ = public_dir(__name__, __all__)

KERNELS = ("gaussian", "linear")


def _checked(scores: Any, boxes: Any, masks: Any, labels: Any) -> Tensor:
    """The checked boxes or masks."""
    if (boxes is None) == (masks is None):
        raise ValueError("matrix_nms takes exactly one of boxes and masks (give one, not both)")
    if boxes is not None:
        regions = check_real("boxes", boxes)
        if boxes.dim() != 2 or boxes.shape[-1] != 4:
            raise ValueError(
                f"boxes must have shape (N, 4) in 'xyxy' format, got {tuple(boxes.shape)}"
            )
        check_range(boxes, boxes, ("boxes", "boxes"))
    else:
        regions = check_tensor("masks", masks)
        if masks.is_complex() or masks.dim() != 3:
            raise ValueError(
                f"masks must be a real or bool (N, H, W) tensor, got {masks.dtype} {tuple(masks.shape)}"
            )
    of = "boxes" if boxes is not None else "masks"
    _per_item("scores", scores, regions, of, "a floating-point", Tensor.is_floating_point)
    if labels is not None:
        _per_item("labels", labels, regions, of, "an integer", _is_integer)
    return regions


def _is_integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _per_item(
    name: str, value: Any, regions: Tensor, of: str, kind: str, ok: Callable[[Tensor], bool]
) -> None:
    """``value`` is a ``(N,)`` tensor of ``kind`` (``ok``) on the device of ``regions``."""
    check_tensor(name, value)
    if not ok(value):
        raise TypeError(f"{name} must be {kind} tensor, got dtype {value.dtype}")
    if tuple(value.shape) != (regions.shape[0],):
        raise ValueError(
            f"{name} must have shape (N,) = ({regions.shape[0]},) like {of}, "
            f"got {tuple(value.shape)}"
        )
    check_same_device(**{of: regions, name: value})


def matrix_nms(
    scores: Tensor,
    *,
    boxes: Tensor | None = None,
    masks: Tensor | None = None,
    labels: Tensor | None = None,
    kernel: str = "gaussian",
    sigma: float = 2.0,
    score_threshold: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Matrix NMS of boxes or masks: indices by decreasing decayed score, and those scores.

    mmdetection's ``mask_matrix_nms`` (the module's Convention) with ``nms_pre`` and
    ``max_num`` left to the caller (slice the input or the result) and ``filter_thr`` as
    ``score_threshold``; boxes as well as masks. Memory ``N**2`` numbers.

    Args:
        scores (Tensor[N]): Scores, floating point.
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes (floating or integer); or
        masks (Tensor[N, H, W]): masks (bool or integer: nonzero pixels count; floating:
            soft masks weigh).
        labels (Tensor[N]): Integer classes: only the same class decays (None: all do).
        kernel: ``"gaussian"`` or ``"linear"``.
        sigma: The Gaussian kernel's ``sigma`` (mmdet's and SOLOv2's, default 2.0); finite,
            ``> 0``.
        score_threshold: Drop results whose decayed score is below it (mmdet's
            ``filter_thr``); None keeps all ``N`` (no host read).

    Returns:
        tuple[Tensor[K], Tensor[K]]: int64 indices into the inputs, by decreasing decayed
        score (ties in score order), and the decayed scores (float32; float64 for float64
        inputs); non-finite scores last (the module's Convention). ``K = N`` without
        ``score_threshold``, which drops non-finite scores too.

    Raises:
        TypeError: Non-tensor or non-floating scores, complex or bool boxes, non-integer
            labels, a non-number ``sigma`` or ``score_threshold``.
        ValueError: Both or neither of boxes and masks, bad shapes or devices, ``sigma`` not
            positive or not finite, a NaN ``score_threshold``, an unknown ``kernel``, CPU
            boxes beyond `visionblocks.ops.box_iou`'s range.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 8.0],
        ...                       [0.0, 0.0, 10.0, 6.0], [20.0, 20.0, 30.0, 30.0]])
        >>> scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
        >>> matrix_nms(scores, boxes=boxes)
        (tensor([0, 3, 2, 1]), tensor([0.9000, 0.6000, 0.3407, 0.2224]))
        >>> matrix_nms(scores, boxes=boxes, labels=torch.tensor([0, 1, 0, 0]),
        ...            kernel="linear", score_threshold=0.5)
        (tensor([0, 1, 3]), tensor([0.9000, 0.8000, 0.6000]))
    """
    regions = _checked(scores, boxes, masks, labels)
    check_choice("kernel", kernel, KERNELS)
    sigma = check_finite("sigma", check_number("sigma", sigma, 0.0, low_inclusive=False))
    if score_threshold is not None:
        score_threshold = check_number("score_threshold", score_threshold)
    dtype = compute_dtype(
        scores.dtype if masks is not None else torch.promote_types(regions.dtype, scores.dtype)
    )
    scores = scores.detach().to(dtype)
    # NaN and infinite scores last (a plain sort puts NaN first): they decay no box
    _, order = torch.sort(
        scores.nan_to_num(-math.inf, -math.inf, -math.inf), descending=True, stable=True
    )
    if scores.shape[0] == 0:
        return order, scores
    regions = regions.detach()[order]
    if boxes is not None:
        iou = _overlap(regions, regions, 0, False, 1e-7).to(dtype)  # box_iou, checked
    else:
        regions = _counts(regions, dtype)  # bool and integer masks binary (0/255 uint8)
        iou = mask_iou(regions, regions)
    iou = iou.triu(1)  # [i, j]: i before j
    if labels is not None:
        classes = labels[order]
        iou = iou * (classes[:, None] == classes[None, :])
    compensate = iou.amax(0)[:, None]  # each box's largest IoU with a box before it
    if kernel == "gaussian":
        sigma = min(sigma, torch.finfo(dtype).max)  # beyond it: 0 * inf (NaN) for equal IoUs
        decay = torch.exp((iou.square() - compensate.square()) * -sigma)
    else:
        decay = (1 - iou) / (1 - compensate).clamp_min(torch.finfo(dtype).tiny)
    decayed = scores[order] * decay.amin(0)
    # finite scores times decays in [0, 1] are finite: the others keep their order, last
    key = decayed.nan_to_num(-math.inf, -math.inf, -math.inf)
    if score_threshold is not None:
        kept = key >= score_threshold
        order, decayed, key = order[kept], decayed[kept], key[kept]
    rank = torch.sort(key, descending=True, stable=True).indices
    return order[rank], decayed[rank]
