"""Points, boxes and masks follow the image under one matrix."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as tvf

import visionblocks
from tests.helpers import assert_close, gradcheck
from tests.transforms.test_warp_sample import make_sample
from visionblocks.ops.warp import (
    affine_matrix,
    invert_affine,
    matrix_to_theta,
    theta_to_matrix,
    warp_affine,
)
from visionblocks.ops.warp_targets import warp_boxes, warp_masks, warp_points
from visionblocks.transforms import warp_sample

cv2 = pytest.importorskip("cv2")

H, W = 40, 60
CENTER = ((W - 1) / 2, (H - 1) / 2)

AXIS_ALIGNED = {
    "translate": torch.tensor([[1.0, 0.0, 7.25], [0.0, 1.0, -3.5]]),
    "scale": affine_matrix(scale=1.7, center=CENTER, translate=(2.0, 1.0)),
    "shrink": affine_matrix(scale=0.6, center=(3.0, 4.0)),
    "hflip": torch.tensor([[-1.0, 0.0, W - 1.0], [0.0, 1.0, 0.0]]),
    "anisotropic": torch.tensor([[1.5, 0.0, -4.0], [0.0, 0.5, 6.0]]),
}
GENERAL = {
    "rotate": affine_matrix(angle=30.0, center=CENTER),
    "rot_shear": affine_matrix(angle=-65.0, scale=0.8, shear=(15.0, 5.0), center=CENTER),
}


def corner_boxes(boxes: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Reference: warp the four corners (edge convention) and take min/max."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    corners = torch.stack(
        [torch.stack(c, -1) for c in ((x1, y1), (x2, y1), (x2, y2), (x1, y2))], -2
    )
    pts = corners - 0.5
    moved = pts @ matrix[:, :2].T + matrix[:, 2] + 0.5
    return torch.cat((moved.amin(-2), moved.amax(-2)), -1)


# ---------------------------------------------------------------------------- points


def test_warp_points_matches_cv2_transform():
    gen = torch.Generator().manual_seed(0)
    pts = torch.rand(17, 2, generator=gen, dtype=torch.float64) * 50
    for m in (*AXIS_ALIGNED.values(), *GENERAL.values()):
        ref = cv2.transform(pts.numpy()[:, None], m.double().numpy())[:, 0]
        assert_close(warp_points(pts, m.double()), torch.from_numpy(ref))


def test_warp_points_batched_and_dtypes():
    mats = torch.stack(list(GENERAL.values()))
    pts = torch.randint(0, 30, (2, 5, 2))  # integer points give floats
    out = warp_points(pts, mats)
    assert out.shape == (2, 5, 2) and out.dtype == torch.float32
    for i in range(2):
        assert_close(out[i], warp_points(pts[i].float(), mats[i]))
    # one matrix for (B, N, 2), and (B, 2, 3) against shared points (N, 2)
    assert warp_points(pts.float(), mats[0]).shape == (2, 5, 2)
    shared = torch.stack([warp_points(pts[0].float(), mats[i]) for i in range(2)])
    assert_close(warp_points(pts[0].float(), mats), shared)
    gradcheck(warp_points, [torch.rand(3, 2), mats[0]])


@pytest.mark.parametrize("name", ["rotate", "rot_shear", "scale", "hflip"])
def test_warp_points_lands_where_warp_affine_moves_a_pixel(name):
    m = {**AXIS_ALIGNED, **GENERAL}[name]
    for i, j in [(12, 20), (25, 31), (18, 40)]:
        img = torch.zeros(1, H, W, dtype=torch.float64)
        img[0, i, j] = 1.0
        # A 3x magnification spreads the pixel into a bilinear tent centred at M (j, i).
        zoom = affine_matrix(scale=3.0, center=(0.0, 0.0)).double() @ torch.cat(
            [m.double(), torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)]
        )
        out = warp_affine(img, zoom, size=(3 * H, 3 * W))[0]
        ys, xs = torch.meshgrid(
            torch.arange(3 * H, dtype=torch.float64),
            torch.arange(3 * W, dtype=torch.float64),
            indexing="ij",
        )
        centroid = torch.stack(((out * xs).sum(), (out * ys).sum())) / out.sum() / 3
        expected = warp_points(
            torch.tensor([[float(j), float(i)]], dtype=torch.float64), m.double()
        )[0]
        assert_close(centroid, expected, dtype=torch.float32, scale=1e3)  # within 1e-3 px


# ---------------------------------------------------------------------------- boxes

BOXES = torch.tensor(
    [
        [5.0, 6.0, 20.0, 30.0],
        [30.0, 10.0, 55.0, 35.0],
        [0.0, 0.0, 60.0, 40.0],
        [12.5, 3.25, 12.5, 9.0],
    ]
)


@pytest.mark.parametrize("name", [*AXIS_ALIGNED, *GENERAL])
def test_warp_boxes_equals_corner_reference(name):
    m = {**AXIS_ALIGNED, **GENERAL}[name]
    assert_close(warp_boxes(BOXES, m), corner_boxes(BOXES, m))
    clipped = warp_boxes(BOXES, m, size=(H, W))
    ref = corner_boxes(BOXES, m)
    ref = torch.stack(
        [
            ref[:, 0].clamp(0, W),
            ref[:, 1].clamp(0, H),
            ref[:, 2].clamp(0, W),
            ref[:, 3].clamp(0, H),
        ],
        -1,
    )
    assert_close(clipped, ref)


def test_warp_boxes_known_values_and_resize_convention():
    boxes = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    assert torch.equal(
        warp_boxes(boxes, AXIS_ALIGNED["translate"]), torch.tensor([[17.25, 16.5, 37.25, 36.5]])
    )
    # a pure resize by s is x' = s x + (s - 1) / 2 in pixel coordinates: boxes simply scale
    resize = torch.tensor([[3.0, 0.0, 1.0], [0.0, 0.5, -0.25]])
    assert_close(warp_boxes(boxes, resize), torch.tensor([[30.0, 10.0, 90.0, 20.0]]))
    # horizontal flip of a W-wide image: x -> W - x for box edges
    assert torch.equal(
        warp_boxes(boxes, AXIS_ALIGNED["hflip"]), torch.tensor([[30.0, 20.0, 50.0, 40.0]])
    )


def test_warp_boxes_matches_torchvision_affine_bounding_boxes():
    boxes = tv_tensors.BoundingBoxes(BOXES, format="XYXY", canvas_size=(H, W), clamping_mode=None)
    for angle, scale in [(0.0, 1.5), (30.0, 1.0), (-110.0, 0.7)]:
        ref = tvf.affine(boxes, angle=angle, translate=[3, -2], scale=scale, shear=[0.0, 0.0])
        m = affine_matrix(angle=-angle, translate=(3.0, -2.0), scale=scale, center=CENTER)
        assert_close(warp_boxes(BOXES, m), ref.as_subclass(torch.Tensor), scale=10)


def test_warp_boxes_batched_empty_dtypes_and_gradients():
    mats = torch.stack(list(GENERAL.values()))
    batch = BOXES.expand(2, 4, 4)
    out = warp_boxes(batch, mats, size=(H, W))
    for i in range(2):
        assert_close(out[i], warp_boxes(BOXES, mats[i], size=(H, W)))
    assert warp_boxes(torch.zeros(0, 4), mats[0]).shape == (0, 4)
    assert warp_boxes(BOXES.long(), mats[0]).dtype == torch.float32
    assert warp_boxes(BOXES.double(), mats[0]).dtype == torch.float64
    gen = torch.Generator().manual_seed(1)
    xy = torch.rand(5, 2, generator=gen) * 20
    boxes = torch.cat((xy, xy + 1 + torch.rand(5, 2, generator=gen) * 10), -1)
    gradcheck(lambda b, m: warp_boxes(b, m), [boxes, GENERAL["rot_shear"]])


def test_mask_box_matches_warped_box():
    """For axis-aligned transforms the box of a warped mask is the warped box (to a pixel)."""
    mask = torch.zeros(1, H, W, dtype=torch.bool)
    mask[0, 8:22, 11:29] = True  # pixels 11..28, 8..21 -> box (11, 8, 29, 22)
    box = torch.tensor([[11.0, 8.0, 29.0, 22.0]])
    for name, m in {**AXIS_ALIGNED, **GENERAL}.items():
        out = warp_masks(mask, m, size=(2 * H, 2 * W))[0]
        ys, xs = out.nonzero(as_tuple=True)
        mask_box = torch.tensor(
            [[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float32
        )
        warped = warp_boxes(box, m, size=(2 * H, 2 * W))
        if name in AXIS_ALIGNED:
            assert (mask_box - warped).abs().max() <= 1.0, name
        else:  # rotation/shear: the enclosing box contains the mask
            assert (mask_box[:, :2] >= warped[:, :2] - 1).all() and (
                mask_box[:, 2:] <= warped[:, 2:] + 1
            ).all()


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float32])
def test_warp_masks_keeps_dtype_and_matches_opencv_nearest(dtype):
    gen = torch.Generator().manual_seed(2)
    masks = torch.randint(0, 2, (3, H, W), generator=gen).to(dtype)
    m = GENERAL["rot_shear"]
    out = warp_masks(masks, m, size=(30, 50))
    assert out.dtype == dtype and out.shape == (3, 30, 50)
    ref = cv2.warpAffine(
        masks.to(torch.uint8).permute(1, 2, 0).numpy(),
        m.double().numpy(),
        (50, 30),
        flags=cv2.INTER_NEAREST,
    )
    mismatch = (out.to(torch.uint8).permute(1, 2, 0).numpy() != ref).any(-1).mean()
    assert mismatch < 2e-3  # near-ties only


def test_warp_masks_batched_and_empty():
    masks = torch.rand(2, 4, H, W) > 0.5
    mats = torch.stack(list(GENERAL.values()))
    out = warp_masks(masks, mats)
    for i in range(2):
        assert torch.equal(out[i], warp_masks(masks[i], mats[i]))
    assert warp_masks(torch.zeros(0, H, W, dtype=torch.bool), mats[0]).shape == (0, H, W)


def test_warp_boxes_and_points_errors():
    with pytest.raises(ValueError, match=r"boxes must have shape \(\.\.\., 4\)"):
        warp_boxes(torch.zeros(3, 5), torch.eye(2, 3))
    with pytest.raises(ValueError, match="size must be positive"):
        warp_boxes(torch.zeros(3, 4), torch.eye(2, 3), size=(0, 3))
    two = torch.eye(2, 3).expand(2, 2, 3)
    with pytest.raises(ValueError, match=r"matrix of shape \(2, 2, 3\) does not broadcast with"):
        warp_points(torch.zeros(3, 5, 2), two)
    with pytest.raises(ValueError, match=r"does not broadcast with boxes of shape \(3, 5, 4\)"):
        warp_boxes(torch.zeros(3, 5, 4), two)


# --- singular matrices, devices, options (issue 19) --------------------------------------------

SINGULAR = torch.tensor([[1.0, 2.0, 0.0], [2.0, 4.0, 1.0]])  # det 0: the image onto a line
NAN = torch.tensor([[1.0, 0.0, float("nan")], [0.0, 1.0, 0.0]])
WARPS = {
    "invert_affine": lambda m: invert_affine(m),
    "matrix_to_theta": lambda m: matrix_to_theta(m, (4, 5), (4, 5)),
    "theta_to_matrix": lambda m: theta_to_matrix(m, (4, 5), (4, 5)),
    "warp_affine": lambda m: warp_affine(torch.rand(2, 3, 4, 5), m),
    "warp_affine_nearest": lambda m: warp_affine(torch.rand(3, 4, 5), m, mode="nearest"),
    "warp_masks": lambda m: warp_masks(torch.zeros(2, 4, 5, dtype=torch.bool), m),
    "warp_sample": lambda m: warp_sample(*make_sample(), m),
}


@pytest.mark.parametrize("name", list(WARPS))
def test_singular_or_non_finite_matrices_raise(name):
    arg = "theta" if name == "theta_to_matrix" else "matrix"
    for matrix in (SINGULAR, NAN):
        with pytest.raises(ValueError, match=f"{arg} must be an invertible affine matrix"):
            WARPS[name](matrix)
    batch = torch.stack([torch.eye(2, 3), SINGULAR])
    if name in ("invert_affine", "matrix_to_theta", "warp_affine"):
        with pytest.raises(ValueError, match=r"singular or non-finite one at index \(1,\)"):
            WARPS[name](batch)


def test_singular_matrices_move_points_and_boxes():
    # Collapsing points onto a line is a valid (if odd) transform: no inverse involved.
    assert torch.isfinite(warp_points(torch.rand(3, 2), SINGULAR)).all()
    assert torch.isfinite(warp_boxes(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), SINGULAR)).all()


def test_value_checks_off_skip_the_singular_check():
    with visionblocks.value_checks(False):
        assert torch.isnan(warp_affine(torch.rand(1, 4, 5), SINGULAR)).all()
        assert not torch.isfinite(invert_affine(SINGULAR)).all()
    m = affine_matrix(angle=10.0, translate=(1.0, 0.5))
    img = torch.rand(3, 8, 9)
    with visionblocks.value_checks(False):
        off = warp_affine(img, m)
    assert torch.equal(off, warp_affine(img, m))


META = torch.eye(2, 3, device="meta")


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: warp_affine(torch.rand(3, 4, 5), META), "img and matrix"),
        (
            lambda: warp_affine(torch.rand(3, 4, 5, device="meta"), torch.eye(2, 3)),
            "img and matrix",
        ),
        (lambda: warp_points(torch.rand(3, 2), META), "points and matrix"),
        (lambda: warp_boxes(torch.rand(3, 4), META), "boxes and matrix"),
        (lambda: warp_masks(torch.zeros(2, 4, 5), META), "masks and matrix"),
        (lambda: warp_sample(torch.rand(3, 4, 5), None, META), "image and matrix"),
    ],
)
def test_tensors_on_different_devices_raise(call, names):
    with pytest.raises(ValueError, match=f"{names} must be on the same device"):
        call()


def test_absurd_output_size_is_rejected_before_allocating():
    with pytest.raises(ValueError, match="the warped img would need a tensor of shape"):
        warp_affine(torch.rand(3, 4, 5), affine_matrix(), size=(10**9, 10**9))


# --- one-argument checks: real tensors, sizes that agree with the image --------------------


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("points", lambda bad: warp_points(bad[:, :2], torch.eye(2, 3))),
        ("boxes", lambda bad: warp_boxes(bad, torch.eye(2, 3))),
        ("translate", lambda bad: affine_matrix(translate=bad[0, :2])),
        ("angle", lambda bad: affine_matrix(angle=bad[0, 0])),
    ],
)
def test_complex_and_bool_coordinates_are_refused(name, call, dtype):
    bad = torch.zeros(3, 4, dtype=dtype)
    with pytest.raises(TypeError, match=f"{name} must be a real tensor.*{dtype}"):
        call(bad)
