"""Task-aligned assignment (TOOD, YOLOv8) in blocks of objects, without the ``B x M x A`` tensors.

`task_aligned_assign` is ultralytics' ``TaskAlignedAssigner`` (``ultralytics/utils/tal.py``)
as a function of the same inputs, returning its five tensors. Each object scores the anchors
whose points lie inside its box by ``score ** alpha * CIoU ** beta`` (the predicted score of
the object's class, the CIoU of the predicted box with the object's); its ``topk`` best are
its candidates; an anchor that is a candidate of several objects goes to the object of
highest CIoU; the target score of a positive is its metric normalized per object (divided by
the object's best metric, times its best CIoU). ultralytics builds every ``batch x objects x
anchors`` tensor of this at once; here objects go through in blocks (``block_bytes``), so the
peak memory is one block plus ``O(B x A)`` results; the block size changes no assignment
(the target scores by at most an ulp: on the CPU, ``Tensor.pow`` rounds vectorized lanes and
loop tails apart by up to an ulp, in ultralytics too).

Convention:
    Boxes are ``"xyxy"`` and anchor points ``(x, y)``, all in one unit (pixels, as ultralytics).
    Scores are probabilities (sigmoid outputs). Labels are class indices in ``[0, C)`` for the
    valid objects; ``gt_mask`` is nonzero for valid objects (the padding of a batch is not).

Ties:
    The ``topk`` and ``topk2`` selections are ``torch.topk`` over the same ``A`` values as
    ultralytics', so ties (among them the zero metrics of objects with fewer than ``topk``
    anchors inside) resolve as they do there; an anchor claimed by several objects goes to the
    first object of highest CIoU, as ``torch.max``.

Dtypes:
    Computed in float32 (float64 if an input is float64): float16 and bfloat16 inputs are
    promoted first, as ultralytics' loss does for the boxes and CUDA autocast does for its
    ``score ** alpha``. Outputs: labels and indices int64, the mask bool, the target boxes in
    ``gt_boxes``' dtype, the target scores in the compute dtype. No gradient; no tensor value is
    read on the host, and the function compiles with ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_finite, check_int, check_number
from visionblocks._core.dispatch import reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, check_real, check_same_device
from visionblocks.ops._assign_blocks import rows_per_block

__all__ = ["TaskAlignedAssigner", "TaskAlignedTargets", "task_aligned_assign"]
__dir__ = public_dir(__name__, __all__)

BLOCK_BYTES: int = 32 * 2**20
"""Default memory budget of one block of objects (all images, all anchors)."""

_PAIR_TEMPS = 12  # pair-sized temporaries at a block's peak (the CIoU formula, masks, top-k)
_SPARSE_TEMPS = 5  # the same where the CIoU runs on the candidates only (the CPU)
_INSIDE_EPS = 1e-9  # ultralytics' margin of an anchor point inside a box
_CIOU_EPS = 1e-7  # ultralytics' bbox_iou eps


class TaskAlignedTargets(NamedTuple):
    """`task_aligned_assign`'s results, in ultralytics' order (``B`` images, ``A`` anchors).

    Attributes:
        target_labels (Tensor[B, A]): int64, the class of each anchor's object (for an anchor
            without one: the class of object 0, as ultralytics; use ``fg_mask``).
        target_bboxes (Tensor[B, A, 4]): The box of each anchor's object (object 0 for the
            background).
        target_scores (Tensor[B, A, C]): The normalized alignment metric at the object's class,
            0 elsewhere and for the background.
        fg_mask (Tensor[B, A]): bool, the positive anchors.
        target_gt_idx (Tensor[B, A]): int64, each anchor's object index (0 for the background).

    Examples:
        >>> TaskAlignedTargets._fields[3]
        'fg_mask'
    """

    target_labels: Tensor
    target_bboxes: Tensor
    target_scores: Tensor
    fg_mask: Tensor
    target_gt_idx: Tensor


def _aspect(boxes: Tensor, eps: float = _CIOU_EPS) -> Tensor:
    """``atan(w / h)`` of boxes ``(..., 4)``, as ultralytics' CIoU computes it (``h + eps``)."""
    return ((boxes[..., 2] - boxes[..., 0]) / (boxes[..., 3] - boxes[..., 1] + eps)).atan()


def _ciou(gt: Tensor, pd: Tensor, gt_aspect: Tensor, pd_aspect: Tensor) -> Tensor:
    """ultralytics' ``bbox_iou(gt, pd, xywh=False, CIoU=True)`` op for op (same bits), for
    boxes ``(..., 4)`` that broadcast, with their `_aspect` terms."""
    eps = _CIOU_EPS
    b1_x1, b1_y1, b1_x2, b1_y2 = gt.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = pd.unbind(-1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = (b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp_(0) * (
        b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)
    ).clamp_(0)
    iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
    del inter
    c2 = (b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)).pow(2)
    c2 = c2 + (b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)).pow(2) + eps
    rho2 = (b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2)
    rho2 = (rho2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
    v = (4 / math.pi**2) * (pd_aspect - gt_aspect).pow(2)
    alpha = v / (1 - iou + v + eps)
    return iou - (rho2 / c2 + v * alpha)


def _pair_metrics(
    cand: Tensor,
    pair: tuple[Tensor, Tensor, Tensor, Tensor],
    scores: Tensor,
    labels: Tensor,
    alpha: float,
    beta: float,
    dense: bool,
) -> tuple[Tensor, Tensor]:
    """CIoU (clamped at 0) and metric ``(B, rows, A)`` of a block's candidate pairs, 0 for the
    other pairs: over all pairs (``dense``: on CUDA and under ``torch.compile``) or over the
    candidates only (on the CPU, where ``nonzero`` costs no device sync). Same values."""
    gt, pd, gt_aspect, pd_aspect = pair
    if dense:
        iou = _ciou(gt[:, :, None], pd[:, None], gt_aspect[:, :, None], pd_aspect[:, None])
        iou = iou.clamp_(0)
        index = labels[:, None].expand(-1, cand.shape[-1], -1)  # (B, A, rows)
        score = scores.gather(2, index).transpose(1, 2).to(iou.dtype).pow(alpha)
        metric = torch.where(cand, score * iou.pow(beta), 0.0)
        return torch.where(cand, iou, 0.0), metric
    b, o, a = cand.nonzero(as_tuple=True)
    values = _ciou(gt[b, o], pd[b, a], gt_aspect[b, o], pd_aspect[b, a]).clamp_(0)
    score = scores[b, a, labels[b, o]].to(values.dtype).pow(alpha)
    both = torch.zeros(2, *cand.shape, dtype=pd.dtype)  # one fill, one scatter: fewer ops
    which = torch.arange(2).unsqueeze(1)
    both.index_put_((which, b, o, a), torch.stack([values, score * values.pow(beta)]))
    return both[0], both[1]


def _check_inputs(
    scores: Tensor,
    pred_boxes: Tensor,
    anchor_points: Tensor,
    gt_labels: Tensor,
    gt_boxes: Tensor,
    gt_mask: Tensor,
) -> None:
    check_floating("scores", scores)
    check_floating("pred_boxes", pred_boxes)
    check_real("anchor_points", anchor_points)
    check_real("gt_labels", gt_labels)
    check_real("gt_boxes", gt_boxes)
    if not isinstance(gt_mask, Tensor):
        raise TypeError(f"gt_mask must be a tensor, got {type(gt_mask).__name__}")
    if scores.dim() != 3:
        raise ValueError(f"scores must have shape (B, A, C), got {tuple(scores.shape)}")
    b, a, _ = scores.shape
    m = gt_boxes.shape[1] if gt_boxes.dim() == 3 else -1
    expected = {
        "pred_boxes": (pred_boxes, (b, a, 4), "(B, A, 4)"),
        "anchor_points": (anchor_points, (a, 2), "(A, 2)"),
        "gt_boxes": (gt_boxes, (b, m, 4), "(B, M, 4)"),
        "gt_labels": (gt_labels, (b, m, 1), "(B, M, 1)"),
        "gt_mask": (gt_mask, (b, m, 1), "(B, M, 1)"),
    }
    for name, (value, shape, text) in expected.items():
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{name} must have shape {text} = {shape} for scores of shape "
                f"{tuple(scores.shape)}, got {tuple(value.shape)}"
            )
    check_same_device(
        scores=scores,
        pred_boxes=pred_boxes,
        anchor_points=anchor_points,
        gt_labels=gt_labels,
        gt_boxes=gt_boxes,
        gt_mask=gt_mask,
    )
    if m > 0 and reads_values(gt_labels):
        _check_labels(gt_labels, gt_mask, scores.shape[-1])


def _check_labels(gt_labels: Tensor, gt_mask: Tensor, num_classes: int) -> None:
    """The objects' labels (not the padding's) are whole numbers in ``[0, C)``: a value
    check, one read on CPU. ultralytics reads a label of -1 as class C - 1 and truncates 1.7."""
    labels = gt_labels.detach().double().masked_fill(gt_mask.detach() == 0, 0.0)
    lo, hi = (float(v) for v in torch.aminmax(labels))
    whole = bool((labels == labels.floor()).all())  # False for NaN and inf
    if not (whole and lo >= 0 and hi < num_classes):
        bad = labels[(labels != labels.floor()) | (labels < 0) | (labels >= num_classes)]
        raise ValueError(
            f"gt_labels of the objects (gt_mask != 0) must be class indices in "
            f"[0, {num_classes}) (scores has {num_classes} classes), got {bad[0].item()}"
        )


def _check_options(
    topk: int,
    alpha: float,
    beta: float,
    eps: float,
    topk2: int | None,
    min_side: float | None,
    block_bytes: int | None,
) -> None:
    check_int("topk", topk, 1)
    check_finite("alpha", check_number("alpha", alpha, 0.0))
    check_finite("beta", check_number("beta", beta, 0.0))
    check_finite("eps", check_number("eps", eps, 0.0, low_inclusive=False))
    if topk2 is not None:
        check_int("topk2", topk2, 1)
    if min_side is not None:
        check_finite("min_side", check_number("min_side", min_side, 0.0))
    if block_bytes is not None:
        check_int("block_bytes", block_bytes, 1)


def task_aligned_assign(
    scores: Tensor,
    pred_boxes: Tensor,
    anchor_points: Tensor,
    gt_labels: Tensor,
    gt_boxes: Tensor,
    gt_mask: Tensor,
    *,
    topk: int = 13,
    alpha: float = 1.0,
    beta: float = 6.0,
    eps: float = 1e-9,
    topk2: int | None = None,
    min_side: float | None = None,
    block_bytes: int | None = None,
) -> TaskAlignedTargets:
    """TOOD's task-aligned assignment, as ultralytics' ``TaskAlignedAssigner``, in blocks.

    Equal to ``TaskAlignedAssigner(topk, C, alpha, beta, eps=eps)(scores, pred_boxes,
    anchor_points, gt_labels, gt_boxes, gt_mask)`` (``C = scores.shape[-1]``, its
    ``num_classes``). Steps, per image: an anchor is a candidate of a valid object when its
    point lies inside the box by more than 1e-9 on every side; the metric of a candidate is
    ``score ** alpha * max(CIoU, 0) ** beta`` (0 for the other pairs); each object keeps the
    ``topk`` anchors of highest metric (``torch.topk`` over all anchors) that are candidates;
    an anchor kept by several objects goes to the object of highest CIoU with it (over all
    objects, the first on ties); with ``topk2``, each object then keeps its ``topk2`` anchors
    of highest metric; a positive's target score is its metric times its object's best CIoU
    divided by its object's best metric (plus ``eps``), at its object's class.

    ``min_side`` is ultralytics' newer minimum side (``stride[1]`` of the model, 16 for
    YOLOv8; ultralytics 8.4 and later always apply it): boxes with a side below it are widened
    to it about their centre for the inside test only. ``None`` is the classic rule (TOOD,
    ultralytics before 8.4).

    Peak memory: one block of objects (``block_bytes``) plus the ``(B, A, C)`` target scores
    and a copy of ``scores``, where ultralytics holds several ``(B, M, A)`` tensors at once.

    Args:
        scores (Tensor[B, A, C]): Predicted class probabilities of ``A`` anchors in ``B`` images.
        pred_boxes (Tensor[B, A, 4]): Predicted boxes, ``(x1, y1, x2, y2)``.
        anchor_points (Tensor[A, 2]): Anchor points ``(x, y)``.
        gt_labels (Tensor[B, M, 1]): Classes of ``M`` objects per image (padded), in ``[0, C)``.
        gt_boxes (Tensor[B, M, 4]): Object boxes, ``(x1, y1, x2, y2)``.
        gt_mask (Tensor[B, M, 1]): Nonzero for the valid objects, zero for the padding.
        topk: Anchors each object keeps (``1 <= topk <= A``; ultralytics' YOLOv8 loss uses 10).
        alpha: Exponent of the score (``>= 0``; YOLOv8: 0.5).
        beta: Exponent of the CIoU (``>= 0``).
        eps: Added to each object's best metric before dividing (``> 0``).
        topk2: ultralytics' second selection (``1 <= topk2 <= A``); ``None`` or ``topk``: none.
        min_side: Minimum box side of the inside test (``>= 0``), or ``None`` (see above).
        block_bytes: Memory budget of one block of objects in bytes (default 32 MiB); the
            assignment does not depend on it.

    Returns:
        TaskAlignedTargets: ``(target_labels, target_bboxes, target_scores, fg_mask,
        target_gt_idx)`` (see `TaskAlignedTargets`). No objects (``M = 0``): labels ``C``,
        zero boxes and scores, no positives, indices 0 (ultralytics returns the same values,
        labels and indices in the scores' dtype).

    Raises:
        TypeError: Inputs not tensors of the right kind; options of the wrong type.
        ValueError: Shapes that disagree (each named with the expected shape) or devices;
            ``topk`` or ``topk2`` outside ``[1, A]``; ``eps <= 0`` or infinite;
            ``min_side < 0``; ``block_bytes < 1``; ``alpha`` or ``beta`` negative, NaN or
            infinite; on CPU (a value check), an object's label that is not a whole number
            in ``[0, C)``.

    Examples:
        >>> import torch
        >>> points = torch.tensor([[2.0, 2.0], [6.0, 2.0], [10.0, 2.0], [14.0, 2.0]])
        >>> pred = torch.tensor([[[0.0, 0.0, 4.0, 4.0], [3.0, 0.0, 9.0, 4.0],
        ...                       [8.0, 0.0, 12.0, 4.0], [12.0, 0.0, 16.0, 4.0]]])
        >>> scores = torch.tensor([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.2, 0.6]]])
        >>> gt_boxes = torch.tensor([[[0.0, 0.0, 8.0, 4.0], [8.0, 0.0, 16.0, 4.0]]])
        >>> labels, mask = torch.tensor([[[0.0], [1.0]]]), torch.ones(1, 2, 1)
        >>> out = task_aligned_assign(scores, pred, points, labels, gt_boxes, mask, topk=1)
        >>> out.fg_mask, out.target_gt_idx
        (tensor([[False,  True,  True, False]]), tensor([[0, 0, 1, 0]]))
        >>> out.target_scores
        tensor([[[0.0000, 0.0000],
                 [0.5142, 0.0000],
                 [0.0000, 0.4468],
                 [0.0000, 0.0000]]])
    """
    _check_inputs(scores, pred_boxes, anchor_points, gt_labels, gt_boxes, gt_mask)
    b, a, c = scores.shape
    m = gt_boxes.shape[1]
    _check_options(topk, alpha, beta, eps, topk2, min_side, block_bytes)
    for name, value in (("topk", topk), ("topk2", topk2)):
        if value is not None and value > a:
            raise ValueError(f"{name} must be at most the number of anchors ({a}), got {value}")
    topk2 = topk if topk2 is None else topk2
    budget = BLOCK_BYTES if block_bytes is None else block_bytes

    dtypes = (scores.dtype, pred_boxes.dtype, gt_boxes.dtype, anchor_points.dtype)
    dtype = torch.float64 if torch.float64 in dtypes else torch.float32
    device = scores.device
    labels = gt_labels.detach().reshape(b, m).long()
    if m == 0:
        return TaskAlignedTargets(
            torch.full((b, a), c, dtype=torch.long, device=device),
            gt_boxes.new_zeros(b, a, 4),
            torch.zeros(b, a, c, dtype=dtype, device=device),
            torch.zeros(b, a, dtype=torch.bool, device=device),
            torch.zeros(b, a, dtype=torch.long, device=device),
        )
    dense = device.type != "cpu" or torch.compiler.is_compiling()
    pd = pred_boxes.detach().to(dtype)
    gt = gt_boxes.detach().to(dtype)
    x, y = anchor_points.detach().to(dtype).unbind(-1)
    valid = gt_mask.detach().reshape(b, m) != 0
    safe_labels = torch.where(valid, labels, 0)
    gt_aspect, pd_aspect = _aspect(gt), _aspect(pd)
    if min_side is None:
        lt, rb = gt[..., :2], gt[..., 2:]
    else:  # ultralytics' xyxy -> xywh -> xyxy round trip, with the short sides widened
        centre, side = (gt[..., :2] + gt[..., 2:]) / 2, gt[..., 2:] - gt[..., :2]
        half = torch.where(side < min_side, torch.full_like(side, min_side), side) / 2
        lt, rb = centre - half, centre + half
    lt = torch.where(valid[..., None], lt, math.inf)  # the padding holds no anchor

    # Each object's topk anchors (whether they are candidates, their CIoU and metric), and
    # per anchor the first object of highest CIoU over all objects, with its CIoU and metric.
    tops, kept, kept_iou, kept_metric = [], [], [], []
    best_iou = torch.full((b, a), -math.inf, dtype=dtype, device=device)
    best_idx = torch.zeros(b, a, dtype=torch.long, device=device)
    best_metric = torch.zeros(b, a, dtype=dtype, device=device)
    itemsize = 8 if dtype == torch.float64 else 4
    block = rows_per_block(b * a, (_PAIR_TEMPS if dense else _SPARSE_TEMPS) * itemsize, budget)
    for start in range(0, m, block):
        stop = min(start + block, m)
        l0, l1, r0, r1 = (t[:, start:stop, None] for t in (*lt.unbind(-1), *rb.unbind(-1)))
        # ultralytics' amin of the four distances > eps (padding: no anchor, lt = inf)
        cand = torch.minimum(torch.minimum(x - l0, y - l1), torch.minimum(r0 - x, r1 - y))
        cand = cand > _INSIDE_EPS
        pair = (gt[:, start:stop], pd, gt_aspect[:, start:stop], pd_aspect)
        iou, metric = _pair_metrics(
            cand, pair, scores, safe_labels[:, start:stop], alpha, beta, dense
        )
        top = metric.topk(topk, dim=-1).indices
        tops.append(top)
        kept.append(cand.gather(-1, top))
        kept_iou.append(iou.gather(-1, top))
        kept_metric.append(metric.gather(-1, top))
        value, where = iou.max(1, keepdim=True)
        take = value[:, 0] > best_iou
        best_iou = torch.where(take, value[:, 0], best_iou)
        best_idx = torch.where(take, where[:, 0] + start, best_idx)
        best_metric = torch.where(take, metric.gather(1, where)[:, 0], best_metric)

    # Per anchor, sums over the kept pairs (an object's topk that are candidates): how many
    # objects keep it, and the object, its CIoU and metric where that is one.
    at = torch.cat(tops, 1).flatten(1)
    keep = torch.cat(kept, 1)
    objects = torch.arange(m, device=device)[:, None]
    count = torch.zeros(b, a, dtype=torch.long, device=device)
    count.scatter_add_(1, at, keep.flatten(1).long())
    kept_idx = torch.zeros_like(count).scatter_add_(1, at, (keep * objects).flatten(1))
    kept_iou = torch.zeros_like(best_metric).scatter_add_(
        1, at, torch.where(keep, torch.cat(kept_iou, 1), 0.0).flatten(1)
    )
    kept_metric = torch.zeros_like(best_metric).scatter_add_(
        1, at, torch.where(keep, torch.cat(kept_metric, 1), 0.0).flatten(1)
    )
    fg = count > 0
    multi = count > 1
    gt_idx = torch.where(multi, best_idx, kept_idx)
    metric_a = torch.where(multi, best_metric, kept_metric)
    iou_a = torch.where(multi, best_iou, kept_iou)
    if topk2 != topk:
        fg = _second_topk(fg, gt_idx, metric_a, m, topk2, block)
        gt_idx = torch.where(fg, gt_idx, 0)
    metric_a = torch.where(fg, metric_a, 0.0)
    iou_a = torch.where(fg, iou_a, 0.0)
    zeros = torch.zeros(b, m, dtype=dtype, device=device)
    best_metric_obj = zeros.scatter_reduce(1, gt_idx, metric_a, "amax")
    best_iou_obj = zeros.scatter_reduce(1, gt_idx, iou_a, "amax")
    norm = metric_a * best_iou_obj.gather(1, gt_idx) / (best_metric_obj.gather(1, gt_idx) + eps)
    target_labels = labels.gather(1, gt_idx).clamp_(min=0)  # ultralytics' (padding's too)
    target_scores = torch.zeros(b, a, c, dtype=dtype, device=device)
    # norm is 0 off the positives: a padding label (any value) puts that 0 into class 0
    target_scores.scatter_(2, safe_labels.gather(1, gt_idx)[..., None], norm[..., None])
    boxes_index = gt_idx[..., None].expand(-1, -1, 4)
    target_bboxes = gt_boxes.detach().gather(1, boxes_index)
    return TaskAlignedTargets(target_labels, target_bboxes, target_scores, fg, gt_idx)


def _second_topk(fg: Tensor, gt_idx: Tensor, metric: Tensor, m: int, k: int, block: int) -> Tensor:
    """ultralytics' ``topk2``: the positives among their object's ``k`` highest metrics."""
    keep = torch.zeros_like(fg)
    owner = torch.where(fg, gt_idx, -1)[:, None]  # (B, 1, A)
    for start in range(0, m, block):
        stop = min(start + block, m)
        own = owner == torch.arange(start, stop, device=fg.device)[:, None]  # (B, rows, A)
        rows = torch.where(own, metric[:, None], 0.0)
        top = rows.topk(k, dim=-1).indices
        keep |= (torch.zeros_like(own).scatter_(-1, top, True) & own).any(1)
    return keep


class TaskAlignedAssigner(nn.Module):
    """`task_aligned_assign` as a module (the options fixed at construction).

    Args:
        topk: Anchors each object keeps (``>= 1``, at most the anchors of each call).
        alpha: Exponent of the score.
        beta: Exponent of the CIoU.
        eps: Added to each object's best metric before dividing.
        topk2: ultralytics' second selection, or ``None``.
        min_side: Minimum box side of the inside test, or ``None`` (the classic rule).
        block_bytes: Memory budget of one block of objects.

    Raises:
        TypeError: An option of the wrong type.
        ValueError: An option out of its range (see `task_aligned_assign`).

    Examples:
        >>> import torch
        >>> assigner = TaskAlignedAssigner(topk=1)
        >>> points = torch.tensor([[2.0, 2.0], [6.0, 2.0]])
        >>> pred = torch.tensor([[[0.0, 0.0, 4.0, 4.0], [4.0, 0.0, 8.0, 4.0]]])
        >>> out = assigner(torch.full((1, 2, 3), 0.5), pred, points, torch.zeros(1, 1, 1),
        ...                torch.tensor([[[0.0, 0.0, 8.0, 4.0]]]), torch.ones(1, 1, 1))
        >>> out.fg_mask
        tensor([[ True, False]])
    """

    def __init__(
        self,
        topk: int = 13,
        alpha: float = 1.0,
        beta: float = 6.0,
        eps: float = 1e-9,
        topk2: int | None = None,
        min_side: float | None = None,
        block_bytes: int | None = None,
    ) -> None:
        super().__init__()
        _check_options(topk, alpha, beta, eps, topk2, min_side, block_bytes)
        self.topk, self.alpha, self.beta, self.eps = topk, alpha, beta, eps
        self.topk2, self.min_side, self.block_bytes = topk2, min_side, block_bytes

    def forward(
        self,
        scores: Tensor,
        pred_boxes: Tensor,
        anchor_points: Tensor,
        gt_labels: Tensor,
        gt_boxes: Tensor,
        gt_mask: Tensor,
    ) -> TaskAlignedTargets:
        """`task_aligned_assign` of the inputs with this module's options."""
        return task_aligned_assign(
            scores,
            pred_boxes,
            anchor_points,
            gt_labels,
            gt_boxes,
            gt_mask,
            topk=self.topk,
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
            topk2=self.topk2,
            min_side=self.min_side,
            block_bytes=self.block_bytes,
        )
