"""The eps rule, dtypes, the coordinate range, and reproducibility of the IoU family.

The eps rule (visionblocks.ops.boxes): eps replaces a denominator only where it is exactly
zero, so identical boxes give exactly 1 at every scale and in every dtype.
"""

from __future__ import annotations

import re

import pytest
import torch
import torchvision.ops as tvo
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close
from tests.ops.test_boxes import random_boxes
from tests.reference import boxes as ref
from visionblocks.losses.iou import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)
from visionblocks.ops.boxes import (
    box_area,
    box_iou,
    complete_box_iou,
    distance_box_iou,
    generalized_box_iou,
)

FUNCTIONS = [box_iou, generalized_box_iou, distance_box_iou, complete_box_iou]
IDS = ["iou", "giou", "diou", "ciou"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LOSSES = [generalized_box_iou_loss, distance_box_iou_loss, complete_box_iou_loss]


def identical_ones(fn, boxes: torch.Tensor) -> None:
    """``fn`` of ``boxes`` with themselves is exactly 1, pairwise (diagonal) and aligned."""
    ones = torch.ones(len(boxes), dtype=torch.float64)
    assert torch.equal(fn(boxes, boxes, aligned=True).double(), ones)
    assert torch.equal(fn(boxes, boxes).diagonal().double(), ones)


# --- identical boxes: exactly 1 ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("scale", [2e-4, 1e-15, 1.0, 640.0, 1e15])
def test_identical_boxes_give_one_at_every_scale_and_dtype(fn, scale, dtype):
    if dtype in (torch.float16, torch.bfloat16) and not 1e-3 <= scale <= 1e3:
        scale = min(max(scale, 1e-3), 1e3)  # half coordinates cannot hold 1e-15 or 1e15
    unit = torch.tensor([[0.5, 0.5, 0.7, 0.9], [0.0, 0.0, 1.0, 1.0], [0.1, 0.3, 0.2, 0.4]])
    identical_ones(fn, (unit * scale).to(dtype))


def test_the_issue_case_two_identical_2e_4_wide_boxes():
    boxes = torch.tensor([[0.3, 0.3, 0.3002, 0.3002]])
    assert tvo.box_iou(boxes, boxes).item() == 1.0
    for fn in FUNCTIONS:
        assert fn(boxes, boxes).item() == 1.0 and fn(boxes, boxes, aligned=True).item() == 1.0


_scale = st.sampled_from([1e-15, 1e-12, 2e-4, 1.0, 1e3, 1e12, 1e15])  # the documented range
_box = st.tuples(
    st.floats(-1, 1), st.floats(-1, 1), st.floats(1e-3, 1), st.floats(1e-3, 1)
)  # x, y, w, h


@settings(max_examples=40, deadline=None)
@given(
    st.lists(_box, min_size=1, max_size=5), _scale, st.sampled_from([torch.float32, torch.float64])
)
def test_identical_boxes_property(boxes, scale, dtype):
    b = torch.tensor(boxes, dtype=torch.float64)
    xyxy = (torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], -1) * scale).to(dtype)
    for fn in FUNCTIONS:
        identical_ones(fn, xyxy)


# --- eps only where a denominator is zero --------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_eps_changes_nothing_where_denominators_are_positive(fn):
    boxes1 = random_boxes(6, dtype=torch.float64) * 1e-5  # unions about 1e-8, below eps
    boxes2 = boxes1 + 2e-6
    expected = fn(boxes1, boxes2, eps=1e-7)
    for eps in (0.0, 1e-20, 1e-3):
        assert torch.equal(fn(boxes1, boxes2, eps=eps), expected)
    name = IDS[FUNCTIONS.index(fn)]
    assert_close(expected, ref.pairwise(ref.MEASURES[name], boxes1, boxes2))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_zero_denominators_give_zero_and_eps_zero_gives_nan(fn):
    point = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    assert fn(point, point).item() == 0.0  # torchvision's box_iou: 0 / 0 = NaN
    assert torch.isnan(tvo.box_iou(point, point)).all()
    assert torch.isnan(fn(point, point, eps=0.0)).all()


def test_collinear_zero_width_boxes_have_gradients_of_about_one_over_eps():
    line1 = torch.tensor([[1.0, 0.0, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    line2 = torch.tensor([[1.0, 1.0, 1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    out = generalized_box_iou(line1, line2, eps=1e-7)
    assert out.item() == 0.0  # no penalty: the enclosing box has zero area too
    grad = torch.autograd.grad(out.sum(), line1)[0]
    assert torch.isfinite(grad).all() and 1e6 < grad.abs().max() < 1e8
    expected = torch.autograd.grad(ref.pairwise(ref.giou, line1, line2).sum(), line1)[0]
    assert_close(grad, expected)


# --- dtypes --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_half_boxes_compute_in_float32(fn, dtype):
    boxes1, boxes2 = random_boxes(6, dtype=dtype), random_boxes(5, dtype=dtype)
    actual = fn(boxes1, boxes2)
    assert actual.dtype == torch.float32
    name = IDS[FUNCTIONS.index(fn)]
    assert_close(actual, ref.pairwise(ref.MEASURES[name], boxes1, boxes2).float())
    assert fn(boxes1, boxes1, aligned=True).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_half_zero_width_line_gradients_are_finite(fn, aligned, dtype):
    # Collinear zero-width boxes: float32 gradients of ~1/eps, clamped to the half range.
    lines = torch.tensor([[1.0, 0.0, 1.0, 2.0], [1.0, 1.0, 1.0, 3.0]], dtype=dtype)
    boxes1 = lines.clone().requires_grad_()
    boxes2 = lines.flip(0).clone().requires_grad_()
    out = fn(boxes1, boxes2, aligned=aligned)
    grads = torch.autograd.grad(out.sum(), (boxes1, boxes2))
    for g in grads:
        assert g.dtype == dtype and torch.isfinite(g).all()
    if fn is generalized_box_iou and dtype == torch.float16:  # ~1/eps: clamped, not inf
        assert grads[0].abs().max() == torch.finfo(dtype).max


# --- the coordinate range ------------------------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("scale", [1e15, 1e-15])
def test_scaled_boxes_give_the_unit_values(fn, aligned, scale):
    # Scale invariance inside the documented float32 range (no rescaling is done).
    unit = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0], [0.5, 1.0, 4.0, 1.5]])
    out = fn(unit * scale, unit * scale, aligned=aligned)
    assert torch.isfinite(out).all()
    assert_close(out, fn(unit, unit, aligned=aligned))
    assert torch.equal(out if aligned else out.diagonal(), torch.ones(3))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_scaled_gradients(fn):
    unit = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.5, 3.0, 2.0]], requires_grad=True)
    (small,) = torch.autograd.grad(fn(unit, unit.detach().flip(0)).sum(), unit)
    huge = (unit.detach() * 1e15).requires_grad_()
    (grad,) = torch.autograd.grad(fn(huge, huge.detach().flip(0)).sum(), huge)
    assert_close(grad * 1e15, small)


def test_huge_offset_keeps_small_boxes_in_float64():
    boxes = torch.tensor([[1e15, 1e15, 1e15 + 1, 1e15 + 1]], dtype=torch.float64)
    assert box_iou(boxes, boxes).item() == 1.0
    assert generalized_box_iou(boxes, boxes + 0.5).item() == pytest.approx(
        generalized_box_iou(boxes - 1e15, boxes - 1e15 + 0.5).item()
    )


HUGE = [1e19, 1e30, -1e37, 1.1e38]  # finite float32 coordinates beyond the float32 range


def _huge_pairs(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit boxes (point-reflected for a negative scale) and the same boxes as float32 times
    ``|scale|``, given as float64: the documented way past the float32 range."""
    unit = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.5, 3.0, 2.5], [-1.0, -3.0, 0.5, -1.0]])
    if scale < 0:
        unit = -unit[:, [2, 3, 0, 1]]
    boxes = unit * abs(scale)
    assert torch.isfinite(boxes).all()  # the inputs are finite float32 boxes
    return unit.double(), boxes.double()


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("scale", HUGE)
def test_float64_gives_every_finite_float32_box(fn, scale):
    unit, boxes = _huge_pairs(scale)
    huge = boxes.requires_grad_()
    out = fn(huge, boxes.detach().flip(0))
    (grad,) = torch.autograd.grad(out.sum(), huge)
    small = unit.clone().requires_grad_()
    expected = fn(small, unit.flip(0))
    (expected_grad,) = torch.autograd.grad(expected.sum(), small)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad * abs(scale), expected_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", LOSSES, ids=["giou", "diou", "ciou"])
@pytest.mark.parametrize("scale", HUGE)
def test_float64_losses_of_every_finite_float32_box(loss, scale):
    unit, boxes = _huge_pairs(scale)
    huge = boxes.requires_grad_()
    (grad,) = torch.autograd.grad(loss(huge, boxes.detach().flip(0), reduction="sum"), huge)
    small = unit.clone().requires_grad_()
    expected = loss(small, unit.flip(0), reduction="sum")
    (expected_grad,) = torch.autograd.grad(expected, small)
    torch.testing.assert_close(
        loss(boxes.detach(), boxes.detach().flip(0), reduction="none"),
        loss(unit, unit.flip(0), reduction="none"),
        rtol=1e-6,
        atol=1e-6,
    )
    torch.testing.assert_close(grad * abs(scale), expected_grad, rtol=1e-5, atol=1e-6)


LIMIT32 = 2.0**61  # the float32 compute range: refused from here (the module's Range)
LIMIT64 = 2.0**509


def _unit_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    unit = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.5, 3.0, 2.5], [-1.0, -1.0, 0.5, 1.0]])
    return unit, unit.flip(0)


def _loss_calls(a: torch.Tensor, b: torch.Tensor) -> list:
    """The IoU losses, functions and modules, as (name, call)."""
    from visionblocks.losses import CompleteBoxIoULoss, DistanceBoxIoULoss, GeneralizedBoxIoULoss

    calls = [(loss.__name__, lambda f=loss: f(a, b)) for loss in LOSSES]
    for module in (GeneralizedBoxIoULoss, DistanceBoxIoULoss, CompleteBoxIoULoss):
        calls.append((module.__name__, lambda m=module: m()(a, b)))
    return calls


def _op_calls(a: torch.Tensor, b: torch.Tensor) -> list:
    """The IoU family, pairwise and aligned, as (name, call)."""
    return [(f"{fn.__name__} aligned={aligned}", lambda f=fn, al=aligned: f(a, b, aligned=al))
            for fn in FUNCTIONS for aligned in (False, True)]  # fmt: skip


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("coordinate", [LIMIT32, -LIMIT32, 1e19, 3e38])
def test_float32_coordinates_beyond_the_range_are_refused(which, coordinate):
    # Torchvision gives NaN, inf or (box_iou) 0 here: areas and squared distances overflow.
    boxes = list(_unit_pairs())
    boxes[which] = boxes[which].clone()
    boxes[which][1, 2 if coordinate > 0 else 0] = coordinate
    names = {"loss": ("pred", "target"), "op": ("boxes1", "boxes2")}
    for kind, calls in (("loss", _loss_calls(*boxes)), ("op", _op_calls(*boxes))):
        for label, call in calls:
            with pytest.raises(ValueError, match=r"holds a coordinate of") as e:
                call()
            assert str(e.value).split()[0] == names[kind][which], label
            assert "2**61" in str(e.value) and ".double()" in str(e.value), label


def test_int64_boxes_are_checked_in_float32():
    # int64 holds coordinates beyond float32's range (up to 9.2e18); int32 cannot reach it.
    unit, other = _unit_pairs()
    huge = unit.long() * 2**62
    with pytest.raises(ValueError, match=r"boxes2 holds .*int64 boxes \(computed in float32\)"):
        box_iou(other.long(), huge)
    assert_close(box_iou(unit.long() * 2**59, other.long() * 2**59),
                 box_iou(unit.long(), other.long()))  # fmt: skip
    top = torch.iinfo(torch.int32).max  # int32 is not read: its largest boxes are in range
    corners = torch.tensor([[0, 0, top, top], [-top, -top, 1, top]], dtype=torch.int32)
    assert_close(box_iou(corners, corners.flip(0)), box_iou(corners.double(), corners.flip(0).double()).float())  # fmt: skip


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_do_not_hide_a_coordinate_beyond_the_range(bad):
    # aminmax of a set holding NaN (or inf) is NaN (inf): the huge finite one is found anyway.
    unit, other = _unit_pairs()
    boxes = unit.clone()
    boxes[0, 2], boxes[1, 3] = bad, -1e30
    for label, call in _op_calls(other, boxes) + _loss_calls(other, boxes):
        with pytest.raises(ValueError) as e:
            call()
        assert re.match(r"(boxes2|target) holds a coordinate of -1e\+30", str(e.value)), label


@pytest.mark.parametrize("eps", [0.0, 1e-7])
def test_special_corners_match_the_reference(eps):
    # Every pair of boxes whose corners are drawn from a few special values (zero, signed
    # zero, equal and swapped corners: degenerate and inverted boxes), at eps 0 (0 / 0 is
    # NaN) and eps > 0, against the float64 reference, NaN where it is NaN.
    gen = torch.Generator().manual_seed(0)
    values = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, 0.5])
    boxes = values[torch.randint(0, len(values), (400, 4), generator=gen)]
    for fn, name in zip(FUNCTIONS, IDS, strict=True):
        out = fn(boxes[:200], boxes[200:], eps=eps)
        expected = ref.pairwise(ref.MEASURES[name], boxes[:200], boxes[200:], eps)
        torch.testing.assert_close(out, expected.float(), equal_nan=True, msg=name)


def test_one_set_given_twice_is_read_once(monkeypatch):
    reads = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: reads.append(t) or aminmax(t))
    unit, other = _unit_pairs()
    box_iou(unit, unit)
    assert len(reads) == 1
    generalized_box_iou(unit, other)
    assert len(reads) == 3


def test_matrix_nms_names_its_boxes():
    from visionblocks.ops import matrix_nms

    unit, _ = _unit_pairs()
    with pytest.raises(ValueError, match=r"^boxes holds a coordinate of 3e\+19"):
        matrix_nms(torch.rand(3), boxes=unit * 1e19)
    order, scores = matrix_nms(torch.rand(3), boxes=(unit * 1e19).double())
    assert torch.isfinite(scores).all() and sorted(order.tolist()) == [0, 1, 2]


def test_bfloat16_losses_are_checked_in_float32():
    unit, other = _unit_pairs()
    huge = (unit * 2.0**62).bfloat16()
    with pytest.raises(ValueError, match=r"pred holds .*bfloat16 boxes \(computed in float32\)"):
        generalized_box_iou_loss(huge, other.bfloat16())


def test_the_range_ends_just_below_its_limit():
    # The largest float32 coordinates allowed keep every value and gradient finite.
    below = torch.tensor(LIMIT32).nextafter(torch.tensor(0.0)).item()
    corners = torch.tensor([[-below, -below, below, below], [below, below, below, below],
                            [-below, -below, -below, -below]])  # fmt: skip
    for fn in FUNCTIONS:
        boxes = corners.clone().requires_grad_()
        out = fn(boxes, corners.flip(0))
        (grad,) = torch.autograd.grad(out.sum(), boxes)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all(), fn.__name__
    unit, other = _unit_pairs()
    for fn in FUNCTIONS:  # scale invariance up to the limit: the unit values
        assert_close(fn(unit * 2.0**59, other * 2.0**59), fn(unit, other))
    for loss in LOSSES:
        assert_close(loss(unit * 2.0**59, other * 2.0**59), loss(unit, other))
    assert box_area(torch.tensor([-below, -below, below, below])).item() == pytest.approx(
        4 * below**2, rel=1e-6
    )


def test_float64_has_its_own_limit():
    unit, other = _unit_pairs()
    scaled = box_iou(unit.double() * 2.0**500, other.double() * 2.0**500)
    assert_close(scaled, box_iou(unit.double(), other.double()))
    with pytest.raises(
        ValueError,
        match=r"target holds .*float64 boxes must stay within ±2\*\*509.*scale them down",
    ):
        complete_box_iou_loss(unit.double(), other.double() * 2.0**510)
    # float32 boxes beside float64 ones are computed in float64: all finite float32 values pass
    assert torch.isfinite(generalized_box_iou_loss(unit * 1e38, other.double())).all()


def test_non_finite_coordinates_are_not_refused():
    # NaN and inf are not a range question: they give NaN, as in torchvision.
    unit, other = _unit_pairs()
    for bad in (float("nan"), float("inf")):
        boxes = unit.clone()
        boxes[0, 2] = bad
        assert torch.isnan(generalized_box_iou(boxes, other)[0]).all()
        assert torch.isnan(generalized_box_iou_loss(boxes, other, reduction="none")[0])


def test_value_checks_off_skip_the_range():
    import visionblocks

    unit, other = _unit_pairs()
    with visionblocks.value_checks(False):
        out = generalized_box_iou_loss(unit * 1e19, other * 1e19, reduction="none")
        op = generalized_box_iou(unit * 1e19, other * 1e19)
    assert torch.isnan(out).any() and torch.isnan(op).any()  # what the check refuses
    assert_close(generalized_box_iou(unit.double() * 1e19, other.double() * 1e19),
                 generalized_box_iou(unit.double(), other.double()))  # fmt: skip


def test_cuda_boxes_are_not_read(monkeypatch):
    # No host read and no device-side assert: the check is CPU only.
    from torch._subclasses.fake_tensor import FakeTensorMode

    import visionblocks

    asserted = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: asserted.append(msg))
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        a = torch.rand(5, 4, device="cuda")
        assert generalized_box_iou(a, a[:3]).shape == (5, 3)
        assert generalized_box_iou_loss(a, a).shape == (5,)
        for fn in FUNCTIONS:
            assert fn(a, a, aligned=True).shape == (5,)
        from visionblocks.ops import matrix_nms

        assert matrix_nms(torch.rand(5, device="cuda"), boxes=a)[1].shape == (5,)
    assert asserted == []


def test_box_area_beyond_the_dtype_is_inf():
    # Not refused: inf is the float32 rounding of an area above its maximum.
    box = torch.tensor([0.0, 0.0, 2e19, 2e19])
    assert box_area(box).item() == float("inf")
    assert box_area(box.double()).item() == pytest.approx(4e38, rel=1e-6)


# --- reproducibility -----------------------------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_results_do_not_depend_on_the_thread_count(fn):
    boxes1 = random_boxes(300).requires_grad_()
    boxes2 = random_boxes(400).requires_grad_()
    weight = torch.randn(300, 400)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = fn(boxes1, boxes2)
            results.append((out, *torch.autograd.grad((out * weight).sum(), (boxes1, boxes2))))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(other, results[0], strict=True):
            assert torch.equal(a, b)
