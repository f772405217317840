"""Rotated boxes: IoU against shapely, the conventions, gradients, the loss, NMS.

The oracle is shapely's polygon intersection in float64, on corners from torchvision's own
``CXCYWHR -> XYXYXYXY`` conversion (so the angle convention is torchvision's by
construction). NMS is checked against a greedy loop written here, and against torchvision's
``nms``/``batched_nms`` for axis-aligned boxes. The Triton kernel: tests/kernels.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torchvision.ops as tvo
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as TF

import visionblocks
from tests.helpers import gradcheck
from visionblocks import losses
from visionblocks.ops import (
    _rotated_nms,
    _rotated_overlap,
    batched_nms_rotated,
    box_iou,
    nms_rotated,
    rotated_box_iou,
    rotated_box_iou_loss,
)
from visionblocks.registry import LOSSES

CXCYWHR = tv_tensors.BoundingBoxFormat.CXCYWHR


# ------------------------------------------------------------------------------- helpers
def tv_corners(boxes: torch.Tensor, fmt=CXCYWHR) -> torch.Tensor:
    """``(N, 8)`` corners by torchvision's conversion (float64)."""
    return TF.convert_bounding_box_format(
        boxes.double().reshape(-1, boxes.shape[-1]),
        old_format=fmt,
        new_format=tv_tensors.BoundingBoxFormat.XYXYXYXY,
    )


def shapely_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Aligned IoU of cxcywhr boxes by shapely, float64 (0 where the union is empty)."""
    Polygon = pytest.importorskip("shapely.geometry").Polygon  # a test dependency
    out = []
    for p, q in zip(tv_corners(boxes1).tolist(), tv_corners(boxes2).tolist(), strict=True):
        a = Polygon(list(zip(p[0::2], p[1::2], strict=True)))
        b = Polygon(list(zip(q[0::2], q[1::2], strict=True)))
        inter = a.intersection(b).area
        union = a.area + b.area - inter
        out.append(inter / union if union > 0 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def random_rboxes(n: int, seed: int, spread: float = 10.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * spread
    wh = torch.rand(n, 2, generator=g) * 6 + 0.05
    angle = torch.rand(n, 1, generator=g) * 720 - 360
    return torch.cat([xy, wh, angle], 1)


def hard_pairs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs from several families: overlapping jitters, nested, shared edges and corners,
    nearly coincident, thin, far from the origin, and random ones."""
    g = torch.Generator().manual_seed(seed)
    a = random_rboxes(n, seed)
    k = n // 8
    parts = []
    # overlapping jitters
    parts.append(
        a[:k] + torch.cat([torch.randn(k, 2, generator=g), torch.randn(k, 3, generator=g)], 1)
    )
    # nested: same centre and angle, smaller; or a small box inside turned freely
    inner = a[k : 2 * k].clone()
    inner[:, 2:4] *= torch.rand(k, 2, generator=g) * 0.5 + 0.1
    inner[k // 2 :, 4] += torch.rand(k - k // 2, generator=g) * 360
    inner[k // 2 :, 2:4] = inner[k // 2 :, 2:4].min(1, keepdim=True).values * 0.6
    parts.append(inner)
    # shared edge lines: shifted along the height axis, or along the width axis by w
    shifted = a[2 * k : 3 * k].clone()
    rad = shifted[:, 4] * math.pi / 180
    u = torch.stack([rad.cos(), -rad.sin()], 1)
    v = torch.stack([rad.sin(), rad.cos()], 1)
    step = torch.rand(k, 1, generator=g)
    half = k // 2
    shifted[:half, :2] += v[:half] * step[:half] * shifted[:half, 3:4]
    shifted[half:, :2] += u[half:] * shifted[half:, 2:3]  # touching
    parts.append(shifted)
    # nearly coincident: tiny turns and shifts
    near = a[3 * k : 4 * k].clone()
    near[:, 4] += torch.randn(k, generator=g) * 1e-4
    near[:, :2] += torch.randn(k, 2, generator=g) * 1e-5
    parts.append(near)
    # thin boxes
    thin = a[4 * k : 5 * k].clone()
    thin[:, 3] = thin[:, 3] * 1e-3
    parts.append(thin + torch.cat([torch.randn(k, 2, generator=g) * 0.3, torch.zeros(k, 3)], 1))
    # far from the origin (float32 keeps ~3 decimals there)
    far = a[5 * k : 6 * k].clone()
    far[:, :2] += 1e4
    a[5 * k : 6 * k, :2] += 1e4
    parts.append(far + torch.cat([torch.randn(k, 2, generator=g), torch.zeros(k, 3)], 1))
    # equal angles (axis-aligned in each other's frame) with random offsets
    same_angle = a[6 * k : 7 * k].clone()
    same_angle[:, :4] += torch.randn(k, 4, generator=g)
    same_angle[:, 2:4] = same_angle[:, 2:4].abs() + 0.1
    parts.append(same_angle)
    parts.append(random_rboxes(n - 7 * k, seed + 1))
    b = torch.cat(parts)
    b[:, 2:4] = b[:, 2:4].abs()
    return a, b


def reference_nms(boxes, scores, threshold, idxs=None):
    """The textbook greedy loop, on the float64 pairwise IoU."""
    order = torch.sort(scores, descending=True, stable=True).indices.tolist()
    iou = rotated_box_iou(boxes.double(), boxes.double())
    removed = [False] * len(order)
    keep = []
    for i in order:
        if removed[i]:
            continue
        keep.append(i)
        for j in order:
            same = idxs is None or int(idxs[j]) == int(idxs[i])
            if j != i and same and iou[i, j] > threshold:
                removed[j] = True
    return torch.tensor(keep, dtype=torch.int64)


# --------------------------------------------------------------------- values: the oracle
# float64: shapely works in absolute coordinates, which costs it ~1e-12 on boxes near 1e4.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_aligned_iou_matches_shapely_on_thousands_of_pairs(dtype, tol):
    a, b = hard_pairs(4000, 0)
    a, b = a.to(dtype), b.to(dtype)
    got = rotated_box_iou(a, b, aligned=True)
    want = shapely_iou(a, b)
    assert got.dtype == dtype
    err = (got.double() - want).abs()
    assert err.max() <= tol, f"max error {err.max():.3g} at {err.argmax()}"
    assert (want > 0).float().mean() > 0.5  # most pairs overlap: the test measures something


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_pairwise_iou_matches_shapely(dtype, tol):
    a, b = random_rboxes(40, 1, spread=6).to(dtype), random_rboxes(30, 2, spread=6).to(dtype)
    got = rotated_box_iou(a, b)
    assert got.shape == (40, 30)
    ii, jj = torch.meshgrid(torch.arange(40), torch.arange(30), indexing="ij")
    want = shapely_iou(a[ii.reshape(-1)], b[jj.reshape(-1)]).view(40, 30)
    assert (got.double() - want).abs().max() <= tol
    assert torch.equal(got.diagonal()[:30], rotated_box_iou(a[:30], b, aligned=True))


def test_axis_aligned_boxes_equal_box_iou():
    g = torch.Generator().manual_seed(3)
    xy = torch.randint(0, 20, (60, 2), generator=g).float()
    wh = torch.randint(1, 12, (60, 2), generator=g).float()
    xyxy = torch.cat([xy, xy + wh], 1)
    want = box_iou(xyxy, xyxy[:45])
    assert (want > 0).float().mean() > 0.1 and (want == 0).any()  # shared edges and corners
    centre = torch.cat([xy + wh / 2, wh], 1)
    for turn in (0, 90, -90, 180, 270, 360, -540):
        if turn % 180:
            boxes = torch.cat([centre[:, :2], wh.flip(1), torch.full((60, 1), float(turn))], 1)
        else:
            boxes = torch.cat([centre, torch.full((60, 1), float(turn))], 1)
        got = rotated_box_iou(boxes, boxes[:45])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------ special cases
def test_identical_boxes_give_exactly_one():
    boxes = random_rboxes(200, 4)
    boxes[:50, 2:4] *= 1e-4  # tiny
    boxes[50:100, :4] *= 1e4  # huge and far away
    for dtype in (torch.float32, torch.float64):
        b = boxes.to(dtype)
        assert torch.equal(rotated_box_iou(b, b, aligned=True), torch.ones(200, dtype=dtype))
        assert torch.equal(rotated_box_iou(b, b).diagonal(), torch.ones(200, dtype=dtype))
    half = boxes.half()
    assert torch.equal(rotated_box_iou(half, half, aligned=True), torch.ones(200))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equivalent_representations_give_one(dtype):
    g = torch.Generator().manual_seed(5)
    base = random_rboxes(100, 5)
    base[:, 4] = torch.randint(-400, 400, (100,), generator=g).float()  # integer degrees
    cx, cy, w, h, r = base.to(dtype).unbind(1)
    variants = [
        torch.stack([cx, cy, w, h, r + 180], 1),
        torch.stack([cx, cy, w, h, r - 180], 1),
        torch.stack([cx, cy, w, h, r + 360], 1),
        torch.stack([cx, cy, h, w, r + 90], 1),
        torch.stack([cx, cy, h, w, r - 90], 1),
        torch.stack([cx, cy, -w, h, r], 1),  # negative sides read as their size
    ]
    for other in variants:
        assert torch.equal(
            rotated_box_iou(base.to(dtype), other, aligned=True), torch.ones(100, dtype=dtype)
        )
    # non-integer angles: the same rectangle up to rounding
    frac = base.to(dtype).clone()
    frac[:, 4] += 0.3712
    turned = frac.clone()
    turned[:, 4] += 180
    got = rotated_box_iou(frac, turned, aligned=True)
    assert (got - 1).abs().max() <= (1e-5 if dtype == torch.float32 else 1e-12)


def exact_iou(box1: list[float], box2: list[float]) -> float:
    """The IoU of two cxcywhr boxes (degrees, as given in float) computed with 50 digits
    (mpmath, a dependency of torch's sympy): corners, then the first box clipped to each
    edge of the second (Sutherland-Hodgman), then the shoelace area."""
    mp = pytest.importorskip("mpmath").mp.clone()
    mp.dps = 50

    def corners(box):
        cx, cy, w, h, r = (mp.mpf(v) for v in box)
        t = r * mp.pi / 180
        c, s = mp.cos(t), mp.sin(t)
        pts = [(i * abs(w) / 2, j * abs(h) / 2) for i, j in ((-1, -1), (1, -1), (1, 1), (-1, 1))]
        return [(cx + x * c + y * s, cy - x * s + y * c) for x, y in pts]

    def area(p):
        return sum(p[i - 1][0] * p[i][1] - p[i][0] * p[i - 1][1] for i in range(len(p))) / 2

    p, q = corners(box1), corners(box2)
    q = q if area(q) >= 0 else q[::-1]
    for k in range(4):
        (ax, ay), (bx, by) = q[k], q[(k + 1) % 4]
        side = [(bx - ax) * (y - ay) - (by - ay) * (x - ax) for x, y in p]
        out = []
        for i in range(len(p)):
            j = (i + 1) % len(p)
            if side[i] >= 0:
                out.append(p[i])
            if (side[i] >= 0) != (side[j] >= 0):
                f = side[i] / (side[i] - side[j])
                out.append((p[i][0] + f * (p[j][0] - p[i][0]), p[i][1] + f * (p[j][1] - p[i][1])))
        p = out
    inter = abs(area(p)) if len(p) >= 3 else 0
    union = abs(area(corners(box1))) + abs(area(corners(box2))) - inter
    return float(inter / union) if union > 0 else 0.0


def exact_angles(n: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Angles in ``[256, 512)`` with every bit of ``dtype`` used: ``r - 180`` and ``r - 360``
    are exact, and ``r + 45`` is not (it rounds to the ulp of 512)."""
    return (256 + 256 * torch.rand(n, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_equivalents_of_thin_boxes_give_exactly_one(dtype):
    """The angle is reduced with no rounding, so a 180- or 360-degree equivalent has the same
    canonical parameters: IoU exactly 1, however thin the box (the reduction through
    ``r + 45`` lost ~1e-13 degrees in float64, times the aspect ratio in the IoU)."""
    g = torch.Generator().manual_seed(40)
    n = 200
    w = torch.rand(n, generator=g, dtype=torch.float64) * 100 + 1
    h = w * 10 ** -(torch.rand(n, generator=g, dtype=torch.float64) * 6)  # aspect up to 1e6
    base = torch.stack([torch.rand(n, generator=g) * 50, torch.rand(n, generator=g) * 50], 1)
    boxes = torch.cat([base.double(), w[:, None], h[:, None], torch.zeros(n, 1)], 1).to(dtype)
    boxes[:, 4] = exact_angles(n, g, dtype)
    ones = torch.ones(n, dtype=dtype)
    for turn in (-180.0, -360.0, -540.0):
        other = boxes.clone()
        other[:, 4] += turn
        assert torch.equal(other[:, 4] - boxes[:, 4], torch.full((n,), turn, dtype=dtype))
        assert torch.equal(rotated_box_iou(boxes, other, aligned=True), ones)
        assert torch.equal(rotated_box_iou(boxes[:20], other[:20]).diagonal(), ones[:20])
        assert torch.equal(rotated_box_iou_loss(boxes, other), torch.zeros(n, dtype=dtype))
    swapped = torch.stack([*boxes[:, :2].T, boxes[:, 3], boxes[:, 2], boxes[:, 4] - 90], 1)
    assert torch.equal(rotated_box_iou(boxes, swapped, aligned=True), ones)


def test_float64_is_exact_to_1e12_on_adversarial_pairs():
    """float64 IoUs within 1e-12 of a 50-digit oracle (the issue: a box and its 180-degree
    equivalent gave 0.9999982): thin boxes and their equivalents at large angles,
    near-parallel edges, nested, touching, far from the origin."""
    g = torch.Generator().manual_seed(41)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    pairs = []
    for i in range(30):
        cx, cy = rand(2) * 20
        w, h = 1 + rand(2) * 30
        r = (rand(1) * 2 - 1).item() * (90 if i % 2 else 1e4)  # every bit used
        thin = h.item() * 10 ** -(rand(1).item() * 6)
        a = [cx.item(), cy.item(), w.item(), h.item(), r]
        t = math.radians(r)
        u = (math.cos(t), -math.sin(t))
        pairs += [
            (a, [*a[:4], r + 180]),  # rounded: not exactly the same rectangle
            ([*a[:3], thin, r], [*a[:3], thin, r + 360]),
            ([*a[:3], thin, r], [*a[:3], thin, r + 3e-9]),  # near-parallel edges
            (a, [*a[:2], a[2] * 0.5, a[3] * 0.7, r + 1e-7]),  # nested
            (a, [a[0] + a[2] * u[0], a[1] + a[2] * u[1], *a[2:]]),  # touching
            (a, [a[0] + 0.3 * a[2] * u[0], a[1] + 0.3 * a[2] * u[1], *a[2:4], r - 1e-6]),
            (
                [a[0] + 1e4, a[1] - 1e4, *a[2:]],
                [a[0] + 1e4 + 0.1, a[1] - 1e4, a[3], a[2], r + 90.5],
            ),
        ]
    a = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    b = torch.tensor([q for _, q in pairs], dtype=torch.float64)
    want = torch.tensor([exact_iou(p, q) for p, q in pairs], dtype=torch.float64)
    assert (want > 0).float().mean() > 0.8
    for got in (rotated_box_iou(a, b, aligned=True), rotated_box_iou(a, b).diagonal()):
        err = (got - want).abs()
        assert err.max() <= 1e-12, f"max error {err.max():.3g} at {pairs[int(err.argmax())]}"


def test_nested_boxes_give_the_ratio_of_areas():
    outer = torch.tensor([[3.0, 4.0, 8.0, 6.0, 30.0]]).repeat(5, 1)
    inner = torch.tensor(
        [
            [3.0, 4.0, 4.0, 3.0, 30.0],  # same angle
            [3.0, 4.0, 2.0, 2.0, 77.0],  # turned freely
            [3.0, 4.0, 8.0, 3.0, 30.0],  # shares two edges
            [3.0, 4.0, 0.5, 0.5, -10.0],
            [3.5, 4.0, 1.0, 1.0, 0.0],
        ]
    )
    want = (inner[:, 2] * inner[:, 3]) / (outer[:, 2] * outer[:, 3])
    torch.testing.assert_close(rotated_box_iou(outer, inner, aligned=True), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(rotated_box_iou(inner, outer, aligned=True), want, rtol=1e-6, atol=0)


def test_touching_boxes_give_zero():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 2.0, 2.0, 30.0]])
    rad = math.radians(30.0)
    u = (math.cos(rad), -math.sin(rad))
    b = torch.tensor(
        [
            [2.0, 0.5, 2.0, 1.0, 0.0],  # shares part of an edge
            [2.0, 2.0, 2.0, 2.0, 0.0],  # shares a corner
        ]
    )
    assert torch.equal(rotated_box_iou(a[:1].expand(2, 5), b, aligned=True), torch.zeros(2))
    side = torch.tensor([[2 * u[0], 2 * u[1], 2.0, 2.0, 30.0]])  # the rotated box's neighbour
    assert rotated_box_iou(a[1:], side, aligned=True).abs().max() < 1e-6


def test_degenerate_boxes_give_zero():
    box = torch.tensor([[0.0, 0.0, 4.0, 4.0, 20.0]])
    lines = torch.tensor(
        [
            [0.0, 0.0, 0.0, 3.0, 20.0],  # zero width, inside
            [0.0, 0.0, 3.0, 0.0, -70.0],  # zero height
            [0.0, 0.0, 0.0, 0.0, 0.0],  # a point
            [1.0, 1.0, 0.0, 9.0, 45.0],  # crossing the box
        ]
    )
    assert torch.equal(rotated_box_iou(box.expand(4, 5), lines, aligned=True), torch.zeros(4))
    assert torch.equal(rotated_box_iou(lines, lines, aligned=True), torch.zeros(4))  # even equal
    assert torch.equal(rotated_box_iou(lines, lines), torch.zeros(4, 4))
    # eps=0: a zero union gives 0/0, as box_iou
    assert rotated_box_iou(lines[:1], lines[:1], aligned=True, eps=0.0).isnan().all()


def test_disjoint_boxes_give_zero():
    a = random_rboxes(20, 6)
    b = a.clone()
    b[:, 0] += 100
    assert torch.equal(rotated_box_iou(a, b), torch.zeros(20, 20))


# ----------------------------------------------------------------- formats and conventions
def test_formats_agree_with_torchvision_conversions():
    boxes = random_rboxes(50, 7)
    other = random_rboxes(40, 8, spread=6)
    want = rotated_box_iou(boxes, other)
    for fmt in ("XYWHR", "XYXYXYXY"):
        new = getattr(tv_tensors.BoundingBoxFormat, fmt)
        a = TF.convert_bounding_box_format(boxes, old_format=CXCYWHR, new_format=new)
        b = TF.convert_bounding_box_format(other, old_format=CXCYWHR, new_format=new)
        for spelling in (fmt, fmt.lower(), new):
            got = rotated_box_iou(a, b, fmt=spelling)
            torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


def test_bounding_boxes_input_must_carry_fmt():
    boxes = tv_tensors.BoundingBoxes(random_rboxes(4, 9), format="CXCYWHR", canvas_size=(20, 20))
    got = rotated_box_iou(boxes, boxes)
    assert type(got) is torch.Tensor and torch.equal(got.diagonal(), torch.ones(4))
    with pytest.raises(ValueError, match=r"BoundingBoxes in format 'CXCYWHR' but fmt is 'xywhr'"):
        rotated_box_iou(boxes, boxes, fmt="xywhr")


def test_corners_in_either_order_are_the_same_rectangle():
    corners = tv_corners(random_rboxes(30, 10))  # float64: the corners' own rounding is small
    reversed_order = corners.view(30, 4, 2).flip(1).reshape(30, 8)  # p4, p3, p2, p1
    shifted = torch.roll(corners.view(30, 4, 2), 1, 1).reshape(30, 8)  # another first corner
    for other in (reversed_order, shifted):
        got = rotated_box_iou(corners, other, fmt="xyxyxyxy", aligned=True)
        assert (got - 1).abs().max() < 1e-9


def test_the_documented_relations_to_detectron2_and_mmrotate():
    """Corners by detectron2's documented vertex formula (degrees, counter-clockwise) and by
    mmrotate's ``rbox2qbox`` (radians, clockwise: t = -r) are torchvision's corners."""
    boxes = random_rboxes(20, 11).double()
    cx, cy, w, h, r = boxes.unbind(1)
    theirs = tv_corners(boxes).view(20, 4, 2)
    # detectron2: yr = cos(t)(y - yc) - sin(t)(x - xc) + yc, xr = sin(t)(y - yc) + cos(t)(x - xc) + xc
    t = r * math.pi / 180
    local = torch.tensor([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    x = local[:, 0] * (w[:, None] / 2)
    y = local[:, 1] * (h[:, None] / 2)
    d2 = torch.stack(
        [t.sin()[:, None] * y + t.cos()[:, None] * x + cx[:, None],
         t.cos()[:, None] * y - t.sin()[:, None] * x + cy[:, None]], -1
    )  # fmt: skip
    torch.testing.assert_close(d2, theirs)
    # mmrotate 1.x rbox2qbox with t_mm = -r (radians)
    tm = -t
    vec1 = torch.stack([w / 2 * tm.cos(), w / 2 * tm.sin()], -1)
    vec2 = torch.stack([-h / 2 * tm.sin(), h / 2 * tm.cos()], -1)
    ctr = boxes[:, :2]
    mm = torch.stack(
        [ctr + vec1 + vec2, ctr + vec1 - vec2, ctr - vec1 - vec2, ctr - vec1 + vec2], 1
    )
    # the same four points (mmrotate lists them from another corner)
    dist = (mm[:, :, None, :] - theirs[:, None, :, :]).norm(dim=-1)
    assert dist.min(-1).values.max() < 1e-9


def ultralytics_like(n: int, seed: int) -> torch.Tensor:
    """``(n, 5)`` float64 boxes as ultralytics' ``xywhr``: centre, size, radians in ``[0, pi/2)``."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 40
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 20 + 2
    return torch.cat([xy, wh, torch.rand(n, 1, generator=g, dtype=torch.float64) * math.pi / 2], 1)


def test_cxcywhr_rad_cw_is_degrees_turned_the_other_way():
    a, b = ultralytics_like(30, 50), ultralytics_like(20, 51)

    def degrees(x):
        return torch.cat([x[:, :4], -x[:, 4:] * 180 / math.pi], 1)

    got = rotated_box_iou(a, b, fmt="cxcywhr_rad_cw")
    want = rotated_box_iou(degrees(a), degrees(b))
    assert (want > 0).sum() > 50
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    assert torch.equal(rotated_box_iou(a.float(), b.float(), fmt="CXCYWHR_RAD_CW").diagonal(),
                       rotated_box_iou(a.float(), b.float(), fmt="cxcywhr_rad_cw").diagonal())  # fmt: skip
    # a quarter turn clockwise on screen: the width runs down (+y)
    tall = torch.tensor([[0.0, 0.0, 4.0, 2.0, math.pi / 2]], dtype=torch.float64)
    upright = torch.tensor([[0.0, 0.0, 2.0, 4.0, 0.0]], dtype=torch.float64)
    assert abs(rotated_box_iou(tall, upright, fmt="cxcywhr_rad_cw").item() - 1) < 1e-15
    # the loss, its module and NMS take the format
    loss = rotated_box_iou_loss(a[:20], b, fmt="cxcywhr_rad_cw")
    torch.testing.assert_close(loss, 1 - got[:20].diagonal(), rtol=0, atol=0)
    module = losses.RotatedBoxIoULoss("none", fmt="cxcywhr_rad_cw")
    assert torch.equal(module(a[:20], b), loss)
    scores = torch.rand(30, generator=torch.Generator().manual_seed(52))
    keep = nms_rotated(a, scores, 0.1, fmt="cxcywhr_rad_cw")
    assert 0 < len(keep) < 30 and torch.equal(keep, nms_rotated(degrees(a), scores, 0.1))


def test_ultralytics_own_corners_agree(tmp_path):
    """ultralytics' ``xywhr2xyxyxyxy`` corners (flattened, ``"xyxyxyxy"``) give the IoU of
    its ``xywhr`` boxes as ``"cxcywhr_rad_cw"`` (in a child process: importing ultralytics
    changes torch's print options, OpenCV's threads and the environment)."""
    pytest.importorskip("ultralytics")
    boxes = ultralytics_like(25, 53)
    code = (
        "import json, sys, torch\n"
        "from ultralytics.utils.ops import xywhr2xyxyxyxy\n"
        "x = torch.tensor(json.load(sys.stdin), dtype=torch.float64)\n"
        "print(json.dumps(xywhr2xyxyxyxy(x).flatten(-2).tolist()))\n"
    )
    env = {**os.environ, "YOLO_CONFIG_DIR": str(tmp_path), "YOLO_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(boxes.tolist()), capture_output=True,
        text=True, cwd=tmp_path, env=env, timeout=300, check=True,
    )  # fmt: skip
    corners = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]), dtype=torch.float64)
    want = rotated_box_iou(corners, corners[5:], fmt="xyxyxyxy")
    got = rotated_box_iou(boxes, boxes[5:], fmt="cxcywhr_rad_cw")
    assert (want > 0).sum() > 30
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # read as our "cxcywhr" (degrees, counter-clockwise) they are other boxes: a warning
    with pytest.warns(UserWarning, match="fmt='cxcywhr_rad_cw'"):
        assert (rotated_box_iou(boxes, boxes[5:]) - want).abs().max() > 0.05


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b, fmt: rotated_box_iou(a, b, fmt=fmt),
        lambda a, b, fmt: rotated_box_iou(a, b[:10], fmt=fmt, aligned=True),
        lambda a, b, fmt: rotated_box_iou_loss(a, b[:10], fmt=fmt),
        lambda a, b, fmt: losses.RotatedBoxIoULoss(fmt=fmt)(a, b[:10]),
        lambda a, b, fmt: nms_rotated(a, torch.rand(10), 0.5, fmt=fmt),
        lambda a, b, fmt: batched_nms_rotated(a, torch.rand(10), torch.zeros(10, dtype=torch.long), 0.5, fmt=fmt),
    ],
)  # fmt: skip
def test_radians_given_as_degrees_warn(call):
    """Every angle in [0, pi/2] (ultralytics' range, in radians) with a degree format warns,
    naming the format to use; other angles, the radian format and value checks off do not."""
    a, b = ultralytics_like(10, 54).float(), ultralytics_like(12, 55).float()
    for fmt in ("cxcywhr", "xywhr"):
        with pytest.warns(
            UserWarning, match=r"every angle is in \[0, pi/2\].*fmt='cxcywhr_rad_cw'"
        ):
            call(a, b, fmt)
    degrees = a.clone()
    degrees[0, 4] = 30.0
    small = a.clone()
    small[:, 4] *= 0.05  # below 0.1: radians or degrees, nearly the same rectangle
    negative = a.clone()
    negative[0, 4] = -0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(degrees, b.clone().fill_(30.0) + b, "cxcywhr")
        call(small, small.repeat(2, 1), "cxcywhr")
        call(negative, negative.repeat(2, 1), "cxcywhr")
        call(a, b, "cxcywhr_rad_cw")
        rotated_box_iou(a.round().long(), b.round().long())  # integer angles: degrees
        with visionblocks.value_checks(False):
            call(a, b, "cxcywhr")


# ---------------------------------------------------------------------- shapes and dtypes
def test_batch_dims_broadcast():
    a = random_rboxes(2 * 3 * 4, 12).view(2, 3, 4, 5)
    b = random_rboxes(3 * 5, 13).view(3, 5, 5)
    got = rotated_box_iou(a, b)
    assert got.shape == (2, 3, 4, 5)
    for i in range(2):
        for j in range(3):
            assert torch.equal(got[i, j], rotated_box_iou(a[i, j], b[j]))
    aligned = rotated_box_iou(a, b[:, :4], aligned=True)
    assert aligned.shape == (2, 3, 4)
    assert torch.equal(aligned[1], rotated_box_iou(a[1], b[:, :4], aligned=True))


def test_empty_inputs():
    a, empty = random_rboxes(3, 14), torch.zeros(0, 5)
    assert rotated_box_iou(a, empty).shape == (3, 0)
    assert rotated_box_iou(empty, a).shape == (0, 3)
    assert rotated_box_iou(empty, empty, aligned=True).shape == (0,)
    loss = rotated_box_iou_loss(empty.requires_grad_(), empty, reduction="mean")
    assert loss.item() == 0 and loss.requires_grad


@pytest.mark.parametrize(
    "dtype,out",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.int64, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_result_dtypes(dtype, out):
    a = (random_rboxes(6, 15) * 4).round()
    got = rotated_box_iou(a.to(dtype), a.to(dtype)[:4])
    assert got.dtype == out
    torch.testing.assert_close(
        got.float(), rotated_box_iou(a.to(dtype).float(), a.to(dtype).float()[:4])
    )
    mixed = rotated_box_iou(a.half(), a.double()[:4])
    assert mixed.dtype == torch.float64


def test_tiles_and_sparse_path_give_the_same_values_and_gradients(monkeypatch):
    a, b = random_rboxes(37, 16, spread=8), random_rboxes(23, 17, spread=8)
    weight = torch.rand(37, 23, generator=torch.Generator().manual_seed(0))

    def run():
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = rotated_box_iou(x, y)
        return (out, *torch.autograd.grad((out * weight).sum(), (x, y)))

    plain = run()
    monkeypatch.setattr(_rotated_overlap, "FORWARD_PAIRS", 50)
    monkeypatch.setattr(_rotated_overlap, "BACKWARD_PAIRS", 30)
    tiled_sparse = run()
    monkeypatch.setattr(_rotated_overlap, "_sparse", lambda *tensors: False)
    tiled_dense = run()
    monkeypatch.setattr(_rotated_overlap, "FORWARD_PAIRS", 1 << 15)
    monkeypatch.setattr(_rotated_overlap, "BACKWARD_PAIRS", 1 << 12)
    dense = run()
    assert (plain[0] > 0).any() and (plain[0] == 0).any()
    for other in (tiled_sparse, tiled_dense, dense):
        assert torch.equal(other[0], plain[0])
        for g, h in zip(other[1:], plain[1:], strict=True):
            torch.testing.assert_close(g, h, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ gradients
def overlapping(n: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = random_rboxes(n, seed, spread=3).to(dtype)
    b = (a + torch.cat([torch.randn(n, 2, generator=g) * 0.7, torch.randn(n, 2, generator=g) * 0.5,
                        torch.randn(n, 1, generator=g) * 25], 1).to(dtype))  # fmt: skip
    b[:, 2:4] = b[:, 2:4].abs() + 0.3
    a[:, 2:4] += 0.3
    return a, b


def test_gradcheck_pairwise_and_aligned():
    a, b = overlapping(6, 20)
    assert gradcheck(lambda x, y: rotated_box_iou(x, y), (a, b[:4]))
    assert gradcheck(lambda x, y: rotated_box_iou(x, y, aligned=True), (a, b))
    assert gradcheck(lambda x, y: rotated_box_iou_loss(x, y, reduction="sum"), (a, b))


@pytest.mark.parametrize("fmt", ["XYWHR", "XYXYXYXY"])
def test_gradcheck_other_formats(fmt):
    a, b = overlapping(5, 21)
    new = getattr(tv_tensors.BoundingBoxFormat, fmt)
    a = TF.convert_bounding_box_format(a, old_format=CXCYWHR, new_format=new)
    b = TF.convert_bounding_box_format(b, old_format=CXCYWHR, new_format=new)
    assert gradcheck(lambda x, y: rotated_box_iou(x, y, fmt=fmt, aligned=True), (a, b))


def test_gradcheck_radian_format():
    a, b = overlapping(5, 22)
    a[:, 4], b[:, 4] = a[:, 4] * (math.pi / 180), b[:, 4] * (math.pi / 180)
    assert gradcheck(lambda x, y: rotated_box_iou(x, y, fmt="cxcywhr_rad_cw"), (a, b[:4]))


def test_gradient_matches_finite_differences_on_many_pairs():
    a, b = overlapping(300, 22)
    x = a.clone().requires_grad_()
    (grad,) = torch.autograd.grad(rotated_box_iou(x, b, aligned=True).sum(), x)
    h = 1e-6
    for k in range(5):
        step = torch.zeros_like(a)
        step[:, k] = h
        fd = (
            rotated_box_iou(a + step, b, aligned=True) - rotated_box_iou(a - step, b, aligned=True)
        ) / (2 * h)
        close = (fd - grad[:, k]).abs() <= 1e-5 + 1e-4 * fd.abs()
        assert close.float().mean() >= 0.99  # a few pairs sit on a kink
        assert (fd - grad[:, k]).abs().median() < 1e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_gradients_are_finite_everywhere(dtype):
    box = torch.tensor([2.0, 3.0, 4.0, 2.0, 30.0])
    cases = torch.stack(
        [
            box,  # equal
            box + torch.tensor([0.0, 0.0, 0.0, 0.0, 180.0]),  # equivalent
            torch.tensor([2.0, 3.0, 2.0, 4.0, 120.0]),  # equivalent, sides swapped
            torch.tensor([2.0, 3.0, 1.0, 1.0, 10.0]),  # nested
            torch.tensor([2.0, 3.0, 0.0, 1.5, 10.0]),  # zero width inside
            torch.tensor([2.0, 3.0, 0.0, 0.0, 0.0]),  # a point
            torch.tensor([50.0, 3.0, 4.0, 2.0, 30.0]),  # disjoint
            box + torch.tensor([0.0, 0.0, 0.0, 0.0, 1e-3]),  # nearly coincident
            box + torch.tensor([1e-4, 0.0, 0.0, 0.0, 0.0]),
            torch.tensor(
                [
                    2.0 + 2 * math.cos(math.radians(30)),
                    3.0 - 2 * math.sin(math.radians(30)),
                    4.0,
                    2.0,
                    30.0,
                ]
            ),  # touching
            torch.tensor([2.0, 3.0, 1e-30, 1e-30, 0.0]),  # subnormal area
        ]
    ).to(dtype)
    a = box.to(dtype).expand_as(cases).clone().requires_grad_()
    b = cases.clone().requires_grad_()
    for loss in (
        rotated_box_iou(a, b, aligned=True).sum(),
        rotated_box_iou(a, b).sum(),
        rotated_box_iou_loss(a, b, reduction="sum"),
        rotated_box_iou_loss(b, b.detach()[[5, 4, 3, 2, 1, 0, 6, 7, 8, 9, 10]], reduction="sum"),
    ):
        for g in torch.autograd.grad(loss, (a, b), allow_unused=True):
            assert g is None or (g.dtype == dtype and torch.isfinite(g).all())


def test_equal_boxes_have_a_zero_gradient():
    a = random_rboxes(10, 23).requires_grad_()
    loss = rotated_box_iou_loss(a, a.detach().clone(), reduction="sum")
    assert loss.item() == 0
    (grad,) = torch.autograd.grad(loss, a)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_a_zero_width_prediction_is_pushed_to_grow():
    target = torch.tensor([[0.0, 0.0, 4.0, 4.0, 0.0]], dtype=torch.float64)
    pred = torch.tensor([[0.5, 0.0, 0.0, 2.0, 10.0]], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(rotated_box_iou_loss(pred, target, reduction="sum"), pred)
    h = 1e-7
    grown = pred.detach() + torch.tensor([[0.0, 0.0, h, 0.0, 0.0]], dtype=torch.float64)
    one_sided = (rotated_box_iou_loss(grown, target, reduction="sum") - 1.0) / h
    assert grad[0, 2] < 0
    torch.testing.assert_close(grad[0, 2], one_sided, rtol=1e-5, atol=0)


# -------------------------------------------------------------------------------- the loss
def test_loss_is_one_minus_iou_with_the_reductions():
    a, b = overlapping(9, 24, torch.float32)
    iou = rotated_box_iou(a, b, aligned=True)
    assert torch.equal(rotated_box_iou_loss(a, b), 1 - iou)
    torch.testing.assert_close(rotated_box_iou_loss(a, b, "mean"), (1 - iou).mean())
    torch.testing.assert_close(rotated_box_iou_loss(a, b, "sum"), (1 - iou).sum())
    half = rotated_box_iou_loss(a.half(), b.half())
    assert half.dtype == torch.float16
    assert rotated_box_iou_loss(a.half(), b.half(), "mean").dtype == torch.float32
    corners = tv_corners(a).float(), tv_corners(b).float()
    torch.testing.assert_close(
        rotated_box_iou_loss(*corners, fmt="xyxyxyxy"), 1 - iou, atol=2e-5, rtol=0
    )


def test_loss_module_and_registry():
    a, b = overlapping(4, 25, torch.float32)
    module = LOSSES.build("rotated_iou", reduction="sum")
    assert isinstance(module, losses.RotatedBoxIoULoss)
    assert torch.equal(module(a, b), rotated_box_iou_loss(a, b, "sum"))
    assert LOSSES.build("rotated_box_iou").reduction == "mean"
    corners = losses.RotatedBoxIoULoss(reduction="none", fmt="XYXYXYXY")
    torch.testing.assert_close(
        corners(tv_corners(a).float(), tv_corners(b).float()),
        rotated_box_iou_loss(a, b),
        atol=2e-5,
        rtol=0,
    )
    assert "fmt='xyxyxyxy'" in repr(corners)


# ------------------------------------------------------------------------------------- NMS
@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.3, 0.5, 0.7, 1.0])
def test_nms_matches_the_greedy_loop(threshold):
    boxes = random_rboxes(150, 26, spread=25)
    scores = torch.rand(150, generator=torch.Generator().manual_seed(26))
    keep = nms_rotated(boxes, scores, threshold)
    assert keep.dtype == torch.int64
    assert torch.equal(keep, reference_nms(boxes, scores, threshold))
    assert (scores[keep].diff() <= 0).all()


def test_nms_ties_follow_torchvision():
    g = torch.Generator().manual_seed(27)
    xy = torch.rand(200, 2, generator=g) * 30
    wh = torch.rand(200, 2, generator=g) * 8 + 1
    xyxy = torch.cat([xy, xy + wh], 1)
    boxes = torch.cat([xy + wh / 2, wh, torch.zeros(200, 1)], 1)
    scores = torch.randint(0, 4, (200,), generator=g).float()  # many ties
    idxs = torch.randint(0, 3, (200,), generator=g)
    for t in (0.2, 0.5):
        assert torch.equal(nms_rotated(boxes, scores, t), tvo.nms(xyxy, scores, t))
        assert torch.equal(
            batched_nms_rotated(boxes, scores, idxs, t), tvo.batched_nms(xyxy, scores, idxs, t)
        )


def test_batched_nms_matches_the_greedy_loop_per_category():
    boxes = random_rboxes(120, 28, spread=15)
    scores = torch.rand(120, generator=torch.Generator().manual_seed(28))
    idxs = torch.randint(0, 4, (120,), generator=torch.Generator().manual_seed(29))
    keep = batched_nms_rotated(boxes, scores, idxs, 0.2)
    assert torch.equal(keep, reference_nms(boxes, scores, 0.2, idxs))


def test_nms_in_several_blocks(monkeypatch):
    boxes = random_rboxes(90, 30, spread=12)
    scores = torch.rand(90, generator=torch.Generator().manual_seed(30))
    idxs = torch.arange(90) % 2
    want = nms_rotated(boxes, scores, 0.25), batched_nms_rotated(boxes, scores, idxs, 0.25)
    monkeypatch.setattr(_rotated_nms, "BLOCK", 7)
    assert torch.equal(nms_rotated(boxes, scores, 0.25), want[0])
    assert torch.equal(batched_nms_rotated(boxes, scores, idxs, 0.25), want[1])
    assert torch.equal(want[0], reference_nms(boxes, scores, 0.25))


def test_nms_edge_cases():
    empty = nms_rotated(torch.zeros(0, 5), torch.zeros(0), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64
    boxes = torch.tensor(
        [[0.0, 0.0, 4.0, 2.0, 0.0], [0.0, 0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 2.0, 4.0, 90.0],
         [0.0, 0.0, 4.0, 2.0, 180.0]]
    )  # fmt: skip
    scores = torch.tensor([0.5, 0.9, 0.4, 0.45])
    # the degenerate box overlaps nothing; the two equal rectangles are removed by the first
    assert nms_rotated(boxes, scores, 0.99).tolist() == [1, 0]
    corners = tv_corners(boxes).float()
    assert nms_rotated(corners, scores, 0.99, fmt="xyxyxyxy").tolist() == [1, 0]


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: rotated_box_iou(torch.zeros(2, 4), torch.zeros(2, 4)), ValueError, r"boxes1 must have shape \(\.\.\., N, 5\) in 'cxcywhr'"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5), fmt="xyxy"), ValueError, "axis-aligned format"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5), fmt=3), TypeError, "fmt must be a str"),
        (lambda: rotated_box_iou(torch.zeros(5), torch.zeros(2, 5)), ValueError, "boxes1 must have shape"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5), aligned=1), TypeError, "aligned must be bool"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5), eps=-1.0), ValueError, "eps"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5), impl="cuda"), ValueError, "impl"),
        (lambda: rotated_box_iou(torch.zeros(3, 2, 5), torch.zeros(4, 2, 5)), ValueError, "batch dims"),
        (lambda: rotated_box_iou(torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 5)), TypeError, "boxes1 must be a real tensor"),
        (lambda: rotated_box_iou(torch.zeros(2, 5), torch.zeros(2, 5, device="meta")), ValueError, "same device"),
        (lambda: rotated_box_iou_loss(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5)), TypeError, "pred must be a floating"),
        (lambda: rotated_box_iou_loss(torch.zeros(2, 5), torch.zeros(3, 5)), ValueError, "same shape"),
        (lambda: rotated_box_iou_loss(torch.zeros(2, 5), torch.zeros(2, 5), "avg"), ValueError, "reduction"),
        (lambda: nms_rotated(torch.zeros(2, 5), torch.zeros(2), 1.5), ValueError, r"iou_threshold must be a number in \[0, 1\]"),
        (lambda: nms_rotated(torch.zeros(2, 5), torch.zeros(2), "0.5"), TypeError, "iou_threshold must be a float"),
        (lambda: nms_rotated(torch.zeros(1, 2, 5), torch.zeros(2), 0.5), ValueError, r"boxes must have shape \(N, 5\)"),
        (lambda: nms_rotated(torch.zeros(2, 5), torch.zeros(3), 0.5), ValueError, r"scores must have shape \(N,\)"),
        (lambda: nms_rotated(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), 0.5), TypeError, "scores must be a floating"),
        (lambda: batched_nms_rotated(torch.zeros(2, 5), torch.zeros(2), None, 0.5), TypeError, "idxs must be a torch.Tensor"),
        (lambda: batched_nms_rotated(torch.zeros(2, 5), torch.zeros(2), torch.zeros(2), 0.5), TypeError, "idxs must be an integer"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------- compile and fake tensors
def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")


@pytest.mark.slow
def test_iou_and_loss_compile_fullgraph_and_equal_eager():
    a, b = overlapping(7, 31, torch.float32)

    def run(x, y):
        return (
            rotated_box_iou(x, y[:5]),
            rotated_box_iou(x, y, aligned=True),
            rotated_box_iou_loss(x, y, "mean"),
            rotated_box_iou(tv_corners(x).float(), tv_corners(y).float(), fmt="xyxyxyxy"),
        )

    def values_and_grads(fn):
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        outs = fn(x, y)
        return (*outs, *torch.autograd.grad(sum(o.sum() for o in outs[:3]), (x, y)))

    with visionblocks.value_checks(True):
        want = values_and_grads(run)
        got = values_and_grads(_compiled(run))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_nms_compiles_as_one_node():
    boxes = random_rboxes(60, 32, spread=10)
    scores = torch.rand(60, generator=torch.Generator().manual_seed(32))
    idxs = torch.arange(60) % 3

    def run(b, s):
        return nms_rotated(b, s, 0.3), batched_nms_rotated(b, s, idxs, 0.3)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = torch.compile(run, fullgraph=True, backend="aot_eager")(boxes, scores)
    want = run(boxes, scores)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_fake_cuda_tensors_read_no_values():
    from tests.package.test_fake_cuda import no_driver

    cuda = torch.device("cuda")
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        a, b = torch.rand(7, 5, device=cuda), torch.rand(4, 5, device=cuda)
        corners = torch.rand(3, 8, device=cuda)
        with no_driver():
            assert rotated_box_iou(a, b).shape == (7, 4)
            assert rotated_box_iou(a[:4], b, aligned=True).shape == (4,)
            assert rotated_box_iou_loss(a[:4], b, "mean").shape == ()
            assert rotated_box_iou(corners, corners, fmt="xyxyxyxy").shape == (3, 3)
    shape_env = ShapeEnv(allow_dynamic_output_shape_ops=True)
    with FakeTensorMode(allow_non_fake_inputs=False, shape_env=shape_env):
        boxes, scores = torch.rand(7, 5, device=cuda), torch.rand(7, device=cuda)
        idxs = torch.zeros(7, dtype=torch.long, device=cuda)
        with no_driver():
            keep = nms_rotated(boxes, scores, 0.5)
            kept = batched_nms_rotated(boxes, scores, idxs, 0.5)
    assert keep.device.type == "cuda" and keep.dtype == torch.int64
    assert isinstance(keep.shape[0], torch.SymInt) and isinstance(kept.shape[0], torch.SymInt)


# ----------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_matches_cpu():
    a, b = hard_pairs(800, 33)
    for impl in ("torch", "auto"):
        got = rotated_box_iou(a.cuda(), b.cuda(), impl=impl).cpu()
        torch.testing.assert_close(got, rotated_box_iou(a, b), rtol=0, atol=2e-6)
    boxes = random_rboxes(2000, 34, spread=200)
    scores = torch.rand(2000, generator=torch.Generator().manual_seed(34))
    assert torch.equal(
        nms_rotated(boxes.cuda(), scores.cuda(), 0.3).cpu(), nms_rotated(boxes, scores, 0.3)
    )
    p, t = overlapping(300, 35, torch.float32)  # pairs away from kinks: one gradient
    x = p.cuda().requires_grad_()
    (g,) = torch.autograd.grad(rotated_box_iou_loss(x, t.cuda(), "sum"), x)
    y = p.clone().requires_grad_()
    (h,) = torch.autograd.grad(rotated_box_iou_loss(y, t, "sum"), y)
    torch.testing.assert_close(g.cpu(), h, rtol=1e-4, atol=1e-5)
