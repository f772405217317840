"""The IoU family against the float64 reference (tests/reference/boxes.py) and torchvision.

Values and gradients, pairwise and aligned, batched, degenerate and inverted boxes, and
``torch.compile``. The eps rule, dtypes, the coordinate range and thread independence:
test_box_iou_numerics.py.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close, gradcheck
from tests.ops.test_boxes import random_boxes
from tests.reference import boxes as ref
from visionblocks.ops.boxes import (
    box_iou,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
)

FUNCTIONS = {
    "iou": box_iou,
    "giou": generalized_box_iou,
    "diou": distance_box_iou,
    "ciou": complete_box_iou,
}
TORCHVISION = {
    "iou": tvo.box_iou,
    "giou": tvo.generalized_box_iou,
    "diou": tvo.distance_box_iou,
    "ciou": tvo.complete_box_iou,
}
NAMES = list(FUNCTIONS)


def expected(name: str, boxes1: torch.Tensor, boxes2: torch.Tensor, aligned: bool = False):
    """The reference, float64."""
    combine = ref.aligned if aligned else ref.pairwise
    return combine(ref.MEASURES[name], boxes1, boxes2)


def values_and_grads(fn, boxes1, boxes2, weight):
    a = boxes1.detach().clone().requires_grad_()
    b = boxes2.detach().clone().requires_grad_()
    out = fn(a, b)
    return (out, *torch.autograd.grad((out * weight.to(out.dtype)).sum(), (a, b)))


# --- the reference and torchvision -------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shape1,shape2",
    [((7, 4), (5, 4)), ((3, 7, 4), (3, 5, 4)), ((2, 3, 6, 4), (2, 3, 1, 4)), ((7, 4), (3, 5, 4))],
)
@pytest.mark.parametrize("name", NAMES)
def test_pairwise_values_and_gradients_match_the_reference(name, shape1, shape2, dtype):
    boxes1 = random_boxes(*shape1[:-1], dtype=dtype)
    boxes2 = random_boxes(*shape2[:-1], dtype=dtype)
    weight = torch.randn(
        (*torch.broadcast_shapes(shape1[:-2], shape2[:-2]), shape1[-2], shape2[-2])
    )
    actual = values_and_grads(FUNCTIONS[name], boxes1, boxes2, weight)
    oracle = values_and_grads(lambda a, b: expected(name, a, b), boxes1, boxes2, weight)
    assert actual[0].dtype == dtype
    for a, e in zip(actual, oracle, strict=True):
        assert_close(a, e.to(dtype), scale=10)  # float32 gradients sum up to 7 terms


@pytest.mark.parametrize("name", NAMES)
def test_pairwise_matches_torchvision(name):
    # torchvision adds eps to every denominator; we only to zero ones: ~eps / area apart.
    boxes1, boxes2 = random_boxes(9, dtype=torch.float64), random_boxes(6, dtype=torch.float64)
    weight = torch.randn(9, 6, dtype=torch.float64)
    actual = values_and_grads(FUNCTIONS[name], boxes1, boxes2, weight)
    peer = values_and_grads(TORCHVISION[name], boxes1, boxes2, weight)
    for a, e in zip(actual, peer, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_aligned_values_and_gradients_match_the_reference(name):
    boxes1, boxes2 = (
        random_boxes(3, 11, dtype=torch.float64),
        random_boxes(1, 11, dtype=torch.float64),
    )
    weight = torch.randn(3, 11, dtype=torch.float64)
    fn = FUNCTIONS[name]
    actual = values_and_grads(lambda a, b: fn(a, b, aligned=True), boxes1, boxes2, weight)
    oracle = values_and_grads(lambda a, b: expected(name, a, b, True), boxes1, boxes2, weight)
    for a, e in zip(actual, oracle, strict=True):
        assert_close(a, e)
    assert_close(actual[0], fn(boxes1, boxes2).diagonal(dim1=-2, dim2=-1))


@pytest.mark.parametrize("name", NAMES)
def test_aligned_broadcasts(name):
    fn = FUNCTIONS[name]
    preds, target = random_boxes(5), random_boxes(1)
    assert_close(fn(preds, target, aligned=True), fn(preds, target)[:, 0])
    assert fn(random_boxes(4), random_boxes(4), aligned=True).shape == (4,)
    assert fn(random_boxes(), random_boxes(), aligned=True).shape == ()  # one box, (4,)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("name", NAMES)
def test_integer_boxes_give_float32(name, dtype):
    boxes1, boxes2 = random_boxes(6).round().to(dtype), random_boxes(5).round().to(dtype)
    actual = FUNCTIONS[name](boxes1, boxes2)
    assert actual.dtype == torch.float32
    assert_close(actual, expected(name, boxes1, boxes2).float())


def test_mixed_dtypes_promote():
    out = box_iou(random_boxes(3, dtype=torch.float32), random_boxes(2, dtype=torch.float64))
    assert out.dtype == torch.float64


# --- properties ----------------------------------------------------------------------------

_coord = st.floats(-100, 100, allow_nan=False, width=32)
_side = st.floats(-20, 100, allow_nan=False, width=32)
_box = st.tuples(_coord, _coord, _side, _side)  # (x, y, w, h): zero-area and inverted too


def _xyxy(boxes: list) -> torch.Tensor:
    b = torch.tensor(boxes, dtype=torch.float64)
    return torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], dim=-1)


@settings(max_examples=60, deadline=None)
@given(st.lists(_box, min_size=1, max_size=6), st.lists(_box, min_size=1, max_size=6))
def test_properties_and_reference(list1, list2):
    boxes1, boxes2 = _xyxy(list1), _xyxy(list2)
    values = {name: fn(boxes1, boxes2) for name, fn in FUNCTIONS.items()}
    tol = 1e-9
    for name, value in values.items():
        assert torch.isfinite(value).all()
        torch.testing.assert_close(value, FUNCTIONS[name](boxes2, boxes1).T)  # symmetry
        torch.testing.assert_close(value, expected(name, boxes1, boxes2))
    iou, giou, diou, ciou = values.values()
    assert ((iou >= 0) & (iou <= 1)).all()
    assert ((giou >= -1 - tol) & (giou <= iou + tol)).all()
    assert ((diou >= -1 - tol) & (diou <= iou + tol)).all()
    assert ((ciou >= -2 - tol) & (ciou <= diou + tol)).all()


# --- degenerate and inverted boxes ---------------------------------------------------------

DEGENERATE = torch.tensor(
    [
        [2.0, 2.0, 2.0, 2.0],  # point
        [1.0, 3.0, 5.0, 3.0],  # horizontal line (h = 0)
        [4.0, 0.0, 4.0, 6.0],  # vertical line (w = 0)
        [0.0, 0.0, 0.0, 0.0],  # point at the origin
        [4.0, 1.0, 4.0, 3.0],  # a vertical line collinear with the other one
        [1.0, 1.0, 4.0, 5.0],  # a valid box among them
    ],
    dtype=torch.float64,
)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_degenerate_boxes_match_the_reference(name, aligned):
    fn = FUNCTIONS[name]
    weight = torch.rand(6 if aligned else (6, 6), dtype=torch.float64)
    actual = values_and_grads(
        lambda a, b: fn(a, b, aligned=aligned), DEGENERATE, DEGENERATE, weight
    )
    oracle = values_and_grads(
        lambda a, b: expected(name, a, b, aligned), DEGENERATE, DEGENERATE, weight
    )
    for a, e in zip(actual, oracle, strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, e)
    # Identical zero-area boxes have no intersection: every measure is 0 (torchvision: NaN).
    diagonal = actual[0] if aligned else actual[0].diagonal()
    assert diagonal[:5].tolist() == [0.0] * 5 and diagonal[5].item() == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_inverted_boxes_collapse(name):
    fn = FUNCTIONS[name]
    inverted = torch.tensor([[5.0, 5.0, 1.0, 1.0], [0.0, 4.0, 4.0, 0.0]], dtype=torch.float64)
    valid = random_boxes(3, dtype=torch.float64)
    weight = torch.randn(2, 3, dtype=torch.float64)
    actual = values_and_grads(fn, inverted, valid, weight)
    oracle = values_and_grads(lambda a, b: expected(name, a, b), inverted, valid, weight)
    for a, e in zip(actual, oracle, strict=True):
        assert_close(a, e)
    assert (actual[0] <= 0).all() and (actual[0] >= -2).all()
    assert (box_iou(inverted, valid) == 0).all()


# --- gradients -----------------------------------------------------------------------------


def same_aspect_ratio(boxes: torch.Tensor) -> torch.Tensor:
    """Boxes resized to width = 1.5 * height (CIoU's aspect-ratio term v is then 0)."""
    x1, y1, _, y2 = boxes.unbind(-1)
    return torch.stack([x1, y1, x1 + 1.5 * (y2 - y1), y2], dim=-1)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name, aligned):
    fn = FUNCTIONS[name]
    boxes1, boxes2 = random_boxes(2, 4), random_boxes(2, 4 if aligned else 3)
    if name == "ciou":
        # alpha is a constant by definition, so finite differences see another function
        # unless v = 0; the reference tests cover CIoU's gradient.
        boxes1, boxes2 = same_aspect_ratio(boxes1), same_aspect_ratio(boxes2)
    assert gradcheck(lambda a, b: fn(a, b, aligned=aligned), (boxes1, boxes2))


@pytest.mark.parametrize("name", NAMES)
def test_gradient_of_a_plain_sum_and_of_a_scaled_sum(name):
    # `.sum()` sends a broadcast gradient: its one value scales the per-box result.
    fn = FUNCTIONS[name]
    boxes1, boxes2 = random_boxes(6, dtype=torch.float64), random_boxes(5, dtype=torch.float64)
    for factor in (1.0, -2.5):
        weight = torch.full((6, 5), factor, dtype=torch.float64)
        a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
        grads = torch.autograd.grad(fn(a, b).sum() * factor, (a, b))
        for g, e in zip(grads, values_and_grads(fn, boxes1, boxes2, weight)[1:], strict=True):
            assert_close(g, e)


def test_gradient_for_one_input_only():
    boxes1 = random_boxes(4, dtype=torch.float64).requires_grad_()
    boxes2 = random_boxes(3, dtype=torch.float64)
    (grad,) = torch.autograd.grad(complete_box_iou(boxes1, boxes2).sum(), boxes1)
    (oracle,) = torch.autograd.grad(expected("ciou", boxes1, boxes2).sum(), boxes1)
    assert_close(grad, oracle)


# --- shapes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape1,shape2,expected_shape",
    [((0, 4), (5, 4), (0, 5)), ((3, 4), (0, 4), (3, 0)), ((0, 3, 4), (0, 2, 4), (0, 3, 2))],
)
@pytest.mark.parametrize("name", NAMES)
def test_empty_inputs(name, shape1, shape2, expected_shape):
    fn = FUNCTIONS[name]
    boxes1 = torch.zeros(shape1, requires_grad=True)
    boxes2 = torch.zeros(shape2, requires_grad=True)
    out = fn(boxes1, boxes2)
    assert out.shape == expected_shape and out.dtype == torch.float32
    out.sum().backward()  # graph-connected even when empty
    assert boxes1.grad.shape == shape1
    assert fn(torch.zeros(0, 4), torch.zeros(0, 4), aligned=True).shape == (0,)


def test_large_problem_matches_torchvision():
    boxes1, boxes2 = random_boxes(700), random_boxes(800)
    assert_close(generalized_box_iou(boxes1, boxes2), tvo.generalized_box_iou(boxes1, boxes2))


def test_non_contiguous_inputs():
    boxes1 = random_boxes(9, 4).transpose(0, 1)  # (4, 9, 4), non-contiguous
    boxes2 = random_boxes(4, 4, 6)[:, 1]  # a strided slice
    assert not boxes1.is_contiguous() and not boxes2.is_contiguous()
    for name, fn in FUNCTIONS.items():
        assert_close(fn(boxes1, boxes2), expected(name, boxes1, boxes2).float())


@pytest.mark.parametrize("name", NAMES)
def test_boxes_on_different_devices_raise(name):
    with pytest.raises(ValueError, match="boxes1 and boxes2 must be on the same device"):
        FUNCTIONS[name](torch.zeros(2, 4), torch.zeros(3, 4, device="meta"))


# --- torch.compile -------------------------------------------------------------------------


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("aligned", [False, True])
def test_compiles_fullgraph_dynamic_and_equals_eager(aligned):
    # One graph for the four measures, traced with dynamic shapes, then run on two sizes.
    def all_four(a, b):
        return torch.stack([fn(a, b, aligned=aligned) for fn in FUNCTIONS.values()])

    torch._dynamo.reset()
    compiled = torch.compile(all_four, fullgraph=True, dynamic=True, backend="aot_eager")
    for n, m in ((7, 7), (4, 1)) if aligned else ((7, 5), (9, 3)):
        boxes1 = torch.cat([random_boxes(n - 2), DEGENERATE[:2].float()])
        boxes2 = random_boxes(m)
        weight = torch.randn(4, n) if aligned else torch.randn(4, n, m)
        actual = values_and_grads(compiled, boxes1, boxes2, weight)
        eager = values_and_grads(all_four, boxes1, boxes2, weight)
        for a, e in zip(actual, eager, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


# --- Python overhead --------------------------------------------------------------------------


def python_calls(fn) -> int:
    """Python-level function calls (cProfile's count, builtins included) of one ``fn()``."""
    import cProfile
    import pstats

    fn()  # warm: lazy imports and caches
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    return pstats.Stats(profiler).total_calls


def test_python_calls_at_most_twice_torchvision():
    boxes1, boxes2 = random_boxes(10), random_boxes(8)
    ours = python_calls(lambda: box_iou(boxes1, boxes2))
    peer = python_calls(lambda: tvo.box_iou(boxes1, boxes2))
    assert ours <= 2 * peer, (ours, peer)
