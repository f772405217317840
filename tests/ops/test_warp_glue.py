"""The glue users used to write by hand: flips in `affine_matrix`, `compose_affine`, ``(3, 3)``
matrices in every warp; and complex images, refused at the boundary.

OpenCV is the oracle for flips (``cv2.flip`` then ``cv2.warpAffine``) and float64 ``3 x 3``
products for composition.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torchvision import tv_tensors

import visionblocks
import visionblocks.ops as ops
from tests.package.test_fake_cuda import no_driver
from visionblocks.ops.warp import affine_matrix, compose_affine, warp_affine
from visionblocks.ops.warp_targets import warp_boxes, warp_keypoints, warp_masks, warp_points
from visionblocks.transforms import warp_sample

cv2 = pytest.importorskip("cv2")

H, W = 13, 17  # odd, unequal sizes: a flip about the wrong centre shows
CENTER = ((W - 1) / 2, (H - 1) / 2)


def _image(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    img = torch.rand(3, H, W, generator=torch.Generator().manual_seed(0)) * 255
    return img.round().to(dtype)


def _to3x3(m: torch.Tensor) -> torch.Tensor:
    last = torch.zeros(*m.shape[:-2], 1, 3, dtype=m.dtype)
    last[..., 0, 2] = 1
    return torch.cat((m, last), dim=-2)


# ------------------------------------------------------------------------------- flips


@pytest.mark.parametrize(
    ("flags", "flip"),
    [
        (dict(hflip=True), lambda x: x.flip(-1)),
        (dict(vflip=True), lambda x: x.flip(-2)),
        (dict(hflip=True, vflip=True), lambda x: x.flip(-1, -2)),
    ],
)
def test_flips_about_the_image_centre_are_tensor_flips(flags, flip):
    img = _image(torch.uint8)
    m = affine_matrix(center=CENTER, **flags)
    assert torch.equal(warp_affine(img, m), flip(img))
    assert torch.equal(warp_affine(img, m, mode="nearest"), flip(img))


@pytest.mark.parametrize(("hflip", "vflip", "code"), [(True, False, 1), (False, True, 0)])
def test_a_flip_comes_first_as_cv2_flip_then_the_rotation(hflip, vflip, code):
    img = _image()
    m = affine_matrix(angle=25.0, scale=0.8, center=CENTER, hflip=hflip, vflip=vflip)
    src = np.ascontiguousarray(img.permute(1, 2, 0).numpy())
    ref = cv2.getRotationMatrix2D(CENTER, 25.0, 0.8)
    want = cv2.warpAffine(cv2.flip(src, code), ref, (W, H), flags=cv2.INTER_LINEAR)
    got = warp_affine(img, m).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(got, want, atol=1e-3)
    # the same matrix as the flip composed before the rotation
    flip = affine_matrix(center=CENTER, hflip=hflip, vflip=vflip)
    turn = affine_matrix(angle=25.0, scale=0.8, center=CENTER)
    torch.testing.assert_close(m, compose_affine(flip, turn))


def test_flags_as_tensors_flip_per_sample_and_match_the_numbers_path():
    flags = torch.tensor([True, False, True])
    angles = torch.tensor([10.0, 20.0, 30.0])
    got = affine_matrix(angle=angles, center=CENTER, hflip=flags)
    assert got.shape == (3, 2, 3)
    for i in range(3):
        one = affine_matrix(angle=float(angles[i]), center=CENTER, hflip=bool(flags[i]))
        torch.testing.assert_close(got[i], one)
    # a tensor flag alone gives a batch too; its gradient-free sign keeps other gradients
    assert affine_matrix(center=CENTER, vflip=flags).shape == (3, 2, 3)
    angle = torch.tensor(10.0, requires_grad=True)
    affine_matrix(angle=angle, hflip=torch.tensor(True)).sum().backward()
    assert angle.grad is not None


@pytest.mark.parametrize("bad", [1, 0, "yes", None, torch.tensor(1.0), torch.tensor([1])])
def test_flip_flags_must_be_bools(bad):
    with pytest.raises(TypeError, match="hflip must be a bool or a bool tensor"):
        affine_matrix(hflip=bad)
    with pytest.raises(TypeError, match="vflip must be a bool or a bool tensor"):
        affine_matrix(vflip=bad)


def test_flag_batches_must_broadcast():
    with pytest.raises(ValueError, match="do not broadcast"):
        affine_matrix(angle=torch.zeros(3), hflip=torch.zeros(2, dtype=torch.bool))


# --------------------------------------------------------------------------- composition


def test_compose_applies_in_order_and_equals_the_3x3_product():
    g = torch.Generator().manual_seed(1)
    mats = [torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in range(3)]
    got = compose_affine(*mats)
    want = (_to3x3(mats[2]) @ _to3x3(mats[1]) @ _to3x3(mats[0]))[:2]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    points = torch.randn(5, 2, generator=g, dtype=torch.float64)
    step = points
    for m in mats:
        step = warp_points(step, m)
    torch.testing.assert_close(warp_points(points, got), step)
    assert torch.equal(compose_affine(mats[0]), mats[0])
    assert ops.compose_affine is compose_affine


def test_compose_broadcasts_takes_3x3_and_promotes():
    one = affine_matrix(angle=30.0, center=CENTER)
    batch = affine_matrix(angle=torch.tensor([0.0, 90.0]), center=CENTER)
    got = compose_affine(one, batch)
    assert got.shape == (2, 2, 3)
    torch.testing.assert_close(got[1], compose_affine(one, batch[1]))
    torch.testing.assert_close(compose_affine(_to3x3(one), batch), got)
    half = compose_affine(one.half(), one.double())
    assert half.dtype == torch.float64
    assert compose_affine(one.bfloat16(), one.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("matrices", "error", "match"),
    [
        ((), ValueError, "at least one matrix"),
        ((torch.eye(2, 3), torch.eye(2, 3, dtype=torch.int64)), TypeError, r"matrices\[1\]"),
        ((torch.eye(2, 3), torch.eye(2, 2)), ValueError, r"matrices\[1\] must have shape"),
        ((torch.eye(2, 3).expand(2, 2, 3), torch.eye(2, 3).expand(3, 2, 3)), ValueError,
         "do not broadcast"),
        ((torch.eye(2, 3), torch.tensor([[1.0, 0, 0], [0, 1, 0], [0.1, 0, 1]])), ValueError,
         r"matrices\[1\] is a \(3, 3\) matrix whose last row is not \[0, 0, 1\]"),
    ],
)  # fmt: skip
def test_compose_errors(matrices, error, match):
    with pytest.raises(error, match=match):
        compose_affine(*matrices)


# --------------------------------------------------------------------------- 3 x 3 matrices

M = affine_matrix(angle=20.0, scale=1.1, shear=(5.0, 0.0), center=CENTER, translate=(1.0, -2.0))
PROJECTIVE = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1e-3, 0.0, 1.0]])


def test_every_warp_takes_the_3x3_form():
    img, m3 = _image(), _to3x3(M)
    assert torch.equal(warp_affine(img, m3), warp_affine(img, M))
    batch = torch.stack((img, img))
    assert torch.equal(warp_affine(batch, torch.stack((m3, m3))), warp_affine(batch, M))
    masks = img[:2] > 128
    assert torch.equal(warp_masks(masks, m3), warp_masks(masks, M))
    points = torch.tensor([[[1.0, 2.0], [5.0, 3.0]]])
    assert torch.equal(warp_points(points, m3), warp_points(points, M))
    boxes = torch.tensor([[1.0, 2.0, 6.0, 9.0]])
    assert torch.equal(warp_boxes(boxes, m3, (H, W)), warp_boxes(boxes, M, (H, W)))
    got, want = warp_keypoints(points, m3, (H, W)), warp_keypoints(points, M, (H, W))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    target = {
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(H, W)),
        "labels": torch.tensor([3]),
    }
    got, want = warp_sample(img, target, m3), warp_sample(img, target, M)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1]["boxes"], want[1]["boxes"])


def test_projective_matrices_are_refused_everywhere():
    img = _image()
    match = r"matrix is a \(3, 3\) matrix whose last row is not \[0, 0, 1\].*warpPerspective"
    for call in (
        lambda: warp_affine(img, PROJECTIVE),
        lambda: warp_sample(img, None, PROJECTIVE),
        lambda: warp_points(torch.zeros(1, 2), PROJECTIVE),
        lambda: warp_boxes(torch.zeros(1, 4), PROJECTIVE),
        lambda: warp_masks(torch.zeros(1, H, W), PROJECTIVE),
        lambda: warp_affine(img, _to3x3(M) * 2),  # [0, 0, 2]: not normalised
    ):
        with pytest.raises(ValueError, match=match):
            call()
    with visionblocks.value_checks(False):  # a value check: off with the others
        warp_points(torch.zeros(1, 2), PROJECTIVE)
    with pytest.raises(ValueError, match="one"):
        warp_sample(img, None, torch.stack((_to3x3(M), _to3x3(M))))


def test_3x3_check_on_fake_cuda_reads_nothing():
    cuda = torch.device("cuda")
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        m3 = torch.zeros(2, 3, 3, device=cuda)
        points = torch.zeros(2, 4, 2, device=cuda)
        with no_driver():
            out = warp_points(points, m3)
            both = compose_affine(m3, m3)
    assert out.shape == (2, 4, 2) and both.shape == (2, 2, 3)


def test_3x3_compiles_fullgraph():
    def call(points, m):
        return warp_points(points, compose_affine(m, m))

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    points, m3 = torch.rand(4, 2), _to3x3(M)
    with visionblocks.value_checks(True):
        torch.testing.assert_close(compiled(points, m3), call(points, m3))


# ------------------------------------------------------------------------------ complex


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_images_are_refused_naming_the_argument(dtype):
    img = torch.zeros(3, H, W, dtype=dtype)
    with pytest.raises(TypeError, match=f"img must be a real tensor.*got dtype {dtype}"):
        warp_affine(img, M)
    with pytest.raises(TypeError, match=f"img must be a real tensor.*got dtype {dtype}"):
        warp_affine(img[None], M, mode="nearest")
    with pytest.raises(TypeError, match=f"image must be a real tensor.*got dtype {dtype}"):
        warp_sample(img, None, M)
    with pytest.raises(TypeError, match=f"masks must be a real tensor.*got dtype {dtype}"):
        warp_masks(img, M)
    target = {"masks": tv_tensors.Mask(img.real.bool()).to(dtype)}
    with pytest.raises(TypeError, match=r"target\['masks'\] must be a real tensor"):
        warp_sample(_image(), target, M)
