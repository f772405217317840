"""`dynamic_soft_label_assign` against a float64 re-expression of mmdetection's
``DynamicSoftLabelAssigner``.

Reference: open-mmlab/mmdetection,
``mmdet/models/task_modules/assigners/dynamic_soft_label_assigner.py`` (``assign`` with tensor
boxes and no masks, ``dynamic_k_matching``; stored version at commit
18cd2b4fd5241d638ef97a9b761211672cc63a2b), written out here since mmdet is not a test
dependency: candidates compacted by ``valid_mask``, the soft centre prior, the
``(candidates, M, C)`` quality-focal-style class cost, one ``topk`` per object (the matching
is `tests.ops.test_simota.dynamic_k_reference`, the same as SimOTA's). Differences, all
deliberate: background ``max_overlaps`` 0 (mmdetection: ``-INF``), objects 0-based; with
``stable=True`` the per-object ``topk`` is a stable sort, the tie rule of the op.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.ops.test_simota import (
    assert_same,
    bbox_overlaps,
    dynamic_k_reference,
    make_image,
    scatter_result,
)
from visionblocks.ops import dynamic_soft_label_assign

EPS = 1e-7


def dsl_reference(
    priors, boxes, logits, gt_boxes, gt_labels, radius=3.0, topk=13, iou_w=3.0, stable=False
):
    priors, boxes, logits, gt_boxes = (t.double() for t in (priors, boxes, logits, gt_boxes))
    n, m = priors.shape[0], gt_boxes.shape[0]
    if n == 0 or m == 0:
        return scatter_result(None, None, None, None, gt_labels, n)
    centre = priors[:, :2]
    lt = centre[:, None] - gt_boxes[:, :2]
    rb = gt_boxes[:, 2:] - centre[:, None]
    is_in_gts = torch.cat([lt, rb], dim=-1).min(dim=-1).values > 0
    valid = is_in_gts.sum(dim=1) > 0
    nv = int(valid.sum())
    if nv == 0:
        return scatter_result(valid, None, None, None, gt_labels, n)
    gt_center = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2.0
    valid_prior = priors[valid]
    distance = (valid_prior[:, None, :2] - gt_center[None]).pow(2).sum(-1).sqrt()
    distance = distance / valid_prior[:, 2][:, None]
    soft_center_prior = torch.pow(10, distance - radius)
    ious = bbox_overlaps(boxes[valid], gt_boxes)
    iou_cost = -torch.log(ious + EPS) * iou_w
    onehot = F.one_hot(gt_labels, logits.shape[1]).double().unsqueeze(0).repeat(nv, 1, 1)
    repeated = logits[valid].unsqueeze(1).repeat(1, m, 1)
    soft_label = onehot * ious[..., None]
    scale = soft_label - repeated.sigmoid()
    cls_cost = F.binary_cross_entropy_with_logits(repeated, soft_label, reduction="none")
    cls_cost = (cls_cost * scale.abs().pow(2.0)).sum(dim=-1)
    cost = cls_cost + iou_cost + soft_center_prior
    fg, matched, matched_ious = dynamic_k_reference(cost, ious, topk, stable)
    return scatter_result(valid, fg, matched, matched_ious, gt_labels, n)


def make_dsl_image(seed, m=8, crowded=False, dtype=torch.float64):
    priors, boxes, scores, gt_boxes, labels = make_image(seed, m=m, crowded=crowded, dtype=dtype)
    logits = torch.logit(scores.clamp(1e-3, 1 - 1e-3)) * 1.5
    return priors, boxes, logits, gt_boxes, labels


@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_equals_mmdet_float64(seed, crowded):
    m = 40 if crowded else 3 + 3 * seed
    inputs = make_dsl_image(seed, m=m, crowded=crowded)
    want = dsl_reference(*inputs)
    assert (want[0] >= 0).any()
    assert_same(dynamic_soft_label_assign(*inputs), want)
    assert_same(dynamic_soft_label_assign(*inputs, block_bytes=50_000), want)  # several blocks


@pytest.mark.parametrize("seed", range(4))
def test_options_equal_mmdet(seed):
    inputs = make_dsl_image(seed + 10, m=12, crowded=seed % 2 == 1)
    want = dsl_reference(*inputs, radius=1.0, topk=5, iou_w=1.5)
    options = dict(soft_center_radius=1.0, topk=5, iou_weight=1.5, block_bytes=30_000)
    assert_same(dynamic_soft_label_assign(*inputs, **options), want)


@pytest.mark.parametrize("seed", range(4))
def test_float32_and_half(seed):
    inputs = make_dsl_image(seed + 20, m=10, crowded=seed % 2 == 1, dtype=torch.float32)
    got = dynamic_soft_label_assign(*inputs)
    assert got.max_ious.dtype == torch.float32
    assert_same(got, dsl_reference(*inputs), exact=False)
    half = [t.half() if t.is_floating_point() else t for t in inputs]
    upcast = [t.float() if t.is_floating_point() else t for t in half]
    got = dynamic_soft_label_assign(*half)
    assert got.max_ious.dtype == torch.float32
    for a, b in zip(got, dynamic_soft_label_assign(*upcast), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_infinite_centre_prior_stays_a_candidate():
    """Hundreds of strides from an object's centre the centre prior overflows to inf; such a
    candidate still comes before anchor 0, which is no candidate (inside no box)."""
    priors = torch.tensor([[4.0, 4, 8, 8], [900, 4, 8, 8], [950, 4, 8, 8]], dtype=torch.float64)
    gt_boxes = torch.tensor([[890.0, 0, 960, 8], [4000, 0, 4001, 8]], dtype=torch.float64)
    boxes = torch.tensor([[0.0, 0, 8, 8], [3999, 0, 4001, 8], [940, 0, 960, 8]]).double()
    logits, labels = torch.zeros(3, 2, dtype=torch.float64), torch.tensor([0, 1])
    got = dynamic_soft_label_assign(priors, boxes, logits, gt_boxes, labels)
    assert got.gt_indices.tolist() == [-1, 1, 0]
    assert_same(got, dsl_reference(priors, boxes, logits, gt_boxes, labels, stable=True))
    got = dynamic_soft_label_assign(*(t.float() for t in (priors, boxes, logits, gt_boxes)), labels)
    assert got.gt_indices.tolist() == [-1, 1, 0]


def test_cost_ties_go_to_the_lower_anchor():
    """Anchors in pairs of equal cost (same distance to the centre, same box and logits),
    ``k = 3``: the tie at the third place goes to anchor 2, not 3."""
    x = torch.tensor([4.0, 12.0, 20.0, 28.0, 36.0, 44.0])
    priors = torch.stack([x, x * 0 + 4, x * 0 + 8, x * 0 + 8], 1).double()
    gt_boxes = torch.tensor([[0.0, 0.0, 48.0, 8.0]]).double()
    order = torch.tensor([2, 3, 1, 4, 0, 5])  # pairs at equal distance from the centre, 24
    priors = priors[order]
    boxes = torch.tensor([[0.0, 0.0, 40.0, 8.0]]).double().repeat(6, 1)  # IoU 5/6 each
    logits, labels = torch.zeros(6, 3).double(), torch.tensor([1])
    got = dynamic_soft_label_assign(priors, boxes, logits, gt_boxes, labels, topk=4)
    assert got.gt_indices.tolist() == [0, 0, 0, -1, -1, -1]
    want = dsl_reference(priors, boxes, logits, gt_boxes, labels, topk=4, stable=True)
    assert_same(got, want)
    for block_bytes in (1, 700):
        again = dynamic_soft_label_assign(
            priors, boxes, logits, gt_boxes, labels, topk=4, block_bytes=block_bytes
        )
        assert_same(again, want)


def test_no_objects_no_anchors_no_candidates():
    priors, boxes, logits, gt_boxes, labels = make_dsl_image(0, m=4)
    got = dynamic_soft_label_assign(priors, boxes, logits, gt_boxes[:0], labels[:0])
    assert (got.gt_indices == -1).all() and (got.labels == -1).all() and (got.max_ious == 0).all()
    got = dynamic_soft_label_assign(priors[:0], boxes[:0], logits[:0], gt_boxes, labels)
    assert got.gt_indices.shape == (0,)
    # A box between the points (4, 8, 12, 16...): none inside, no candidate.
    small = torch.tensor([[5.0, 5.0, 7.0, 7.0]], dtype=torch.float64)
    got = dynamic_soft_label_assign(priors, boxes, logits, small, labels[:1])
    assert_same(got, dsl_reference(priors, boxes, logits, small, labels[:1]))
    assert (got.gt_indices == -1).all()


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(logits=torch.zeros(4, 3)), ValueError, "same anchors"),
        (dict(logits=torch.zeros(5, 3, dtype=torch.long)), TypeError, "logits must be a floating"),
        (dict(gt_labels=torch.tensor([0, 3])), ValueError, r"gt_labels must be class .* got 3"),
        (dict(soft_center_radius=float("nan")), ValueError, "soft_center_radius"),
        (dict(topk=0), ValueError, "topk"),
        (dict(iou_weight=-2.0), ValueError, "iou_weight"),
        (dict(block_bytes=1.5), TypeError, "block_bytes"),
        (dict(logits=torch.full((5, 3), float("nan"))), ValueError, r"logits must be finite"),
        (dict(logits=torch.full((5, 3), -float("inf"))), ValueError, r"logits must be finite"),
        (dict(priors=torch.zeros(5, 4)), ValueError, r"priors' strides"),
    ],
)
def test_validation(change, error, match):
    args = dict(
        priors=torch.tensor([[0.0, 0.0, 8.0, 8.0]] * 5),
        boxes=torch.zeros(5, 4),
        logits=torch.zeros(5, 3),
        gt_boxes=torch.zeros(2, 4),
        gt_labels=torch.zeros(2, dtype=torch.long),
    )
    args.update(change)
    with pytest.raises(error, match=match):
        dynamic_soft_label_assign(**args)


@pytest.mark.slow
def test_compiles_fullgraph():
    inputs = make_dsl_image(2, m=6, dtype=torch.float32)

    def run(*args):
        return tuple(dynamic_soft_label_assign(*args, block_bytes=20000))

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, dynamic=True, backend="aot_eager")
    for got, want in zip(compiled(*inputs), run(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
