"""Soft-NMS (Bodla et al., ICCV 2017): decay the scores of overlapping boxes, keep the rest.

The greedy algorithm of the authors' ``cpu_soft_nms`` (bharatsingh430/soft-nms,
``lib/nms/cpu_nms.pyx``): take the box of highest current score, multiply every other box's
score by a weight of its IoU ``o`` with it, drop boxes whose score falls below
``score_threshold``, repeat. torchvision has no soft-NMS (pytorch/vision#8849).

Convention:
    Weights: ``"linear"``: ``1 - o`` where ``o > iou_threshold``, else 1; ``"gaussian"``:
    ``exp(-o**2 / sigma)`` for every pair (``iou_threshold`` unused), as the original code.
    IoUs are `visionblocks.ops.box_iou`'s (``"xyxy"``, no ``+ 1``: the original adds one
    pixel to every side). Ties in current score go to the box of higher original score, then
    lower index. Boxes are dropped when their score falls *below* ``score_threshold``; unlike
    the original code the first box too (the same result otherwise). Scores below the
    threshold, NaN and infinite ones never count.

    The selections depend on each other, so the loop runs on the host, one step per kept box
    over the ``M`` boxes that reach the threshold. Rows of IoU weights (each ``M`` numbers)
    are computed as torch ops in blocks, for the boxes likely to be picked next (the highest
    current scores); at most ``M**2`` numbers in all. On CUDA each step reads the device once,
    and each block once more (the usual cost of soft-NMS on a GPU); on the CPU the steps run
    on NumPy views of the same tensors, whose calls cost a fraction of a torch op's. Not
    traceable by ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_number
from visionblocks._core.namespace import public_dir
from visionblocks.ops.boxes import box_iou
from visionblocks.ops.nms import check_nms_inputs

__all__ = ["batched_soft_nms", "soft_nms"]
__dir__ = public_dir(__name__, __all__)

METHODS = ("linear", "gaussian")
BLOCK = (16, 128)  # rows of weights computed at once: as many as so far, within these


def _host_view(t: Tensor) -> Any:
    """A NumPy view of a CPU tensor (same memory; its ops cost less per call), else ``t``."""
    return t.numpy() if t.is_cpu else t


def _top(current: Any) -> tuple[int, float]:
    """Position and value of the first maximum (the better-ranked box among equals)."""
    if isinstance(current, Tensor):  # CUDA: one device read
        value, index = current.max(0)
        v, i = torch.stack((value, index.to(value.dtype))).tolist()
        return int(i), v
    i = int(current.argmax())
    return i, float(current[i])


def _greedy(
    current: Tensor, weights: Callable[[Tensor], Tensor], threshold: float
) -> tuple[list[int], list[float]]:
    """The soft-NMS loop over the ``(M,)`` scores ``current`` (decayed in place); the weights
    of the picked box's row are ``weights(rows)`` ``(R, M)``, computed for the ``BLOCK``
    highest current scores at a time (the pick among them). Picked positions and scores."""
    view = _host_view(current)
    rows: dict[int, Any] = {}
    computed = torch.zeros_like(current, dtype=torch.bool)
    picked: list[int] = []
    values: list[float] = []
    for _ in range(len(current)):
        i, v = _top(view)
        if not v >= threshold:
            break
        if i not in rows:  # the rows of the next picks, likely: the highest scores left
            ahead = current.masked_fill(computed, -1)
            ahead[i] = math.inf  # in the block whatever the ties
            size = min(max(len(rows), BLOCK[0]), BLOCK[1], len(ahead) - len(rows))
            block = ahead.topk(size).indices
            block = block[ahead[block] >= threshold]
            computed[block] = True
            w = weights(block)
            # A picked box decays itself to 0: never picked again.
            w[torch.arange(len(block), device=w.device), block] = 0
            for r, row in zip(block.tolist(), _host_view(w), strict=True):
                rows[r] = row
        picked.append(i)
        values.append(v)
        view *= rows[i]
    return picked, values


def _soft_nms(
    boxes: Any,
    scores: Any,
    idxs: Any,
    iou_threshold: Any,
    sigma: Any,
    score_threshold: Any,
    method: Any,
    batched: bool,
) -> tuple[Tensor, Tensor]:
    boxes, scores, iou_threshold = check_nms_inputs(boxes, scores, idxs, iou_threshold, batched)
    sigma = check_number("sigma", sigma, 0.0, low_inclusive=False)
    score_threshold = check_number("score_threshold", score_threshold, 0.0, low_inclusive=False)
    check_choice("method", method, METHODS)
    order = torch.sort(scores, descending=True, stable=True).indices
    ranked = scores[order]
    order = order[(ranked >= score_threshold) & ranked.isfinite()]
    boxes = boxes[order]
    cats = idxs[order] if idxs is not None else None

    def weights(rows: Tensor) -> Tensor:
        iou = box_iou(boxes[rows], boxes).to(scores.dtype)
        if method == "linear":
            w = torch.where(iou > iou_threshold, 1 - iou, 1)
        else:
            w = torch.exp(iou.square_().div_(-sigma))
        if cats is not None:
            w = torch.where(cats[rows, None] == cats[None, :], w, 1)
        return w

    picked, values = _greedy(scores[order], weights, score_threshold)
    keep = order[torch.tensor(picked, dtype=torch.int64, device=order.device)]
    return keep, torch.tensor(values, dtype=scores.dtype, device=scores.device)


def soft_nms(
    boxes: Tensor,
    scores: Tensor,
    iou_threshold: float = 0.3,
    sigma: float = 0.5,
    score_threshold: float = 0.001,
    method: str = "linear",
) -> tuple[Tensor, Tensor]:
    """Soft-NMS: kept boxes by decreasing rescored score, and those scores.

    Repeatedly keeps the box of highest current score and multiplies every remaining score
    by the weight of its IoU with it (the module's Convention); boxes whose score falls
    below ``score_threshold`` are dropped. The defaults are the original code's and mmcv's.

    Args:
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes; floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        iou_threshold: ``"linear"`` decays boxes overlapping by more than this; in ``[0, 1]``.
        sigma: ``"gaussian"``'s width, ``> 0``.
        score_threshold: Boxes scoring below it (at the start or once decayed) are dropped;
            ``> 0``.
        method: ``"linear"`` or ``"gaussian"``.

    Returns:
        tuple[Tensor[K], Tensor[K]]: int64 indices into ``boxes`` of the kept boxes, in the
        order they were taken (decreasing rescored score), and their rescored scores
        (float32; float64 for float64 inputs).

    Raises:
        TypeError: As `visionblocks.ops.nms`, or a non-number ``sigma``/``score_threshold``.
        ValueError: As `visionblocks.ops.nms`, ``sigma`` or ``score_threshold`` not
            positive, an unknown ``method``.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 8.0],
        ...                       [20.0, 20.0, 30.0, 30.0]])
        >>> keep, rescored = soft_nms(boxes, torch.tensor([0.9, 0.8, 0.7]))
        >>> keep, rescored  # box 1 (IoU 0.8 with box 0) decays to 0.8 * (1 - 0.8)
        (tensor([0, 2, 1]), tensor([0.9000, 0.7000, 0.1600]))
        >>> soft_nms(boxes, torch.tensor([0.9, 0.8, 0.7]), method="gaussian")[1]
        tensor([0.9000, 0.7000, 0.2224])
    """
    return _soft_nms(boxes, scores, None, iou_threshold, sigma, score_threshold, method, False)


def batched_soft_nms(
    boxes: Tensor,
    scores: Tensor,
    idxs: Tensor,
    iou_threshold: float = 0.3,
    sigma: float = 0.5,
    score_threshold: float = 0.001,
    method: str = "linear",
) -> tuple[Tensor, Tensor]:
    """`soft_nms` per category: boxes with different ``idxs`` never decay each other.

    The result is every category's `soft_nms` merged by decreasing rescored score, computed
    in one pass (categories masked).

    Args:
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes; floating or integer.
        scores (Tensor[N]): Their scores, floating point.
        idxs (Tensor[N]): Integer category of each box.
        iou_threshold: As `soft_nms`.
        sigma: As `soft_nms`.
        score_threshold: As `soft_nms`.
        method: As `soft_nms`.

    Returns:
        tuple[Tensor[K], Tensor[K]]: As `soft_nms`.

    Raises:
        TypeError: As `soft_nms`, or non-integer ``idxs``.
        ValueError: As `soft_nms`, or ``idxs`` not ``(N,)`` or on another device.

    Examples:
        >>> import torch
        >>> boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 8.0]])
        >>> batched_soft_nms(boxes, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]))
        (tensor([0, 1]), tensor([0.9000, 0.8000]))
    """
    return _soft_nms(boxes, scores, idxs, iou_threshold, sigma, score_threshold, method, True)
