"""`simota_assign` against a float64 re-expression of mmdetection's ``SimOTAAssigner``.

Reference: open-mmlab/mmdetection, ``mmdet/models/task_modules/assigners/sim_ota_assigner.py``
(``assign``, ``get_in_gt_and_in_center_info``, ``dynamic_k_matching``; stored version at
commit 24be16ee321f5401d02a13ed3cf2d5552972c6b4) and ``bbox_overlaps`` of
``mmdet/structures/bbox/bbox_overlaps.py`` (``mode="iou"``, ``eps=1e-6``), written out here
since mmdet is not a test dependency: the candidates compacted by ``valid_mask``, the
``(candidates, M, C)`` one-hot BCE, one ``topk`` per object. Differences, all deliberate: the
BCE is taken in float64 (mmdetection casts it to float32), ``max_overlaps`` of background
anchors is 0 (mmdetection: ``-INF``) and objects are 0-based (``gt_inds - 1``). With
``stable=True`` the per-object ``topk`` is a stable sort, the tie rule of `simota_assign`.
`dynamic_k_reference` is shared with `tests/ops/test_dynamic_soft_label.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from visionblocks.ops import DynamicKAssignment, simota_assign

INF = 100000.0
EPS = 1e-7


def bbox_overlaps(boxes1, boxes2, eps=1e-6):
    """mmdetection's pairwise ``bbox_overlaps(..., mode="iou")``."""
    area1 = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    union = area1[:, None] + area2[None, :] - overlap
    return overlap / union.clamp(min=eps)


def dynamic_k_reference(cost, ious, topk, stable=False):
    """mmdetection's ``dynamic_k_matching``: (foreground mask, matched object, matched IoU)."""
    matching = torch.zeros_like(cost, dtype=torch.uint8)
    topk_ious = torch.topk(ious, min(topk, ious.shape[0]), dim=0).values
    dynamic_ks = torch.clamp(topk_ious.sum(0).int(), min=1)
    for j in range(cost.shape[1]):
        k = int(dynamic_ks[j])
        if stable:
            pos = torch.sort(cost[:, j], stable=True).indices[:k]
        else:
            pos = torch.topk(cost[:, j], k=k, largest=False).indices
        matching[pos, j] = 1
    several = matching.sum(1) > 1
    if several.any():
        argmin = cost[several].min(dim=1).indices
        matching[several] = 0
        matching[several.nonzero()[:, 0], argmin] = 1
    fg = matching.sum(1) > 0
    return fg, matching[fg].argmax(1), (matching * ious).sum(1)[fg]


def scatter_result(valid, fg, matched, ious, gt_labels, n):
    """mmdetection's conversion to ``AssignResult``, 0-based, background IoU 0."""
    gt = torch.full((n,), -1, dtype=torch.long)
    max_ious = torch.zeros(n, dtype=torch.float64)
    if fg is not None:  # else: nothing to assign
        where = valid.nonzero()[:, 0][fg]
        gt[where] = matched
        max_ious[where] = ious
    labels = torch.where(gt >= 0, gt_labels[gt.clamp(min=0)], -1)
    return gt, max_ious, labels


def simota_reference(
    priors,
    boxes,
    scores,
    gt_boxes,
    gt_labels,
    radius=2.5,
    topk=10,
    iou_w=3.0,
    cls_w=1.0,
    stable=False,
):
    priors, boxes, scores, gt_boxes = (t.double() for t in (priors, boxes, scores, gt_boxes))
    n, m = priors.shape[0], gt_boxes.shape[0]
    if n == 0 or m == 0:
        return scatter_result(torch.zeros(n, dtype=torch.bool), None, None, None, gt_labels, n)
    x, y, sx, sy = (priors[:, i : i + 1].repeat(1, m) for i in range(4))
    deltas = torch.stack(
        [x - gt_boxes[:, 0], y - gt_boxes[:, 1], gt_boxes[:, 2] - x, gt_boxes[:, 3] - y], dim=1
    )
    in_gts = deltas.min(dim=1).values > 0
    cx, cy = (gt_boxes[:, 0] + gt_boxes[:, 2]) / 2.0, (gt_boxes[:, 1] + gt_boxes[:, 3]) / 2.0
    cl, ct, cr, cb = cx - radius * sx, cy - radius * sy, cx + radius * sx, cy + radius * sy
    in_cts = torch.stack([x - cl, y - ct, cr - x, cb - y], dim=1).min(dim=1).values > 0
    valid = in_gts.any(1) | in_cts.any(1)
    both = in_gts[valid] & in_cts[valid]
    nv = int(valid.sum())
    if nv == 0:
        return scatter_result(valid, None, None, None, gt_labels, n)
    ious = bbox_overlaps(boxes[valid], gt_boxes)
    iou_cost = -torch.log(ious + EPS)
    onehot = F.one_hot(gt_labels, scores.shape[1]).double().unsqueeze(0).repeat(nv, 1, 1)
    repeated = scores[valid].unsqueeze(1).repeat(1, m, 1)
    cls_cost = F.binary_cross_entropy(repeated, onehot, reduction="none").sum(-1)
    cost = cls_cost * cls_w + iou_cost * iou_w + (~both) * INF
    fg, matched, matched_ious = dynamic_k_reference(cost, ious, topk, stable)
    return scatter_result(valid, fg, matched, matched_ious, gt_labels, n)


def make_priors(size=128, strides=(8, 16, 32), dtype=torch.float64):
    out = []
    for s in strides:
        c = (torch.arange(size // s, dtype=dtype) + 0.5) * s
        cy, cx = torch.meshgrid(c, c, indexing="ij")
        out.append(torch.stack([cx, cy, cx * 0 + s, cy * 0 + s], -1).reshape(-1, 4))
    return torch.cat(out)


def make_image(seed, m=8, c=5, crowded=False, size=128, dtype=torch.float64):
    """Priors, predicted boxes near them, probabilities, and ``m`` objects (crowded: all in
    one corner, several duplicated)."""
    g = torch.Generator().manual_seed(seed)
    priors = make_priors(size, dtype=dtype)
    a = priors.shape[0]
    centre = priors[:, :2] + torch.randn(a, 2, generator=g, dtype=dtype) * priors[:, 2:] * 0.5
    wh = priors[:, 2:] * torch.exp(torch.randn(a, 2, generator=g, dtype=dtype) * 0.7) * 2
    boxes = torch.cat([centre - wh / 2, centre + wh / 2], 1)
    scores = torch.rand(a, c, generator=g, dtype=dtype)
    span = 40.0 if crowded else size
    xy = torch.rand(m, 2, generator=g, dtype=dtype) * span
    gwh = 6 + torch.rand(m, 2, generator=g, dtype=dtype) * (30 if crowded else 60)
    gt_boxes = torch.cat([xy, xy + gwh], 1)
    if crowded and m > 3:
        gt_boxes[m // 2 :: 3] = gt_boxes[0]  # duplicates of object 0
    labels = torch.randint(0, c, (m,), generator=g)
    return priors, boxes, scores, gt_boxes, labels


def assert_same(got: DynamicKAssignment, want, exact=True):
    gt, ious, labels = want
    assert isinstance(got, DynamicKAssignment)
    assert got.gt_indices.dtype == torch.long and got.labels.dtype == torch.long
    torch.testing.assert_close(got.gt_indices, gt, rtol=0, atol=0)
    torch.testing.assert_close(got.labels, labels, rtol=0, atol=0)
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.max_ious.double(), ious, **tol)


@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_equals_mmdet_float64(seed, crowded):
    m = 40 if crowded else 3 + 3 * seed
    inputs = make_image(seed, m=m, crowded=crowded)
    want = simota_reference(*inputs)
    assert (want[0] >= 0).any()
    assert_same(simota_assign(*inputs), want)
    assert_same(simota_assign(*inputs, block_bytes=50_000), want)  # several blocks


@pytest.mark.parametrize("seed", range(4))
def test_options_equal_mmdet(seed):
    inputs = make_image(seed + 10, m=12, crowded=seed % 2 == 1)
    options = dict(center_radius=1.5, candidate_topk=4, iou_weight=1.0, cls_weight=2.0)
    want = simota_reference(*inputs, radius=1.5, topk=4, iou_w=1.0, cls_w=2.0)
    assert_same(simota_assign(*inputs, **options, block_bytes=30_000), want)


@pytest.mark.parametrize("seed", range(4))
def test_float32_and_half(seed):
    inputs = make_image(seed + 20, m=10, crowded=seed % 2 == 1, dtype=torch.float32)
    want = simota_reference(*inputs)
    got = simota_assign(*inputs)
    assert got.max_ious.dtype == torch.float32
    assert_same(got, want, exact=False)
    half = [t.half() if t.is_floating_point() else t for t in inputs]
    upcast = [t.float() if t.is_floating_point() else t for t in half]
    got = simota_assign(*half)
    assert got.max_ious.dtype == torch.float32
    for a, b in zip(got, simota_assign(*upcast), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cost_ties_go_to_the_lower_anchor():
    """Six anchors of equal cost, ``k = 3``: anchors 0, 1, 2 (``Tensor.topk`` may take any
    three: all its choices cost the same)."""
    x = torch.arange(6.0) * 8 + 4
    priors = torch.stack([x, x * 0 + 4, x * 0 + 8, x * 0 + 8], 1).double()
    gt_boxes = torch.tensor([[0.0, 0.0, 48.0, 8.0]]).double()
    boxes = gt_boxes.repeat(6, 1) * torch.tensor([1.0, 1.0, 0.6, 1.0]).double()  # IoU 0.6
    scores = torch.full((6, 3), 0.3).double()
    labels = torch.tensor([2])
    options = dict(radius=3.0, topk=5)  # every point inside the box and the centre region
    got = simota_assign(
        priors, boxes, scores, gt_boxes, labels, center_radius=3.0, candidate_topk=5
    )
    assert got.gt_indices.tolist() == [0, 0, 0, -1, -1, -1]
    assert_same(
        got, simota_reference(priors, boxes, scores, gt_boxes, labels, **options, stable=True)
    )
    topk = simota_reference(priors, boxes, scores, gt_boxes, labels, **options)[0]
    assert (topk >= 0).sum() == 3
    for block_bytes in (1, 2000):  # ties across blocks too
        again = simota_assign(
            priors,
            boxes,
            scores,
            gt_boxes,
            labels,
            center_radius=3.0,
            candidate_topk=5,
            block_bytes=block_bytes,
        )
        assert again.gt_indices.tolist() == [0, 0, 0, -1, -1, -1]


def test_anchor_taken_twice_goes_to_first_cheapest_object():
    """A duplicated object: every anchor costs the same for both, so both take the same
    anchors, which all go to the first (``Tensor.min``)."""
    priors, boxes, scores, gt_boxes, labels = make_image(3, m=2)
    gt_boxes[1], labels[1] = gt_boxes[0], labels[0]
    got = simota_assign(priors, boxes, scores, gt_boxes, labels)
    assert (got.gt_indices == 0).any() and not (got.gt_indices == 1).any()
    assert_same(got, simota_reference(priors, boxes, scores, gt_boxes, labels))
    assert_same(simota_assign(priors, boxes, scores, gt_boxes, labels, block_bytes=2000), got)


def test_no_objects_no_anchors_no_candidates():
    priors, boxes, scores, gt_boxes, labels = make_image(0, m=4)
    got = simota_assign(priors, boxes, scores, gt_boxes[:0], labels[:0])
    assert (got.gt_indices == -1).all() and (got.labels == -1).all() and (got.max_ious == 0).all()
    assert got.gt_indices.shape == (priors.shape[0],)
    got = simota_assign(priors[:0], boxes[:0], scores[:0], gt_boxes, labels)
    assert got.gt_indices.shape == (0,) and got.max_ious.dtype == torch.float64
    # An object away from every point and beyond 2.5 strides of all of them: no candidate.
    far = torch.tensor([[500.0, 500.0, 510.0, 510.0]], dtype=torch.float64)
    got = simota_assign(priors, boxes, scores, far, labels[:1])
    assert_same(got, simota_reference(priors, boxes, scores, far, labels[:1]))
    assert (got.gt_indices == -1).all()


def test_inputs_are_not_modified_and_carry_no_gradient():
    inputs = make_image(1, m=5)
    boxes = inputs[1].clone().requires_grad_()
    copies = [t.clone() for t in inputs]
    got = simota_assign(inputs[0], boxes, *inputs[2:])
    assert not got.max_ious.requires_grad
    for a, b in zip((inputs[0], boxes, *inputs[2:]), copies, strict=True):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(priors=torch.zeros(5, 3)), ValueError, "priors must have shape"),
        (dict(boxes=torch.zeros(4, 4)), ValueError, "same anchors"),
        (dict(scores=torch.zeros(5)), ValueError, "scores must have shape"),
        (dict(gt_boxes=torch.zeros(2, 5)), ValueError, "gt_boxes must have shape"),
        (dict(gt_labels=torch.zeros(3, dtype=torch.long)), ValueError, "gt_labels must have shape"),
        (dict(gt_labels=torch.zeros(2)), TypeError, "gt_labels must hold class indices"),
        (dict(gt_labels=torch.tensor([0, 3])), ValueError, r"gt_labels must be class .* got 3"),
        (dict(gt_labels=torch.tensor([-1, 0])), ValueError, r"\[0, 3\).* got -1"),
        (dict(boxes=torch.zeros(5, 4, dtype=torch.long)), TypeError, "boxes must be a floating"),
        (dict(gt_boxes=torch.zeros(2, 4, device="meta")), ValueError, "same device"),
        (dict(center_radius=-1.0), ValueError, "center_radius"),
        (dict(candidate_topk=0), ValueError, "candidate_topk"),
        (dict(candidate_topk=2.0), TypeError, "candidate_topk"),
        (dict(iou_weight=float("nan")), ValueError, "iou_weight"),
        (dict(cls_weight=-1.0), ValueError, "cls_weight"),
        (dict(block_bytes=0), ValueError, "block_bytes"),
        (
            dict(priors=torch.tensor([[0.0, 0.0, 8.0, 0.0]] * 5)),
            ValueError,
            r"strides .* finite and > 0, got values in \[0.0, 8.0\]",
        ),
        (
            dict(priors=torch.tensor([[0.0, 0.0, float("inf"), 8.0]] * 5)),
            ValueError,
            "priors' strides",
        ),
    ],
)
def test_validation(change, error, match):
    args = dict(
        priors=torch.tensor([[0.0, 0.0, 8.0, 8.0]] * 5),
        boxes=torch.zeros(5, 4),
        scores=torch.zeros(5, 3),
        gt_boxes=torch.zeros(2, 4),
        gt_labels=torch.zeros(2, dtype=torch.long),
    )
    args.update(change)
    with pytest.raises(error, match=match):
        simota_assign(**args)


@pytest.mark.slow
def test_compiles_fullgraph():
    inputs = make_image(2, m=6, dtype=torch.float32)

    def run(*args):
        return tuple(simota_assign(*args, block_bytes=20000))

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, dynamic=True, backend="aot_eager")
    for got, want in zip(compiled(*inputs), run(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(3))
def test_dense_path_equals_candidates_first(seed, monkeypatch):
    """On the CPU the candidates are gathered first; elsewhere (CUDA, compiled) every anchor
    runs, masked: the same results, bit for bit."""
    import visionblocks.ops.dynamic_soft_label as dsl
    import visionblocks.ops.simota as simota

    inputs = make_image(seed + 30, m=15, crowded=seed == 1, dtype=torch.float32)
    logits = torch.logit(inputs[2].clamp(1e-3, 1 - 1e-3))
    dsl_inputs = (inputs[0], inputs[1], logits, *inputs[3:])
    want = simota_assign(*inputs, block_bytes=40_000)
    want_dsl = dsl.dynamic_soft_label_assign(*dsl_inputs, block_bytes=40_000)
    monkeypatch.setattr(simota, "reads_values", lambda *t: False)
    for a, b in zip(simota_assign(*inputs, block_bytes=40_000), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    got = dsl.dynamic_soft_label_assign(*dsl_inputs, block_bytes=40_000)
    for a, b in zip(got, want_dsl, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
