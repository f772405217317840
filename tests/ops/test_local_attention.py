"""local_attention2d (torch formula): unfold and naive references, masking, gradients, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import assert_close, gradcheck
from tests.reference.local_ops import local_attention2d as reference
from visionblocks.ops import _local_attention_torch
from visionblocks.ops.local_attention import local_attention2d

F64 = torch.float64


def qkv(shape, dtype=F64, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(*shape, generator=gen, dtype=F64).to(dtype).requires_grad_(requires_grad)
        for _ in range(3)
    )


def zero_padded_attention(q, k, v, kernel_size, dilation, heads):
    """The common mistake: unfold pads with zero keys that take part in the softmax."""
    b, c, h, w = q.shape
    depth, taps, pad = c // heads, kernel_size * kernel_size, dilation * (kernel_size // 2)
    k_cols = F.unfold(k, kernel_size, dilation=dilation, padding=pad).view(
        b, heads, depth, taps, -1
    )
    v_cols = F.unfold(v, kernel_size, dilation=dilation, padding=pad).view(
        b, heads, depth, taps, -1
    )
    logits = (q.reshape(b, heads, depth, 1, -1) * k_cols).sum(2) / math.sqrt(depth)
    return (logits.softmax(2).unsqueeze(2) * v_cols).sum(3).reshape(b, c, h, w)


def naive_attention(q, k, v, kernel_size, dilation, heads):
    """Loops over pixels, heads and taps; only taps inside the image are kept (checks the reference)."""
    b, c, h, w = q.shape
    depth, half = c // heads, kernel_size // 2
    out = torch.zeros_like(q)
    for bi in range(b):
        for n in range(heads):
            ch = slice(n * depth, (n + 1) * depth)
            for y in range(h):
                for x in range(w):
                    keys, values = [], []
                    for i in range(kernel_size):
                        for j in range(kernel_size):
                            yy, xx = y + (i - half) * dilation, x + (j - half) * dilation
                            if 0 <= yy < h and 0 <= xx < w:
                                keys.append(k[bi, ch, yy, xx])
                                values.append(v[bi, ch, yy, xx])
                    logits = torch.stack(keys) @ q[bi, ch, y, x] / math.sqrt(depth)
                    out[bi, ch, y, x] = logits.softmax(0) @ torch.stack(values)
    return out


@pytest.mark.parametrize(
    ("shape", "kernel_size", "dilation", "heads"),
    [
        ((2, 8, 9, 11), 3, 1, 1),
        ((2, 8, 9, 11), 5, 2, 2),
        ((1, 12, 6, 5), 7, 1, 3),
        ((1, 4, 3, 8), 1, 1, 4),
        ((3, 6, 4, 4), 9, 3, 2),
    ],
)
def test_matches_reference(shape, kernel_size, dilation, heads):
    q, k, v = qkv(shape, requires_grad=True)
    out = local_attention2d(q, k, v, kernel_size, dilation, heads)
    ref = reference(q, k, v, kernel_size, dilation, heads)
    assert_close(out, ref)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for g, r in zip(grads, ref_grads, strict=True):
        assert_close(g, r)


def test_matches_naive_loop():
    q, k, v = qkv((2, 4, 4, 5), seed=1)
    for dilation, heads in ((1, 2), (2, 1)):
        expected = naive_attention(q, k, v, 3, dilation, heads)
        assert_close(local_attention2d(q, k, v, 3, dilation, heads), expected)
        assert_close(reference(q, k, v, 3, dilation, heads), expected)


@pytest.mark.slow  # torch.compile
def test_compile_matches_eager():
    """``torch.compile(fullgraph=True, dynamic=True)`` traces the formula: its eager bits, two sizes."""
    kernel_size, dilation, heads = 3, 2, 2
    fn = lambda a, b, c: local_attention2d(a, b, c, kernel_size, dilation, heads, impl="torch")  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in ((2, 4, 7, 9), (1, 6, 12, 5)):
        q, k, v = qkv(shape, dtype=torch.float32, seed=shape[2])
        grad_out = torch.randn(shape)
        results = []
        for f in (fn, compiled):
            inputs = [x.clone().requires_grad_() for x in (q, k, v)]
            out = f(*inputs)
            results.append((out, *torch.autograd.grad(out, inputs, grad_out)))
        for a, e in zip(*results, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize(("kernel_size", "dilation", "heads"), [(3, 1, 2), (5, 2, 1), (7, 1, 4)])
def test_fast_path_matches_formula(kernel_size, dilation, heads):
    """``impl="auto"`` on CPU (the chunked path) against ``impl="torch"`` (the formula)."""
    q, k, v = qkv((2, 8, 11, 10), dtype=torch.float32, seed=12)
    grad_out = torch.randn(2, 8, 11, 10)
    results = []
    for impl in ("auto", "torch"):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = local_attention2d(*inputs, kernel_size, dilation, heads, impl=impl)
        results.append((out, *torch.autograd.grad(out, inputs, grad_out)))
    for a, e in zip(*results, strict=True):
        assert_close(a, e, scale=2.0)


def test_formula_gradcheck():
    q, k, v = qkv((1, 4, 3, 4), seed=13)
    fn = lambda a, b, c: local_attention2d(a, b, c, 3, 2, 2, impl="torch")  # noqa: E731
    assert gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("tile", [None, 1], ids=["default-blocks", "smallest-blocks"])
@pytest.mark.parametrize(("kernel_size", "dilation"), [(3, 1), (5, 1), (5, 2)])
def test_float32_matches_reference(monkeypatch, tile, kernel_size, dilation):
    """Forward and the three gradients in float32 against the float64 reference, with the
    default row blocks and with the smallest ones (2h rows; backward: even blocks, then odd)."""
    if tile is not None:
        monkeypatch.setattr(_local_attention_torch, "_TILE", tile)
    q, k, v = qkv((2, 8, 31, 13), dtype=torch.float32, seed=10, requires_grad=True)
    grad_out = torch.randn(2, 8, 31, 13)
    out = local_attention2d(q, k, v, kernel_size, dilation, 2)
    ref = reference(q, k, v, kernel_size, dilation, 2)
    assert_close(out, ref.float(), scale=4.0)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out.double())
    for got, want in zip(grads, ref_grads, strict=True):
        assert_close(got, want.float(), scale=4.0)


def test_threads_do_not_change_the_result(monkeypatch):
    """Parts depend on the shapes only: one thread or two give the same bits."""
    monkeypatch.setattr(_local_attention_torch, "_TILE", 30000)  # several parts
    q, k, v = qkv((2, 16, 45, 40), dtype=torch.float32, seed=11, requires_grad=True)
    grad_out = torch.randn(2, 16, 45, 40)

    def run():
        out = local_attention2d(q, k, v, 7, 1, 2)
        return (out, *torch.autograd.grad(out, (q, k, v), grad_out))

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        two = run()
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_tiles_match_one_tile(monkeypatch):
    q, k, v = qkv((3, 4, 7, 6), requires_grad=True)
    grad_out = torch.randn(3, 4, 7, 6, dtype=F64)

    def run():
        out = local_attention2d(q, k, v, 5, 1, 2)
        return (out, *torch.autograd.grad(out, (q, k, v), grad_out))

    expected = run()
    taps_row = 2 * 25 * 6
    for tile in (1, 2 * taps_row, 7 * taps_row * 2):  # row blocks, then batch blocks
        monkeypatch.setattr(_local_attention_torch, "_TILE", tile)
        for a, e in zip(run(), expected, strict=True):
            assert_close(a, e)


def test_border_taps_are_masked_not_zero_keys():
    q, k, v = qkv((1, 4, 7, 7), seed=2)
    v = v + 3.0  # values far from 0: a zero key's share pulls the output towards 0
    out = local_attention2d(q, k, v, 3, 1, 2)
    masked = reference(q, k, v, 3, 1, 2)
    zero_keys = zero_padded_attention(q, k, v, 3, 1, 2)
    assert_close(out, masked)
    # Interior pixels see no padding: both agree there and differ on every border pixel.
    assert_close(out[..., 1:-1, 1:-1], zero_keys[..., 1:-1, 1:-1])
    border = torch.ones(7, 7, dtype=torch.bool)
    border[1:-1, 1:-1] = False
    assert ((out - zero_keys).abs()[..., border] > 1e-3).all()


def test_window_covering_the_image_is_global_attention():
    q, k, v = qkv((2, 6, 3, 4), seed=3)
    out = local_attention2d(q, k, v, 7, 1, 3)  # every 7x7 window holds the whole 3x4 image
    flat = [x.reshape(2, 3, 2, 12).transpose(2, 3) for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*flat).transpose(2, 3).reshape(2, 6, 3, 4)
    assert_close(out, ref)


@pytest.mark.parametrize(("kernel_size", "dilation", "heads"), [(3, 1, 1), (5, 2, 2), (3, 1, 3)])
def test_gradcheck(kernel_size, dilation, heads):
    q, k, v = qkv((1, 6, 3, 4), seed=4)
    assert gradcheck(  # fast mode: a few random projections of the Jacobian, not all of it
        lambda a, b, c: local_attention2d(a, b, c, kernel_size, dilation, heads),
        (q, k, v),
        fast_mode=True,
    )


@pytest.mark.parametrize("which", [0, 1, 2])
def test_gradient_of_one_input_only(which):
    inputs = list(qkv((1, 4, 5, 6), seed=5))
    inputs[which].requires_grad_(True)
    out = local_attention2d(*inputs, 3, 1, 2)
    (grad,) = torch.autograd.grad(out.square().sum(), inputs[which])
    ref_inputs = [x.detach().requires_grad_(i == which) for i, x in enumerate(inputs)]
    ref = reference(*ref_inputs, 3, 1, 2)
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), ref_inputs[which])
    assert_close(grad, ref_grad)


@pytest.mark.parametrize("kernel_size", [1, 3, 7])
def test_one_pixel_image_returns_v(kernel_size):
    q, k, v = qkv((2, 4, 1, 1), dtype=torch.float32, requires_grad=True)
    out = local_attention2d(q, k, v, kernel_size, 2, 2)
    assert torch.equal(out, v)
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(gv, torch.ones_like(v))
    assert not gq.any() and not gk.any()


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "channel_slice"])
def test_non_contiguous_inputs(layout):
    q, k, v = qkv((2, 4, 6, 6), seed=6)
    expected = local_attention2d(q, k, v, 3, 1, 2)
    if layout == "channels_last":
        views = [x.to(memory_format=torch.channels_last) for x in (q, k, v)]
    elif layout == "transposed":
        views = [x.transpose(2, 3).contiguous().transpose(2, 3) for x in (q, k, v)]
    else:
        views = list(torch.cat([q, k, v], 1).chunk(3, 1))
    assert not any(x.is_contiguous() for x in views)
    assert_close(local_attention2d(*views, 3, 1, 2), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_and_float_dtypes(dtype):
    q, k, v = qkv((1, 4, 5, 7), seed=7)
    out = local_attention2d(q.to(dtype), k.to(dtype), v.to(dtype), 3, 1, 2)
    assert out.dtype == dtype
    ref = reference(*(x.to(dtype).double() for x in (q, k, v)), 3, 1, 2)
    assert_close(out, ref.to(dtype))


def test_mixed_dtypes_promote():
    q, k, v = qkv((1, 2, 3, 3), seed=8)
    out = local_attention2d(q.float(), k.half(), v.float(), 3)
    assert out.dtype == torch.float32
    assert_close(out, local_attention2d(q.float(), k.half().float(), v.float(), 3))


@pytest.mark.parametrize("shape", [(0, 4, 5, 5), (2, 4, 0, 3), (1, 0, 2, 2)])
def test_empty_inputs(shape):
    q, k, v = qkv(shape, requires_grad=True)
    out = local_attention2d(q, k, v, 3, 1, 2 if shape[1] else 1)
    assert out.shape == shape
    grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
    assert all(g is None or g.shape == shape for g in grads)


def test_key_shift_invariance():
    """Adding one vector to every key shifts a query's logits equally: the softmax is unchanged."""
    q, k, v = qkv((1, 4, 6, 5), seed=9)
    shift = torch.randn(1, 4, 1, 1, dtype=F64)
    assert_close(local_attention2d(q, k + shift, v, 5, 1, 2), local_attention2d(q, k, v, 5, 1, 2))


@settings(max_examples=20, deadline=None)
@given(
    b=st.integers(1, 2),
    heads=st.integers(1, 3),
    depth=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    half=st.integers(0, 3),
    dilation=st.integers(1, 3),
)
def test_random_shapes_match_reference(b, heads, depth, h, w, half, dilation):
    q, k, v = qkv((b, heads * depth, h, w), seed=h * 7 + w)
    ks = 2 * half + 1
    assert_close(
        local_attention2d(q, k, v, ks, dilation, heads),
        reference(q, k, v, ks, dilation, heads),
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kernel_size": 4}, ValueError, "kernel_size must be odd"),
        ({"kernel_size": 0}, ValueError, "kernel_size must be >= 1"),
        ({"kernel_size": 3.0}, TypeError, "kernel_size must be int"),
        ({"dilation": 0}, ValueError, "dilation must be >= 1"),
        ({"num_heads": 3}, ValueError, "num_heads must divide the channels C = 4"),
        ({"num_heads": 0}, ValueError, "num_heads must be >= 1"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    q, k, v = qkv((1, 4, 5, 5))
    args = {"kernel_size": 3, **kwargs}
    with pytest.raises(error, match=match):
        local_attention2d(q, k, v, **args)


def test_bad_tensors():
    q, k, v = qkv((1, 4, 5, 5))
    with pytest.raises(ValueError, match=r"q and v must have the same shape, got \(1, 4, 5, 5\)"):
        local_attention2d(q, k, v[..., :4], 3)
    with pytest.raises(ValueError, match=r"q must have shape \(B, C, H, W\), got \(4, 5, 5\)"):
        local_attention2d(q[0], k[0], v[0], 3)


def test_windows_past_the_image_equal_smaller_ones():
    # Taps beyond the image are masked: a huge window (or dilation) is the whole image.
    q, k, v = torch.randn(3, 1, 4, 5, 3).unbind(0)
    whole = local_attention2d(q, k, v, kernel_size=9)
    assert torch.equal(local_attention2d(q, k, v, kernel_size=10**9 + 1), whole)
    centre = local_attention2d(q, k, v, kernel_size=3, dilation=10**9)
    assert torch.equal(centre, v)  # only the centre tap is inside: attention to itself
