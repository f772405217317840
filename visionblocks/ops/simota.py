"""SimOTA, YOLOX's dynamic-k assignment, as mmdetection's ``SimOTAAssigner``, in blocks of anchors.

Each object takes as positives the ``k`` anchors of lowest cost, where ``k`` is the sum
(floored, at least 1) of its ``candidate_topk`` best IoUs with the predicted boxes; an anchor
taken by several objects goes to the object of lowest cost. mmdetection builds the
``candidates x objects x classes`` class cost and runs one ``topk`` per object on the host's
count; here each image runs in blocks of anchors, each block's costs merged into the
``topk`` cheapest per object, so the peak extra memory is ``O(block x (M + C) + topk x M + A)``
(``block_bytes`` bounds a block). On the CPU the candidates are gathered first, as
mmdetection's ``valid_mask`` (a host read is free there); on other devices and under
``torch.compile(fullgraph=True)`` (one graph) every anchor runs, masked, with no host read.
Both give the same results, bit for bit. `dynamic_soft_label_assign` (RTMDet) shares the matching.

Convention:
    ``priors (A, 4)`` are mmdetection's point priors ``(cx, cy, stride_w, stride_h)`` (YOLOX
    shifts its grid points by half a stride first); boxes are ``"xyxy"``. Results follow
    mmdetection's ``AssignResult`` with 0-based objects: `DynamicKAssignment`'s ``gt_indices``
    is ``gt_inds - 1`` (-1 background), ``labels`` is ``labels`` (-1 background) and
    ``max_ious`` is ``max_overlaps`` on the positives (0 elsewhere, where mmdetection stores
    ``-INF``, or 0 when nothing can be assigned).

Ties:
    On equal costs at an object's ``k``-th place the lower anchor index wins; ``Tensor.topk``,
    which mmdetection calls, leaves that choice unspecified (on the CPU it changes with ``k``).
    An anchor taken by several objects goes to its first object of lowest cost over all objects
    (``Tensor.min``), as in mmdetection.

Dtypes:
    Costs and IoUs are computed in float32 (float64 for float64 inputs); half inputs and
    ``torch.autocast`` give float32. IoUs are `visionblocks.ops.box_iou`'s, equal to
    mmdetection's ``bbox_overlaps`` for boxes with ``x1 <= x2``, ``y1 <= y2`` (an inverted box
    counts as zero width, where ``bbox_overlaps`` takes a negative area). The class cost sums
    each anchor's classes once (target 0) and swaps in the label's term per object: the sum of
    mmdetection's one-hot cost in another order, equal up to rounding. The results carry no
    gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from visionblocks._core.checks import check_int, check_number
from visionblocks._core.dispatch import reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, check_same_device, compute_dtype
from visionblocks.ops.assign import BLOCK_BYTES
from visionblocks.ops.boxes import _measure

__all__ = ["DynamicKAssignment", "simota_assign"]
__dir__ = public_dir(__name__, __all__)

_EPS = 1e-7  # mmdetection's EPS in -log(IoU + EPS)
_INF = 100000.0  # SimOTAAssigner's INF: the cost added outside an object's box and centre
_PAIR_TEMPS = 24  # (anchor, object) temporaries at a block's peak, merge included
_ROW_TEMPS = 4  # (anchor, class) temporaries
_SCAN_TEMPS = 6  # (anchor, object) temporaries of the candidates' scan (CPU)

# ``pairs(priors, boxes, scores, masked) -> (valid (r,), iou (r, M), cost (r, M))`` for ``r``
# anchors; without ``masked`` the anchors are all candidates and ``valid`` may be None.
Pairs = Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor | None, Tensor, Tensor]]


class DynamicKAssignment(NamedTuple):
    """`simota_assign`'s and `dynamic_soft_label_assign`'s results (mmdetection's
    ``AssignResult`` fields, objects 0-based).

    Attributes:
        gt_indices (Tensor[A]): int64, each anchor's object in ``[0, M)``, -1 for background.
        max_ious (Tensor[A]): IoU of each positive's predicted box with its object (0 for
            background): YOLOX's and RTMDet's soft classification targets.
        labels (Tensor[A]): int64, the object's label, -1 for background.

    Examples:
        >>> r = DynamicKAssignment(torch.tensor([0, -1]), torch.tensor([0.5, 0.0]),
        ...                        torch.tensor([3, -1]))
        >>> r.labels
        tensor([ 3, -1])
    """

    gt_indices: Tensor
    max_ious: Tensor
    labels: Tensor


def _check_inputs(
    priors: Tensor, boxes: Tensor, scores: Tensor, gt_boxes: Tensor, gt_labels: Tensor, name: str
) -> bool:
    """The shared checks: shapes ``(A, 4)``, ``(A, 4)``, ``(A, C)``, ``(M, 4)``, ``(M,)``,
    floating values, one device; on the CPU only, integer labels in ``[0, C)`` and finite
    priors' strides ``> 0`` (a distance in strides of 0 is infinite). Returns whether values
    may be read on the host (`reads_values`)."""
    for arg, value in (
        ("priors", priors),
        ("boxes", boxes),
        (name, scores),
        ("gt_boxes", gt_boxes),
    ):
        check_floating(arg, value)
        if value.dim() != 2 or (arg != name and value.shape[1] != 4):
            want = "(M, 4)" if arg == "gt_boxes" else "(A, C)" if arg == name else "(A, 4)"
            raise ValueError(f"{arg} must have shape {want}, got {tuple(value.shape)}")
    if not isinstance(gt_labels, Tensor):
        raise TypeError(f"gt_labels must be a torch.Tensor, got {type(gt_labels).__name__}")
    if gt_labels.is_floating_point() or gt_labels.is_complex() or gt_labels.dtype == torch.bool:
        raise TypeError(
            f"gt_labels must hold class indices (an integer dtype), got {gt_labels.dtype}"
        )
    a, m = priors.shape[0], gt_boxes.shape[0]
    if boxes.shape[0] != a or scores.shape[0] != a or scores.shape[1] < 1:
        raise ValueError(
            f"priors, boxes and {name} must describe the same anchors (A, 4), (A, 4), (A, C >= 1), "
            f"got {tuple(priors.shape)}, {tuple(boxes.shape)} and {tuple(scores.shape)}"
        )
    if gt_labels.shape != (m,):
        raise ValueError(
            f"gt_labels must have shape (M,) = ({m},) for gt_boxes of shape "
            f"{tuple(gt_boxes.shape)}, got {tuple(gt_labels.shape)}"
        )
    check_same_device(
        priors=priors, boxes=boxes, **{name: scores}, gt_boxes=gt_boxes, gt_labels=gt_labels
    )
    reads = reads_values(gt_labels)
    if m and reads:
        lo, hi = (int(v) for v in torch.aminmax(gt_labels))
        if lo < 0 or hi >= scores.shape[1]:
            raise ValueError(
                f"gt_labels must be class indices in [0, {scores.shape[1]}) ({name} has "
                f"{scores.shape[1]} classes), got {lo if lo < 0 else hi}"
            )
    if priors.shape[0] and reads:
        low, high = (float(v) for v in torch.aminmax(priors.detach()[:, 2:]))
        if not (low > 0 and high < math.inf):  # also False for NaN
            raise ValueError(
                "priors' strides (columns 2 and 3: stride_w, stride_h) must be finite and > 0, "
                f"got values in [{low}, {high}]"
            )
    return reads


def _block_rows(m: int, c: int, dtype: torch.dtype, block_bytes: int | None) -> int:
    """Anchors a block: ``block_bytes`` (default `BLOCK_BYTES`) over one anchor's temporaries."""
    budget = BLOCK_BYTES if block_bytes is None else check_int("block_bytes", block_bytes, 1)
    per_row = (_PAIR_TEMPS * m + _ROW_TEMPS * c) * (8 if dtype == torch.float64 else 4)
    return max(1, budget // max(1, per_row))


def _dynamic_k(
    pairs: Pairs,
    candidates: Callable[[Tensor], Tensor],
    rows: tuple[Tensor, ...],
    gt_labels: Tensor,
    topk: int,
    block: int,
    dtype: torch.dtype,
    compact: bool,
) -> DynamicKAssignment:
    """mmdetection's ``dynamic_k_matching`` over the valid anchors, in blocks of ``block`` anchors.

    Per block: the running ``topk`` best IoUs of each object (invalid anchors count 0, which
    leaves the sum of mmdetection's ``min(topk, valid)`` best unchanged), the running ``topk``
    cheapest anchors of each object (a stable sort; invalid anchors NaN, after every valid
    one, even of infinite cost) and each anchor's cheapest object. ``topk`` bounds ``k``, so
    the ``k`` cheapest are among the kept ones. ``compact``: gather the candidates first (a
    host read). One block resolves the anchors taken twice on its ``(n, M)`` matching matrix,
    several by scatters per anchor; both give the same results.
    """
    total, m, device = rows[0].shape[0], gt_labels.shape[0], gt_labels.device
    keep = None
    if compact:  # CPU: gather the candidates first (mmdetection's valid_mask)
        # The scan holds about _SCAN_TEMPS (anchor, object) values a row: longer blocks.
        scan = block * (_PAIR_TEMPS * m + _ROW_TEMPS * rows[2].shape[1]) // (_SCAN_TEMPS * m)
        blocks = [candidates(rows[0][i : i + scan]) for i in range(0, total, scan)]
        keep = _cat(blocks).nonzero().squeeze(1)
        rows = tuple(t[keep] for t in rows)
    n = rows[0].shape[0]
    if n == 0:
        return _background(total, dtype, device)
    k = min(topk, n)
    top_iou = cheap = cheap_at = cheap_iou = None
    valids, row_gt, row_iou = [], [], []
    for start in range(0, n, block):
        stop = min(start + block, n)
        part = rows if stop - start == n else tuple(t[start:stop] for t in rows)
        valid, iou, cost = pairs(*part, keep is None)
        at = torch.arange(start, stop, device=device).unsqueeze(1).expand(stop - start, m)
        if keep is None:  # every anchor: the others count IoU 0 and sort last (NaN)
            inside = valid.unsqueeze(1)
            top, c = iou.masked_fill(~inside, 0.0), cost.masked_fill(~inside, float("nan"))
            valids.append(valid)
        else:
            top, c = iou, cost
        if cheap is not None:  # merge with the best so far
            top, c = torch.cat([top_iou, top]), torch.cat([cheap, c])
            at, iou_c = torch.cat([cheap_at, at]), torch.cat([cheap_iou, iou])
        else:
            iou_c = iou
        top_iou = top.topk(min(k, top.shape[0]), dim=0).values
        order = c.sort(dim=0, stable=True).indices[:k]
        cheap, cheap_at, cheap_iou = c.gather(0, order), at.gather(0, order), iou_c.gather(0, order)
        row_gt.append(cost.min(dim=1).indices)  # the first cheapest object, as Tensor.min
        row_iou.append(iou if stop - start == n else iou.gather(1, row_gt[-1][:, None])[:, 0])
    dynamic_k = top_iou.sum(0).int().clamp(min=1)  # as mmdetection: truncated, at least 1
    taken = torch.arange(k, device=device).unsqueeze(1) < dynamic_k
    if keep is None:
        taken &= _cat(valids)[cheap_at]  # no valid anchor: nothing taken
    best = _cat(row_gt)
    if len(row_iou) == 1:  # one block, (n, M) costs: mmdetection's matching matrix
        matched = torch.zeros(n, m, dtype=torch.bool, device=device).scatter(0, cheap_at, taken)
        count = matched.sum(1)
        gt = torch.where(count > 1, best, matched.byte().argmax(1))  # argmax: the only one
        ious = row_iou[0].gather(1, gt.unsqueeze(1)).squeeze(1)
        fg = count > 0
        gt, ious = torch.where(fg, gt, -1), torch.where(fg, ious, 0.0)
    else:  # per anchor, how many objects took it, which one (of one) and its IoU
        flat_at, flat_taken = cheap_at.reshape(-1), taken.reshape(-1)
        count = torch.zeros(n, dtype=torch.long, device=device)
        count = count.scatter_add(0, flat_at, flat_taken.long())
        objects = torch.arange(m, device=device).expand(k, m).reshape(-1)
        one = torch.full((n,), -1, dtype=torch.long, device=device)
        one = one.scatter_reduce(0, flat_at, torch.where(flat_taken, objects, -1), "amax")
        one_iou = torch.zeros(n, dtype=dtype, device=device)
        one_iou = one_iou.scatter_reduce(
            0, flat_at, torch.where(taken, cheap_iou, 0.0).reshape(-1), "amax"
        )
        gt, ious = torch.where(count > 1, best, one), torch.where(count > 1, _cat(row_iou), one_iou)
    if keep is not None:  # back to every anchor
        gt = torch.full((total,), -1, dtype=torch.long, device=device).index_copy(0, keep, gt)
        ious = torch.zeros(total, dtype=dtype, device=device).index_copy(0, keep, ious)
    # gt_labels with -1 appended: index -1 (background) reads it
    labels = torch.cat([gt_labels.long(), gt_labels.new_full((1,), -1, dtype=torch.long)])[gt]
    return DynamicKAssignment(gt, ious, labels)


def _cat(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``, without the copy of a single part."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _background(n: int, dtype: torch.dtype, device: torch.device) -> DynamicKAssignment:
    """Every anchor background (no objects)."""
    background = torch.full((n,), -1, dtype=torch.long, device=device)
    return DynamicKAssignment(background, torch.zeros(n, dtype=dtype, device=device), background)


def _inside(x: Tensor, y: Tensor, x1: Tensor, y1: Tensor, x2: Tensor, y2: Tensor) -> Tensor:
    """Whether points ``(x, y)`` (``(r, 1)``) lie strictly inside boxes (``(M,)`` sides)."""
    return torch.minimum(torch.minimum(x - x1, y - y1), torch.minimum(x2 - x, y2 - y)) > 0


def simota_assign(
    priors: Tensor,
    boxes: Tensor,
    scores: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    *,
    center_radius: float = 2.5,
    candidate_topk: int = 10,
    iou_weight: float = 3.0,
    cls_weight: float = 1.0,
    block_bytes: int | None = None,
) -> DynamicKAssignment:
    """YOLOX's SimOTA assignment of one image, as mmdetection's ``SimOTAAssigner.assign``.

    Candidates are the anchors whose point lies inside some object's box or within
    ``center_radius`` strides of its centre. Cost of a candidate for object ``j``:
    ``cls_weight * sum_c BCE(scores[c], onehot(label_j)[c]) - iou_weight * log(IoU + 1e-7)``,
    plus 100000 unless the point is both inside box ``j`` and near its centre. Object ``j``
    takes its ``k_j`` cheapest candidates, ``k_j = max(1, floor(sum of its candidate_topk best
    IoUs))``; an anchor taken twice goes to its cheapest object (module notes).

    Args:
        priors (Tensor[A, 4]): ``(cx, cy, stride_w, stride_h)`` of each anchor point.
        boxes (Tensor[A, 4]): Predicted (decoded) boxes, ``"xyxy"``.
        scores (Tensor[A, C]): Class probabilities in ``[0, 1]`` (YOLOX: the square root of
            ``sigmoid(cls) * sigmoid(objectness)``).
        gt_boxes (Tensor[M, 4]): Objects, ``"xyxy"``.
        gt_labels (Tensor[M]): Their classes, integers in ``[0, C)``.
        center_radius: Radius of the centre region, in strides (``>= 0``; YOLOX 2.5).
        candidate_topk: IoUs summed into each object's ``k`` (``>= 1``; YOLOX 10).
        iou_weight: Weight of the IoU cost (``>= 0``).
        cls_weight: Weight of the class cost (``>= 0``).
        block_bytes: Memory budget of one block of anchors (default 8 MiB); results do not
            depend on it.

    Returns:
        DynamicKAssignment: ``gt_indices``, ``max_ious``, ``labels``, each ``(A,)``.

    Raises:
        TypeError: Inputs not floating tensors, ``gt_labels`` not integer, options of the
            wrong type.
        ValueError: Bad shapes or devices, labels outside ``[0, C)``, scores outside
            ``[0, 1]`` or priors' strides not finite and ``> 0`` (checked on the CPU only),
            options out of range.

    Examples:
        >>> import torch
        >>> x = torch.arange(4.0) * 8 + 4  # four points of stride 8 on a row
        >>> priors = torch.stack([x, x * 0 + 4, x * 0 + 8, x * 0 + 8], 1)
        >>> boxes = torch.tensor([[0.0, 0, 8, 8], [6, 0, 14, 8], [18, 0, 26, 8], [24, 0, 32, 8]])
        >>> scores = torch.full((4, 2), 0.5)
        >>> gt_boxes, gt_labels = torch.tensor([[2.0, 0, 12, 8]]), torch.tensor([1])
        >>> simota_assign(priors, boxes, scores, gt_boxes, gt_labels)
        DynamicKAssignment(gt_indices=tensor([ 0, -1, -1, -1]), max_ious=tensor([0.5000, 0.0000, 0.0000, 0.0000]), labels=tensor([ 1, -1, -1, -1]))
    """
    reads = _check_inputs(priors, boxes, scores, gt_boxes, gt_labels, "scores")
    if reads and scores.numel():  # as mmdetection's BCE; CPU only
        lo, hi = (float(v) for v in torch.aminmax(scores.detach()))
        if not (lo >= 0.0 and hi <= 1.0):
            raise ValueError(f"scores must be probabilities in [0, 1], got values in [{lo}, {hi}]")
    center_radius = check_number("center_radius", center_radius, 0.0)
    candidate_topk = check_int("candidate_topk", candidate_topk, 1)
    iou_weight = check_number("iou_weight", iou_weight, 0.0)
    cls_weight = check_number("cls_weight", cls_weight, 0.0)
    dtype = compute_dtype(
        torch.promote_types(torch.promote_types(priors.dtype, boxes.dtype), scores.dtype)
    )
    dtype = compute_dtype(torch.promote_types(dtype, gt_boxes.dtype))
    n, m, c = priors.shape[0], gt_boxes.shape[0], scores.shape[1]
    block = _block_rows(m, c, dtype, block_bytes)
    if n == 0 or m == 0:
        return _background(n, dtype, priors.device)
    p, b, s = (t.detach().to(dtype) for t in (priors, boxes, scores))
    g = gt_boxes.detach().to(dtype)
    gx1, gy1, gx2, gy2 = sides = list(g.t().contiguous().unbind(0))  # `_measure`
    gcx, gcy = (gx1 + gx2) / 2.0, (gy1 + gy2) / 2.0
    labels = gt_labels.long()

    def regions(pr: Tensor) -> tuple[Tensor, Tensor]:
        x, y, sx, sy = (v.unsqueeze(1) for v in pr.unbind(1))
        rx, ry = center_radius * sx, center_radius * sy
        in_centre = _inside(x, y, gcx - rx, gcy - ry, gcx + rx, gcy + ry)
        return _inside(x, y, gx1, gy1, gx2, gy2), in_centre

    def candidates(pr: Tensor) -> Tensor:
        in_box, in_centre = regions(pr)
        return (in_box | in_centre).any(1)

    def pairs(pr: Tensor, br: Tensor, sr: Tensor, masked: bool) -> tuple[Tensor | None, ...]:
        in_box, in_centre = regions(pr)
        valid = (in_box | in_centre).any(1) if masked else None
        iou = _measure(list(br.unsqueeze(1).unbind(-1)), sides, 0, _EPS)  # `box_iou`
        # F.binary_cross_entropy of each class against 0, the label's against 1 (logs >= -100)
        negative = -torch.log1p(-sr).clamp_min(-100.0)
        positive = -torch.log(sr[:, labels]).clamp_min(-100.0)
        cls_cost = negative.sum(1, keepdim=True) - negative[:, labels] + positive
        cost = cls_cost * cls_weight + (-torch.log(iou + _EPS)) * iou_weight
        return valid, iou, torch.where(in_box & in_centre, cost, cost + _INF)

    return _dynamic_k(pairs, candidates, (p, b, s), labels, candidate_topk, block, dtype, reads)
