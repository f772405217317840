"""`warp_affine` on CPU is ``cv2.warpAffine`` (`visionblocks.ops._warp_opencv`): exactly, for
every dtype, channel count, padding mode and fill; and it steps aside where it must (gradients,
tracing, float64, no OpenCV), leaving OpenCV's thread setting alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.reference import warp as reference
from visionblocks.ops import _warp_opencv
from visionblocks.ops.warp import affine_matrix, warp_affine

cv2 = pytest.importorskip("cv2")
if _warp_opencv.opencv() is None:
    pytest.skip("OpenCV 5 is not installed", allow_module_level=True)

BORDER = {
    "zeros": cv2.BORDER_CONSTANT,
    "fill": cv2.BORDER_CONSTANT,
    "border": cv2.BORDER_REPLICATE,
    "reflection": cv2.BORDER_REFLECT,
}
INTER = {"bilinear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}
MATRIX = affine_matrix(angle=23.0, scale=1.3, shear=(7.0, -3.0), center=(9.3, 6.1))
SIZE = (15, 19)


def opencv_planes(img: torch.Tensor, matrix: torch.Tensor, mode: str, padding: str, fill):
    """``cv2.warpAffine`` of each ``(H, W)`` plane of ``img (B, C, H, W)``, one call each."""
    fills = torch.as_tensor(fill, dtype=torch.float64).reshape(-1).expand(img.shape[1])
    mats = matrix.double().reshape(-1, 2, 3).expand(img.shape[0], 2, 3)
    out = np.stack(
        [
            [
                cv2.warpAffine(
                    plane.numpy(),
                    m.numpy(),
                    (SIZE[1], SIZE[0]),
                    flags=INTER[mode],
                    borderMode=BORDER[padding],
                    borderValue=float(f) if padding == "fill" else 0.0,
                )
                for plane, f in zip(image, fills)
            ]
            for image, m in zip(img, mats)
        ]
    )
    return torch.from_numpy(out)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.float32])
@pytest.mark.parametrize("channels", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("padding", list(BORDER))
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_equals_opencv_exactly(dtype, channels, padding, mode):
    """Groups of 4 (8-bit) or single planes: per channel the same values as OpenCV's call."""
    gen = torch.Generator().manual_seed(channels)
    img = (torch.rand(2, channels, 12, 17, generator=gen) * 250).to(dtype)
    mats = torch.stack([MATRIX, affine_matrix(angle=-61.0, translate=(2.5, 1.0))])
    fill = [float(10 + 7 * k) for k in range(channels)] if padding == "fill" else 0.0
    out = warp_affine(img, mats, SIZE, mode, padding, fill)
    assert out.dtype == dtype and torch.equal(out, opencv_planes(img, mats, mode, padding, fill))
    shared = warp_affine(img, MATRIX, SIZE, mode, padding, fill)
    assert torch.equal(shared, opencv_planes(img, MATRIX, mode, padding, fill))


@pytest.mark.parametrize(
    ("dtype", "mode"),
    [
        (dtype, mode)
        for dtype in (torch.uint8, torch.uint16, torch.float32, torch.int16, torch.float16)
        for mode in ("bilinear", "nearest")
    ]
    + [(torch.bool, "nearest")],
)
@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("padding", list(BORDER))
def test_interleaved_images_warp_in_one_call_and_keep_their_layout(
    dtype, mode, channels, padding, monkeypatch
):
    """An image in ``H x W x C`` memory (``torch.from_numpy(opencv_image).permute(2, 0, 1)``)
    goes to OpenCV as it is, one call per image (through four channels for 8-bit data), and
    comes back in the same layout, with the values of its planes' warp."""
    gen = torch.Generator().manual_seed(channels)
    hwc = (torch.rand(2, 12, 17, channels, generator=gen) * 250).to(dtype)
    img = hwc.permute(0, 3, 1, 2)
    mats = torch.stack([MATRIX, affine_matrix(angle=-61.0, translate=(2.5, 1.0))])
    fill = [float(1 + k % 2) for k in range(channels)] if padding == "fill" else 0.0
    calls = []
    real = cv2.warpAffine
    monkeypatch.setattr(cv2, "warpAffine", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = warp_affine(img, mats, SIZE, mode, padding, fill)
    assert len(calls) == 2, "one OpenCV call per image"
    assert out.dtype == dtype and out.permute(0, 2, 3, 1).is_contiguous()
    assert torch.equal(out, warp_affine(img.contiguous(), mats, SIZE, mode, padding, fill))
    assert torch.equal(warp_affine(img[1], mats[1], SIZE, mode, padding, fill), out[1])


@pytest.mark.parametrize(
    "dtype",
    [torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16],
)
def test_other_dtypes_interpolate_in_float32_as_the_torch_path(dtype):
    """Bilinear: the float32 result of OpenCV's exact kernel, rounded half to even and
    clamped (integers) or rounded to the dtype (half floats): the torch path's rule."""
    low = -100 if dtype.is_signed else 0
    img = torch.randint(low, 120, (1, 3, 12, 17), generator=torch.Generator().manual_seed(1))
    img = img.to(dtype)
    out = warp_affine(img, MATRIX, SIZE, padding_mode="fill", fill=(-300.0, 5.5, 1e9))
    wide = opencv_planes(img.float(), MATRIX, "bilinear", "fill", (-300.0, 5.5, 1e9))
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        wide = wide.round().clamp(info.min, info.max)
    assert out.dtype == dtype and torch.equal(out, wide.to(dtype))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.int8,
        torch.int16,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.uint32,
        torch.float32,
        torch.int64,
        torch.float64,
    ],
)
@pytest.mark.parametrize("padding", ["zeros", "fill", "border", "reflection"])
def test_nearest_copies_every_dtype_bit_for_bit(dtype, padding):
    """Every output pixel is a source element, bits included (NaN payloads, -0.0): checked
    against the source pixel each output pixel took, read from a warped index image."""
    h, w = 12, 17
    index = torch.arange(h * w, dtype=torch.float32).view(1, 1, h, w)
    constant = padding in ("zeros", "fill")  # the index image pads with -1 then
    how = ("fill", -1.0) if constant else (padding, 0.0)
    taken = warp_affine(index, MATRIX, SIZE, "nearest", *how).long().flatten()
    bits = torch.randint(0, 256, (2, h * w * dtype.itemsize), generator=torch.Generator())
    img = bits.to(torch.uint8).view(dtype).view(2, 1, h, w)
    if dtype == torch.bool:
        img = img.view(torch.uint8).bool()
    fill = 1 if padding == "fill" else 0
    out = warp_affine(img, MATRIX, SIZE, "nearest", padding, fill)
    raw = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    source = img.flatten(1)[:, taken.clamp(min=0)].view(2, 1, *SIZE)
    if constant:
        border = torch.tensor(fill, dtype=dtype)
        source = torch.where((taken >= 0).view(1, 1, *SIZE), source, border)
    assert out.dtype == dtype and torch.equal(raw(out), raw(source))


def test_float64_keeps_the_exact_torch_path():
    """OpenCV's float64 warp rounds positions to 1/32 pixel: float64 stays on grid_sample."""
    img = torch.rand(3, 12, 17, dtype=torch.float64)
    m = MATRIX.double()
    expected = reference.warp_affine(img, m, SIZE)
    assert (warp_affine(img, m, SIZE) - expected).abs().max() < 1e-12


def test_gradients_tracing_and_no_opencv_take_the_torch_path(monkeypatch):
    calls = []
    real = _warp_opencv.warp_opencv
    monkeypatch.setattr("visionblocks.ops.warp.warp_opencv", lambda *a: calls.append(1) or real(*a))
    img = torch.rand(1, 3, 12, 17)
    plain = warp_affine(img, MATRIX, SIZE)
    assert calls == [1]
    grad_img = img.clone().requires_grad_()
    warp_affine(grad_img, MATRIX, SIZE).sum().backward()
    assert grad_img.grad is not None and grad_img.grad.abs().sum() > 0
    m = MATRIX.clone().requires_grad_()
    warp_affine(img, m, SIZE).sum().backward()
    assert m.grad is not None and m.grad.abs().sum() > 0
    traced = torch.jit.trace(lambda x: warp_affine(x, MATRIX, SIZE), (img,))
    assert "grid_sampler" in str(traced.graph)
    torch.testing.assert_close(traced(img), plain, atol=1e-5, rtol=0)
    monkeypatch.setattr(_warp_opencv, "opencv", lambda: None)
    torch.testing.assert_close(warp_affine(img, MATRIX, SIZE), plain, atol=1e-5, rtol=0)


def test_singular_matrices_still_raise():
    with pytest.raises(ValueError, match="invertible"):
        warp_affine(torch.rand(3, 8, 8), torch.zeros(2, 3))


def test_threads_and_opencv_setting():
    """A loader's threads call it at once: each gets its own result; OpenCV's thread count
    stays what the user set."""
    before = cv2.getNumThreads()
    images = [torch.rand(3, 64, 80, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    expected = [warp_affine(x, MATRIX) for x in images]
    got: list = [None] * len(images)

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = warp_affine(images[i], MATRIX)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(images))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert cv2.getNumThreads() == before


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8])
@pytest.mark.parametrize("channels", [2, 5, 8, 17])
@pytest.mark.parametrize("padding", list(BORDER))
def test_binary_masks_eight_to_a_byte_equal_opencv(dtype, channels, padding):
    """0/1 planes are warped as the bits of one byte plane: the same as one call per plane."""
    gen = torch.Generator().manual_seed(channels)
    masks = (torch.rand(2, channels, 12, 17, generator=gen) > 0.5).to(dtype)
    mats = torch.stack([MATRIX, affine_matrix(angle=-61.0, translate=(2.5, 1.0))])
    fill = [k % 2 for k in range(channels)] if padding == "fill" else 0
    out = warp_affine(masks, mats, SIZE, "nearest", padding, fill)
    planes = masks.view(torch.uint8) if dtype == torch.bool else masks
    expected = opencv_planes(planes.view(torch.uint8), mats, "nearest", padding, fill)
    assert out.dtype == dtype and torch.equal(out.view(torch.uint8), expected)
    if dtype == torch.uint8:  # a value above 1 anywhere: byte by byte
        masks[1, 0, 0, 0] = 7
        out = warp_affine(masks, mats, SIZE, "nearest", padding, fill)
        assert torch.equal(out, opencv_planes(masks, mats, "nearest", padding, fill))


def test_opencv_threads_give_the_same_bits():
    """OpenCV cuts a warp into row stripes: 1 and 2 of its threads give the same result."""
    before = cv2.getNumThreads()
    img = torch.rand(2, 3, 200, 150, generator=torch.Generator().manual_seed(35))
    try:
        cv2.setNumThreads(1)
        one = warp_affine(img, MATRIX, (190, 170))
        cv2.setNumThreads(2)
        two = warp_affine(img, MATRIX, (190, 170))
    finally:
        cv2.setNumThreads(before)
    assert torch.equal(one, two)
