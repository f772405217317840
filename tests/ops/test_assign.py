"""Anchor assignment without the IoU matrix: `best_box_iou`, `match_anchors`, `atss_assign`.

References: the full matrix (`box_iou`) reduced with ``torch.max``; torchvision's ``Matcher``
run on that matrix; mmdetection's ``ATSSAssigner.assign`` written out on the full matrices
(here, since mmdet is not a test dependency). Each test runs on both paths (``impl``
fixture: the torch blocks, and the Triton kernels in the interpreter) where the op has both.
"""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection._utils import Matcher

import visionblocks.ops.assign as assign_module
from visionblocks.ops import (
    BELOW_LOW_THRESHOLD,
    BETWEEN_THRESHOLDS,
    atss_assign,
    best_box_iou,
    box_iou,
    match_anchors,
)


def random_boxes(n: int, seed: int, size: float = 40.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 100
    return torch.cat([xy, xy + 2 + torch.rand(n, 2, generator=g) * size], 1).to(dtype)


def grid_anchors(step: float = 4.0, count: int = 12, sizes=(8.0, 16.0)) -> torch.Tensor:
    """Anchors on a grid, several sizes per location: exact IoUs (0.5, 0.25...) and ties."""
    centres = torch.arange(count, dtype=torch.float32) * step + step / 2
    cy, cx = torch.meshgrid(centres, centres, indexing="ij")
    out = []
    for s in sizes:
        for ratio in (0.5, 1.0, 2.0):
            w, h = s * ratio**0.5, s / ratio**0.5
            out.append(torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1))
    return torch.stack(out, 2).reshape(-1, 4)


def tie_boxes() -> torch.Tensor:
    """Objects that tie: a duplicate, boxes on the anchor grid, and one far away."""
    base = torch.tensor(
        [
            [0.0, 0.0, 8.0, 8.0],
            [0.0, 0.0, 8.0, 8.0],  # duplicate of 0: every anchor ties between 0 and 1
            [4.0, 0.0, 12.0, 8.0],  # half-overlaps 0: IoU exactly 1/3 with it
            [8.0, 8.0, 24.0, 24.0],
            [2.0, 2.0, 6.0, 6.0],
            [200.0, 200.0, 210.0, 210.0],  # touches no anchor: its best IoU is 0
        ]
    )
    return base


def full_reference(anchors, boxes, eps=1e-7):
    iou = box_iou(anchors, boxes, eps=eps)
    values, indices = iou.max(dim=1)
    return values, indices, iou.max(dim=0).values


def match(anchors, boxes, high, low, allow=False, **options):
    """`match_anchors` with its keyword arguments given by position (``Matcher``'s order)."""
    return match_anchors(
        anchors, boxes=boxes, high_threshold=high, low_threshold=low,
        allow_low_quality_matches=allow, **options,
    )  # fmt: skip


def assert_same(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(a, e), (a, e)


CASES = {
    "random": lambda: (random_boxes(300, 0), random_boxes(23, 1)),
    "grid": lambda: (grid_anchors(), tie_boxes()),
    "grid_random": lambda: (grid_anchors(), random_boxes(40, 2, 20.0)),
    "one_anchor": lambda: (random_boxes(1, 3), random_boxes(5, 4)),
    "one_box": lambda: (random_boxes(70, 5), random_boxes(1, 6)),
}


# ---------------------------------------------------------------------------- best_box_iou


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("block_bytes", [1, 5000, None])
def test_best_box_iou_equals_the_matrix_reduced(case, block_bytes, impl):
    anchors, boxes = CASES[case]()
    got = best_box_iou(anchors, boxes, block_bytes=block_bytes, impl=impl)
    assert_same(got, full_reference(anchors, boxes))


@pytest.mark.parametrize(
    ("adtype", "bdtype"),
    [
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float32),
        (torch.int64, torch.int32),
        (torch.int32, torch.float64),
    ],
)
def test_best_box_iou_dtypes_follow_box_iou(adtype, bdtype, impl):
    anchors, boxes = (grid_anchors() * 4).to(adtype), (tie_boxes() * 4).to(bdtype)
    got = best_box_iou(anchors, boxes, block_bytes=3000, impl=impl)
    expected = full_reference(anchors, boxes)
    assert got.anchor_values.dtype == box_iou(anchors, boxes).dtype
    assert_same(got, expected)


def test_ties_go_to_the_first_object_as_torch_max_documents(impl):
    # torch.max(dim) returns "the indices of the first maximal value"; Matcher relies on it.
    anchors, boxes = grid_anchors(), tie_boxes()
    iou = box_iou(anchors, boxes)
    assert torch.equal(iou[:, 0], iou[:, 1])
    got = best_box_iou(anchors, boxes, block_bytes=2000, impl=impl)
    assert not (got.anchor_indices == 1).any()  # 1 duplicates 0: never chosen
    untouched = iou.amax(1) == 0
    assert untouched.any() and (got.anchor_indices[untouched] == 0).all()
    # Between different objects with equal IoU, the lower index too.
    tied = (iou == iou.amax(1, keepdim=True)).sum(1) > 1
    first = (iou == iou.amax(1, keepdim=True)).float().argmax(1)
    assert tied.sum() > len(anchors) // 4
    assert torch.equal(got.anchor_indices[tied], first[tied])


def test_empty_inputs(impl):
    anchors, boxes = random_boxes(5, 0), random_boxes(3, 1)
    none = best_box_iou(anchors, boxes[:0], impl=impl)
    assert torch.equal(none.anchor_values, torch.zeros(5))
    assert torch.equal(none.anchor_indices, torch.full((5,), -1))
    assert none.box_values.shape == (0,)
    empty = best_box_iou(anchors[:0], boxes, impl=impl)
    assert empty.anchor_values.shape == empty.anchor_indices.shape == (0,)
    assert torch.equal(empty.box_values, torch.zeros(3))


def test_nan_boxes_follow_torch_max(impl):
    anchors, boxes = random_boxes(50, 0), random_boxes(6, 1)
    anchors[3, 1] = float("nan")
    boxes[4, 2] = float("nan")
    got = best_box_iou(anchors, boxes, block_bytes=1000, impl=impl)
    expected = full_reference(anchors, boxes)
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a.isnan(), e.isnan())
        assert torch.equal(a.nan_to_num(-7.0), e.nan_to_num(-7.0))


def test_blocks_hold_at_most_block_bytes(monkeypatch):
    rows_seen = []
    real = assign_module._overlap

    def spy(a, b, *args):
        rows_seen.append(a.shape[0])
        return real(a, b, *args)

    monkeypatch.setattr(assign_module, "_overlap", spy)
    anchors, boxes = random_boxes(1000, 0), random_boxes(50, 1)
    budget = 50 * 6 * 4 * 7  # seven anchors' worth of temporaries
    got = best_box_iou(anchors, boxes, block_bytes=budget, impl="torch")
    assert max(rows_seen) == 7 and sum(rows_seen) == 1000
    assert_same(got, full_reference(anchors, boxes))
    rows_seen.clear()
    match(anchors, boxes, 0.5, 0.4, True, block_bytes=budget, impl="torch")
    assert max(rows_seen) <= 7 and sum(rows_seen) == 2000  # two passes


def test_results_carry_no_gradient():
    anchors = random_boxes(10, 0).requires_grad_()
    got = best_box_iou(anchors, random_boxes(3, 1))
    assert not any(t.requires_grad for t in got)


# --------------------------------------------------------------------------- match_anchors

THRESHOLDS = [(0.5, 0.4), (0.7, 0.3), (0.5, 0.5), (0.3, 0.0), (1.0, 1.0)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("high", "low"), THRESHOLDS)
@pytest.mark.parametrize("allow", [False, True])
def test_match_anchors_equals_torchvision_matcher(case, high, low, allow, impl):
    anchors, boxes = CASES[case]()
    expected = Matcher(high, low, allow)(box_iou(anchors, boxes).T)
    got = match(anchors, boxes, high, low, allow, block_bytes=4000, impl=impl)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)


def test_match_anchors_exact_thresholds_on_the_grid(impl):
    # Grid anchors give IoUs of exactly 0.5 and 1/3: ">= high" and "< low" must hold exactly.
    anchors = torch.tensor([[0.0, 0.0, 8.0, 8.0], [4.0, 0.0, 12.0, 8.0], [0.0, 0.0, 16.0, 8.0]])
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0], [8.0, 0.0, 16.0, 8.0]])
    iou = box_iou(anchors, boxes)
    assert iou[2, 0] == 0.5 and iou[1, 0] == iou[1, 1] == 1 / 3
    for high, low in [(0.5, 0.4), (0.6, 0.5), (0.5, 1 / 3)]:
        for allow in (False, True):
            expected = Matcher(high, low, allow)(iou.T)
            got = match(anchors, boxes, high, low, allow, impl=impl)
            assert torch.equal(got, expected), (high, low, allow)
    assert match(anchors, boxes, 0.5, 0.4, impl=impl).tolist() == [0, -1, 0]


def test_match_anchors_all_below_threshold(impl):
    anchors, boxes = random_boxes(200, 0, 5.0), random_boxes(4, 1, 5.0) + 1000
    for allow in (False, True):
        expected = Matcher(0.5, 0.4, allow)(box_iou(anchors, boxes).T)
        got = match(anchors, boxes, 0.5, 0.4, allow, impl=impl)
        assert torch.equal(got, expected)
    # All IoUs are 0, every object's best is 0: low-quality matching gives every anchor
    # back its first object (Matcher's rule, kept as is).
    assert (match(anchors, boxes, 0.5, 0.4, impl=impl) == BELOW_LOW_THRESHOLD).all()
    assert (match(anchors, boxes, 0.5, 0.4, True, impl=impl) == 0).all()


def test_match_anchors_empty_inputs(impl):
    anchors, boxes = random_boxes(6, 0), random_boxes(3, 1)
    # torchvision's Matcher refuses an empty matrix; its detection models fill -1 for an
    # image without objects (RetinaNet.compute_loss, FCOS, SSD), which is what we return.
    with pytest.raises(ValueError, match="No ground-truth boxes"):
        Matcher(0.5, 0.4)(box_iou(anchors, boxes[:0]).T)
    for allow in (False, True):
        got = match(anchors, boxes[:0], 0.5, 0.4, allow, impl=impl)
        assert torch.equal(got, torch.full((6,), -1))
        empty = match(anchors[:0], boxes, 0.5, 0.4, allow, impl=impl)
        assert empty.shape == (0,) and empty.dtype == torch.int64
    with pytest.raises(ValueError, match="No proposal boxes"):
        Matcher(0.5, 0.4)(box_iou(anchors[:0], boxes).T)


def test_match_anchors_nan_boxes_as_matcher(impl):
    anchors, boxes = random_boxes(80, 0), random_boxes(6, 1)
    anchors[5, 0] = float("nan")
    boxes[2, 3] = float("nan")
    for allow in (False, True):
        expected = Matcher(0.5, 0.4, allow)(box_iou(anchors, boxes).T)
        got = match(anchors, boxes, 0.5, 0.4, allow, block_bytes=2000, impl=impl)
        assert torch.equal(got, expected)


def test_constants_are_torchvisions():
    assert BELOW_LOW_THRESHOLD == Matcher.BELOW_LOW_THRESHOLD
    assert BETWEEN_THRESHOLDS == Matcher.BETWEEN_THRESHOLDS


def test_threshold_errors():
    anchors, boxes = random_boxes(3, 0), random_boxes(2, 1)
    with pytest.raises(ValueError, match="low_threshold must be <= high_threshold"):
        match(anchors, boxes, 0.4, 0.5)
    with pytest.raises(TypeError, match="allow_low_quality_matches"):
        match(anchors, boxes, 0.5, 0.4, 1)
    with pytest.raises(ValueError, match=r"anchors must have shape \(N, 4\)"):
        match(anchors[None], boxes, 0.5, 0.4)
    for high, low in [(1.5, 0.4), (0.5, -0.1), (float("nan"), 0.4), (float("inf"), 0.4)]:
        name = "high_threshold" if low == 0.4 else "low_threshold"
        with pytest.raises(ValueError, match=rf"{name} must be in \[0.0, 1.0\], got"):
            match(anchors, boxes, high, low)
    assert match(anchors, boxes, 1.0, 1.0).shape == (3,)  # the bounds are allowed


def test_arguments_after_anchors_are_keyword_only():
    # box_iou(gt, anchors) and Matcher take the objects first: the swapped call, whose
    # (M,) result has the wrong shape, must not run; nor may boxes and thresholds by position.
    anchors, gt = random_boxes(30, 0), random_boxes(4, 1)
    with pytest.raises(TypeError, match="positional"):
        match_anchors(gt, anchors, 0.5, 0.4)  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        match_anchors(anchors, gt, high_threshold=0.5, low_threshold=0.4)  # type: ignore[misc]
    got = match_anchors(anchors, boxes=gt, high_threshold=0.5, low_threshold=0.4)
    assert got.shape == (30,)


# ----------------------------------------------------------------------------- atss_assign


def atss_reference(anchors, boxes, levels, topk, stable=True):
    """mmdetection's ATSSAssigner.assign on the full matrices (its INF constant, its
    flattened indexing), with ``box_iou``; ``stable``: distance ties to the lower index."""
    inf = 100000000
    a, b = anchors.float(), boxes.float()
    n, m = len(a), len(b)
    assigned = torch.full((n,), -1, dtype=torch.long)
    if n == 0 or m == 0:
        return assigned
    overlaps = box_iou(a, b)
    gt_points = torch.stack([(b[:, 0] + b[:, 2]) / 2.0, (b[:, 1] + b[:, 3]) / 2.0], dim=1)
    cx, cy = (a[:, 0] + a[:, 2]) / 2.0, (a[:, 1] + a[:, 3]) / 2.0
    points = torch.stack([cx, cy], dim=1)
    distances = (points[:, None, :] - gt_points[None, :, :]).pow(2).sum(-1).sqrt()
    candidate_idxs, start = [], 0
    for size in levels:
        end = start + size
        k = min(topk, size)
        level = distances[start:end, :]
        if stable:
            idxs = torch.sort(level, dim=0, stable=True).indices[:k]
        else:
            idxs = level.topk(k, dim=0, largest=False).indices
        candidate_idxs.append(idxs + start)
        start = end
    candidate_idxs = torch.cat(candidate_idxs, dim=0)
    candidate_overlaps = overlaps[candidate_idxs, torch.arange(m)]
    threshold = candidate_overlaps.mean(0) + candidate_overlaps.std(0)
    is_pos = candidate_overlaps >= threshold[None, :]
    for gt_idx in range(m):
        candidate_idxs[:, gt_idx] += gt_idx * n
    ep_cx = cx.view(1, -1).expand(m, n).contiguous().view(-1)
    ep_cy = cy.view(1, -1).expand(m, n).contiguous().view(-1)
    candidate_idxs = candidate_idxs.view(-1)
    left = ep_cx[candidate_idxs].view(-1, m) - b[:, 0]
    top = ep_cy[candidate_idxs].view(-1, m) - b[:, 1]
    right = b[:, 2] - ep_cx[candidate_idxs].view(-1, m)
    bottom = b[:, 3] - ep_cy[candidate_idxs].view(-1, m)
    is_in_gts = torch.stack([left, top, right, bottom], dim=1).min(dim=1)[0] > 0.01
    is_pos = is_pos & is_in_gts
    overlaps_inf = torch.full_like(overlaps, -inf).t().contiguous().view(-1)
    index = candidate_idxs.view(-1)[is_pos.view(-1)]
    overlaps_inf[index] = overlaps.t().contiguous().view(-1)[index]
    overlaps_inf = overlaps_inf.view(m, -1).t()
    max_overlaps, argmax_overlaps = overlaps_inf.max(dim=1)
    keep = max_overlaps != -inf
    assigned[keep] = argmax_overlaps[keep]
    return assigned


def pyramid(image: int = 64, strides=(8, 16, 32), scale: float = 4.0):
    """ATSS's anchors: one square anchor of ``scale x stride`` per location and level."""
    anchors, levels = [], []
    for s in strides:
        centres = torch.arange(0, image, s, dtype=torch.float32) + s / 2
        cy, cx = torch.meshgrid(centres, centres, indexing="ij")
        half = scale * s / 2
        anchors.append(torch.stack([cx - half, cy - half, cx + half, cy + half], -1).reshape(-1, 4))
        levels.append(anchors[-1].shape[0])
    return torch.cat(anchors), levels


@pytest.mark.parametrize("topk", [1, 3, 9, 100])
@pytest.mark.parametrize("block_bytes", [1, 3000, None])
def test_atss_equals_mmdetection_on_the_anchor_pyramid(topk, block_bytes):
    anchors, levels = pyramid()
    boxes = torch.cat([random_boxes(12, 7, 30.0) * 0.6, tie_boxes()[:5] * 2])
    got = atss_assign(anchors, boxes, levels, topk, block_bytes=block_bytes)
    expected = atss_reference(anchors, boxes, levels, topk)
    assert torch.equal(got, expected)
    assert (got >= 0).sum() >= 8  # a real test: positives for many objects


def test_atss_equals_topk_where_there_are_no_distance_ties():
    anchors = random_boxes(500, 3, 30.0)
    boxes = random_boxes(15, 4, 30.0)
    levels = [300, 150, 50]
    expected = atss_reference(anchors, boxes, levels, 9, stable=False)
    assert torch.equal(atss_assign(anchors, boxes, levels, 9, block_bytes=2000), expected)
    assert (expected >= 0).any()


def test_atss_distance_ties_go_to_the_lower_index():
    # Four anchors at the same distance from the object's centre; topk=2 takes the first two.
    anchors = torch.tensor(
        [[0.0, 0.0, 4.0, 4.0], [4.0, 0.0, 8.0, 4.0], [0.0, 4.0, 4.0, 8.0], [4.0, 4.0, 8.0, 8.0]]
    )
    boxes = torch.tensor([[1.0, 1.0, 7.0, 7.0]])
    got = atss_assign(anchors, boxes, [4], topk=2)
    # The two candidates tie in IoU: mean + std = their IoU, both reach it.
    assert got.tolist() == [0, 0, -1, -1]
    assert torch.equal(got, atss_reference(anchors, boxes, [4], 2))


def test_atss_empty_levels_and_inputs():
    anchors, levels = pyramid(32)
    boxes = random_boxes(3, 0, 20.0) * 0.3
    with_empty = [levels[0], 0, *levels[1:]]
    assert torch.equal(
        atss_assign(anchors, boxes, with_empty, 4), atss_reference(anchors, boxes, levels, 4)
    )
    assert torch.equal(atss_assign(anchors, boxes[:0], levels), torch.full((len(anchors),), -1))
    assert atss_assign(anchors[:0], boxes, [0, 0]).shape == (0,)


def test_atss_level_errors():
    anchors, boxes = random_boxes(10, 0), random_boxes(2, 1)
    with pytest.raises(ValueError, match=r"must add up to the number of anchors \(10\)"):
        atss_assign(anchors, boxes, [4, 5])
    with pytest.raises(ValueError, match=r"num_anchors_per_level\[1\] must be in"):
        atss_assign(anchors, boxes, [11, -1])
    with pytest.raises(TypeError, match="num_anchors_per_level must be a list or tuple"):
        atss_assign(anchors, boxes, 10)


# ------------------------------------------------------------------------- compile, devices


def test_compiles_fullgraph_with_several_blocks():
    anchors, boxes = random_boxes(60, 0), random_boxes(7, 1)

    def run(a, b):
        best = best_box_iou(a, b, block_bytes=2700, impl="torch")
        matches = match_anchors(
            a, boxes=b, high_threshold=0.5, low_threshold=0.3, allow_low_quality_matches=True,
            block_bytes=2700, impl="torch",
        )  # fmt: skip
        atss = atss_assign(a, b, [40, 20], topk=5, block_bytes=2700)
        return (*best, matches, atss)

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(anchors, boxes), run(anchors, boxes), strict=True):
        assert torch.equal(got, want)


def test_no_host_reads_on_fake_cuda():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tests.package.test_fake_cuda import no_driver

    with FakeTensorMode(allow_non_fake_inputs=False):
        anchors, boxes = random_boxes(50, 0).to("cuda"), random_boxes(5, 1).to("cuda")
        with no_driver():
            best = best_box_iou(anchors, boxes, block_bytes=300)
            matches = match_anchors(
                anchors, boxes=boxes, high_threshold=0.5, low_threshold=0.4,
                allow_low_quality_matches=True, block_bytes=300,
            )  # fmt: skip
            atss = atss_assign(anchors, boxes, [30, 20], 4, block_bytes=300)
    assert best.anchor_values.shape == (50,) and best.box_values.shape == (5,)
    assert matches.shape == atss.shape == (50,)
    assert all(t.device.type == "cuda" for t in (*best, matches, atss))


def test_atss_refuses_a_single_candidate_per_object():
    # mmdetection's unbiased std of one IoU is NaN, and then no anchor is ever positive
    anchors = torch.tensor([[0.0, 0.0, 8.0, 8.0], [0.0, 0.0, 8.0, 8.0]])  # IoUs 1, 1: std 0
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0]])
    with pytest.raises(ValueError, match=r"at least 2 candidates per object.*got 1 \(topk=1"):
        atss_assign(anchors, boxes, [2], topk=1)
    assert atss_assign(anchors, boxes, [2], topk=2).tolist() == [0, 0]
    assert atss_assign(anchors, boxes, [1, 1], topk=1).tolist() == [0, 0]  # 2 levels
