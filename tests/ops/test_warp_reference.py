"""`warp_affine` against the plain float64 reference (tests/reference/warp.py), the oracle.

On CPU the warp is ``cv2.warpAffine`` where OpenCV 5 is installed, ``grid_sample`` without it:
the `path` fixture runs each test with both.
"""

from __future__ import annotations

import pytest
import torch

from tests.ops.test_warp import DST, MATRICES, SRC, path, smooth_image, to_chw
from tests.reference import warp as reference
from visionblocks.ops.warp import affine_matrix, warp_affine

__all__ = ["path"]  # the fixture, used by name


def noise_image(c: int = 3, h: int = SRC[0], w: int = SRC[1], seed: int = 4) -> torch.Tensor:
    return torch.rand(c, h, w, generator=torch.Generator().manual_seed(seed)) * 4 - 2


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection", "fill"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_warp_affine_matches_reference(name, padding_mode, mode, path):
    """tests/reference/warp.py (float64, written out) is the oracle, on smooth and noise images."""
    fill = (0.5, -1.0, 2.0) if padding_mode == "fill" else 0.0
    m = affine_matrix(**MATRICES[name])
    for img in (to_chw(smooth_image()), noise_image()):
        expected = reference.warp_affine(img, m, DST, mode, padding_mode, fill)
        out = warp_affine(img, m, DST, mode, padding_mode, fill)
        assert out.dtype == torch.float32
        if mode == "bilinear":  # float32 rounding of the values (|img| <= 3) and coordinates
            assert (out.double() - expected).abs().max() < 5e-5
        else:  # a position within rounding of a tie may round the other way
            assert (out.double() != expected).any(0).float().mean() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shared", [True, False])
def test_batched_warp_matches_reference(dtype, shared, path):
    """One matrix for the batch and one per image."""
    imgs = torch.stack([noise_image(2, 23, 31, seed=i) for i in range(3)]).to(dtype)
    mats = affine_matrix(
        angle=torch.tensor([17.0, -70.0, 200.0]),
        scale=torch.tensor([0.7, 1.3, 2.1]),
        center=(15.0, 11.0),
    ).to(dtype)
    if shared:
        mats = mats[:1].expand(3, 2, 3)
    out = warp_affine(imgs, mats[0] if shared else mats, (29, 19))
    assert out.dtype == dtype
    tol = 5e-5 if dtype == torch.float32 else 1e-12
    for img, m, o in zip(imgs, mats, out):
        assert (o.double() - reference.warp_affine(img, m, (29, 19))).abs().max() < tol
