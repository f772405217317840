"""sliding_windows and local_filter2d (torch formula): references, gradients, geometry, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import visionblocks.ops._local_filter_torch as torch_path
from tests.helpers import assert_close, gradcheck
from tests.reference.local_ops import local_filter as reference
from visionblocks.ops._local_parts import new_output
from visionblocks.ops.local import local_filter2d, sliding_windows


def naive_loop(x, kernels, k, d=1, s=1):
    """The defining formula, one output value at a time (tiny inputs only; checks the reference)."""
    b, c, h, w = x.shape
    ho, wo = kernels.shape[2:]
    cg = c // (kernels.shape[1] // (k * k))
    out = torch.zeros(b, c, ho, wo, dtype=x.dtype)
    for bi in range(b):
        for ci in range(c):
            g = ci // cg
            for oh in range(ho):
                for ow in range(wo):
                    for i in range(k):
                        for j in range(k):
                            ih, iw = oh * s + (i - k // 2) * d, ow * s + (j - k // 2) * d
                            if 0 <= ih < h and 0 <= iw < w:
                                kv = kernels[bi, g * k * k + i * k + j, oh, ow]
                                out[bi, ci, oh, ow] += kv * x[bi, ci, ih, iw]
    return out


def inputs(b, c, h, w, k, g, s=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(b * 1000 + c * 100 + h * 10 + w + k + g)
    x = torch.randn(b, c, h, w, generator=gen, dtype=dtype)
    kernels = torch.randn(b, g * k * k, -(-h // s), -(-w // s), generator=gen, dtype=dtype)
    return x, kernels


# --------------------------------------------------------------------------- sliding_windows
@pytest.mark.parametrize(("k", "d"), [(1, 1), (3, 1), (3, 2), (5, 3)])
def test_sliding_windows_matches_unfold(k, d):
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    expected = F.unfold(x, k, dilation=d, padding=d * (k // 2)).view(2, 3, k * k, 7, 9)
    torch.testing.assert_close(sliding_windows(x, k, d), expected, rtol=0, atol=0)


def test_sliding_windows_integer_and_gradient():
    labels = torch.arange(12).view(1, 1, 3, 4)
    win = sliding_windows(labels, 3)
    assert win.dtype == torch.int64
    assert win[0, 0, :, 1, 1].tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    x = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    assert gradcheck(lambda t: sliding_windows(t, 3, 2), [x])


# --------------------------------------------------------------------------- references
@pytest.mark.parametrize(
    ("shape", "k", "d", "g"),
    [
        ((2, 4, 7, 9), 3, 1, 1),
        ((2, 4, 7, 9), 3, 2, 4),
        ((1, 6, 13, 17), 5, 1, 3),
        ((1, 6, 13, 17), 7, 2, 2),
        ((3, 2, 1, 1), 3, 1, 2),
        ((1, 3, 6, 5), 1, 1, 1),
    ],
)
def test_matches_reference(shape, k, d, g):
    x, kernels = inputs(*shape, k, g)
    assert_close(local_filter2d(x, kernels, k, d), reference(x, kernels, k, d))


@pytest.mark.parametrize(("k", "d", "s", "g"), [(3, 1, 1, 2), (3, 2, 2, 1), (5, 1, 3, 4)])
def test_matches_naive_loop(k, d, s, g):
    x, kernels = inputs(1, 4, 5, 6, k, g, s)
    expected = naive_loop(x, kernels, k, d, s)
    assert_close(local_filter2d(x, kernels, k, d, stride=s), expected)
    assert_close(reference(x, kernels, k, d, s), expected)


@pytest.mark.parametrize(("h", "w", "s"), [(7, 9, 2), (8, 8, 2), (13, 5, 3)])
def test_stride_matches_reference(h, w, s):
    x, kernels = inputs(2, 4, h, w, 3, 2, s)
    out = local_filter2d(x, kernels, 3, stride=s)
    assert out.shape == (2, 4, -(-h // s), -(-w // s))
    assert_close(out, reference(x, kernels, 3, 1, s))


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 2),
    cg=st.integers(1, 3),
    g=st.integers(1, 3),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    k=st.sampled_from([1, 3, 5]),
    d=st.integers(1, 3),
    s=st.integers(1, 3),
)
def test_random_geometry_matches_reference(b, cg, g, h, w, k, d, s):
    x, kernels = inputs(b, cg * g, h, w, k, g, s)
    assert_close(local_filter2d(x, kernels, k, d, stride=s), reference(x, kernels, k, d, s))


def test_groups_share_kernels():
    x, kernels = inputs(1, 6, 5, 5, 3, 2)
    out = local_filter2d(x, kernels, 3)
    # channels 0..2 use group 0, 3..5 group 1: filtering one channel alone gives the same
    for c in range(6):
        g = c // 3
        alone = local_filter2d(x[:, c : c + 1], kernels[:, g * 9 : (g + 1) * 9], 3)
        assert_close(out[:, c : c + 1], alone)


def test_identity_kernel():
    x = torch.randn(2, 4, 6, 7)
    kernels = torch.zeros(2, 2 * 25, 6, 7)
    kernels[:, 12] = kernels[:, 25 + 12] = 1.0  # the centre tap of both groups
    torch.testing.assert_close(local_filter2d(x, kernels, 5, 2), x)


@pytest.mark.slow  # torch.compile
def test_compile_matches_eager():
    """``torch.compile(fullgraph=True, dynamic=True)`` traces the formula: its eager bits, two sizes."""
    k, d, s, g = 3, 2, 2, 2
    fn = lambda a, b: local_filter2d(a, b, k, d, stride=s, impl="torch")  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in ((2, 4, 7, 9), (1, 6, 12, 5)):
        x, kernels = inputs(*shape, k, g, s, dtype=torch.float32)
        go = torch.randn(shape[0], shape[1], *kernels.shape[2:])
        results = []
        for f in (fn, compiled):
            xx, kk = x.clone().requires_grad_(), kernels.clone().requires_grad_()
            out = f(xx, kk)
            results.append((out, *torch.autograd.grad(out, (xx, kk), go)))
        for a, e in zip(*results, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


# --------------------------------------------------------------------------- chunked CPU path
@pytest.mark.parametrize(("k", "d", "s", "g"), [(3, 1, 1, 2), (5, 2, 2, 1), (3, 3, 3, 4)])
def test_fast_path_matches_formula(k, d, s, g):
    """``impl="auto"`` on CPU (the chunked path) against ``impl="torch"`` (the formula)."""
    x, kernels = inputs(2, 8, 11, 10, k, g, s, dtype=torch.float32)
    go = torch.randn(2, 8, -(-11 // s), -(-10 // s))
    results = []
    for impl in ("auto", "torch"):
        xx, kk = x.clone().requires_grad_(), kernels.clone().requires_grad_()
        out = local_filter2d(xx, kk, k, d, stride=s, impl=impl)
        results.append((out, *torch.autograd.grad(out, (xx, kk), go)))
    for a, e in zip(*results, strict=True):
        assert_close(a, e, scale=2.0)


def test_formula_gradcheck():
    x, kernels = inputs(1, 4, 5, 4, 3, 2, 2)
    fn = lambda a, b: local_filter2d(a, b, 3, 2, stride=2, impl="torch")  # noqa: E731
    assert gradcheck(fn, [x, kernels])


def test_tiled_sweep_matches(monkeypatch):
    """Tiles of rows, of groups and of batch items (a tiny tile budget forces all three)."""
    x, kernels = inputs(3, 8, 9, 10, 3, 4, 2)
    go = torch.randn(3, 8, 5, 5, dtype=torch.float64)

    def run():
        xx, kk = x.clone().requires_grad_(), kernels.clone().requires_grad_()
        out = local_filter2d(xx, kk, 3, 2, stride=2)
        return (out, *torch.autograd.grad(out, (xx, kk), go))

    expected = run()
    for tile in (3, 12, 60, 200):
        monkeypatch.setattr(torch_path, "_TILE", tile)
        for a, e in zip(run(), expected, strict=True):
            assert_close(a, e)


@pytest.mark.parametrize("tile", [None, 400], ids=["default-blocks", "row-blocks"])
@pytest.mark.parametrize(("s", "d"), [(1, 1), (1, 2), (2, 1), (3, 2)])
def test_float32_matches_reference(monkeypatch, tile, s, d):
    """Forward and both gradients in float32 against the float64 reference, with the default
    parts and with parts of one to three output rows each."""
    if tile is not None:
        monkeypatch.setattr(torch_path, "_TILE", tile)
    x, kernels = inputs(2, 8, 29, 33, 5, 2, s, dtype=torch.float32)
    x.requires_grad_(True)
    kernels.requires_grad_(True)
    go = torch.randn(2, 8, -(-29 // s), -(-33 // s))
    out = local_filter2d(x, kernels, 5, d, stride=s)
    ref = reference(x, kernels, 5, d, s)
    assert_close(out, ref.float(), scale=4.0)
    for got, want in zip(
        torch.autograd.grad(out, (x, kernels), go),
        torch.autograd.grad(ref, (x, kernels), go.double()),
        strict=True,
    ):
        assert_close(got, want.float(), scale=4.0)


def test_threads_do_not_change_the_result(monkeypatch):
    """Parts depend on the shapes only: one thread or two give the same bits."""
    monkeypatch.setattr(torch_path, "_TILE", 2000)  # several parts
    x, kernels = inputs(2, 8, 40, 41, 7, 4, dtype=torch.float32)
    go = torch.randn(2, 8, 40, 41)

    def run():
        xx, kk = x.clone().requires_grad_(), kernels.clone().requires_grad_()
        out = local_filter2d(xx, kk, 7)
        return (out, *torch.autograd.grad(out, (xx, kk), go))

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        two = run()
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize("switch", ["1", "0"])
def test_large_results_are_ordinary_tensors(monkeypatch, switch):
    """A result large enough for the huge-page advice is an ordinary, writable tensor."""
    monkeypatch.setenv("VISIONBLOCKS_HUGE_PAGES", switch)
    like = torch.zeros(1, dtype=torch.float64)
    out = new_output((3, (64 << 20) // 24 + 5), like)
    assert out.dtype == torch.float64 and out.is_contiguous() and out.shape[0] == 3
    out.fill_(2.0)
    assert out.sum().item() == 2.0 * out.numel()


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize(("k", "d", "s", "g"), [(3, 1, 1, 1), (3, 2, 1, 4), (5, 1, 2, 2)])
def test_gradcheck(k, d, s, g):
    x, kernels = inputs(2, 4, 5, 4, k, g, s)
    assert gradcheck(lambda a, b: local_filter2d(a, b, k, d, stride=s), [x, kernels])


def test_gradients_match_reference_autograd():
    x, kernels = inputs(2, 6, 9, 8, 5, 3)
    x.requires_grad_(True)
    kernels.requires_grad_(True)
    go = torch.randn(2, 6, 9, 8, dtype=torch.float64)
    ours = torch.autograd.grad(local_filter2d(x, kernels, 5, 2), (x, kernels), go)
    ref = torch.autograd.grad(reference(x, kernels, 5, 2), (x, kernels), go)
    for a, e in zip(ours, ref, strict=True):
        assert_close(a, e)


def test_gradient_of_one_input_only():
    x, kernels = inputs(1, 2, 4, 4, 3, 1)
    kernels.requires_grad_(True)
    (grad,) = torch.autograd.grad(local_filter2d(x, kernels, 3).sum(), kernels)
    expected = sliding_windows(x, 3).sum(1)
    assert_close(grad, expected)


# --------------------------------------------------------------------------- dtypes, layouts
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_precision_dtype_and_accuracy(dtype):
    x, kernels = inputs(1, 4, 6, 6, 3, 2)
    x16, k16 = x.to(dtype).requires_grad_(), kernels.to(dtype).requires_grad_()
    out = local_filter2d(x16, k16, 3)
    assert out.dtype == dtype
    expected = reference(x16, k16, 3)
    assert_close(out.double(), expected, dtype=dtype, scale=2.0)
    gx, gk = torch.autograd.grad(out.float().sum(), (x16, k16))
    assert gx.dtype == gk.dtype == dtype


def test_mixed_dtypes_promote():
    x, kernels = inputs(1, 2, 4, 4, 3, 1)
    out = local_filter2d(x.float(), kernels, 3)
    assert out.dtype == torch.float64


def test_non_contiguous_inputs():
    x, kernels = inputs(2, 4, 6, 7, 3, 2)
    x_nc = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    k_nc = kernels.to(memory_format=torch.channels_last)
    x_sl = torch.cat([x, x], 1)[:, ::2]  # strided channel slice
    assert not x_nc.is_contiguous() and not k_nc.is_contiguous()
    expected = reference(x, kernels, 3)
    assert_close(local_filter2d(x_nc, k_nc, 3), expected)
    assert_close(local_filter2d(x_sl, kernels, 3), reference(x_sl.contiguous(), kernels, 3))


@pytest.mark.parametrize("shape", [(0, 4, 5, 5), (2, 4, 0, 5)])
def test_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    kernels = torch.randn(shape[0], 18, *shape[2:], requires_grad=True)
    out = local_filter2d(x, kernels, 3)
    assert out.shape == shape
    gx, gk = torch.autograd.grad(out.sum(), (x, kernels))
    assert gx.shape == x.shape and gk.shape == kernels.shape


def test_zero_channels():
    x = torch.randn(1, 0, 3, 3, requires_grad=True)
    kernels = torch.randn(1, 9, 3, 3, requires_grad=True)
    out = local_filter2d(x, kernels, 3)
    assert out.shape == (1, 0, 3, 3)
    (gk,) = torch.autograd.grad(out.sum(), kernels)
    assert torch.equal(gk, torch.zeros_like(kernels))


def test_sliding_windows_empty_inputs():
    for shape in [(1, 2, 0, 5), (1, 2, 5, 0), (0, 2, 4, 4), (1, 0, 4, 4)]:
        x = torch.randn(shape)
        out = sliding_windows(x, 3, 2)
        assert out.shape == (*shape[:2], 9, *shape[2:]) and out.dtype == x.dtype


# --------------------------------------------------------------------------- errors
def test_bad_inputs():
    x, kernels = torch.randn(1, 4, 5, 5), torch.randn(1, 18, 5, 5)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        local_filter2d(x, torch.randn(1, 32, 5, 5), 4)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        sliding_windows(x, 2)
    with pytest.raises(ValueError, match="kernel_size must be >= 1"):
        local_filter2d(x, kernels, 0)
    with pytest.raises(ValueError, match="dilation must be >= 1"):
        local_filter2d(x, kernels, 3, 0)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        local_filter2d(x, kernels, 3, stride=0)
    with pytest.raises(TypeError, match="kernel_size must be int"):
        local_filter2d(x, kernels, 3.0)
    with pytest.raises(ValueError, match="G dividing C = 4"):
        local_filter2d(x, torch.randn(1, 27, 5, 5), 3)  # G = 3 does not divide 4
    with pytest.raises(ValueError, match="G dividing C = 4"):
        local_filter2d(x, torch.randn(1, 10, 5, 5), 3)  # not a multiple of 9
    with pytest.raises(ValueError, match=r"kernels must have shape \(1, G\*9, 5, 5\)"):
        local_filter2d(x, torch.randn(1, 18, 5, 4), 3)
    with pytest.raises(ValueError, match=r"kernels must have shape \(1, G\*9, 3, 3\)"):
        local_filter2d(x, kernels, 3, stride=2)
    with pytest.raises(ValueError, match=r"kernels must have shape"):
        local_filter2d(x, torch.randn(2, 18, 5, 5), 3)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        sliding_windows(x.numpy(), 3)


def test_absurd_sizes_are_rejected_or_equivalent_before_allocating():
    x = torch.randn(1, 2, 5, 4)
    # A dilation past the image reads only zeros off-centre: the same as dilation max(H, W).
    assert torch.equal(sliding_windows(x, 3, dilation=10**9), sliding_windows(x, 3, dilation=5))
    kernels = torch.randn(1, 9, 5, 4)
    assert torch.equal(local_filter2d(x, kernels, 3, 10**9), local_filter2d(x, kernels, 3, 5))
    with pytest.raises(ValueError, match="the windows would need a tensor of shape"):
        sliding_windows(x, 10**9 + 1)
    with pytest.raises(ValueError, match="kernels must have G\\*k\\*k channels"):
        local_filter2d(x, kernels, 10**9 + 1)
