"""Affine matrices and image warping: OpenCV, F.affine_grid/grid_sample, kornia and torchvision as oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close, gradcheck
from visionblocks.ops import _warp_opencv
from visionblocks.ops.warp import (
    affine_matrix,
    invert_affine,
    matrix_to_theta,
    theta_to_matrix,
    warp_affine,
)

cv2 = pytest.importorskip("cv2")


@pytest.fixture(params=["opencv", "torch"])
def path(request, monkeypatch):
    """Each CPU path of `warp_affine`: ``cv2.warpAffine``, and the torch path (the reference,
    which runs for gradients, CUDA, tracing and without OpenCV)."""
    if request.param == "torch":
        monkeypatch.setattr(_warp_opencv, "opencv", lambda: None)
    elif _warp_opencv.opencv() is None:
        pytest.skip("OpenCV 5 is not installed")
    return request.param


SRC = (37, 53)  # (H, W), odd sizes on purpose
DST = (30, 41)


def smooth_image(h: int = SRC[0], w: int = SRC[1], c: int = 3) -> np.ndarray:
    """Float32 HWC image with structure on every scale down to a few pixels."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.sin(xx / 5.0) + np.cos(yy / 7.0) + 0.3 * np.sin((xx + yy) / 3.0)
    return np.stack([base * (k + 1) / c - k for k in range(c)], -1).astype(np.float32)


def to_chw(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)


def to_hwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).numpy()


MATRICES = {
    "rot_scale": dict(angle=23.0, scale=1.3, center=(20.3, 15.1)),
    "shear_translate": dict(angle=-40.0, scale=0.7, shear=(10.0, -5.0), translate=(3.2, -2.7)),
    "shrink": dict(scale=0.45, translate=(4.0, 1.5)),
}


# ---------------------------------------------------------------------------- affine_matrix


@pytest.mark.parametrize(
    ("angle", "scale", "center"),
    [(0.0, 1.0, (0.0, 0.0)), (30.0, 0.5, (3.5, 2.0)), (-135.0, 2.25, (100.0, -7.0))],
)
def test_affine_matrix_equals_get_rotation_matrix2d(angle, scale, center):
    ref = cv2.getRotationMatrix2D(center, angle, scale)
    out = affine_matrix(angle=angle, scale=scale, center=center)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert_close(out.double(), torch.from_numpy(ref), dtype=torch.float32, scale=10)


def test_affine_matrix_composition_order():
    """shear first, then rotation+scale, both about center, translation last."""
    angle, scale, (shx, shy), (cx, cy), (tx, ty) = 25.0, 1.7, (12.0, -20.0), (4.0, 9.0), (-3.0, 2.5)
    out = affine_matrix(
        torch.tensor(angle, dtype=torch.float64),
        (tx, ty),
        scale,
        (shx, shy),
        (cx, cy),
    )

    def h(m):
        return np.vstack([m, [0.0, 0.0, 1.0]])

    t = math.radians(angle)
    rot = np.array([[math.cos(t), math.sin(t), 0], [-math.sin(t), math.cos(t), 0]]) * scale
    shear_x = np.array([[1, math.tan(math.radians(shx)), 0], [0, 1, 0]])
    shear_y = np.array([[1, 0, 0], [math.tan(math.radians(shy)), 1, 0]])
    to_c = np.array([[1, 0, cx + tx], [0, 1, cy + ty]], dtype=float)
    from_c = np.array([[1, 0, -cx], [0, 1, -cy]], dtype=float)
    ref = (h(to_c) @ h(rot) @ h(shear_y) @ h(shear_x) @ h(from_c))[:2]
    assert out.dtype == torch.float64
    assert_close(out, torch.from_numpy(ref))
    # A shear keeps areas: the determinant is scale².
    assert abs(np.linalg.det(ref[:, :2]) - scale**2) < 1e-9


def test_affine_matrix_batched_matches_scalar_calls_and_is_differentiable():
    angles = torch.tensor([0.0, 45.0, 190.0])
    translate = torch.tensor([[1.0, 2.0], [-3.0, 0.5], [0.0, 0.0]])
    out = affine_matrix(angle=angles, translate=translate, scale=2.0, center=(1.0, -1.0))
    assert out.shape == (3, 2, 3)
    for i in range(3):
        single = affine_matrix(
            float(angles[i]), translate[i].tolist(), scale=2.0, center=(1.0, -1.0)
        )
        assert_close(out[i], single)
    gradcheck(
        lambda a, s, sh, c: affine_matrix(angle=a, scale=s, shear=sh, center=c),
        [torch.rand(4) * 90, torch.rand(4) + 0.5, torch.rand(4, 2) * 20, torch.rand(2)],
    )


def test_affine_matrix_errors():
    with pytest.raises(ValueError, match="do not broadcast"):
        affine_matrix(angle=torch.zeros(3), center=torch.zeros(4, 2))


# ---------------------------------------------------------------------------- inverse and theta


def test_invert_affine_matches_opencv_and_is_batched():
    gen = torch.Generator().manual_seed(0)
    mats = torch.randn(4, 5, 2, 3, generator=gen, dtype=torch.float64)
    mats[..., :2] += 2 * torch.eye(2, dtype=torch.float64)  # well conditioned
    inv = invert_affine(mats)
    assert inv.shape == mats.shape
    for m, i in zip(mats.reshape(-1, 2, 3), inv.reshape(-1, 2, 3)):
        assert_close(i, torch.from_numpy(cv2.invertAffineTransform(m.numpy())))
    assert_close(invert_affine(inv), mats)
    gradcheck(invert_affine, [mats[0]])


@settings(max_examples=25, deadline=None)
@given(
    angle=st.floats(-180, 180),
    scale=st.floats(0.2, 4.0),
    tx=st.floats(-50, 50),
    src=st.tuples(st.integers(1, 300), st.integers(1, 300)),
    dst=st.tuples(st.integers(1, 300), st.integers(1, 300)),
)
def test_theta_round_trip(angle, scale, tx, src, dst):
    m = affine_matrix(angle=angle, scale=scale, translate=(tx, 2.0), shear=(5.0, 0.0))
    m = m.double()
    theta = matrix_to_theta(m, src, dst)
    assert_close(theta_to_matrix(theta, src, dst), m, scale=100)
    assert_close(matrix_to_theta(theta_to_matrix(theta, src, dst), src, dst), theta, scale=100)


def test_theta_conversions_gradcheck():
    mats = affine_matrix(
        angle=torch.tensor([10.0, -35.0]), scale=torch.tensor([1.2, 0.7]), center=(3.0, 2.0)
    )
    gradcheck(lambda m: matrix_to_theta(m, (7, 9), (5, 11)), [mats])
    gradcheck(
        lambda t: theta_to_matrix(t, (7, 9), (5, 11)), [matrix_to_theta(mats, (7, 9), (5, 11))]
    )


def test_identity_theta_and_matrix():
    assert torch.equal(matrix_to_theta(torch.eye(2, 3), (7, 9), (7, 9)), torch.eye(2, 3))
    assert torch.equal(theta_to_matrix(torch.eye(2, 3), (7, 9), (7, 9)), torch.eye(2, 3))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_warp_affine_equals_affine_grid_path(mode, padding_mode):
    img = to_chw(smooth_image())[None].repeat(2, 1, 1, 1)
    mats = torch.stack([affine_matrix(**kw) for kw in list(MATRICES.values())[:2]])
    theta = matrix_to_theta(mats, SRC, DST)
    grid = F.affine_grid(theta, [2, 3, *DST], align_corners=False)
    ref = F.grid_sample(img, grid, mode=mode, padding_mode=padding_mode, align_corners=False)
    out = warp_affine(img, mats, DST, mode=mode, padding_mode=padding_mode)
    if mode == "bilinear":
        assert_close(out, ref, scale=10)
    else:  # positions within float rounding of a tie may round apart
        assert (out != ref).any(1).float().mean() < 1e-3


# ---------------------------------------------------------------------------- warp_affine vs OpenCV

CV_BORDER = {
    "zeros": cv2.BORDER_CONSTANT,
    "border": cv2.BORDER_REPLICATE,
    "reflection": cv2.BORDER_REFLECT,
    "fill": cv2.BORDER_CONSTANT,
}
CV_INTER = {"bilinear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("padding_mode", list(CV_BORDER))
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_warp_affine_matches_opencv(name, padding_mode, mode, path):
    img = smooth_image()
    m = affine_matrix(**MATRICES[name])
    fill = (0.5, -1.0, 2.0) if padding_mode == "fill" else 0.0
    ref = cv2.warpAffine(
        img,
        m.double().numpy(),
        (DST[1], DST[0]),
        flags=CV_INTER[mode],
        borderMode=CV_BORDER[padding_mode],
        borderValue=fill if padding_mode == "fill" else 0,
    )
    out = to_hwc(warp_affine(to_chw(img), m, DST, mode, padding_mode, fill))
    diff = np.abs(out - ref)
    if path == "opencv":
        assert diff.max() == 0
    elif mode == "bilinear":  # the whole image, borders included
        assert diff.max() < 1e-4
    else:  # OpenCV quantises positions to 1/1024 px: near-ties may round apart
        assert (diff.max(-1) > 0).mean() < 1e-3


def test_warp_affine_uint8_matches_opencv_and_noise_image(path):
    rng = np.random.default_rng(0)
    noise = rng.random((60, 80, 3)).astype(np.float32)
    m = affine_matrix(angle=17.0, scale=0.77, translate=(3.3, 1.1), center=(40.0, 30.0))
    ref = cv2.warpAffine(noise, m.double().numpy(), (80, 60), flags=cv2.INTER_LINEAR)
    assert np.abs(to_hwc(warp_affine(to_chw(noise), m)) - ref).max() < 2e-4
    u8 = (noise * 255).astype(np.uint8)
    ref = cv2.warpAffine(u8, m.double().numpy(), (80, 60), flags=cv2.INTER_LINEAR)
    out = warp_affine(to_chw(u8), m)
    assert out.dtype == torch.uint8
    diff = np.abs(to_hwc(out).astype(int) - ref.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01  # rounding of half levels
    assert path == "torch" or diff.max() == 0


def test_nearest_ties_round_half_to_even_as_opencv(path):
    row = np.arange(8, dtype=np.float32)[None].repeat(2, 0)
    m = torch.tensor(
        [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    )  # source x = x' / 2: ties every other pixel
    ref = cv2.warpAffine(row, m.double().numpy(), (8, 2), flags=cv2.INTER_NEAREST)
    out = warp_affine(torch.from_numpy(row)[None], m, mode="nearest")[0]
    assert torch.equal(out, torch.from_numpy(ref))


def test_warp_affine_matches_kornia_with_align_corners_true(path):
    kornia_warp = pytest.importorskip("kornia.geometry.transform").warp_affine
    img = torch.rand(2, 3, 20, 30, generator=torch.Generator().manual_seed(1))
    m = affine_matrix(angle=33.0, scale=1.2, center=(14.5, 9.5))
    ref = kornia_warp(img, m[None].expand(2, 2, 3), (25, 22), align_corners=True)
    assert_close(warp_affine(img, m, (25, 22)), ref, scale=10)


def test_warp_affine_matches_torchvision_affine_image(path):
    tvf = pytest.importorskip("torchvision.transforms.v2.functional")
    img = to_chw(smooth_image())
    h, w = SRC
    ref = tvf.affine(
        img,
        angle=30.0,
        translate=[3, -2],
        scale=1.5,
        shear=[0.0, 0.0],
        interpolation=tvf.InterpolationMode.BILINEAR,
    )
    # torchvision turns clockwise about the image centre; OpenCV's angle is counter-clockwise.
    m = affine_matrix(
        angle=-30.0, translate=(3.0, -2.0), scale=1.5, center=((w - 1) / 2, (h - 1) / 2)
    )
    assert_close(warp_affine(img, m), ref, scale=10)


# ---------------------------------------------------------------------------- batching, dtypes


def test_batched_shared_and_unbatched_agree(path):
    gen = torch.Generator().manual_seed(2)
    img = torch.rand(3, 2, 11, 13, generator=gen)
    mats = torch.stack([affine_matrix(angle=a, center=(6.0, 5.0)) for a in (10.0, 50.0, -80.0)])
    out = warp_affine(img, mats, (9, 12))
    for i in range(3):
        assert_close(out[i], warp_affine(img[i], mats[i], (9, 12)))
    shared = warp_affine(img, mats[1], (9, 12))
    assert_close(shared, warp_affine(img, mats[1:2], (9, 12)))
    assert_close(shared, warp_affine(img, mats[1].expand(3, 2, 3), (9, 12)))
    # non-contiguous input
    assert_close(warp_affine(img.transpose(-1, -2), mats), warp_affine(img.mT.contiguous(), mats))


def test_identity_and_integer_translation_are_exact(path):
    img = torch.rand(2, 3, 8, 9)
    assert_close(warp_affine(img, torch.eye(2, 3)), img)
    shifted = warp_affine(img, affine_matrix(translate=(2.0, -1.0)), mode="bilinear")
    assert_close(shifted[..., :-1, 2:], img[..., 1:, :-2])
    assert (shifted[..., -1, :] == 0).all() and (shifted[..., :2] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_dtypes_follow_the_float32_result(dtype, path):
    img = to_chw(smooth_image())
    m = affine_matrix(**MATRICES["rot_scale"])
    ref = warp_affine(img, m, DST)
    out = warp_affine(img.to(dtype), m.to(dtype) if dtype == torch.float64 else m, DST)
    assert out.dtype == dtype
    scale = 1.0 if dtype == torch.float64 else 4.0
    assert_close(
        out.float(), ref, dtype=torch.float32 if dtype == torch.float64 else dtype, scale=scale
    )


def test_nearest_keeps_any_dtype_exactly(path):
    labels = torch.randint(0, 2**40, (2, 10, 12), dtype=torch.int64)
    m = affine_matrix(angle=90.0, center=(5.5, 4.5))
    out = warp_affine(labels, m, mode="nearest", padding_mode="fill", fill=7)
    assert out.dtype == torch.int64
    assert set(out.unique().tolist()) <= set(labels.unique().tolist()) | {7}
    as_bool = warp_affine(labels > 2**39, m, mode="nearest")
    assert as_bool.dtype == torch.bool and torch.equal(as_bool, (out > 2**39) & (out != 7))


# ---------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection", "fill"])
def test_gradcheck_image_and_matrix(padding_mode):
    gen = torch.Generator().manual_seed(3)
    img = torch.rand(2, 2, 6, 7, generator=gen, dtype=torch.float64)
    mats = affine_matrix(
        angle=torch.tensor([13.0, -27.0], dtype=torch.float64),
        scale=torch.tensor([1.1, 0.8], dtype=torch.float64),
        translate=torch.tensor([[0.3, 0.2], [-0.4, 0.7]], dtype=torch.float64),
        center=(3.1, 2.3),
    )
    fill = torch.tensor([0.2, -1.0], dtype=torch.float64)
    if padding_mode == "fill":
        gradcheck(
            lambda x, m, f: warp_affine(x, m, (5, 8), padding_mode="fill", fill=f),
            [img, mats, fill],
        )
    else:
        gradcheck(lambda x, m: warp_affine(x, m, (5, 8), padding_mode=padding_mode), [img, mats])


def test_gradient_of_nearest_reaches_the_image():
    img = torch.rand(1, 1, 5, 5, dtype=torch.float64)
    m = affine_matrix(angle=30.0, center=(2.0, 2.0)).double()
    gradcheck(lambda x: warp_affine(x, m, mode="nearest"), [img])


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            dict(matrix=torch.eye(3, 2)),
            ValueError,
            r"matrix must have shape \(2, 3\) or \(B, 2, 3\)",
        ),
        (dict(matrix=torch.eye(3).expand(1, 1, 3, 3)), ValueError, "or the \\(3, 3\\) form"),
        (dict(matrix=torch.eye(2, 3).expand(3, 2, 3)), ValueError, "matrix batch 3 does not match"),
        (dict(size=(0, 4)), ValueError, "size must be positive"),
        (dict(size=(4,)), ValueError, "two ints"),
        (dict(size=(4.0, 4.0)), ValueError, "two ints"),
        (dict(fill=1.0), ValueError, "needs padding_mode='fill'"),
        (dict(padding_mode="fill", fill=(1.0, 2.0)), ValueError, "one value per channel"),
        (dict(img=torch.rand(1, 3, 0, 4)), ValueError, "non-empty"),
        (dict(img=torch.ones(2, 3, 4, 4, dtype=torch.bool)), TypeError, "numeric img"),
        (dict(img=np.zeros((3, 4, 4))), TypeError, "img must be a torch.Tensor"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = dict(img=torch.rand(2, 3, 4, 4), matrix=torch.eye(2, 3))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        warp_affine(**args)


def test_unbatched_image_needs_one_matrix():
    with pytest.raises(ValueError, match="unbatched img"):
        warp_affine(torch.rand(3, 4, 4), torch.eye(2, 3).expand(2, 2, 3))


def test_theta_functions_validate():
    with pytest.raises(ValueError, match=r"\(\.\.\., 2, 3\)"):
        matrix_to_theta(torch.eye(3), (2, 2), (2, 2))
    with pytest.raises(ValueError, match="src_size must be positive"):
        theta_to_matrix(torch.eye(2, 3), (0, 2), (2, 2))
