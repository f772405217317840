"""`task_aligned_assign` against ultralytics' ``TaskAlignedAssigner``.

The oracle is ``ultralytics/utils/tal.py`` (ultralytics 8.4, which always widens short box
sides to ``stride[1]`` in ``select_candidates_in_gts``); the classic rule (ultralytics before
8.4, TOOD) is that class with ``select_candidates_in_gts`` put back as ultralytics 8.3 wrote
it: an anchor point is inside when its four distances to the box sides exceed ``eps``.

Labels, boxes, the mask and the indices must be equal; the target scores equal up to a few
float32 ulps: on the CPU, ``Tensor.pow`` computes vectorized lanes (SLEEF) and the tail of a
loop (libm) to within 1 ulp of each other, and the two implementations put different pairs
in the tails.
"""

from __future__ import annotations

import math

import pytest
import torch

from visionblocks.ops import TaskAlignedAssigner, TaskAlignedTargets, task_aligned_assign

tal = pytest.importorskip("ultralytics.utils.tal")


class _Classic(tal.TaskAlignedAssigner):
    def select_candidates_in_gts(self, xy_centers, gt_bboxes, mask_gt, eps=1e-9):
        lt, rb = gt_bboxes[..., None, :2], gt_bboxes[..., None, 2:]
        deltas = torch.cat((xy_centers - lt, rb - xy_centers), dim=-1)  # (B, M, A, 4)
        return deltas.amin(-1) > eps


def _anchor_points(size: int, strides=(8, 16, 32)) -> torch.Tensor:
    points = []
    for s in strides:
        c = (torch.arange(size // s, dtype=torch.float32) + 0.5) * s
        y, x = torch.meshgrid(c, c, indexing="ij")
        points.append(torch.stack([x, y], -1).reshape(-1, 2))
    return torch.cat(points)


def _inputs(b=3, m=40, c=5, size=160, seed=0, max_side=80.0, pad_label=0.0):
    """Random images with between m/2 and m objects (the rest padding, ultralytics' zeros)."""
    g = torch.Generator().manual_seed(seed)
    points = _anchor_points(size)
    a = points.shape[0]
    centre = torch.rand(b, m, 2, generator=g) * size
    side = 2.0 + torch.rand(b, m, 2, generator=g) * max_side
    gt = torch.cat([centre - side / 2, centre + side / 2], -1).clamp(0, size)
    labels = torch.randint(0, c, (b, m, 1), generator=g).float()
    n = torch.randint(m // 2, m + 1, (b,), generator=g)
    mask = (torch.arange(m) < n[:, None]).unsqueeze(-1).float()
    gt, labels = gt * mask, torch.where(mask > 0, labels, pad_label)
    dist = torch.rand(b, a, 4, generator=g) * 30
    pred = torch.cat([points - dist[..., :2], points + dist[..., 2:]], -1)
    scores = torch.rand(b, a, c, generator=g)
    return scores, pred, points, labels, gt, mask


def _reference(inputs, *, classic=True, topk=13, alpha=1.0, beta=6.0, topk2=None, min_side=16):
    c = inputs[0].shape[-1]
    options = dict(topk=topk, num_classes=c, alpha=alpha, beta=beta, topk2=topk2)
    if classic:
        return _Classic(**options)(*inputs)
    return tal.TaskAlignedAssigner(stride=[min_side], **options)(*inputs)


def _assert_equal(ours: TaskAlignedTargets, ref) -> None:
    labels, boxes, scores, fg, index = ref
    assert torch.equal(ours.target_labels, labels.long())
    assert torch.equal(ours.target_bboxes, boxes)
    assert torch.equal(ours.fg_mask, fg)
    assert torch.equal(ours.target_gt_idx, index.long())
    assert ours.target_scores.dtype == scores.dtype
    torch.testing.assert_close(ours.target_scores, scores, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"topk": 10, "alpha": 0.5},
        {"topk": 10, "alpha": 0.5, "topk2": 4},
        {"topk": 3, "alpha": 2.0, "beta": 2.0, "topk2": 7},
    ],
)
@pytest.mark.parametrize("classic", [True, False])
def test_equals_ultralytics(seed, options, classic):
    inputs = _inputs(seed=seed)
    min_side = None if classic else 16.0
    ours = task_aligned_assign(*inputs, min_side=min_side, **options)
    _assert_equal(ours, _reference(inputs, classic=classic, **options))


def test_crowded_images_ties_and_shared_anchors():
    """Many large overlapping objects (most anchors inside several), duplicated objects (an
    anchor kept by two objects of equal CIoU goes to the first), objects smaller than a
    stride (fewer candidates than topk: zero metrics tie in ``topk``), padding labelled -1."""
    scores, pred, points, labels, gt, mask = _inputs(2, 60, 4, seed=3, max_side=150.0)
    gt[:, 10:20], labels[:, 10:20] = gt[:, :10], labels[:, :10]  # duplicates of 0..9
    centre = (gt[:, 20:30, :2] + gt[:, 20:30, 2:]) / 2
    gt[:, 20:30] = torch.cat([centre - 1.5, centre + 1.5], -1)  # 3-pixel objects
    mask[:, 20:30] = 1.0
    labels = torch.where(mask > 0, labels, -1.0)
    inputs = scores, pred, points, labels, gt, mask
    for classic, min_side in ((True, None), (False, 16.0)):
        ref = _reference(inputs, classic=classic, topk=10, alpha=0.5)
        ours = task_aligned_assign(*inputs, topk=10, alpha=0.5, min_side=min_side)
        _assert_equal(ours, ref)
        assert (ours.target_gt_idx[ours.fg_mask] >= 10).any()  # not every duplicate lost
    shared = ours.fg_mask & torch.isin(ours.target_gt_idx, torch.arange(10))
    assert shared.any()


def test_no_objects_and_empty_images():
    scores, pred, points, labels, gt, mask = _inputs(2, 6, 3)
    empty = task_aligned_assign(scores, pred, points, labels[:, :0], gt[:, :0], mask[:, :0])
    ref = _reference((scores, pred, points, labels[:, :0], gt[:, :0], mask[:, :0]))
    for ours, theirs in zip(empty, ref):
        assert torch.equal(ours, theirs.to(ours.dtype))  # ultralytics: float labels, indices
    assert empty.target_labels.dtype == empty.target_gt_idx.dtype == torch.long
    mask[1] = 0.0  # the second image has only padding
    ours = task_aligned_assign(scores, pred, points, labels, gt, mask)
    _assert_equal(ours, _reference((scores, pred, points, labels, gt, mask)))
    assert not ours.fg_mask[1].any() and ours.target_scores[1].eq(0).all()


def test_block_size_and_dense_path_give_the_same_result(monkeypatch):
    inputs = _inputs(seed=5)
    base = task_aligned_assign(*inputs, topk=10, topk2=5, min_side=16.0)
    one_row = task_aligned_assign(*inputs, topk=10, topk2=5, min_side=16.0, block_bytes=1)
    _assert_equal(one_row, base)  # scores within an ulp: the CPU's pow (module notes)
    # The dense path (CUDA, torch.compile) on the CPU: every pair rather than the candidates.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    dense = task_aligned_assign(*inputs, topk=10, topk2=5, min_side=16.0, block_bytes=2**16)
    _assert_equal(dense, base)


def test_half_inputs_are_computed_in_float32():
    scores, pred, points, labels, gt, mask = _inputs(seed=2)
    half = task_aligned_assign(scores.half(), pred.half(), points, labels, gt, mask)
    full = task_aligned_assign(scores.half().float(), pred.half().float(), points, labels, gt, mask)
    assert half.target_scores.dtype == torch.float32
    for x, y in zip(half, full):
        assert torch.equal(x, y)


def test_module_matches_function_and_returns_named_fields():
    inputs = _inputs(1, 5, 2)
    out = TaskAlignedAssigner(topk=4, alpha=0.5, min_side=8.0)(*inputs)
    expected = task_aligned_assign(*inputs, topk=4, alpha=0.5, min_side=8.0)
    for x, y in zip(out, expected):
        assert torch.equal(x, y)
    labels, boxes, scores, fg, index = out
    assert labels.shape == fg.shape == index.shape == (1, inputs[0].shape[1])
    assert boxes.shape[-1] == 4 and scores.shape == inputs[0].shape


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"gt_boxes": torch.zeros(1, 2, 5)}, ValueError, r"gt_boxes must have shape \(B, M, 4\)"),
        ({"gt_labels": torch.zeros(1, 2)}, ValueError, r"gt_labels must have shape \(B, M, 1\)"),
        ({"anchor_points": torch.zeros(3, 2)}, ValueError, r"anchor_points must have shape"),
        ({"scores": torch.zeros(1, 4, 2, dtype=torch.long)}, TypeError, "scores"),
        ({"topk": 5}, ValueError, r"topk must be at most the number of anchors \(4\), got 5"),
        ({"topk2": 0}, ValueError, "topk2"),
        ({"eps": 0.0}, ValueError, "eps"),
        ({"alpha": float("nan")}, ValueError, "alpha"),
        ({"min_side": -1.0}, ValueError, "min_side"),
        ({"block_bytes": 0}, ValueError, "block_bytes"),
    ],
)
def test_rejects_bad_arguments(change, error, match):
    x = torch.tensor([2.0, 6.0, 10.0, 14.0])
    kwargs = {
        "scores": torch.rand(1, 4, 2),
        "pred_boxes": torch.stack([x - 2, x * 0, x + 2, x * 0 + 4], 1)[None],
        "anchor_points": torch.stack([x, x * 0 + 2], 1),
        "gt_labels": torch.zeros(1, 2, 1),
        "gt_boxes": torch.tensor([[[0.0, 0.0, 8.0, 4.0], [8.0, 0.0, 16.0, 4.0]]]),
        "gt_mask": torch.ones(1, 2, 1),
        **change,
    }
    with pytest.raises(error, match=match):
        task_aligned_assign(**kwargs)


@pytest.mark.slow
def test_compiles_fullgraph_and_matches_eager():
    inputs = _inputs(2, 12, 3, size=96, seed=4)
    compiled = torch.compile(task_aligned_assign, fullgraph=True)
    out = compiled(*inputs, topk=5, alpha=0.5, topk2=3, min_side=16.0)
    _assert_equal(out, task_aligned_assign(*inputs, topk=5, alpha=0.5, topk2=3, min_side=16.0))


def _docstring_inputs():
    points = torch.tensor([[2.0, 2.0], [6.0, 2.0], [10.0, 2.0], [14.0, 2.0]])
    pred = torch.tensor([[[0.0, 0.0, 4.0, 4.0], [3.0, 0.0, 9.0, 4.0],
                          [8.0, 0.0, 12.0, 4.0], [12.0, 0.0, 16.0, 4.0]]])  # fmt: skip
    scores = torch.tensor([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.2, 0.6]]])
    gt_boxes = torch.tensor([[[0.0, 0.0, 8.0, 4.0], [8.0, 0.0, 16.0, 4.0]]])
    return scores, pred, points, gt_boxes


@pytest.mark.parametrize("bad", [-1.0, 1.7, 2.0, float("nan")])
def test_object_labels_outside_the_classes_are_refused(bad):
    # ultralytics reads -1 as class C - 1 (negative indexing) and truncates 1.7 to 1
    scores, pred, points, gt_boxes = _docstring_inputs()
    labels, mask = torch.tensor([[[0.0], [bad]]]), torch.ones(1, 2, 1)
    with pytest.raises(ValueError, match=r"gt_labels of the objects .* in \[0, 2\)"):
        task_aligned_assign(scores, pred, points, labels, gt_boxes, mask, topk=1)


def test_padding_labels_are_not_read():
    scores, pred, points, gt_boxes = _docstring_inputs()
    labels, mask = torch.tensor([[[5.0], [1.0]]]), torch.tensor([[[0.0], [1.0]]])
    out = task_aligned_assign(scores, pred, points, labels, gt_boxes, mask, topk=1)
    assert out.fg_mask.tolist() == [[False, False, True, False]]
    with pytest.raises(ValueError, match=r"eps must be a finite number, got inf"):
        task_aligned_assign(scores, pred, points, labels, gt_boxes, mask, topk=1, eps=math.inf)
