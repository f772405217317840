"""box_convert, box_area and input validation of the IoU family (visionblocks.ops.boxes).

The numerics of the IoU family are in test_box_iou.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torchvision.ops as tvo
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close
from visionblocks.ops.boxes import (
    BOX_FORMATS,
    box_area,
    box_convert,
    box_iou,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
)

IOU_FUNCTIONS = [box_iou, generalized_box_iou, distance_box_iou, complete_box_iou]


def random_boxes(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Valid xyxy boxes of shape ``(*shape, 4)``, sides in [1, 51]."""
    xy = torch.rand(*shape, 2, dtype=torch.float64) * 100
    wh = torch.rand(*shape, 2, dtype=torch.float64) * 50 + 1
    return torch.cat([xy, xy + wh], dim=-1).to(dtype)


# --- box_convert ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("in_fmt,out_fmt", list(itertools.product(BOX_FORMATS, repeat=2)))
@pytest.mark.parametrize("shape", [(7,), (2, 3), (0,)])
def test_box_convert_matches_torchvision(in_fmt, out_fmt, dtype, shape):
    boxes = random_boxes(*shape, dtype=dtype)
    expected = tvo.box_convert(boxes, in_fmt, out_fmt)
    actual = box_convert(boxes, in_fmt, out_fmt)
    assert actual.shape == (*shape, 4)
    assert_close(actual, expected)


@pytest.mark.parametrize("in_fmt,out_fmt", list(itertools.product(BOX_FORMATS, repeat=2)))
def test_box_convert_integer_dtype_as_torchvision(in_fmt, out_fmt):
    boxes = torch.tensor([[2, 4, 10, 20], [0, 0, 3, 5]])
    expected = tvo.box_convert(boxes, in_fmt, out_fmt)
    actual = box_convert(boxes, in_fmt, out_fmt)
    assert actual.dtype == expected.dtype
    assert_close(actual, expected)


def test_box_convert_same_format_returns_a_copy():
    boxes = random_boxes(3)
    out = box_convert(boxes, "xyxy", "xyxy")
    assert out is not boxes and out.data_ptr() != boxes.data_ptr()
    assert torch.equal(out, boxes)


def test_box_convert_gradient_flows():
    boxes = random_boxes(4, dtype=torch.float64).requires_grad_()
    torch.autograd.gradcheck(lambda b: box_convert(b, "cxcywh", "xywh"), (boxes,))


_coord = st.floats(-1e3, 1e3, allow_nan=False, width=64)
_size = st.floats(0.0, 1e3, allow_nan=False, width=64)


@settings(max_examples=50, deadline=None)
@given(
    boxes=st.lists(st.tuples(_coord, _coord, _size, _size), min_size=1, max_size=8),
    fmts=st.tuples(st.sampled_from(BOX_FORMATS), st.sampled_from(BOX_FORMATS)),
)
def test_box_convert_round_trip(boxes, fmts):
    xyxy = box_convert(torch.tensor(boxes, dtype=torch.float64), "xywh", "xyxy")
    start, middle = fmts
    boxes_start = box_convert(xyxy, "xyxy", start)
    back = box_convert(box_convert(boxes_start, start, middle), middle, start)
    torch.testing.assert_close(back, boxes_start, rtol=1e-9, atol=1e-9)


# --- box_area ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int64]
)
def test_box_area_matches_torchvision(dtype):
    boxes = random_boxes(2, 5).to(dtype)
    expected = tvo.box_area(boxes)
    actual = box_area(boxes)
    # integer boxes give int64 (torchvision: int32 for narrow integers, which can overflow)
    assert actual.dtype == (torch.int64 if not dtype.is_floating_point else expected.dtype)
    assert actual.shape == (2, 5)
    assert_close(actual, expected.to(actual.dtype))


# --- exact for integer and half boxes at the edges of their ranges ----------------------

EDGE_CASES = [
    # dtype, xyxy box, its exact cxcywh (float64), its exact area
    (torch.uint8, [200, 10, 220, 30], [210, 20, 20, 20], 400),
    (torch.uint8, [0, 0, 255, 255], [127.5, 127.5, 255, 255], 65025),
    (torch.int16, [30000, 100, 32000, 300], [31000, 200, 2000, 200], 400000),
    (torch.int16, [-30000, -30000, 30000, 30000], [0, 0, 60000, 60000], 3600000000),
    (torch.int32, [2**30, 0, 2**30 + 2**20, 2**20], [2**30 + 2**19, 2**19, 2**20, 2**20], 2**40),
    (torch.float16, [32768, 0, 49152, 32], [40960, 16, 16384, 32], 524288),
    (torch.float16, [0, 0, 65504, 65504], [32752, 32752, 65504, 65504], 65504.0**2),
    (torch.bfloat16, [3.0e38, 0, 3.2e38, 8], None, None),
]


@pytest.mark.parametrize(("dtype", "box", "cxcywh", "area"), EDGE_CASES, ids=str)
def test_box_convert_and_area_do_not_overflow(dtype, box, cxcywh, area):
    boxes = torch.tensor([box], dtype=torch.float64).to(dtype)
    exact = boxes.double()  # the values the dtype holds
    if cxcywh is not None:
        assert exact.tolist() == [[float(v) for v in box]]
    centre = box_convert(boxes, "xyxy", "cxcywh")
    assert centre.dtype == (dtype if dtype.is_floating_point else torch.float32)
    expected = torch.stack(
        ((exact[:, 0] + exact[:, 2]) / 2, (exact[:, 1] + exact[:, 3]) / 2,
         exact[:, 2] - exact[:, 0], exact[:, 3] - exact[:, 1]), dim=-1,
    )  # fmt: skip
    assert torch.isfinite(centre.double()).all()
    # rounded once from the exact value: within half an ulp of the output dtype
    torch.testing.assert_close(centre.double(), expected.to(centre.dtype).double(), rtol=0, atol=0)
    if cxcywh is not None:
        assert centre.double().tolist() == [[float(v) for v in cxcywh]]
        back = box_convert(centre, "cxcywh", "xyxy")
        assert back.double().tolist() == [[float(v) for v in box]]
        assert box_area(boxes).double().item() == area
    xywh = box_convert(boxes, "xyxy", "xywh")
    assert xywh.dtype == dtype
    assert box_convert(xywh, "xywh", "xyxy").double().tolist() == exact.tolist()


def test_integer_xywh_that_fits_its_dtype_is_exact():
    boxes = torch.tensor([[-32000, -32000, 32000, 32000]], dtype=torch.int16)
    xywh = box_convert(boxes, "xyxy", "xywh")  # w = 64000 does not fit int16: wraps on the cast
    assert xywh.dtype == torch.int16
    assert box_convert(xywh, "xywh", "xyxy").tolist() == boxes.tolist()  # x + w exact in int64
    assert box_convert(boxes, "xyxy", "cxcywh").tolist() == [[0.0, 0.0, 64000.0, 64000.0]]


@pytest.mark.parametrize("fn", [box_area, lambda b: box_convert(b, "xyxy", "xywh")])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
def test_complex_and_bool_boxes_are_refused(fn, dtype):
    with pytest.raises(TypeError, match=f"boxes must be a real tensor.*{dtype}"):
        fn(torch.zeros(2, 4, dtype=dtype))


def test_box_area_inverted_box_is_negative_like_torchvision():
    boxes = torch.tensor([[4.0, 0.0, 2.0, 3.0]])
    assert box_area(boxes).item() == tvo.box_area(boxes).item() == -6.0


# --- bad inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [box_area, lambda b: box_convert(b, "xyxy", "xywh")])
def test_box_functions_reject_bad_boxes(fn):
    with pytest.raises(ValueError, match=r"boxes must have shape \(\.\.\., 4\).*got \(3, 5\)"):
        fn(torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"got \(\)"):
        fn(torch.tensor(1.0))


@pytest.mark.parametrize("fn", IOU_FUNCTIONS)
def test_iou_rejects_bad_inputs(fn):
    boxes = random_boxes(3)
    with pytest.raises(ValueError, match=r"boxes2 must have shape \(\.\.\., 4\).*got \(3, 5\)"):
        fn(boxes, torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"batch dims .* got \(2,\) and \(3,\)"):
        fn(random_boxes(2, 5), random_boxes(3, 4))
    with pytest.raises(ValueError, match=r"all but the last dim.* got \(3,\) and \(4,\)"):
        fn(boxes, random_boxes(4), aligned=True)
    with pytest.raises(TypeError, match="eps must be a float, got bool"):
        fn(boxes, boxes, eps=True)
    with pytest.raises(TypeError, match="must be real"):
        fn(boxes.to(torch.complex64), boxes)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        fn(boxes, boxes, eps=float("inf"))


def test_iou_positional_options_match_keywords():
    # aligned and eps are positional-or-keyword (TorchScript has no keyword-only defaults).
    boxes = random_boxes(3)
    assert torch.equal(box_iou(boxes, boxes, True, 1e-6), box_iou(boxes, boxes, aligned=True))
