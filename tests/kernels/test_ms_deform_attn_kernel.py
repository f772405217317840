"""Triton multi-scale deformable attention against the torch formula (``grid_sample``).

The reference is `ms_deform_attn` with ``impl="torch"`` in float64 on CPU, whose formula is
mmcv's ``multi_scale_deformable_attn_pytorch`` (checked in tests/ops/test_ms_deform_attn.py).
On CPU the kernels run in triton's interpreter (``TRITON_INTERPRET=1``), which is slow:
sizes stay tiny.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close
from visionblocks.ops.ms_deform_attn import ms_deform_attn

pytestmark = pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)

# Non-square levels, a 1 x 1 level and a one-row level.
SHAPES = [(4, 5), (1, 1), (2, 3), (1, 4)]


def inputs(shapes, b=2, q=5, heads=2, c=4, points=2, seed=0, spread=0.3):
    """Float64 inputs on CPU; locations up to ``spread`` outside ``[0, 1]``."""
    gen = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in shapes)
    value = torch.randn(b, keys, heads, c, generator=gen, dtype=torch.float64)
    loc = torch.rand(b, q, heads, len(shapes), points, 2, generator=gen, dtype=torch.float64)
    loc = loc * (1 + 2 * spread) - spread
    weights = torch.rand(b, q, heads, len(shapes), points, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(b, q, heads * c, generator=gen, dtype=torch.float64)
    return value, loc, weights, grad_out


def run(impl, shapes, value, loc, weights, grad_out, dtype, device, needs=(True, True, True)):
    """Output and the gradients of value, locations and weights (None where not needed)."""
    leaves = [
        x.to(device, dtype).requires_grad_(need) for x, need in zip((value, loc, weights), needs)
    ]
    sizes = torch.tensor(shapes, device=device) if impl == "triton" else shapes
    out = ms_deform_attn(leaves[0], sizes, leaves[1], leaves[2], impl=impl)
    wanted = [x for x in leaves if x.requires_grad]
    grads = iter(torch.autograd.grad(out, wanted, grad_out.to(device, out.dtype)))
    return [out, *(next(grads) if x.requires_grad else None for x in leaves)]


def expected(shapes, value, loc, weights, grad_out, dtype, needs=(True, True, True)):
    """The float64 formula on the inputs as rounded to ``dtype``."""
    rounded = [x.to(dtype).double() for x in (value, loc, weights)]
    return run("torch", shapes, *rounded, grad_out, torch.float64, "cpu", needs)


def check(actual, want, dtype, scale=1.0):
    for name, a, e in zip(("out", "grad_value", "grad_loc", "grad_weights"), actual, want):
        assert (a is None) == (e is None), name
        if a is not None:
            assert a.dtype == dtype, name
            assert_close(a.cpu().double(), e, dtype=dtype, scale=scale, msg=f"{name} differs")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_kernel_matches_formula_forward_and_gradients(dtype, device):
    args = inputs(SHAPES, seed=1)
    actual = run("triton", SHAPES, *args, dtype, device)
    check(actual, expected(SHAPES, *args, dtype), dtype, scale=4.0)


def test_wide_heads_loop_over_channel_blocks(device):
    """C = 100: two blocks of 64 channels in the forward and grad_value, a loop of blocks
    in the per-sample reductions."""
    shapes = [(3, 4), (1, 1)]
    args = inputs(shapes, b=1, q=3, heads=1, c=100, seed=2)
    actual = run("triton", shapes, *args, torch.float32, device)
    check(actual, expected(shapes, *args, torch.float32), torch.float32, scale=4.0)


def test_locations_on_borders_and_pixel_centres_take_grid_samples_side(device):
    """Locations exactly on 0 and 1, on pixel centres (integer pixel coordinates: the
    gradient is the floor side's, as grid_sample's), at pixel -1 and at W, where a corner
    enters or leaves the map; computed in float64, where both sides form the same pixel."""
    shapes = [(4, 8), (1, 2), (2, 1)]
    value, _, weights, grad_out = inputs(shapes, b=1, q=8, heads=1, c=3, points=3, seed=3)
    edges = torch.tensor([0.0, 1.0, 0.5, 0.0625, 0.5 + 1 / 16, -1 / 16, 17 / 16, 1.25])
    xy = torch.stack(torch.meshgrid(edges, edges.flip(0), indexing="ij"), -1).reshape(-1, 2)
    loc = xy[torch.arange(8 * 3 * 3) % len(xy)].reshape(1, 8, 1, 3, 3, 2).double()
    args = (value, loc, weights, grad_out)
    actual = run("triton", shapes, *args, torch.float64, device)
    check(actual, expected(shapes, *args, torch.float64), torch.float64)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, True), (False, False, True)])
def test_only_the_gradients_asked_for(needs, device):
    args = inputs(SHAPES[:2], b=1, q=4, seed=4)
    actual = run("triton", SHAPES[:2], *args, torch.float32, device, needs)
    check(actual, expected(SHAPES[:2], *args, torch.float32, needs), torch.float32, scale=4.0)


def test_grad_value_is_bitwise_reproducible(device):
    """Many samples share corners (locations on a coarse grid): grad_value sums them in
    the order of the sorted buckets, identically on every run."""
    shapes = [(3, 3), (2, 2)]
    value, loc, weights, grad_out = inputs(shapes, b=1, q=12, heads=2, c=4, points=3, seed=5)
    loc = (loc * 4).round() / 4 + 0.01
    first = run("triton", shapes, value, loc, weights, grad_out, torch.float32, device)
    second = run("triton", shapes, value, loc, weights, grad_out, torch.float32, device)
    assert torch.equal(first[1], second[1])
    check(first, expected(shapes, value, loc, weights, grad_out, torch.float32), torch.float32, 4.0)


def test_empty_queries(device):
    value, loc, weights, grad_out = inputs(SHAPES, b=1, q=0)
    out, grad_value, grad_loc, grad_weights = run(
        "triton", SHAPES, value, loc, weights, grad_out, torch.float32, device
    )
    assert out.shape == (1, 0, 8)
    assert grad_value.shape == value.shape and not grad_value.any()
    assert grad_loc.shape == loc.shape and grad_weights.shape == weights.shape


def test_launch_limits_fall_back_to_the_formula():
    """Past int32 indexing the entry raises `LaunchLimitError` (the op runs the formula)."""
    from visionblocks.kernels._launch import LaunchLimitError
    from visionblocks.kernels.ms_deform_attn import _check_limits

    value = torch.empty(1, 2**16, 8, 2**12, device="meta")  # 2**31 elements
    with pytest.raises(LaunchLimitError, match="value has 2147483648 elements"):
        _check_limits(value, torch.empty(1, 4, 8, 1, 1, device="meta"))
    _check_limits(value[..., :1], torch.empty(1, 4, 8, 1, 1, device="meta"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_backward_memory_carries_no_channel_times_samples_term():
    """Forward + backward allocate less than the samples times the channels, which the
    formula's grid_sample keeps (at C = 64: 1 x 4096 queries x 8 heads x 4 x 4 samples)."""
    shapes = [(64, 64), (32, 32), (16, 16), (8, 8)]
    value, loc, weights, grad_out = inputs(shapes, b=1, q=4096, heads=8, c=64, points=4)
    value, loc, weights = (x.float().cuda().requires_grad_() for x in (value, loc, weights))
    sizes = torch.tensor(shapes, device="cuda")
    grad_out = grad_out.float().cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = ms_deform_attn(value, sizes, loc, weights, impl="triton")
    torch.autograd.grad(out, (value, loc, weights), grad_out)
    peak = torch.cuda.max_memory_allocated() - base
    samples = weights.numel()
    assert peak < samples * 64 * 4  # one float32 copy of the sampled values
    # Bit for bit the same gradient of value on a second run.
    first = torch.autograd.grad(
        ms_deform_attn(value, sizes, loc, weights, impl="triton"), value, grad_out
    )
    second = torch.autograd.grad(
        ms_deform_attn(value, sizes, loc, weights, impl="triton"), value, grad_out
    )
    assert torch.equal(first[0], second[0])
