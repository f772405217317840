"""Numerics of the IoU family: torchvision oracle, properties, degenerate boxes, chunking."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.ops as tvo
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close, gradcheck
from tests.ops.test_boxes import random_boxes
from visionblocks.ops import _box_iou
from visionblocks.ops.boxes import (
    box_iou,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
)

PAIRS = [
    (box_iou, tvo.box_iou),
    (generalized_box_iou, tvo.generalized_box_iou),
    (distance_box_iou, tvo.distance_box_iou),
    (complete_box_iou, tvo.complete_box_iou),
]
IDS = ["iou", "giou", "diou", "ciou"]
FUNCTIONS = [ours for ours, _ in PAIRS]


def tv_batched(tv_fn, boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """torchvision on 2-D inputs, looped over the (broadcast) batch dims."""
    batch = torch.broadcast_shapes(boxes1.shape[:-2], boxes2.shape[:-2])
    b1 = boxes1.expand(*batch, *boxes1.shape[-2:]).reshape(-1, *boxes1.shape[-2:])
    b2 = boxes2.expand(*batch, *boxes2.shape[-2:]).reshape(-1, *boxes2.shape[-2:])
    out = torch.stack([tv_fn(x, y) for x, y in zip(b1, b2)])
    return out.reshape(*batch, boxes1.shape[-2], boxes2.shape[-2])


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Force many chunks: at most ``elements`` elements per N×M temporary."""

    def set_budget(elements: int) -> None:
        monkeypatch.setattr(_box_iou, "CHUNK_ELEMENTS", elements)
        monkeypatch.setattr(_box_iou, "CUDA_CHUNK_ELEMENTS", elements)

    return set_budget


# --- torchvision oracle -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shape1,shape2",
    [((7, 4), (5, 4)), ((3, 7, 4), (3, 5, 4)), ((2, 3, 6, 4), (2, 3, 1, 4)), ((7, 4), (3, 5, 4))],
)
@pytest.mark.parametrize("ours,tv", PAIRS, ids=IDS)
def test_pairwise_matches_torchvision(ours, tv, shape1, shape2, dtype):
    boxes1, boxes2 = (
        random_boxes(*shape1[:-1], dtype=dtype),
        random_boxes(*shape2[:-1], dtype=dtype),
    )
    actual = ours(boxes1, boxes2)
    assert actual.dtype == dtype
    assert_close(actual, tv_batched(tv, boxes1, boxes2))


@pytest.mark.parametrize("ours,tv", PAIRS, ids=IDS)
def test_pairwise_matches_torchvision_chunked_and_non_contiguous(ours, tv, tiny_chunks):
    tiny_chunks(10)
    boxes1 = random_boxes(9, 4).transpose(0, 1)  # (4, 9, 4), non-contiguous
    assert not boxes1.is_contiguous()
    boxes2 = random_boxes(4, 4, 6)[:, 1]  # a strided slice
    assert not boxes2.is_contiguous()
    assert_close(ours(boxes1, boxes2), tv_batched(tv, boxes1, boxes2))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("ours,tv", PAIRS, ids=IDS)
def test_integer_boxes_as_torchvision(ours, tv, dtype):
    boxes1 = random_boxes(6).round().to(dtype)
    boxes2 = random_boxes(5).round().to(dtype)
    actual = ours(boxes1, boxes2)
    assert actual.dtype == torch.float32
    assert_close(actual, tv(boxes1.long(), boxes2.long()).float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ours,tv", PAIRS, ids=IDS)
def test_half_boxes_compute_in_float32(ours, tv, dtype):
    boxes1, boxes2 = random_boxes(6, dtype=dtype), random_boxes(5, dtype=dtype)
    actual = ours(boxes1, boxes2)
    assert actual.dtype == torch.float32
    # Same as torchvision on the upcast boxes (torchvision subtracts corners in half first).
    assert_close(actual, tv(boxes1.float(), boxes2.float()))
    assert ours(boxes1, boxes1, aligned=True).dtype == torch.float32


def test_mixed_dtypes_promote():
    out = box_iou(random_boxes(3, dtype=torch.float32), random_boxes(2, dtype=torch.float64))
    assert out.dtype == torch.float64


# --- aligned -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_aligned_is_the_diagonal_of_pairwise(fn, dtype):
    boxes1, boxes2 = random_boxes(2, 6, dtype=dtype), random_boxes(2, 6, dtype=dtype)
    aligned = fn(boxes1, boxes2, aligned=True)
    assert aligned.shape == (2, 6) and aligned.dtype == dtype
    assert_close(aligned, fn(boxes1, boxes2).diagonal(dim1=-2, dim2=-1))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_aligned_broadcasts(fn):
    preds, target = random_boxes(5), random_boxes(1)
    assert_close(fn(preds, target, aligned=True), fn(preds, target)[:, 0])
    assert fn(random_boxes(4), random_boxes(4), aligned=True).shape == (4,)
    assert fn(random_boxes(), random_boxes(), aligned=True).shape == ()  # one box, (4,)


# --- properties ----------------------------------------------------------------------------

_coord = st.floats(-100, 100, allow_nan=False, width=32)
_side = st.floats(-20, 100, allow_nan=False, width=32)
_box = st.tuples(_coord, _coord, _side, _side)  # (x, y, w, h): zero-area and inverted too


def _xyxy(boxes: list) -> torch.Tensor:
    b = torch.tensor(boxes, dtype=torch.float64)
    return torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], dim=-1)


@settings(max_examples=60, deadline=None)
@given(st.lists(_box, min_size=1, max_size=6), st.lists(_box, min_size=1, max_size=6))
def test_properties(list1, list2):
    boxes1, boxes2 = _xyxy(list1), _xyxy(list2)
    iou = box_iou(boxes1, boxes2)
    giou = generalized_box_iou(boxes1, boxes2)
    diou = distance_box_iou(boxes1, boxes2)
    ciou = complete_box_iou(boxes1, boxes2)
    tol = 1e-9
    for value in (iou, giou, diou, ciou):
        assert torch.isfinite(value).all()
    torch.testing.assert_close(iou, box_iou(boxes2, boxes1).T)
    torch.testing.assert_close(giou, generalized_box_iou(boxes2, boxes1).T)
    assert ((iou >= 0) & (iou <= 1 + tol)).all()
    assert ((giou >= -1 - tol) & (giou <= iou + tol)).all()
    assert ((diou >= -1 - tol) & (diou <= iou + tol)).all()
    assert ((ciou >= -2 - tol) & (ciou <= diou + tol)).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_coord, _coord, st.floats(0.5, 100), st.floats(0.5, 100)), min_size=1))
def test_identical_valid_boxes_give_one(boxes):
    boxes = _xyxy(boxes)
    for fn in FUNCTIONS:
        torch.testing.assert_close(
            fn(boxes, boxes, aligned=True), torch.ones(len(boxes), dtype=torch.float64)
        )


# --- degenerate and inverted boxes ---------------------------------------------------------

DEGENERATE = torch.tensor(
    [
        [2.0, 2.0, 2.0, 2.0],  # point
        [1.0, 3.0, 5.0, 3.0],  # horizontal line (h = 0)
        [4.0, 0.0, 4.0, 6.0],  # vertical line (w = 0)
        [0.0, 0.0, 0.0, 0.0],  # point at the origin
        [1.0, 1.0, 4.0, 5.0],  # a valid box among them
    ],
    dtype=torch.float64,
)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_degenerate_boxes_give_finite_values_and_grads(fn, aligned):
    boxes1 = DEGENERATE.clone().requires_grad_()
    boxes2 = DEGENERATE.clone().requires_grad_()
    out = fn(boxes1, boxes2, aligned=aligned)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(boxes1.grad).all() and torch.isfinite(boxes2.grad).all()
    # Identical zero-area boxes: IoU 0 (torchvision's box_iou: 0/0 = NaN), and every variant 0.
    diagonal = out if aligned else out.diagonal()
    assert diagonal[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert diagonal[4].item() == pytest.approx(1.0)


def test_torchvision_gives_nan_where_we_do_not():
    point = DEGENERATE[:1]
    assert torch.isnan(tvo.box_iou(point, point)).all()
    assert box_iou(point, point).item() == 0.0
    assert torch.isnan(box_iou(point, point, eps=0.0)).all()  # eps=0: torchvision's 0/0


def test_tiny_normalised_boxes_need_a_smaller_eps():
    boxes1 = random_boxes(4, dtype=torch.float64) * 2e-6  # sides 2e-6 .. 1e-4: areas < 1e-7
    boxes2 = boxes1 + 1e-6
    expected = tvo.generalized_box_iou(boxes1, boxes2)
    assert not torch.allclose(generalized_box_iou(boxes1, boxes2), expected)
    assert_close(generalized_box_iou(boxes1, boxes2, eps=1e-20), expected)
    assert_close(generalized_box_iou(boxes1, boxes2, eps=0), expected)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_zero_height_box_against_valid_box_has_finite_grads(fn):
    line = torch.tensor([[1.0, 2.0, 5.0, 2.0]], dtype=torch.float64, requires_grad=True)
    box = torch.tensor([[0.0, 0.0, 4.0, 4.0]], dtype=torch.float64, requires_grad=True)
    fn(line, box).sum().backward()
    assert torch.isfinite(line.grad).all() and torch.isfinite(box.grad).all()


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_inverted_boxes_are_finite_with_zero_iou(fn):
    inverted = torch.tensor([[5.0, 5.0, 1.0, 1.0], [0.0, 4.0, 4.0, 0.0]], requires_grad=True)
    valid = random_boxes(3)
    out = fn(inverted, valid)
    assert torch.isfinite(out).all()
    assert (out <= 0).all() and (out >= -2).all()
    assert (box_iou(inverted, valid) == 0).all()
    out.sum().backward()
    assert torch.isfinite(inverted.grad).all()


# --- gradients -----------------------------------------------------------------------------


def same_aspect_ratio(boxes: torch.Tensor) -> torch.Tensor:
    """Boxes resized to width = 1.5 * height (CIoU's aspect-ratio term v is then 0)."""
    x1, y1, _, y2 = boxes.unbind(-1)
    return torch.stack([x1, y1, x1 + 1.5 * (y2 - y1), y2], dim=-1)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_gradcheck(fn, aligned):
    boxes1, boxes2 = random_boxes(2, 4), random_boxes(2, 4 if aligned else 3)
    if fn is complete_box_iou:
        # CIoU's weight alpha is a constant by definition (no gradient), so finite differences
        # see a different function unless v = 0; its gradient is compared with torchvision's
        # in test_gradients_match_torchvision.
        boxes1, boxes2 = same_aspect_ratio(boxes1), same_aspect_ratio(boxes2)
    assert gradcheck(lambda a, b: fn(a, b, aligned=aligned), (boxes1, boxes2))


@pytest.mark.parametrize("ours,tv", PAIRS, ids=IDS)
def test_gradients_match_torchvision(ours, tv):
    boxes1, boxes2 = random_boxes(6, dtype=torch.float64), random_boxes(5, dtype=torch.float64)
    weight = torch.randn(6, 5, dtype=torch.float64)
    grads = []
    for fn in (ours, tv):
        a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
        grads.append(torch.autograd.grad((fn(a, b) * weight).sum(), (a, b)))
    for actual, expected in zip(*grads):
        assert_close(actual, expected)


# --- chunking ------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 7, 40, 100])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_chunked_equals_unchunked(fn, budget, tiny_chunks):
    boxes1 = random_boxes(3, 9, dtype=torch.float64).requires_grad_()
    boxes2 = random_boxes(1, 7, dtype=torch.float64).requires_grad_()  # broadcast batch dim
    weight = torch.randn(3, 9, 7, dtype=torch.float64)
    expected = fn(boxes1, boxes2)
    expected_grads = torch.autograd.grad((expected * weight).sum(), (boxes1, boxes2))
    tiny_chunks(budget)  # 1 and 7: rows of one item per chunk; 100: whole items per chunk
    actual = fn(boxes1, boxes2)
    assert actual.shape == (3, 9, 7)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    grads = torch.autograd.grad((actual * weight).sum(), (boxes1, boxes2))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-15, atol=1e-15)
    with torch.no_grad():  # the no-grad path writes chunks into a preallocated output
        torch.testing.assert_close(fn(boxes1, boxes2), expected, rtol=0, atol=0)


def test_gradcheck_through_chunks(tiny_chunks):
    tiny_chunks(5)
    assert gradcheck(distance_box_iou, (random_boxes(2, 4), random_boxes(3)))


@pytest.mark.parametrize("m", [1, 50, 3000])
def test_chunk_temporaries_stay_within_budget(m, tiny_chunks, monkeypatch):
    tiny_chunks(600)
    seen = []
    core = _box_iou._overlap

    def spy(a, b, kind, *eps):
        out = core(a, b, kind, *eps)
        seen.append(out.numel())
        return out

    monkeypatch.setattr(_box_iou, "_overlap", spy)
    out = generalized_box_iou(random_boxes(2, 40), random_boxes(m))
    assert out.shape == (2, 40, m)
    assert max(seen) <= max(600, m)  # a chunk is at least one row
    assert len(seen) > 1 or out.numel() <= 600
    assert sum(seen) == out.numel()


# --- empty inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape1,shape2,expected",
    [((0, 4), (5, 4), (0, 5)), ((3, 4), (0, 4), (3, 0)), ((0, 3, 4), (0, 2, 4), (0, 3, 2))],
)
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_empty_inputs(fn, shape1, shape2, expected, tiny_chunks):
    tiny_chunks(1)
    boxes1 = torch.zeros(shape1, requires_grad=True)
    boxes2 = torch.zeros(shape2, requires_grad=True)
    out = fn(boxes1, boxes2)
    assert out.shape == expected and out.dtype == torch.float32
    out.sum().backward()  # graph-connected even when empty
    assert boxes1.grad.shape == shape1
    assert fn(torch.zeros(0, 4), torch.zeros(0, 4), aligned=True).shape == (0,)


def test_large_problem_chunks_match_small_budget_reference():
    boxes1, boxes2 = random_boxes(700), random_boxes(800)  # 560k pairs: several default chunks
    expected = tvo.generalized_box_iou(boxes1, boxes2)
    assert_close(generalized_box_iou(boxes1, boxes2), expected)
    assert math.prod(expected.shape) > _box_iou.CHUNK_ELEMENTS


# --- huge coordinates and devices (issue 19) --------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("offset", [1e19, 3e37])
def test_huge_boxes_are_exact(fn, aligned, offset):
    # Scale invariance: boxes of 1e19 (areas overflow float32) give the values of boxes of 1.
    unit = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0], [0.5, 1.0, 4.0, 1.5]])
    huge = unit * offset
    expected = fn(unit, unit, aligned=aligned)
    out = fn(huge, huge, aligned=aligned)
    assert torch.isfinite(out).all()
    assert_close(out, expected)
    identical = out if aligned else out.diagonal()
    assert torch.equal(identical, torch.ones(3))
    if not aligned:  # overlapping pairs: the unit boxes' values (checked above), not 0
        assert out[0, 1] > 0.25


def test_huge_offset_keeps_small_boxes_in_float64():
    # eps is scaled with the boxes: a unit box far away is still a unit box.
    boxes = torch.tensor([[1e15, 1e15, 1e15 + 1, 1e15 + 1]], dtype=torch.float64)
    assert box_iou(boxes, boxes).item() == 1.0
    assert generalized_box_iou(boxes, boxes + 0.5).item() == pytest.approx(
        generalized_box_iou(boxes - 1e15, boxes - 1e15 + 0.5).item()
    )


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_boxes_on_different_devices_raise(fn):
    with pytest.raises(ValueError, match="boxes1 and boxes2 must be on the same device"):
        fn(torch.zeros(2, 4), torch.zeros(3, 4, device="meta"))
