"""The C kernel of bilinear zeros-padding `warp_affine` on CPU (`visionblocks.ops._warp_native`).

The float64 reference (tests/reference/warp.py) is the oracle; grid_sample, the fallback, is
tested against it in test_warp.py with both paths.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import team_fixture
from tests.reference import warp as reference
from visionblocks._core import native as _native
from visionblocks.ops import _warp_native, _warp_sampling
from visionblocks.ops.warp import affine_matrix, warp_affine


@pytest.fixture
def native():
    reason = _warp_native.native_unavailable_reason()
    if reason:
        pytest.skip(reason)


def random_case(i: int, gen: torch.Generator):
    """Image, matrix and output size of case ``i``: generic, axis-aligned with half-pixel
    shifts (ties, exact borders), extreme scales, far away, or a random matrix."""

    def r(*shape):
        return torch.rand(shape, generator=gen)

    h, w, ho, wo = (int(v) for v in (r(4) * 40).long() + 1)
    center = (w / 2, h / 2)
    kind = i % 5
    if kind == 0:
        m = affine_matrix(
            angle=float(r() * 360),
            scale=float(r() * 3 + 0.1),
            translate=((r(2) - 0.5) * 60).tolist(),
            shear=((r(2) - 0.5) * 60).tolist(),
            center=center,
        )
    elif kind == 1:
        m = affine_matrix(
            angle=float((r() * 4).floor() * 90),
            translate=((r(2) * 8).round() / 2 - 2).tolist(),
            center=((w - 1) / 2, (h - 1) / 2),
        )
    elif kind == 2:
        m = affine_matrix(angle=float(r() * 360), scale=float(10 ** (r() * 6 - 3)), center=center)
    elif kind == 3:
        m = affine_matrix(angle=float(r() * 360), translate=((r(2) - 0.5) * 1e5).tolist())
    else:
        m = torch.randn(2, 3, generator=gen) * torch.tensor([[1.0, 1.0, 20.0], [1.0, 1.0, 20.0]])
    dtype = torch.float64 if i % 3 == 0 else torch.float32
    img = (r(2, h, w) * 2 - 1).to(dtype)
    return img, m.to(dtype), (ho, wo)


def test_random_warps_match_reference(native, monkeypatch):
    def no_grid_sample(*args, **kwargs):
        raise AssertionError("grid_sample called: the C kernel should have run")

    monkeypatch.setattr(_warp_sampling.F, "grid_sample", no_grid_sample)
    gen = torch.Generator().manual_seed(0)
    for i in range(250):
        img, m, size = random_case(i, gen)
        out = warp_affine(img, m, size)
        expected = reference.warp_affine(img, m, size)
        tol = 2e-6 if img.dtype == torch.float32 else 1e-11  # |img| <= 1, up to 1000x zoom
        assert out.shape == expected.shape and out.dtype == img.dtype
        assert (out.double() - expected).abs().max() <= tol, (i, m)


def test_rgb_batches_match_reference(native, monkeypatch):
    """Three channels take their own loop in the kernel, and batches one plan per matrix."""

    def no_grid_sample(*args, **kwargs):
        raise AssertionError("grid_sample called: the C kernel should have run")

    monkeypatch.setattr(_warp_sampling.F, "grid_sample", no_grid_sample)
    gen = torch.Generator().manual_seed(4)
    for i in range(100):
        img, m, size = random_case(i, gen)
        batch = (torch.rand((2, 3, *img.shape[-2:]), generator=gen) * 2 - 1).to(img.dtype)
        if i % 7 == 0:
            batch[0, 1, 0, 0] = float("nan")
        other = affine_matrix(angle=float(i), scale=1.1, center=(3.0, 2.0)).to(m.dtype)
        tol = 2e-6 if img.dtype == torch.float32 else 1e-11
        for mats in (m, torch.stack((m, other))):
            out = warp_affine(batch, mats, size)
            for n in range(2):
                expected = reference.warp_affine(
                    batch[n], mats if mats.dim() == 2 else mats[n], size
                )
                assert torch.equal(out[n].isnan(), expected.isnan()), (i, n)
                finite = expected.isfinite()
                assert (out[n].double()[finite] - expected[finite]).abs().max() <= tol, (i, n)


def test_nan_and_inf_spread_as_in_the_reference(native):
    img = torch.rand(1, 20, 30, generator=torch.Generator().manual_seed(1))
    img[0, 7, 11], img[0, 0, 29], img[0, 19, 0] = float("nan"), float("inf"), float("-inf")
    m = affine_matrix(angle=23.0, scale=1.37, translate=(2.3, -1.1), center=(14.5, 9.5))
    out, expected = warp_affine(img, m, (27, 33)), reference.warp_affine(img, m, (27, 33))
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out.isinf(), expected.isinf())
    finite = expected.isfinite()
    assert (out.double()[finite] - expected[finite]).abs().max() < 2e-6


team = team_fixture(_warp_native.LIBRARY)


def test_same_result_with_one_or_two_threads_and_any_layout(team):
    imgs = torch.rand(5, 3, 70, 90, generator=torch.Generator().manual_seed(2))
    mats = affine_matrix(angle=torch.linspace(-50.0, 50.0, 5), scale=0.9, center=(44.5, 34.5))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [warp_affine(imgs, mats), warp_affine(imgs, mats[2])]
        torch.set_num_threads(2)
        two = [warp_affine(imgs, mats), warp_affine(imgs, mats[2])]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    channels_last = imgs.contiguous(memory_format=torch.channels_last)
    assert torch.equal(warp_affine(channels_last, mats), one[0])
    assert torch.equal(warp_affine(imgs[:, :2], mats), one[0][:, :2])  # 2 channels


def test_autograd_uses_grid_sample(native, monkeypatch):
    calls = []
    grid_sample = _warp_sampling.F.grid_sample
    monkeypatch.setattr(
        _warp_sampling.F, "grid_sample", lambda *a, **k: calls.append(1) or grid_sample(*a, **k)
    )
    img = torch.rand(1, 2, 9, 8, requires_grad=True)
    m = affine_matrix(angle=30.0, center=(4.0, 4.0))
    warp_affine(img, m).sum().backward()
    assert calls and img.grad is not None
    with torch.no_grad():
        warp_affine(img, m)
    assert len(calls) == 1  # no autograd: the C kernel


def test_falls_back_to_grid_sample_when_the_kernel_cannot_be_built(monkeypatch, tmp_path):
    monkeypatch.setattr(_warp_native.LIBRARY, "state", {})
    monkeypatch.setenv("VISIONBLOCKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert "could not build the warp_kernel" in _warp_native.native_unavailable_reason()
    img, m = torch.rand(2, 11, 13), affine_matrix(angle=40.0, center=(6.0, 5.0))
    assert (
        warp_affine(img, m).double() - reference.warp_affine(img, m, (11, 13))
    ).abs().max() < 5e-6

    monkeypatch.setattr(_warp_native.LIBRARY, "state", {})
    monkeypatch.setenv(_warp_native.ENV_DISABLE, "1")
    assert "disabled" in _warp_native.native_unavailable_reason()


def test_builds_in_the_temp_folder_when_the_cache_folder_is_unusable(native, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(_warp_native.LIBRARY, "state", {})
    monkeypatch.setenv("VISIONBLOCKS_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(_native.tempfile, "tempdir", str(tmp_path))
    assert _warp_native.native_unavailable_reason() is None
    assert list(tmp_path.glob("visionblocks-*/warp_kernel_*.so"))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::FutureWarning")
def test_traced_and_vmapped_calls_use_grid_sample(native):
    """The kernel writes through ``data_ptr``, which a trace or a vmap wrapper would not see:
    those go through grid_sample (and a replayed trace stays right)."""
    m = affine_matrix(angle=30.0, center=(7.5, 7.5))
    imgs, new = torch.rand(2, 4, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    traced = torch.jit.trace(lambda x: warp_affine(x, m), (imgs,), check_trace=False)
    assert (traced(new) - warp_affine(new, m)).abs().max() < 1e-5
    vmapped = torch.func.vmap(lambda x: warp_affine(x, m))(imgs)
    assert (vmapped - warp_affine(imgs, m)).abs().max() < 1e-5


def test_wide_outputs_whose_scratch_is_not_kept(team):
    # 64 rows x 12000 columns of plans: 9 MiB of scratch per part, released after each part.
    img = torch.rand(1, 80, 12000, generator=torch.Generator().manual_seed(3))
    m = affine_matrix(angle=0.3, translate=(1.25, -0.5), center=(5999.5, 39.5))
    out, expected = warp_affine(img, m), reference.warp_affine(img, m, (80, 12000))
    assert (out.double() - expected).abs().max() < 2e-6


# ---------------------------------------------------------------------------- uint8, nearest, fill


def both_paths(monkeypatch, *args, **kwargs):
    """``warp_affine(*args, **kwargs)`` with the C kernel, then with the torch path."""
    native = warp_affine(*args, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(_warp_native.LIBRARY, "functions", lambda: None)
        fallback = warp_affine(*args, **kwargs)
    return native, fallback


def no_torch_sampling(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the torch path ran: the C kernel should have")

    monkeypatch.setattr(_warp_sampling.F, "grid_sample", fail)
    monkeypatch.setattr(_warp_sampling, "source_coords", fail)


def test_uint8_bilinear_rounds_the_reference(native, monkeypatch):
    """uint8 in the kernel: the float32 result rounded half to even, clamped; within float
    rounding of the exact (float64) value, so never more than half a level off, and within
    one level of the torch path (which rounds its own float32 value)."""
    gen = torch.Generator().manual_seed(5)
    for i in range(120):
        img, m, size = random_case(i, gen)
        c = (3, 1, 4)[i % 3]
        u8 = (torch.rand((c, *img.shape[-2:]), generator=gen) * 255).to(torch.uint8)
        padding, fill = ("fill", tuple(range(7, 7 + 40 * c, 40))) if i % 4 == 0 else ("zeros", 0.0)
        with monkeypatch.context() as patch:
            no_torch_sampling(patch)
            out = warp_affine(u8, m, size, padding_mode=padding, fill=fill)
        expected = reference.warp_affine(u8, m, size, padding_mode=padding, fill=fill)
        assert out.dtype == torch.uint8 and out.shape == expected.shape
        assert (out.double() - expected).abs().max() <= 0.5 + 1e-3, i
        _, fallback = both_paths(monkeypatch, u8, m, size, padding_mode=padding, fill=fill)
        assert (out.int() - fallback.int()).abs().max() <= 1, i


def test_uint8_bilinear_within_one_level_of_opencv(native):
    cv2 = pytest.importorskip("cv2")
    gen = torch.Generator().manual_seed(6)
    u8 = (torch.rand(3, 97, 131, generator=gen) * 255).to(torch.uint8)
    m = affine_matrix(
        angle=12.0, scale=0.85, shear=(4.0, 0.0), translate=(3.5, -2.0), center=(65.0, 48.0)
    )
    for padding, fill in (("zeros", 0.0), ("fill", (114.0, 114.0, 114.0))):
        out = warp_affine(u8, m, (90, 140), padding_mode=padding, fill=fill)
        ref = cv2.warpAffine(
            u8.permute(1, 2, 0).numpy(),
            m.double().numpy(),
            (140, 90),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=fill if padding == "fill" else 0,
        )
        diff = (out.permute(1, 2, 0).int() - torch.from_numpy(ref).int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.float16,
        torch.int32,
        torch.float32,
        torch.int64,
        torch.float64,
    ],
)
def test_nearest_equals_the_torch_path_exactly(native, monkeypatch, dtype):
    """Both paths round the same float64 coordinates: the same pixels, any dtype, ties (the
    half-pixel shifts of every fifth case) included."""
    gen = torch.Generator().manual_seed(7)
    for i in range(60):
        img, m, size = random_case(i, gen)
        masks = (torch.rand((5, *img.shape[-2:]), generator=gen) * 100).to(dtype)
        if dtype == torch.bool:
            masks = torch.rand((5, *img.shape[-2:]), generator=gen) > 0.5
        padding, fill = ("fill", 1) if i % 3 == 0 else ("zeros", 0.0)
        with monkeypatch.context() as patch:
            no_torch_sampling(patch)
            out = warp_affine(masks, m, size, "nearest", padding, fill)
        _, fallback = both_paths(monkeypatch, masks, m, size, "nearest", padding, fill)
        assert out.dtype == dtype and torch.equal(out, fallback), i
        expected = reference.warp_affine(masks.double(), m, size, "nearest", padding, fill)
        assert (out.double() != expected).float().mean() < 1e-3  # near-ties of float32 matrices


def test_nearest_batches_and_per_channel_fill(native, monkeypatch):
    gen = torch.Generator().manual_seed(8)
    labels = torch.randint(0, 200, (3, 4, 21, 34), generator=gen, dtype=torch.uint8)
    mats = affine_matrix(angle=torch.tensor([10.0, -35.0, 190.0]), scale=1.2, center=(16.5, 10.0))
    fill = torch.tensor([255, 0, 7, 9], dtype=torch.uint8)
    for mat in (mats, mats[1]):
        native_out, fallback = both_paths(
            monkeypatch, labels, mat, (25, 30), "nearest", "fill", fill
        )
        assert torch.equal(native_out, fallback)


def test_bilinear_fill_matches_the_reference(native, monkeypatch):
    gen = torch.Generator().manual_seed(9)
    for i in range(60):
        img, m, size = random_case(i, gen)
        fill = (0.25, -1.5) if i % 2 else 0.75
        with monkeypatch.context() as patch:
            no_torch_sampling(patch)
            out = warp_affine(img, m, size, padding_mode="fill", fill=fill)
        expected = reference.warp_affine(img, m, size, padding_mode="fill", fill=fill)
        tol = 5e-6 if img.dtype == torch.float32 else 1e-11
        assert (out.double() - expected).abs().max() <= tol, (i, m)


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (1, 2), (3, 1)])
def test_tiny_and_one_pixel_wide_images(native, monkeypatch, shape):
    gen = torch.Generator().manual_seed(10)
    img = torch.rand(3, *shape, generator=gen)
    u8 = (img * 255).to(torch.uint8)
    for m in (
        affine_matrix(angle=30.0, scale=2.5, center=(0.5, 0.5)),
        affine_matrix(translate=(0.5, -0.5)),
        affine_matrix(scale=3.0),
    ):
        for size in (shape, (5, 7), (1, 4)):
            out = warp_affine(img, m, size)
            assert (out.double() - reference.warp_affine(img, m, size)).abs().max() < 2e-6
            u8_out, u8_fallback = both_paths(monkeypatch, u8, m, size)
            assert (u8_out.int() - u8_fallback.int()).abs().max() <= 1
            near, near_fallback = both_paths(monkeypatch, u8, m, size, mode="nearest")
            assert torch.equal(near, near_fallback)


def test_non_contiguous_inputs(native):
    gen = torch.Generator().manual_seed(11)
    base = (torch.rand(2, 6, 40, 50, generator=gen) * 255).to(torch.uint8)
    m = affine_matrix(angle=20.0, scale=0.9, center=(24.5, 19.5))
    for view in (base[:, ::2], base.contiguous(memory_format=torch.channels_last), base[..., 5:45]):
        for mode in ("bilinear", "nearest"):
            assert torch.equal(
                warp_affine(view, m, mode=mode), warp_affine(view.contiguous(), m, mode=mode)
            )
    masks = base[0] > 128
    assert torch.equal(
        warp_affine(masks.mT, m, mode="nearest"),
        warp_affine(masks.mT.contiguous(), m, mode="nearest"),
    )


def test_disabled_kernel_gives_the_same_results(monkeypatch, tmp_path):
    """``VISIONBLOCKS_DISABLE_NATIVE=1``: the torch path, same pixels (nearest) and values."""
    gen = torch.Generator().manual_seed(12)
    u8 = (torch.rand(3, 33, 47, generator=gen) * 255).to(torch.uint8)
    masks = torch.rand(5, 33, 47, generator=gen) > 0.7
    m = affine_matrix(angle=14.0, scale=1.1, translate=(2.0, 0.5), center=(23.0, 16.0))
    runs = []
    for disabled in (False, True):
        monkeypatch.setattr(_warp_native.LIBRARY, "state", {})
        if disabled:
            monkeypatch.setenv(_warp_native.ENV_DISABLE, "1")
        runs.append(
            (
                warp_affine(u8, m),
                warp_affine(u8.float(), m, padding_mode="fill", fill=3.0),
                warp_affine(masks, m, mode="nearest"),
            )
        )
    assert "disabled" in _warp_native.native_unavailable_reason()
    (u8_a, f_a, m_a), (u8_b, f_b, m_b) = runs
    assert (u8_a.int() - u8_b.int()).abs().max() <= 1
    assert (f_a - f_b).abs().max() < 5e-3  # values up to 255, the torch path's float32 grid
    assert torch.equal(m_a, m_b)
