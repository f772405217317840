"""Tight boxes after rotation and shear: `warp_sample` measures the warped object.

Polygons against ``cv2.transform`` + min/max and ``cv2.boundingRect`` of the warped polygon,
masks against ``cv2.boundingRect`` of the warped mask, hand-computed shears, the issue's
disk (issue 31), and the rules: polygons before masks before corners, the corner method for
warps that map axes to axes, empty masks, filtering.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as tvf

from tests.helpers import assert_close
from visionblocks.ops import affine_matrix, warp_boxes, warp_masks
from visionblocks.transforms import warp_sample

cv2 = pytest.importorskip("cv2")

H, W = 64, 80
CENTER = ((W - 1) / 2, (H - 1) / 2)
SHEAR = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)  # x' = x + y/2
GENERAL = {
    "rotate": affine_matrix(angle=30.0, center=CENTER).double(),
    "rot_shear": affine_matrix(angle=-50.0, scale=0.9, shear=(12.0, 4.0), center=CENTER).double(),
    "shear": SHEAR,
}


def as_boxes(xyxy, fmt: str = "XYXY", size=(H, W)) -> tv_tensors.BoundingBoxes:
    boxes = tv_tensors.BoundingBoxes(
        torch.as_tensor(xyxy, dtype=torch.float64), format="XYXY", canvas_size=size
    )
    return tvf.convert_bounding_box_format(boxes, new_format=fmt)


def plain(x) -> torch.Tensor:
    return x.as_subclass(torch.Tensor)


def disk(radius: float, cx: float, cy: float, size=(H, W)) -> torch.Tensor:
    """Pixels whose centre (edge convention: ``j + 0.5``) is within ``radius`` of the centre."""
    rows, cols = torch.meshgrid(
        torch.arange(size[0], dtype=torch.float64),
        torch.arange(size[1], dtype=torch.float64),
        indexing="ij",
    )
    return (cols + 0.5 - cx) ** 2 + (rows + 0.5 - cy) ** 2 <= radius**2


def polygon_of_disk(radius: float, cx: float, cy: float, n: int = 720) -> torch.Tensor:
    t = torch.arange(n, dtype=torch.float64) * (2 * math.pi / n)
    return torch.stack((cx + radius * torch.cos(t), cy + radius * torch.sin(t)), -1)


def cv2_warp_vertices(polygon: torch.Tensor, matrix: torch.Tensor) -> np.ndarray:
    """The reference warp of polygon vertices (edge convention): ``M (p - 0.5) + 0.5``."""
    moved = cv2.transform(polygon.numpy()[:, None] - 0.5, matrix.double().numpy())[:, 0]
    return moved + 0.5


# ------------------------------------------------------------------------------ the issue


def test_issue_disk_rotated_by_45_degrees():
    """Issue 31: a disk of 81 px turned by 45° gave a box 114.6 px wide (the corners)."""
    size = (128, 128)
    mask = disk(40.5, 60.5, 60.5, size)
    box = [[20.0, 20.0, 101.0, 101.0]]
    rot45 = affine_matrix(angle=45.0, center=(60.0, 60.0)).double()  # about the disk's centre
    image = torch.zeros(3, *size)
    _, corners = warp_sample(image, {"boxes": as_boxes(box, size=size)}, rot45)
    width = plain(corners["boxes"])[0, 2] - plain(corners["boxes"])[0, 0]
    assert width == pytest.approx(81 * math.sqrt(2), abs=1e-4) and round(float(width), 1) == 114.6
    masks = tv_tensors.Mask(mask[None])
    _, tight = warp_sample(image, {"boxes": as_boxes(box, size=size), "masks": masks}, rot45)
    assert plain(tight["boxes"]).tolist() == [[20.0, 20.0, 101.0, 101.0]]  # 81 px wide
    polygons = [[polygon_of_disk(40.5, 60.5, 60.5)]]
    _, from_polygon = warp_sample(
        image, {"boxes": as_boxes(box, size=size), "polygons": polygons}, rot45
    )
    assert_close(
        plain(from_polygon["boxes"]),
        torch.tensor([[20.0, 20.0, 101.0, 101.0]], dtype=torch.float64),
        scale=1e5,  # within 1e-3 px: a 720-gon inscribed in the circle
    )


# ------------------------------------------------------------------------------ polygons


def _random_polygons(gen: torch.Generator, n: int) -> list[list[torch.Tensor]]:
    """Star-shaped polygons (non-convex), some instances with two parts."""
    out = []
    for k in range(n):
        parts = []
        for _ in range(1 + k % 2):
            m = int(torch.randint(3, 12, (1,), generator=gen))
            angles = torch.sort(torch.rand(m, generator=gen, dtype=torch.float64) * 2 * math.pi)[0]
            radii = 3 + torch.rand(m, generator=gen, dtype=torch.float64) * 9
            centre = torch.tensor([20.0, 16.0], dtype=torch.float64) + torch.rand(
                2, generator=gen, dtype=torch.float64
            ) * torch.tensor([40.0, 30.0], dtype=torch.float64)
            parts.append(centre + radii[:, None] * torch.stack((angles.cos(), angles.sin()), -1))
        out.append(parts)
    return out


def _enclosing(polygons: list[list[torch.Tensor]]) -> torch.Tensor:
    boxes = [torch.cat(parts) for parts in polygons]
    return torch.stack([torch.cat((b.amin(0), b.amax(0))) for b in boxes])


@pytest.mark.parametrize("name", list(GENERAL))
def test_polygon_boxes_match_opencv(name):
    m = GENERAL[name]
    gen = torch.Generator().manual_seed(3)
    polygons = _random_polygons(gen, 6)
    boxes = _enclosing(polygons)
    target = {"boxes": as_boxes(boxes), "polygons": polygons, "labels": torch.arange(6)}
    _, out = warp_sample(torch.zeros(3, H, W), target, m, size=(2 * H, 2 * W), min_size=None)
    got = plain(out["boxes"])
    for k, parts in enumerate(polygons):
        moved = np.concatenate([cv2_warp_vertices(p, m) for p in parts])
        expected = np.concatenate((moved.min(0), moved.max(0))).clip(0, None)
        np.testing.assert_allclose(got[k].numpy(), expected, rtol=0, atol=1e-9)
        # cv2.boundingRect of the warped polygon: the integer rectangle of the pixels its
        # vertices fall in, (floor(min), floor(max) - floor(min) + 1)
        x, y, w, h = cv2.boundingRect(moved.astype(np.float32))
        assert (math.floor(got[k, 0]), math.floor(got[k, 1])) == (max(x, 0), max(y, 0))
        assert (math.floor(got[k, 2]), math.floor(got[k, 3])) == (x + w - 1, y + h - 1)
        # the warped polygons are returned, vertex for vertex
        for part, warped in zip(parts, out["polygons"][k], strict=True):
            assert warped.dtype == part.dtype
            np.testing.assert_allclose(warped.numpy(), cv2_warp_vertices(part, m), atol=1e-9)
    # tighter than (or as tight as) the corners, and inside them
    corners = warp_boxes(boxes, m, size=(2 * H, 2 * W))
    assert (got[:, :2] >= corners[:, :2] - 1e-9).all() and (
        got[:, 2:] <= corners[:, 2:] + 1e-9
    ).all()
    assert ((got[:, 2:] - got[:, :2]) < (corners[:, 2:] - corners[:, :2]) - 0.5).any()


def test_hand_computed_shear_of_a_diamond():
    # The diamond (15, 10), (20, 15), (15, 20), (10, 15) in box (10, 10, 20, 20); the shear
    # x' = x + y / 2 in pixel coordinates moves an edge-convention vertex to
    # (x + (y - 0.5) / 2, y): (19.75, 10), (27.25, 15), (24.75, 20), (17.25, 15).
    diamond = torch.tensor([[15.0, 10.0], [20.0, 15.0], [15.0, 20.0], [10.0, 15.0]])
    target = {"boxes": as_boxes([[10.0, 10.0, 20.0, 20.0]]), "polygons": [[diamond]]}
    _, out = warp_sample(torch.zeros(3, H, W), target, SHEAR)
    assert plain(out["boxes"]).tolist() == [[17.25, 10.0, 27.25, 20.0]]
    assert out["polygons"][0][0].tolist() == [[19.75, 10], [27.25, 15], [24.75, 20], [17.25, 15]]
    _, corners = warp_sample(torch.zeros(3, H, W), {"boxes": target["boxes"]}, SHEAR)
    assert plain(corners["boxes"]).tolist() == [[14.75, 10.0, 29.75, 20.0]]


def test_polygon_crossing_the_border_is_clipped():
    # Under the shear the vertices go to x + (y - 0.5) / 2: (74.75, 10), (104.75, 20),
    # (86.75, 30); the box of the whole object, clipped to the canvas (W = 80).
    triangle = torch.tensor([[70.0, 10.0], [95.0, 20.0], [72.0, 30.0]])
    target = {"boxes": as_boxes([[70.0, 10.0, 80.0, 30.0]]), "polygons": [[triangle]]}
    _, out = warp_sample(torch.zeros(3, H, W), target, SHEAR)
    assert plain(out["boxes"]).tolist() == [[74.75, 10.0, 80.0, 30.0]]
    assert out["polygons"][0][0][1].tolist() == [104.75, 20.0]  # polygons are not clipped


# --------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("name", list(GENERAL))
def test_mask_boxes_match_opencv_bounding_rect(name):
    m = GENERAL[name]
    masks = torch.zeros(3, H, W, dtype=torch.uint8)
    masks[0] = disk(9.0, 30.0, 25.0).to(torch.uint8)
    masks[1, 40:55, 10:40] = 1
    masks[2, 5:12, 60:62] = 1
    masks[2, 20:22, 50:75] = 1  # an L-ish object of two parts
    boxes = []
    for mask in masks:
        x, y, w, h = cv2.boundingRect(mask.numpy())
        boxes.append([x, y, x + w, y + h])
    target = {"boxes": as_boxes(boxes), "masks": tv_tensors.Mask(masks)}
    _, out = warp_sample(torch.zeros(3, H, W), target, m, min_size=None)
    for k, warped in enumerate(out["masks"]):
        assert warped.any()
        x, y, w, h = cv2.boundingRect(warped.numpy())
        assert plain(out["boxes"])[k].tolist() == [x, y, x + w, y + h]
    # and the warped masks are warp_masks'
    assert torch.equal(plain(out["masks"]), warp_masks(masks, m))


def test_polygons_then_masks_then_corners():
    # Instance 0 has a polygon, instance 1 none (a crowd RLE instance: []), instance 2 none.
    diamond = torch.tensor([[15.0, 10.0], [20.0, 15.0], [15.0, 20.0], [10.0, 15.0]])
    masks = torch.zeros(3, H, W, dtype=torch.bool)
    masks[0, 10:20, 10:20] = True  # a square: its box would differ from the diamond's
    masks[1] = disk(8.0, 40.0, 40.0)
    boxes = as_boxes([[10, 10, 20, 20], [32, 32, 48, 48], [60, 5, 70, 15]])  # 2: mask empty
    target = {
        "boxes": boxes,
        "masks": tv_tensors.Mask(masks),
        "polygons": [[diamond], [], []],
    }
    _, out = warp_sample(torch.zeros(3, H, W), target, SHEAR, min_size=None)
    got = plain(out["boxes"])
    assert got[0].tolist() == [17.25, 10.0, 27.25, 20.0]  # the diamond
    x, y, w, h = cv2.boundingRect(out["masks"][1].to(torch.uint8).numpy())
    assert got[1].tolist() == [x, y, x + w, y + h]  # the warped disk
    # instance 2's source mask is empty: nothing to measure, the corners
    assert_close(got[2], warp_boxes(plain(boxes)[2:], SHEAR, size=(H, W))[0])
    # no masks: instances without polygons keep the corners
    sample = {"boxes": boxes, "polygons": [[diamond], [], []]}
    _, out = warp_sample(torch.zeros(3, H, W), sample, SHEAR, min_size=None)
    assert_close(plain(out["boxes"])[1:], warp_boxes(plain(boxes)[1:], SHEAR, size=(H, W)))


def test_a_mask_emptied_by_the_warp_gives_an_empty_box_that_min_size_drops():
    masks = torch.zeros(2, H, W, dtype=torch.uint8)
    masks[0, 5:15, 5:15] = 1
    masks[1, 40:50, 60:75] = 1
    target = {
        "boxes": as_boxes([[5, 5, 15, 15], [60, 40, 75, 50]]),
        "masks": tv_tensors.Mask(masks),
        "labels": torch.tensor([1, 2]),
        "polygons": [[], []],
    }
    # Turned by 30° and shifted so that the corners' box ends at x = 0.4: the turned square
    # itself reaches no pixel centre (x = 0.5), its enclosing box keeps a sliver.
    m = affine_matrix(angle=30.0, center=CENTER).double()
    m[0, 2] += 0.4 - warp_boxes(plain(target["boxes"])[:1], m)[0, 2]
    _, kept = warp_sample(torch.zeros(3, H, W), target, m, min_size=None)
    assert not kept["masks"][0].any() and plain(kept["boxes"])[0].tolist() == [0, 0, 0, 0]
    corner = warp_boxes(plain(target["boxes"])[:1], m, size=(H, W))
    assert corner[0, 2] - corner[0, 0] == pytest.approx(0.4)
    assert corner[0, 3] - corner[0, 1] > 10
    _, out = warp_sample(torch.zeros(3, H, W), target, m, min_size=0.0)
    assert out["labels"].tolist() == [2]  # min_size=0: only empty boxes go
    _, out = warp_sample(torch.zeros(3, H, W), target, m)
    assert out["labels"].tolist() == [2] and out["masks"].shape == (1, H, W)
    assert out["polygons"] == [[]] and plain(out["boxes"]).shape == (1, 4)


def test_mask_fill_counts_as_background():
    masks = torch.zeros(1, H, W, dtype=torch.uint8)
    masks[0, 20:30, 20:40] = 1
    target = {"boxes": as_boxes([[20, 20, 40, 30]]), "masks": tv_tensors.Mask(masks)}
    m = GENERAL["rotate"]
    _, zero = warp_sample(torch.zeros(3, H, W), target, m)
    _, ignore = warp_sample(torch.zeros(3, H, W), target, m, mask_fill=255)
    assert (plain(ignore["masks"]) == 255).any()
    assert torch.equal(plain(ignore["boxes"]), plain(zero["boxes"]))


# ------------------------------------------------------------------ warps that keep axes


@pytest.mark.parametrize(
    "matrix",
    [
        torch.eye(2, 3, dtype=torch.float64),
        torch.tensor([[1.0, 0.0, 3.25], [0.0, 1.0, -1.5]], dtype=torch.float64),
        torch.tensor([[1.5, 0.0, -4.0], [0.0, 0.75, 6.0]], dtype=torch.float64),
        torch.tensor([[-1.0, 0.0, W - 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64),
        affine_matrix(angle=90.0, center=CENTER),  # cos 90° rounds to -4.4e-8
        affine_matrix(angle=-90.0, scale=0.5, center=CENTER).double(),
    ],
    ids=["identity", "shift", "scale", "hflip", "turn90", "turn-90"],
)
def test_axis_keeping_warps_keep_the_exact_corner_boxes(matrix):
    boxes = [[10.3, 12.6, 30.1, 25.2], [40.5, 30.25, 60.75, 50.5]]
    masks = torch.zeros(2, H, W, dtype=torch.bool)
    masks[0, 12:25, 10:30] = True
    masks[1, 30:50, 40:60] = True
    polygons = [[torch.tensor([[11.0, 13.0], [29.0, 13.0], [20.0, 24.0]])], []]
    target = {"boxes": as_boxes(boxes), "masks": tv_tensors.Mask(masks), "polygons": polygons}
    _, out = warp_sample(torch.zeros(3, H, W), target, matrix, size=(2 * H, 2 * W), min_size=None)
    corners = warp_boxes(torch.tensor(boxes, dtype=torch.float64), matrix, size=(2 * H, 2 * W))
    assert_close(plain(out["boxes"]), corners.to(plain(out["boxes"]).dtype))


def test_identity_keeps_boxes_and_formats_are_kept():
    masks = torch.zeros(1, H, W, dtype=torch.bool)
    masks[0, 12:25, 10:30] = True
    for fmt in ("XYXY", "XYWH", "CXCYWH"):
        boxes = as_boxes([[10.3, 12.6, 30.1, 25.2]], fmt)
        sample = {"boxes": boxes, "masks": tv_tensors.Mask(masks)}
        _, out = warp_sample(torch.zeros(3, H, W), sample, torch.eye(2, 3, dtype=torch.float64))
        assert out["boxes"].format == boxes.format
        assert_close(plain(out["boxes"]), plain(boxes))
        _, turned = warp_sample(torch.zeros(3, H, W), sample, GENERAL["rotate"])
        xyxy = tvf.convert_bounding_box_format(turned["boxes"], new_format="XYXY")
        x, y, w, h = cv2.boundingRect(turned["masks"][0].to(torch.uint8).numpy())
        assert_close(plain(xyxy)[0], torch.tensor([x, y, x + w, y + h], dtype=torch.float64))


def test_integer_boxes_and_rotated_formats():
    masks = torch.zeros(1, H, W, dtype=torch.uint8)
    masks[0, 20:30, 20:40] = 1
    m = GENERAL["rotate"]
    boxes = tv_tensors.BoundingBoxes([[20, 20, 40, 30]], format="XYXY", canvas_size=(H, W))
    _, out = warp_sample(torch.zeros(3, H, W), {"boxes": boxes, "masks": tv_tensors.Mask(masks)}, m)
    x, y, w, h = cv2.boundingRect(out["masks"][0].numpy())
    assert out["boxes"].dtype == torch.int64
    assert plain(out["boxes"]).tolist() == [[x, y, x + w, y + h]]
    # rotated formats are warped corner by corner, masks or not
    corners = torch.tensor([[20.0, 20.0, 40.0, 20.0, 40.0, 30.0, 20.0, 30.0]])
    rotated = tv_tensors.BoundingBoxes(corners, format="XYXYXYXY", canvas_size=(H, W))
    sample = {"boxes": rotated, "masks": tv_tensors.Mask(masks)}
    _, with_masks = warp_sample(torch.zeros(3, H, W), sample, m)
    _, alone = warp_sample(torch.zeros(3, H, W), {"boxes": rotated}, m)
    assert torch.equal(plain(with_masks["boxes"]), plain(alone["boxes"]))


# ------------------------------------------------------------------------ polygon entries


@pytest.mark.parametrize(
    ("polygons", "error", "match"),
    [
        (torch.zeros(1, 3, 2), TypeError, r"target\['polygons'\] must be a list"),
        ([torch.zeros(3, 2)], TypeError, "got Tensor for instance 0"),
        ([[[1.0, 2.0]]], TypeError, r"target\['polygons'\]\[0\]\[0\] must be a floating tensor"),
        ([[torch.zeros(3, 2, dtype=torch.int64)]], TypeError, "got torch.int64"),
        ([[torch.zeros(6)]], ValueError, r"\[0\]\[0\] must have shape \(P, 2\), got \(6,\)"),
        ([[], []], ValueError, "has 2 entries but there are 1 boxes"),
    ],
)
def test_polygon_entries_are_checked(polygons, error, match):
    target = {"boxes": as_boxes([[1, 1, 5, 5]]), "polygons": polygons}
    with pytest.raises(error, match=match):
        warp_sample(torch.zeros(3, H, W), target, GENERAL["rotate"])


def test_polygons_without_boxes_are_warped_and_returned():
    square = torch.tensor([[1.0, 1.0], [3.0, 1.0], [3.0, 3.0]], dtype=torch.float32)
    _, out = warp_sample(torch.zeros(3, H, W), {"polygons": [[square], []]}, SHEAR.float())
    assert out["polygons"][1] == [] and out["polygons"][0][0].dtype == torch.float32
    assert out["polygons"][0][0].tolist() == [[1.25, 1.0], [3.25, 1.0], [4.25, 3.0]]
