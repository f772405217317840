"""RTMDet's dynamic soft label assignment, as mmdetection's ``DynamicSoftLabelAssigner``.

SimOTA's dynamic-k matching (`visionblocks.ops.simota`, whose module notes give the memory,
ties and results) with RTMDet's cost: a soft centre prior instead of the centre region, and a
quality-focal-style class cost whose target is the IoU. Candidates are the anchors whose point
lies inside some object's box.

Convention:
    As `visionblocks.ops.simota`: ``priors (A, 4)`` are ``(cx, cy, stride_w, stride_h)`` (the
    distance to an object's centre is measured in ``stride_w``), boxes ``"xyxy"``, results
    `DynamicKAssignment` (mmdetection's ``AssignResult`` with 0-based objects). The class
    scores are logits, as mmdetection's RTMDet head passes them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import check_int, check_number
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.ops.boxes import _measure
from visionblocks.ops.simota import (
    _EPS,
    DynamicKAssignment,
    _background,
    _block_rows,
    _check_inputs,
    _dynamic_k,
    _inside,
)

__all__ = ["dynamic_soft_label_assign"]
__dir__ = public_dir(__name__, __all__)


def dynamic_soft_label_assign(
    priors: Tensor,
    boxes: Tensor,
    logits: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    *,
    soft_center_radius: float = 3.0,
    topk: int = 13,
    iou_weight: float = 3.0,
    block_bytes: int | None = None,
) -> DynamicKAssignment:
    """RTMDet's dynamic soft label assignment of one image, as mmdetection's
    ``DynamicSoftLabelAssigner.assign``.

    Candidates are the anchors whose point lies inside some object's box. Cost of a
    candidate for object ``j`` with label ``l``, IoU ``u`` and distance ``d`` (in strides)
    from its point to the object's centre, ``p = sigmoid(logits)``:
    ``sum_c BCEWithLogits(logits[c], t_c) * (t_c - p_c)**2`` with ``t = u * onehot(l)``, plus
    ``-iou_weight * log(u + 1e-7)`` and ``10 ** (d - soft_center_radius)``. Object ``j``
    takes its ``k_j`` cheapest candidates, ``k_j = max(1, floor(sum of its topk best IoUs))``;
    an anchor taken twice goes to its cheapest object (`simota_assign`'s matching).

    Args:
        priors (Tensor[A, 4]): ``(cx, cy, stride_w, stride_h)`` of each anchor point.
        boxes (Tensor[A, 4]): Predicted (decoded) boxes, ``"xyxy"``.
        logits (Tensor[A, C]): Class logits (before the sigmoid).
        gt_boxes (Tensor[M, 4]): Objects, ``"xyxy"``.
        gt_labels (Tensor[M]): Their classes, integers in ``[0, C)``.
        soft_center_radius: The distance, in strides, whose centre prior costs 1 (``>= 0``;
            RTMDet 3).
        topk: IoUs summed into each object's ``k`` (``>= 1``; RTMDet 13).
        iou_weight: Weight of the IoU cost (``>= 0``).
        block_bytes: Memory budget of one block of anchors (default 8 MiB); results do not
            depend on it.

    Returns:
        DynamicKAssignment: ``gt_indices``, ``max_ious``, ``labels``, each ``(A,)``.

    Raises:
        TypeError: Inputs not floating tensors, ``gt_labels`` not integer, options of the
            wrong type.
        ValueError: Bad shapes or devices, options out of range; on CPU (value checks) labels
            outside ``[0, C)``, logits not finite, priors' strides not finite and ``> 0``.

    Examples:
        >>> import torch
        >>> x = torch.arange(4.0) * 8 + 4  # four points of stride 8 on a row
        >>> priors = torch.stack([x, x * 0 + 4, x * 0 + 8, x * 0 + 8], 1)
        >>> boxes = torch.tensor([[0.0, 0, 8, 8], [6, 0, 14, 8], [10, 0, 18, 8], [24, 0, 32, 8]])
        >>> logits = torch.zeros(4, 2)
        >>> gt_boxes, gt_labels = torch.tensor([[2.0, 0, 22, 8]]), torch.tensor([1])
        >>> dynamic_soft_label_assign(priors, boxes, logits, gt_boxes, gt_labels)
        DynamicKAssignment(gt_indices=tensor([-1,  0, -1, -1]), max_ious=tensor([0.0000, 0.4000, 0.0000, 0.0000]), labels=tensor([-1,  1, -1, -1]))
    """
    reads = _check_inputs(priors, boxes, logits, gt_boxes, gt_labels, "logits")
    if reads and logits.numel():
        low, high = (float(v) for v in torch.aminmax(logits.detach()))
        if not (-math.inf < low and high < math.inf):  # also False for NaN
            raise ValueError(f"logits must be finite, got values in [{low}, {high}]")
    soft_center_radius = check_number("soft_center_radius", soft_center_radius, 0.0)
    topk = check_int("topk", topk, 1)
    iou_weight = check_number("iou_weight", iou_weight, 0.0)
    dtype = torch.promote_types(torch.promote_types(priors.dtype, boxes.dtype), logits.dtype)
    dtype = compute_dtype(torch.promote_types(dtype, gt_boxes.dtype))
    n, m, c = priors.shape[0], gt_boxes.shape[0], logits.shape[1]
    block = _block_rows(m, c, dtype, block_bytes)
    if n == 0 or m == 0:
        return _background(n, dtype, priors.device)
    p, b, x = (t.detach().to(dtype) for t in (priors, boxes, logits))
    g = gt_boxes.detach().to(dtype)
    gx1, gy1, gx2, gy2 = sides = list(g.t().contiguous().unbind(0))  # `_measure`
    gcx, gcy = (gx1 + gx2) / 2.0, (gy1 + gy2) / 2.0
    labels = gt_labels.long()

    def candidates(pr: Tensor) -> Tensor:
        px, py = pr[:, 0:1], pr[:, 1:2]
        return _inside(px, py, gx1, gy1, gx2, gy2).any(1)

    def pairs(pr: Tensor, br: Tensor, rows: Tensor, masked: bool) -> tuple[Tensor | None, ...]:
        px, py, stride = pr[:, 0:1], pr[:, 1:2], pr[:, 2:3]
        valid = _inside(px, py, gx1, gy1, gx2, gy2).any(1) if masked else None
        dx, dy = px - gcx, py - gcy
        distance = (dx * dx + dy * dy).sqrt() / stride
        centre_prior = torch.pow(10, distance - soft_center_radius)
        iou = _measure(list(br.unsqueeze(1).unbind(-1)), sides, 0, _EPS)  # `box_iou`
        iou_cost = -torch.log(iou + _EPS) * iou_weight
        # Quality focal cost: every class against target 0, the label's replaced by target IoU.
        prob = rows.sigmoid()
        zero = (rows - F.logsigmoid(rows)) * prob.pow(2.0)  # BCE with logits against 0
        own, own_prob = rows[:, labels], prob[:, labels]
        soft = F.binary_cross_entropy_with_logits(own, iou, reduction="none")
        soft = soft * (iou - own_prob).abs().pow(2.0)
        cls_cost = zero.sum(1, keepdim=True) - zero[:, labels] + soft
        return valid, iou, cls_cost + iou_cost + centre_prior

    return _dynamic_k(pairs, candidates, (p, b, x), labels, topk, block, dtype, reads)
