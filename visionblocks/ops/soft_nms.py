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
    are computed in blocks, for the boxes likely to be picked next (the highest current
    scores); at most ``M**2`` numbers in all. On CUDA they are torch ops, each step reads the
    device once and each block once more (the usual cost of soft-NMS on a GPU); on the CPU
    the loop runs on NumPy arrays (a call costs a fraction of a torch op's), one per
    coordinate, compacted (dropping the rows computed ahead) when a new row is needed and a
    quarter of the boxes fell below the threshold. Not traceable by
    ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_number
from visionblocks._core.namespace import public_dir
from visionblocks.ops.nms import check_nms_inputs

__all__ = ["batched_soft_nms", "soft_nms"]
__dir__ = public_dir(__name__, __all__)

METHODS = ("linear", "gaussian")
BLOCK = (1, 128)  # rows of weights computed at once: as many as so far, within these
BLOCK_ELEMENTS = 4096  # and at least this many weights (all rows of a few boxes)


def _on_host(t: Tensor) -> bool:
    """Run the loop on NumPy arrays (`_host_soft_nms`): ``t`` is on the CPU."""
    return t.device.type == "cpu"


def _top(current: Tensor) -> tuple[int, float]:
    """Position and value of the first maximum (the better-ranked box among equals): one
    device read."""
    value, index = current.max(0)
    v, i = torch.stack((value, index.to(value.dtype))).tolist()
    return int(i), v


def _greedy(
    current: Tensor, weights: Callable[[Tensor], Tensor], threshold: float
) -> tuple[list[int], list[float]]:
    """The soft-NMS loop over the ``(M,)`` scores ``current`` (decayed in place); the weights
    of the picked box's row are ``weights(rows)`` ``(R, M)``, computed for the ``BLOCK``
    highest current scores at a time (the pick among them). Picked positions and scores."""
    rows: dict[int, Any] = {}
    computed = current < -math.inf  # all False, on current's device
    picked: list[int] = []
    values: list[float] = []
    m, hits = len(current), 0
    for _ in range(m):
        i, v = _top(current)
        if not v >= threshold:
            break
        if i in rows:
            hits += 1
        else:  # the rows of the next picks, likely: the highest scores left
            # as many as were guessed right so far (a cluster reorders: then one at a time)
            least = BLOCK_ELEMENTS // m if not rows else 1
            size = min(max(hits, BLOCK[0], least), BLOCK[1], m - len(rows))
            if size == 1:
                block = torch.tensor([i], device=current.device)
            else:
                ahead = current * 1
                ahead[computed] = -1
                ahead[i] = math.inf  # in the block whatever the ties
                block = ahead.topk(size).indices  # the highest, any order among them
                block = block[ahead[block] >= threshold]
            computed[block] = True
            w = weights(block)
            w[range(len(block)), block] = 0  # a picked box decays itself to 0: never again
            rows.update(zip(block.tolist(), w, strict=True))
        picked.append(i)
        values.append(v)
        current *= rows[i]
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
    if method != "linear" and method != "gaussian":
        check_choice("method", method, METHODS)
    if _on_host(boxes):
        return _host_soft_nms(boxes, scores, idxs, iou_threshold, sigma, score_threshold, method)
    order = torch.sort(scores, descending=True, stable=True).indices
    ranked = scores[order]
    order = order[(ranked >= score_threshold) & torch.isfinite(ranked)]
    cats = None if idxs is None else idxs[order]
    corners = boxes[order].T.contiguous()  # (4, M)
    lows, highs = corners[:2, :, None], corners[2:, :, None]  # (2, M, 1): indexed by rows
    low, high = corners[:2, None], corners[2:, None]  # (2, 1, M)
    # `visionblocks.ops.box_iou`'s formula: sides clamped at 0, a zero area replaced by eps
    sides = torch.relu(corners[2:] - corners[:2])
    area = sides[0] * sides[1]
    area_eps = torch.where(area == 0, 1e-7, area)

    def weights(rows: Any) -> Any:
        across = torch.minimum(highs[:, rows], high) - torch.maximum(lows[:, rows], low)
        inter = torch.relu(across[0]) * torch.relu(across[1])
        iou = inter / ((area_eps[rows, None] + area) - inter)
        if method == "linear":
            w = torch.where(iou > iou_threshold, 1 - iou, 1)
        else:
            w = torch.exp(iou * iou / -sigma)
        if cats is not None:
            w = torch.where(cats[rows, None] == cats, w, 1)
        return w

    picked, values = _greedy(scores[order], weights, score_threshold)
    keep = order[torch.tensor(picked, dtype=torch.int64, device=order.device)]
    return keep, torch.tensor(values, dtype=scores.dtype, device=scores.device)


def _host_soft_nms(
    boxes: Tensor,
    scores: Tensor,
    idxs: Tensor | None,
    iou_threshold: float,
    sigma: float,
    threshold: float,
    method: str,
) -> tuple[Tensor, Tensor]:
    """`_greedy` on the CPU, on one 1-D NumPy array per coordinate (the Convention)."""
    s = scores.numpy()
    order = np.argsort(-s, kind="stable")  # descending, ties in index order
    ranked = s[order]
    idx = order[(ranked >= threshold) & np.isfinite(ranked)]
    cur = s[idx]
    x1, y1, x2, y2 = boxes.numpy().take(idx, 0).T.copy()  # take: the quickest gather
    cats = None if idxs is None else idxs.numpy()[idx]
    # `visionblocks.ops.box_iou`'s formula: sides clamped at 0, a zero area replaced by eps
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    eps = area.dtype.type(1e-7)
    floor = s.dtype.type(threshold)  # the least score >= threshold, compared in s.dtype
    floor = np.nextafter(floor, math.inf, dtype=s.dtype) if floor < threshold else floor
    linear = method == "linear"
    computed = np.zeros(len(cur), dtype=bool)
    rows: dict[int, Any] = {}  # box index -> its row of weights, computed ahead
    picked: list[int] = []
    values: list[float] = []
    least, hits = BLOCK_ELEMENTS // max(len(cur), 1), 0
    while len(cur):
        i = int(cur.argmax())
        v = float(cur[i])
        if not v >= threshold:
            break
        box = int(idx[i])
        if box in rows:
            hits += 1
            w = rows.pop(box)
        else:
            alive = cur >= floor
            if 4 * np.count_nonzero(alive) <= 3 * len(cur):  # compact: a quarter or more gone
                cur, idx, x1, y1, x2, y2, area, computed = (
                    a[alive] for a in (cur, idx, x1, y1, x2, y2, area, computed)
                )
                cats = None if cats is None else cats[alive]
                rows, computed[:] = {}, False  # the rows computed ahead are dropped
                i = int(cur.argmax())
            size = min(max(hits, BLOCK[0], least), BLOCK[1], len(cur) - np.count_nonzero(computed))
            least = 1
            if size <= 1:  # one row: the picked box's numbers as scalars
                c: Any = i
                r: Any = i
                own = area[i] if area[i] != 0 else eps
            else:  # the rows of the next picks, likely: the highest scores left
                ahead = cur * 1
                ahead[computed] = -1
                ahead[i] = math.inf  # in the block whatever the ties
                r = np.argpartition(ahead, len(ahead) - size)[len(ahead) - size :]
                r = r[ahead[r] >= threshold]
                c = r[:, None]
                own = np.where(area[c] == 0, eps, area[c])
            computed[r] = True
            inter = np.minimum(x2[c], x2)
            inter -= np.maximum(x1[c], x1)
            np.maximum(inter, 0, out=inter)
            dy = np.minimum(y2[c], y2)
            dy -= np.maximum(y1[c], y1)
            np.maximum(dy, 0, out=dy)
            inter *= dy
            iou = own + area
            iou -= inter
            np.divide(inter, iou, out=iou)
            if linear:
                w = np.where(iou > iou_threshold, 1 - iou, 1)
            else:
                w = np.exp(iou * iou / -sigma)
            if cats is not None:
                w = np.where(cats[c] == cats, w, 1)
            if size <= 1:
                w[i] = 0  # a picked box decays itself to 0: never again
            else:
                w[np.arange(len(r)), r] = 0
                rows.update(zip(idx[r].tolist(), w, strict=True))
                w = rows.pop(box)
        picked.append(box)
        values.append(v)
        cur *= w
    keep = torch.from_numpy(np.asarray(picked, dtype=np.int64))
    return keep, torch.from_numpy(np.asarray(values, dtype=s.dtype))


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
