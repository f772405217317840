"""`rotated_roi_align`: the torch formula against detectron2's and mmcv's algorithms
(re-expressed in float64 below), torchvision's ``roi_align`` at angle 0, rotation
equivalences, gradients, adaptive sampling on every path, compile and the input checks.

The kernel's own tests are in ``tests/kernels/test_rotated_roi_align_kernel.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import assert_close, gradcheck
from visionblocks import value_checks
from visionblocks.ops import RotatedRoIAlign, rotated_roi_align
from visionblocks.ops.rotated_roi_align import _frames, _rotated_roi_align


def reference_roi_align_rotated(
    input, rois, spatial_scale, ph, pw, sampling_ratio, radians=False, clockwise=False
):
    """Float64 forward and the backward's per-input weights of detectron2's CPU
    ``ROIAlignRotatedForward`` / ``ROIAlignRotatedBackward``
    (facebookresearch/detectron2, ``detectron2/layers/csrc/ROIAlignRotated/ROIAlignRotated_cpu.cpp``),
    written out one sample point at a time. ``radians`` / ``clockwise``: mmcv's
    ``roi_align_rotated_forward_cuda_kernel`` (open-mmlab/mmcv,
    ``mmcv/ops/csrc/common/cuda/roi_align_rotated_cuda_kernel.cuh``, ``aligned=True``), the
    same algorithm with the angle in radians, negated when ``clockwise``.

    Returns ``(out (K, C, ph, pw), jac (K, ph, pw, N, H, W))``: ``out = jac . input``.
    """
    n, c, height, width = input.shape
    input = input.double()
    out = torch.zeros(len(rois), c, ph, pw, dtype=torch.float64)
    jac = torch.zeros(len(rois), ph, pw, n, height, width, dtype=torch.float64)
    for k, roi in enumerate(rois.double().tolist()):
        b = int(roi[0])
        center_w, center_h = roi[1] * spatial_scale - 0.5, roi[2] * spatial_scale - 0.5
        roi_w, roi_h = roi[3] * spatial_scale, roi[4] * spatial_scale
        theta = roi[5] if radians else roi[5] * math.pi / 180.0
        theta = -theta if clockwise else theta
        cos_t, sin_t = math.cos(theta), math.sin(theta)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / ph)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pw)
        count = max(grid_h * grid_w, 1)
        start_h, start_w = -roi_h / 2.0, -roi_w / 2.0
        for i in range(ph):
            for j in range(pw):
                for iy in range(grid_h):
                    yy = start_h + i * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        xx = start_w + j * bin_w + (ix + 0.5) * bin_w / grid_w
                        y = yy * cos_t - xx * sin_t + center_h
                        x = yy * sin_t + xx * cos_t + center_w
                        if y < -1.0 or y > height or x < -1.0 or x > width:
                            continue
                        y, x = max(y, 0.0), max(x, 0.0)
                        y_low, x_low = int(y), int(x)
                        if y_low >= height - 1:
                            y_high = y_low = height - 1
                            y = float(y_low)
                        else:
                            y_high = y_low + 1
                        if x_low >= width - 1:
                            x_high = x_low = width - 1
                            x = float(x_low)
                        else:
                            x_high = x_low + 1
                        ly, lx = y - y_low, x - x_low
                        hy, hx = 1.0 - ly, 1.0 - lx
                        for (yi, xi), wt in (
                            ((y_low, x_low), hy * hx),
                            ((y_low, x_high), hy * lx),
                            ((y_high, x_low), ly * hx),
                            ((y_high, x_high), ly * lx),
                        ):
                            out[k, :, i, j] += wt * input[b, :, yi, xi]
                            jac[k, i, j, b, yi, xi] += wt / count
                out[k, :, i, j] /= count
    return out, jac


def make_rois(k, n, height, width, seed=0, scale=1.0):
    """Random rotated RoIs around the map, some partly or wholly outside, in input units."""
    gen = torch.Generator().manual_seed(seed)
    centre = torch.rand(k, 2, generator=gen) * torch.tensor([width + 6.0, height + 6.0]) - 3
    size = torch.rand(k, 2, generator=gen) * torch.tensor([width * 0.9, height * 0.9]) + 0.3
    angle = torch.rand(k, 1, generator=gen) * 400 - 200
    batch = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([batch, centre / scale, size / scale, angle], 1).double()


def to_xyxy(rois):
    cx, cy, w, h = rois[:, 1:5].unbind(1)
    return torch.stack([rois[:, 0], cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


@pytest.mark.parametrize("sampling_ratio", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.125])
def test_matches_torchvision_roi_align_at_angle_zero(sampling_ratio, spatial_scale):
    from torchvision.ops import roi_align

    x = torch.randn(2, 3, 11, 14, dtype=torch.float64, requires_grad=True)
    rois = make_rois(12, 2, 11, 14, seed=sampling_ratio + 5, scale=spatial_scale)
    rois[:, 5] = 0
    rois[0, 3:5] = 0  # a point: no samples when adaptive
    ours = rotated_roi_align(x, rois, (3, 4), spatial_scale, sampling_ratio)
    theirs = roi_align(x, to_xyxy(rois), (3, 4), spatial_scale, sampling_ratio, aligned=True)
    assert_close(ours, theirs)
    grad = torch.randn_like(ours)
    assert_close(*(torch.autograd.grad(o, x, grad)[0] for o in (ours, theirs)))


@pytest.mark.parametrize("sampling_ratio", [-1, 1, 2])
@pytest.mark.parametrize("output_size", [(2, 2), (3, 2)])
def test_matches_detectron2_algorithm(sampling_ratio, output_size):
    x = torch.randn(2, 2, 9, 12, dtype=torch.float64, requires_grad=True)
    rois = make_rois(10, 2, 9, 12, seed=sampling_ratio + 11)
    rois[0] = torch.tensor([1, 4.0, 3.0, 0.0, 6.0, 30.0])  # zero width
    rois[1] = torch.tensor([0, 30.0, 30.0, 5.0, 5.0, 45.0])  # wholly outside
    rois[2] = torch.tensor([1, 12.0, 9.0, 8.0, 7.0, 90.0])  # on the far corner
    out = rotated_roi_align(x, rois, output_size, 1.0, sampling_ratio)
    expected, jac = reference_roi_align_rotated(x.detach(), rois, 1.0, *output_size, sampling_ratio)
    assert_close(out, expected)
    grad = torch.randn_like(out)
    (actual,) = torch.autograd.grad(out, x, grad)
    assert_close(actual, torch.einsum("kcij,kijnhw->nchw", grad, jac))


def test_spatial_scale_and_mmcv_conventions():
    x = torch.randn(1, 3, 10, 8, dtype=torch.float64)
    rois = make_rois(8, 1, 10, 8, seed=3, scale=0.25)
    out = rotated_roi_align(x, rois, 3, 0.25, 2)
    assert_close(out, reference_roi_align_rotated(x, rois, 0.25, 3, 3, 2)[0])
    # mmcv: radians, clockwise=True (mmrotate) is r = -t * 180 / pi; clockwise=False r = t...
    radians = rois.clone()
    radians[:, 5] = rois[:, 5] * math.pi / 180
    assert_close(out, reference_roi_align_rotated(x, radians, 0.25, 3, 3, 2, radians=True)[0])
    radians[:, 5] = -radians[:, 5]
    expected = reference_roi_align_rotated(x, radians, 0.25, 3, 3, 2, radians=True, clockwise=True)
    assert_close(out, expected[0])


def test_negative_sides_are_the_same_rectangle():
    x = torch.randn(1, 2, 8, 9, dtype=torch.float64)
    rois = make_rois(6, 1, 8, 9, seed=4)
    flipped = rois.clone()
    flipped[:, 3:5] = -flipped[:, 3:5]
    for ratio in (-1, 2):
        assert torch.equal(
            rotated_roi_align(x, flipped, 3, 1.0, ratio), rotated_roi_align(x, rois, 3, 1.0, ratio)
        )


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_quarter_turn_of_the_image_turns_the_box(sampling_ratio):
    # rot90 maps pixel centre (x, y) to (y, W - x) and turns every box by +90 degrees.
    x = torch.randn(2, 3, 7, 10, dtype=torch.float64)
    rois = make_rois(10, 2, 7, 10, seed=7)
    turned = rois.clone()
    turned[:, 1], turned[:, 2], turned[:, 5] = rois[:, 2], 10 - rois[:, 1], rois[:, 5] + 90
    a = rotated_roi_align(x, rois, (2, 3), 1.0, sampling_ratio)
    b = rotated_roi_align(torch.rot90(x, 1, (2, 3)), turned, (2, 3), 1.0, sampling_ratio)
    assert_close(b, a)


def test_half_turn_reverses_the_bins_and_swapped_sides_transpose_them():
    x = torch.randn(1, 2, 12, 12, dtype=torch.float64)
    rois = make_rois(6, 1, 12, 12, seed=8)
    half = rois.clone()
    half[:, 5] += 180
    a = rotated_roi_align(x, rois, (3, 4), 1.0, 2)
    assert_close(rotated_roi_align(x, half, (3, 4), 1.0, 2), a.flip(-1, -2))
    # (w, h, r) and (h, w, r - 90): the same rectangle, bins transposed (one axis reversed)
    swapped = rois.clone()
    swapped[:, 3], swapped[:, 4], swapped[:, 5] = rois[:, 4], rois[:, 3], rois[:, 5] - 90
    b = rotated_roi_align(x, swapped, (4, 3), 1.0, 2)
    assert_close(b, a.transpose(-1, -2).flip(-2))


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_gradcheck_float64(sampling_ratio):
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    rois = make_rois(5, 2, 5, 6, seed=9)
    assert gradcheck(lambda t: rotated_roi_align(t, rois, 2, 1.0, sampling_ratio), [x])


def test_not_differentiable_in_rois():
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    rois = make_rois(3, 1, 6, 6).float().requires_grad_(True)
    out = rotated_roi_align(x, rois, 2)
    out.sum().backward()
    assert rois.grad is None and x.grad is not None


def test_adaptive_fixed_grid_when_values_cannot_be_read():
    # The bound of the module notes: exact for RoIs up to H + W feature pixels a side.
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    rois = make_rois(9, 2, 6, 7, seed=10)
    rois[0, 3:5] = torch.tensor([13.0, 12.5])  # the largest exact: ceil(13 / 2) == 7
    frames = _frames(rois, 1.0, (2, 2), -1, torch.float64)
    fixed = _rotated_roi_align(x, frames, (2, 2), (7, 7))
    assert_close(fixed, rotated_roi_align(x, rois, 2))
    assert_close(fixed, reference_roi_align_rotated(x, rois, 1.0, 2, 2, -1)[0])


def test_compile_fullgraph_adaptive_and_fixed():
    x = torch.randn(2, 3, 6, 7)
    rois = make_rois(5, 2, 6, 7, seed=12).float()
    for ratio in (-1, 2):
        fn = torch.compile(lambda a, b, r=ratio: rotated_roi_align(a, b, 3, 1.0, r), fullgraph=True)
        assert_close(fn(x, rois), rotated_roi_align(x, rois, 3, 1.0, ratio), scale=4.0)


def test_dtypes_and_empty():
    x = torch.randn(1, 4, 8, 8)
    rois = make_rois(4, 1, 8, 8, seed=13).float()
    for dtype in (torch.float16, torch.bfloat16):
        out = rotated_roi_align(x.to(dtype), rois.to(dtype), 3)
        assert out.dtype == dtype
        ref = rotated_roi_align(x.to(dtype).float(), rois.to(dtype).float(), 3)
        assert_close(out.float(), ref, dtype=dtype)
    assert rotated_roi_align(x.double(), rois, 3).dtype == torch.float64
    x.requires_grad_(True)
    out = rotated_roi_align(x, rois[:0], (2, 5))
    assert out.shape == (0, 4, 2, 5)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_module():
    layer = RotatedRoIAlign((2, 3), spatial_scale=0.5, sampling_ratio=2)
    assert repr(layer) == "RotatedRoIAlign(output_size=(2, 3), spatial_scale=0.5, sampling_ratio=2)"
    x, rois = torch.randn(1, 2, 6, 6), make_rois(3, 1, 12, 12).float()
    assert torch.equal(layer(x, rois), rotated_roi_align(x, rois, (2, 3), 0.5, 2))
    with pytest.raises(ValueError, match="spatial_scale"):
        RotatedRoIAlign(2, spatial_scale=0.0)


def test_errors():
    x, rois = torch.randn(2, 3, 5, 5), make_rois(3, 2, 5, 5).float()
    with pytest.raises(TypeError, match="input"):
        rotated_roi_align(x.long(), rois, 2)
    with pytest.raises(TypeError, match="rois"):
        rotated_roi_align(x, rois.long(), 2)
    with pytest.raises(ValueError, match=r"input must have shape \(N, C, H, W\)"):
        rotated_roi_align(x[0], rois, 2)
    with pytest.raises(ValueError, match=r"input must have shape .* got \(2, 3, 0, 5\)"):
        rotated_roi_align(x[:, :, :0], rois, 2)
    with pytest.raises(ValueError, match=r"rois must have shape \(K, 6\)"):
        rotated_roi_align(x, rois[:, :5], 2)
    for size in (0, (2,), (2, 0), (2.0, 2)):
        with pytest.raises((TypeError, ValueError), match="output_size"):
            rotated_roi_align(x, rois, size)
    for scale in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="spatial_scale"):
            rotated_roi_align(x, rois, 2, scale)
    with pytest.raises(TypeError, match="sampling_ratio"):
        rotated_roi_align(x, rois, 2, 1.0, 2.0)
    with pytest.raises(ValueError, match="impl"):
        rotated_roi_align(x, rois, 2, impl="cuda")
    for bad in ([2.0, 1, 1, 1, 1, 0], [0.5, 1, 1, 1, 1, 0], [-1, 1, 1, 1, 1, 0],
                [0, 1, float("nan"), 1, 1, 0], [0, 1, 1, 1, 1, float("inf")]):  # fmt: skip
        with pytest.raises(
            ValueError, match=r"rois must be finite, with integer batch indices in \[0, 2\)"
        ):
            rotated_roi_align(x, torch.tensor([bad], dtype=torch.float32), 2)
    with value_checks(False):  # the check is off: NaN boxes sample nothing (fixed: NaN)
        assert torch.equal(
            rotated_roi_align(x, torch.tensor([[0, 1, 1, float("nan"), 1, 0]]), 2),
            torch.zeros(1, 3, 2, 2),
        )


def test_sampling_is_capped_like_roi_align():
    """``sampling_ratio`` is at most 1024 (`roi_align`'s cap), and so is the adaptive count
    ``ceil(side / bins)`` where the RoIs are read: past it the sample points' tensor failed
    with the allocator's raw error."""
    x = torch.zeros(1, 2, 4, 4)
    rois = torch.tensor([[0.0, 2.0, 2.0, 2.0, 2.0, 0.0]])
    with pytest.raises(ValueError, match=r"sampling_ratio must be in \(-inf, 1024\], got 1000000"):
        rotated_roi_align(x, rois, 2, 1.0, 10**6)
    with pytest.raises(ValueError, match="sampling_ratio must be in"):
        RotatedRoIAlign(2, 1.0, 1025)
    assert rotated_roi_align(x, rois, 1, 1.0, 1024).shape == (1, 2, 1, 1)
    huge = torch.tensor([[0.0, 2.0, 2.0, 1e5, 1e5, 30.0]])
    with pytest.raises(
        ValueError, match=r"rois take up to 14286 x 14286 sample points per bin with "
        r"sampling_ratio <= 0 .* give a sampling_ratio in \[1, 1024\]",
    ):  # fmt: skip
        rotated_roi_align(x, huge, 7)
    edge = torch.tensor([[0.0, 2.0, 2.0, 2048.0, 1.0, 0.0]])  # 1024 per side: allowed
    assert rotated_roi_align(x, edge, (1, 2)).shape == (1, 2, 1, 2)
    assert rotated_roi_align(x, huge, 7, 1.0, 2).shape == (1, 2, 7, 7)
