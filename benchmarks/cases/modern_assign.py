"""Assignment for today's heads against the code users copy: sweeps at 1 and 2 threads.

"Never slower than the peer at any size" (the design's speed rule), one case per
``(block, size, threads)`` in the ``sweep`` group, from one image with one object to crowded
batches, float32:

- `visionblocks.ops.task_aligned_assign` against ultralytics' ``TaskAlignedAssigner``
  (``ultralytics/utils/tal.py``, 8.4: ``topk=10, alpha=0.5, beta=6``, minimum side 16, as
  YOLOv8's loss), ``B x A x M x C``: 1 x 336 x 1 x 80, 4 x 8400 x 30 x 80, 16 x 8400 x 100 x 80.
  Registered only where ultralytics is installed (a test and benchmark dependency). The micro
  case ``task_aligned_assign_16x8400x300x80`` is the issue's size (memory: at most 1/4 of
  ultralytics').
- `visionblocks.ops.simota_assign` and `visionblocks.ops.dynamic_soft_label_assign` against
  float32 re-expressions of mmdetection's ``SimOTAAssigner`` and ``DynamicSoftLabelAssigner``
  (open-mmlab/mmdetection, ``mmdet/models/task_modules/assigners/sim_ota_assigner.py`` and
  ``dynamic_soft_label_assigner.py``; ``bbox_overlaps`` of
  ``mmdet/structures/bbox/bbox_overlaps.py``): the candidates compacted, the
  ``(candidates, M, C)`` class cost, one ``topk`` per object on the host's ``k``. One image,
  ``A x M x C``: 336 x 1 x 80, 8400 x 1 x 80, 8400 x 10 x 80, 8400 x 100 x 80.
- `visionblocks.ops.hungarian_match` against DETR's ``HungarianMatcher.forward``
  (facebookresearch/detr, ``models/matcher.py`` and ``util/box_ops.py``, float32): one cost
  matrix over all targets of the batch, ``.cpu()``, scipy per image. ``B x Q x C``, ``M``
  objects per image: 1 x 100 x 92 with 1, 2 x 100 x 92 with 10, 16 x 300 x 92 with 50.

Each side returns its results; the check compares them on reduced inputs (``small_setup``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.cases.sweep import MIN_RATIO, MIN_SAMPLE_MS, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["MODERN_ASSIGN_CASES"]

_CLASSES = 80
_INF, _EPS = 100000.0, 1e-7  # mmdetection's SimOTA INF and the EPS of -log(IoU + EPS)


# ----------------------------------------------------------------------------- inputs
def _grid(size: int, strides: tuple[int, ...] = (8, 16, 32)) -> torch.Tensor:
    """``(A, 4)`` points ``(cx, cy, stride, stride)`` of a ``size`` image, YOLO's 3 levels."""
    out = []
    for s in strides:
        c = (torch.arange(size // s, dtype=torch.float32) + 0.5) * s
        cy, cx = torch.meshgrid(c, c, indexing="ij")
        out.append(torch.stack([cx, cy, cx * 0 + s, cy * 0 + s], -1).reshape(-1, 4))
    return torch.cat(out)


def _objects(shape: tuple[int, ...], size: int, g: torch.Generator) -> torch.Tensor:
    centre = torch.rand(*shape, 2, generator=g) * size
    side = 4 + torch.rand(*shape, 2, generator=g) * size / 4
    return torch.cat([centre - side / 2, centre + side / 2], -1).clamp(0, size)


def _tal_setup(b: int, size: int, m: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    def setup() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        points = _grid(size)[:, :2].contiguous()
        a = len(points)
        gt = _objects((b, m), size, g)
        labels = torch.randint(0, _CLASSES, (b, m, 1), generator=g).float()
        dist = torch.rand(b, a, 4, generator=g) * 30
        pred = torch.cat([points - dist[..., :2], points + dist[..., 2:]], -1)
        scores = torch.rand(b, a, _CLASSES, generator=g)
        return scores, pred, points, labels, gt, torch.ones(b, m, 1)

    return setup


def _one_image_setup(size: int, m: int, logits: bool) -> Callable[[], tuple[torch.Tensor, ...]]:
    def setup() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        priors = _grid(size)
        a = len(priors)
        centre = priors[:, :2] + torch.randn(a, 2, generator=g) * priors[:, 2:] * 0.5
        wh = priors[:, 2:] * torch.exp(torch.randn(a, 2, generator=g) * 0.7) * 2
        boxes = torch.cat([centre - wh / 2, centre + wh / 2], 1)
        scores = torch.rand(a, _CLASSES, generator=g) * 0.98 + 0.01
        if logits:
            scores = torch.logit(scores) * 1.5
        labels = torch.randint(0, _CLASSES, (m,), generator=g)
        return priors, boxes, scores, _objects((m,), size, g), labels

    return setup


def _detr_setup(b: int, q: int, m: int, c: int = 92) -> Callable[[], Any]:
    def boxes(n: int, g: torch.Generator) -> torch.Tensor:
        centres = torch.rand(n, 2, generator=g) * 0.8 + 0.1
        return torch.cat([centres, torch.rand(n, 2, generator=g) * 0.4 + 0.02], 1)

    def setup() -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
        g = torch.Generator().manual_seed(0)
        outputs = {
            "pred_logits": torch.randn(b, q, c, generator=g) * 2,
            "pred_boxes": boxes(b * q, g).view(b, q, 4),
        }
        sizes = torch.randint(max(1, m // 2), m + 1, (b,), generator=g).tolist()
        targets = [
            {"labels": torch.randint(0, c - 1, (n,), generator=g), "boxes": boxes(n, g)}
            for n in sizes
        ]
        return outputs, targets

    return setup


# ------------------------------------------------------------------------------- sides
def _ours_tal(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    from visionblocks.ops import task_aligned_assign

    return tuple(task_aligned_assign(*state, topk=10, alpha=0.5, beta=6.0, min_side=16.0))


def _ultralytics_tal(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    from ultralytics.utils.tal import TaskAlignedAssigner

    assigner = TaskAlignedAssigner(10, state[0].shape[-1], 0.5, 6.0, stride=[16])
    labels, boxes, scores, fg, index = assigner(*state)
    return labels.long(), boxes, scores, fg, index.long()


def _ours_simota(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    from visionblocks.ops import simota_assign

    return tuple(simota_assign(*state))


def _ours_dsl(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    from visionblocks.ops import dynamic_soft_label_assign

    return tuple(dynamic_soft_label_assign(*state))


def _bbox_overlaps(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """mmdetection's pairwise ``bbox_overlaps(boxes1, boxes2, mode="iou")``."""
    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    return overlap / (area1[:, None] + area2[None, :] - overlap).clamp(min=eps)


def _mmdet_dynamic_k(
    cost: torch.Tensor, ious: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, topk: int
) -> tuple[torch.Tensor, ...]:
    """mmdetection's ``dynamic_k_matching`` and its ``AssignResult`` (0-based, background 0)."""
    matching = torch.zeros_like(cost, dtype=torch.uint8)
    dynamic_ks = torch.clamp(torch.topk(ious, min(topk, len(ious)), dim=0).values.sum(0).int(), 1)
    for j in range(cost.shape[1]):
        pos = torch.topk(cost[:, j], k=int(dynamic_ks[j]), largest=False).indices
        matching[pos, j] = 1
    several = matching.sum(1) > 1
    if several.sum() > 0:
        argmin = cost[several, :].min(dim=1).indices
        matching[several, :] *= 0
        matching[several, argmin] = 1
    fg = matching.sum(1) > 0
    where = valid.nonzero()[:, 0][fg]
    gt = torch.full(valid.shape, -1, dtype=torch.long)
    gt[where] = matching[fg].argmax(1)
    max_ious = torch.zeros(valid.shape)
    max_ious[where] = (matching * ious).sum(1)[fg]
    return gt, max_ious, torch.where(gt >= 0, labels[gt.clamp(min=0)], -1)


def _mmdet_simota(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``SimOTAAssigner.assign`` (center_radius 2.5, candidate_topk 10, weights 3 and 1)."""
    priors, boxes, scores, gt_boxes, labels = state
    m, radius = len(gt_boxes), 2.5
    x, y, sx, sy = (priors[:, i : i + 1].repeat(1, m) for i in range(4))
    in_gts = torch.stack([x - gt_boxes[:, 0], y - gt_boxes[:, 1], gt_boxes[:, 2] - x,
                          gt_boxes[:, 3] - y], 1).min(dim=1).values > 0  # fmt: skip
    cx, cy = (gt_boxes[:, 0] + gt_boxes[:, 2]) / 2.0, (gt_boxes[:, 1] + gt_boxes[:, 3]) / 2.0
    in_cts = torch.stack([x - (cx - radius * sx), y - (cy - radius * sy),
                          cx + radius * sx - x, cy + radius * sy - y], 1).min(1).values > 0  # fmt: skip
    valid = (in_gts.sum(1) > 0) | (in_cts.sum(1) > 0)
    both = in_gts[valid, :] & in_cts[valid, :]
    ious = _bbox_overlaps(boxes[valid], gt_boxes)
    n = len(ious)
    onehot = F.one_hot(labels.long(), scores.shape[-1]).float().unsqueeze(0).repeat(n, 1, 1)
    repeated = scores[valid].unsqueeze(1).repeat(1, m, 1)
    cls_cost = F.binary_cross_entropy(repeated, onehot, reduction="none").sum(-1)
    cost = cls_cost * 1.0 + -torch.log(ious + _EPS) * 3.0 + (~both) * _INF
    return _mmdet_dynamic_k(cost, ious, valid, labels, 10)


def _mmdet_dsl(state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``DynamicSoftLabelAssigner.assign`` (soft_center_radius 3, topk 13, iou_weight 3)."""
    priors, boxes, logits, gt_boxes, labels = state
    m = len(gt_boxes)
    centre = priors[:, :2]
    lt, rb = centre[:, None] - gt_boxes[:, :2], gt_boxes[:, 2:] - centre[:, None]
    valid = (torch.cat([lt, rb], dim=-1).min(dim=-1).values > 0).sum(dim=1) > 0
    prior = priors[valid]
    gt_center = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2.0
    distance = (prior[:, None, :2] - gt_center[None]).pow(2).sum(-1).sqrt() / prior[:, 2][:, None]
    soft_center_prior = torch.pow(10, distance - 3.0)
    ious = _bbox_overlaps(boxes[valid], gt_boxes)
    iou_cost = -torch.log(ious + _EPS) * 3.0
    n = len(ious)
    onehot = F.one_hot(labels.long(), logits.shape[-1]).float().unsqueeze(0).repeat(n, 1, 1)
    repeated = logits[valid].unsqueeze(1).repeat(1, m, 1)
    soft_label = onehot * ious[..., None]
    scale = soft_label - repeated.sigmoid()
    cls_cost = F.binary_cross_entropy_with_logits(repeated, soft_label, reduction="none")
    cls_cost = (cls_cost * scale.abs().pow(2.0)).sum(dim=-1)
    return _mmdet_dynamic_k(cls_cost + iou_cost + soft_center_prior, ious, valid, labels, 13)


def _ours_hungarian(state: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from visionblocks.ops import hungarian_match

    return hungarian_match(*state)


def _detr_xyxy(x: torch.Tensor) -> torch.Tensor:
    x_c, y_c, w, h = x.unbind(-1)
    return torch.stack([(x_c - 0.5 * w), (y_c - 0.5 * h), (x_c + 0.5 * w), (y_c + 0.5 * h)], -1)


def _detr_giou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """DETR's ``util/box_ops.generalized_box_iou`` (its degenerate-box asserts included)."""
    from torchvision.ops.boxes import box_area

    assert (boxes1[:, 2:] >= boxes1[:, :2]).all()
    assert (boxes2[:, 2:] >= boxes2[:, :2]).all()
    area1, area2 = box_area(boxes1), box_area(boxes2)
    wh = (torch.min(boxes1[:, None, 2:], boxes2[:, 2:]) - torch.max(boxes1[:, None, :2], boxes2[:, :2])).clamp(min=0)  # fmt: skip
    inter = wh[:, :, 0] * wh[:, :, 1]
    union = area1[:, None] + area2 - inter
    iou = inter / union
    wh = (torch.max(boxes1[:, None, 2:], boxes2[:, 2:]) - torch.min(boxes1[:, None, :2], boxes2[:, :2])).clamp(min=0)  # fmt: skip
    area = wh[:, :, 0] * wh[:, :, 1]
    return iou - (area - union) / area


@torch.no_grad()
def _detr_matcher(state: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """DETR's ``HungarianMatcher.forward`` with unit weights."""
    from scipy.optimize import linear_sum_assignment

    outputs, targets = state
    bs, num_queries = outputs["pred_logits"].shape[:2]
    out_prob = outputs["pred_logits"].flatten(0, 1).softmax(-1)
    out_bbox = outputs["pred_boxes"].flatten(0, 1)
    tgt_ids = torch.cat([v["labels"] for v in targets])
    tgt_bbox = torch.cat([v["boxes"] for v in targets])
    cost_class = -out_prob[:, tgt_ids]
    cost_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
    cost_giou = -_detr_giou(_detr_xyxy(out_bbox), _detr_xyxy(tgt_bbox))
    c = (cost_bbox + cost_class + cost_giou).view(bs, num_queries, -1).cpu()
    sizes = [len(v["boxes"]) for v in targets]
    indices = [linear_sum_assignment(c[i]) for i, c in enumerate(c.split(sizes, -1))]
    return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64))
            for i, j in indices]  # fmt: skip


# ------------------------------------------------------------------------------ points
def _point(name: str, size: str, threads: int, what: str, setup, small, ours, peer, peer_name,
           check) -> BenchCase:  # fmt: skip
    return register_case(
        BenchCase(
            name=f"sweep_{name}_{size}_t{threads}",
            setup=setup,
            ours=ours,
            peer=peer,
            peer_name=peer_name,
            description=f"{what} {size} float32, {threads} thread{'s' * (threads > 1)}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=check,
            small_setup=small,
            group="sweep",
            params={"op": what, "size": size},
            min_sample_ms=MIN_SAMPLE_MS,
            count_calls=True,
        )
    )


def _register() -> list[BenchCase]:
    exact = same_outputs(rtol=1e-5, atol=1e-6)  # indices exact; IoUs, scores to rounding
    points = []  # (name, size, what, setup, small, ours, peer, peer_name, check)
    if importlib.util.find_spec("ultralytics") is not None:
        tal_small = _tal_setup(2, 320, 10)
        for b, size, m in ((1, 128, 1), (4, 640, 30), (16, 640, 100)):
            a = len(_grid(size))
            points.append(("tal", f"{b}x{a}x{m}x{_CLASSES}", "task_aligned_assign",
                           _tal_setup(b, size, m), tal_small if b > 1 else None, _ours_tal,
                           _ultralytics_tal, "ultralytics TaskAlignedAssigner", exact))  # fmt: skip
    for size, m in ((128, 1), (640, 1), (640, 10), (640, 100)):
        a = len(_grid(size))
        small = _one_image_setup(320, min(m, 10), False) if size > 320 else None
        points.append(("simota", f"{a}x{m}x{_CLASSES}", "simota_assign",
                       _one_image_setup(size, m, False), small, _ours_simota, _mmdet_simota,
                       "mmdet SimOTAAssigner (float32 re-expression)", exact))  # fmt: skip
        small = _one_image_setup(320, min(m, 10), True) if size > 320 else None
        points.append(("dsl", f"{a}x{m}x{_CLASSES}", "dynamic_soft_label_assign",
                       _one_image_setup(size, m, True), small, _ours_dsl, _mmdet_dsl,
                       "mmdet DynamicSoftLabelAssigner (float32 re-expression)", exact))  # fmt: skip
    for b, q, m in ((1, 100, 1), (2, 100, 10), (16, 300, 50)):
        small = _detr_setup(2, 100, 10) if b > 2 else None
        points.append(("hungarian", f"{b}x{q}x{m}", "hungarian_match", _detr_setup(b, q, m),
                       small, _ours_hungarian, _detr_matcher, "DETR HungarianMatcher",
                       same_outputs(rtol=0, atol=0)))  # fmt: skip
    cases = [_point(*p[:2], t, *p[2:]) for p in points for t in THREADS]
    if importlib.util.find_spec("ultralytics") is not None:
        for threads in THREADS:
            cases.append(register_case(BenchCase(
                name=f"task_aligned_assign_16x8400x300x80_t{threads}",
                setup=_tal_setup(16, 640, 300),
                ours=_ours_tal,
                peer=_ultralytics_tal,
                peer_name="ultralytics TaskAlignedAssigner",
                description=f"task_aligned_assign 16 images x 8400 anchors x 300 objects x 80 "
                f"classes float32 (topk 10, alpha 0.5, min side 16), {threads} thread"
                f"{'s' * (threads > 1)}",
                min_speedup=1.0,
                max_memory_ratio=0.25,
                memory=threads == 2,
                threads=threads,
                check=exact,
                small_setup=_tal_setup(2, 320, 10),
                params={"op": "task_aligned_assign", "size": "16x8400x300x80"},
            )))  # fmt: skip
    return cases


MODERN_ASSIGN_CASES = _register()
"""Every case of this module: ``sweep_<block>_<size>_t<threads>`` and the issue-size micro case."""
