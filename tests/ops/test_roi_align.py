"""The RoI pooling family against torchvision: values, gradients, MultiScaleRoIAlign (both
merges), compile, no host reads on fake CUDA tensors, errors the conformance specs do not
word. The Triton backward: tests/kernels/test_roi_align_kernel.py."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.ops as tv
from torch._subclasses.fake_tensor import FakeTensorMode

from visionblocks.ops import MultiScaleRoIAlign, ps_roi_align, ps_roi_pool, roi_align, roi_pool
from visionblocks.ops.roi_align import _level_scale, _rois

OPS = {
    "roi_align": (roi_align, tv.roi_align, (3, 0.5, -1, False)),
    "roi_align_aligned": (roi_align, tv.roi_align, ((2, 3), 0.5, 2, True)),
    "ps_roi_align": (ps_roi_align, tv.ps_roi_align, (2, 0.5, -1)),
    "roi_pool": (roi_pool, tv.roi_pool, ((3, 2), 0.5)),
    "ps_roi_pool": (ps_roi_pool, tv.ps_roi_pool, (2, 0.5)),
}


def make_rois(k=9, n=2, size=40.0, dtype=torch.float32, seed=0):
    """Boxes of many sizes, some past the borders, one degenerate, one per image at least."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=gen, dtype=torch.float64) * size - 4
    wh = torch.rand(k, 2, generator=gen, dtype=torch.float64) * size / 2
    wh[0] = 0.0
    index = torch.arange(k, dtype=torch.float64)[:, None] % n
    return torch.cat([index, xy, xy + wh], 1).to(dtype)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_torchvision(name, dtype):
    ours, theirs, args = OPS[name]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 13, 17, generator=gen, dtype=dtype)
    rois = make_rois(dtype=dtype)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, ref = ours(a, rois, *args), theirs(b, rois, *args)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    grad = torch.randn(ref.shape, generator=gen, dtype=dtype)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["roi_align", "ps_roi_pool"])
def test_box_lists_and_integer_boxes(name):
    ours, theirs, args = OPS[name]
    x = torch.randn(2, 8, 13, 17)
    boxes = [torch.tensor([[1.0, 2, 9, 8], [0, 0, 4, 4]]), torch.tensor([[3.0, 1, 12, 11]])]
    ref = theirs(x, boxes, *args)
    torch.testing.assert_close(ours(x, boxes, *args), ref, rtol=0, atol=0)
    torch.testing.assert_close(ours(x, [b.int() for b in boxes], *args), ref, rtol=0, atol=0)
    assert ours(x, [], *args).shape == (0, *ref.shape[1:])


@pytest.mark.parametrize("name", ["roi_align", "roi_pool"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(name, dtype):
    ours, theirs, args = OPS[name]
    x = torch.randn(2, 8, 13, 17).to(dtype)
    x.requires_grad_(True)
    out = ours(x, make_rois(), *args)
    assert out.dtype == dtype
    ref = theirs(x.detach().float(), make_rois(), *args)
    torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)
    out.float().sum().backward()
    assert x.grad.dtype == dtype


def test_aligned_is_our_box_convention():
    """aligned=True reads pixel i at box coordinate i + 0.5: the box [1, 3) over a ramp
    (pixel i holds i), two samples per bin, averages pixels 1 and 2; aligned=False reads
    half a pixel further right."""
    x = torch.arange(10.0).view(1, 1, 1, 10).expand(1, 1, 4, 10).contiguous()
    rois = torch.tensor([[0.0, 1.0, 0.0, 3.0, 4.0]])
    assert roi_align(x, rois, 1, 1.0, 2, True).item() == 1.5
    assert roi_align(x, rois, 1, 1.0, 2, False).item() == 2.0


@pytest.mark.parametrize("name", ["roi_align", "ps_roi_align", "roi_pool", "ps_roi_pool"])
def test_gradcheck_float64(name):
    ours, _, args = OPS[name]
    x = torch.rand(1, 8, 6, 7, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0.0, 0.6, 0.7, 8.3, 7.9], [0.0, 2.2, 1.3, 5.1, 9.4]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: ours(t, rois, *args), (x,))


def _features(n=2, c=5, base=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.rand(n, c, base >> i, base >> i, generator=gen)
        for i, name in enumerate(["p2", "p3", "p4", "p5", "pool"])
    }


def _boxes(seed=0):
    """Boxes from 4 to 1300 pixels: every FPN level gets some."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in (25, 9):
        size = torch.logspace(math.log10(8), math.log10(900), k)[torch.randperm(k, generator=gen)]
        size = size[:, None]
        xy = torch.rand(k, 2, generator=gen) * 200
        out.append(torch.cat([xy, xy + size * torch.rand(k, 2, generator=gen).add(0.5)], 1))
    return out


@pytest.mark.parametrize(
    ("names", "output_size", "sampling_ratio"),
    [(["p2", "p3", "p4", "p5"], 7, 2), (["p2", "p4"], (3, 5), -1), (["p3"], 4, 2)],
)
def test_multiscale_equals_torchvision_both_merges(names, output_size, sampling_ratio):
    x, boxes, shapes = _features(), _boxes(), [(256, 256), (250, 240)]
    ref_pool = tv.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    ours = MultiScaleRoIAlign(names, output_size, sampling_ratio)
    ref = ref_pool(x, boxes, shapes)
    torch.testing.assert_close(ours(x, boxes, shapes), ref, rtol=0, atol=0)
    if len(names) > 1:  # the sync-free merge (CUDA, tracing) gives the same values
        features = [v for k, v in x.items() if k in names]
        scales = [_level_scale(f, (256, 256)) for f in features]
        rois = _rois(features[0], boxes, torch.float32)
        k_min, k_max = round(-math.log2(scales[0])), round(-math.log2(scales[-1]))
        levels = ours._levels(rois[:, 1:], k_min, k_max)
        assert levels.unique().numel() >= len(names)  # every level is exercised
        torch.testing.assert_close(
            ours._merge_masked(features, scales, rois, levels), ref, rtol=0, atol=0
        )
        mapper = ref_pool.map_levels
        torch.testing.assert_close(levels, mapper(boxes))


def test_multiscale_gradients_equal_torchvision():
    names = ["p2", "p3", "p4"]
    x, boxes, shapes = _features(), _boxes(1), [(256, 256), (256, 256)]
    grads = []
    for pool in (tv.MultiScaleRoIAlign(names, 3, 2), MultiScaleRoIAlign(names, 3, 2)):
        feats = {k: v.clone().requires_grad_(True) for k, v in x.items()}
        pool(feats, boxes, shapes).square().sum().backward()
        grads.append([feats[n].grad for n in names])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_multiscale_options_and_errors():
    pool = MultiScaleRoIAlign(["a"], [4, 6], 2, canonical_scale=112, canonical_level=3)
    assert pool.output_size == (4, 6)
    assert "featmap_names=['a']" in repr(pool)
    with pytest.raises(ValueError, match="image_shapes"):
        pool({"a": torch.rand(1, 2, 8, 8)}, [torch.zeros(0, 4)], [])
    with pytest.raises(ValueError, match="none of featmap_names"):
        pool({"b": torch.rand(1, 2, 8, 8)}, [torch.zeros(0, 4)], [(8, 8)])
    with pytest.raises(TypeError, match="featmap_names"):
        MultiScaleRoIAlign("a", 4, 2)
    with pytest.raises(TypeError, match="sampling_ratio"):
        MultiScaleRoIAlign(["a"], 4, 2.0)


@pytest.mark.parametrize("name", list(OPS))
def test_compiles_fullgraph(name):
    ours, _, args = OPS[name]
    x, rois = torch.randn(2, 8, 13, 17), make_rois()
    compiled = torch.compile(lambda a, b: ours(a, b, *args), fullgraph=True)
    torch.testing.assert_close(compiled(x, rois), ours(x, rois, *args), equal_nan=True)


def test_multiscale_compiles_fullgraph():
    pool = MultiScaleRoIAlign(["p2", "p3", "p4"], 3, 2)
    x, boxes, shapes = _features(), _boxes(), [(256, 256), (250, 240)]
    compiled = torch.compile(pool, fullgraph=True)
    torch.testing.assert_close(compiled(x, boxes, shapes), pool(x, boxes, shapes))


def test_fake_cuda_reads_nothing():
    """On fake CUDA tensors (no data) every op and the multi-scale merge trace to shapes."""
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        x = mode.from_tensor(torch.empty(2, 8, 13, 17, device="meta")).to("cuda")
        rois = torch.zeros(4, 5, device="cuda")
        for name, (ours, _, args) in OPS.items():
            out = ours(x, rois, *args)
            assert out.device.type == "cuda", name
        feats = {k: torch.empty(2, 5, s, s, device="cuda") for k, s in (("a", 32), ("b", 16))}
        boxes = [torch.zeros(3, 4, device="cuda"), torch.zeros(2, 4, device="cuda")]
        out = MultiScaleRoIAlign(["a", "b"], 3, 2)(feats, boxes, [(128, 128)] * 2)
        assert out.shape == (5, 5, 3, 3)


def test_errors_name_the_argument():
    x = torch.randn(2, 8, 5, 5)
    with pytest.raises(
        ValueError, match=r"boxes\[:, 0\] must hold batch indices of input, in \[0, 1\]"
    ):
        roi_align(x, torch.tensor([[2.0, 0, 0, 1, 1]]), 2)
    with pytest.raises(ValueError, match="multiple of output_size"):
        ps_roi_align(x, torch.tensor([[0.0, 0, 0, 1, 1]]), 3)
    with pytest.raises(ValueError, match=r"boxes\[1\] must be a Tensor\[L, 4\]"):
        roi_pool(x, [torch.zeros(1, 4), torch.zeros(1, 5)], 2)
    with pytest.raises(ValueError, match="3 tensors but input has 2 images"):
        roi_pool(x, [torch.zeros(1, 4)] * 3, 2)
    with pytest.raises(TypeError, match="aligned"):
        roi_align(x, torch.zeros(1, 5), 2, aligned=1)
    with pytest.raises(TypeError, match="output_size"):
        roi_align(x, torch.zeros(1, 5), 2.0)
    with pytest.raises(ValueError, match="spatial_scale"):
        roi_align(x, torch.zeros(1, 5), 2, 0.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("boxes", ["tensor", "list", "many"])
def test_non_finite_boxes_are_refused_on_cpu(value, boxes):
    """torchvision's CPU kernel crashes on a NaN coordinate (and sizes its sampling grid from
    an infinite one): every path refuses them, naming the argument and the row."""
    x = torch.randn(2, 8, 5, 5)
    row = [0.0, 1.0, value, 4.0, 4.0]
    rois = {
        "tensor": torch.tensor([row]),
        "list": [torch.tensor([row[1:]])],
        "many": torch.tensor([[1.0, 0.0, 0.0, 2.0, 2.0]] * 80 + [row]),  # the reduction path
    }[boxes]
    for fn, args in ((roi_align, (2, 1.0, 2)), (roi_pool, (2,)), (ps_roi_pool, (2,))):
        with pytest.raises(ValueError, match=r"boxes must hold finite values, got \[\[0\.0, 1\.0"):
            fn(x, rois, *args)


def test_modules_equal_torchvision_modules():
    """RoIAlign, RoIPool, PSRoIAlign and PSRoIPool take torchvision's constructor arguments
    in its order and give its values; bad options fail when the module is built."""
    from visionblocks.ops import PSRoIAlign, PSRoIPool, RoIAlign, RoIPool

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 8, 12, 14, generator=g)
    boxes = [torch.tensor([[1.0, 2.0, 9.0, 11.0]]), torch.tensor([[0.0, 0.0, 13.0, 5.0]] * 2)]
    pairs = [
        (RoIAlign((2, 3), 0.5, 2, True), tv.RoIAlign((2, 3), 0.5, 2, True)),
        (RoIAlign(3, 1.0, -1), tv.RoIAlign(3, 1.0, -1)),
        (RoIPool(2, 0.5), tv.RoIPool(2, 0.5)),
        (PSRoIAlign(2, 0.5, 2), tv.PSRoIAlign(2, 0.5, 2)),
        (PSRoIPool(2, 1.0), tv.PSRoIPool(2, 1.0)),
    ]
    for ours, theirs in pairs:
        assert torch.equal(ours(x, boxes), theirs(x, boxes)), ours
    assert repr(pairs[0][0]) == (
        "RoIAlign(output_size=(2, 3), spatial_scale=0.5, sampling_ratio=2, aligned=True)"
    )
    with pytest.raises(ValueError, match="spatial_scale"):
        RoIPool(2, 0.0)
    with pytest.raises(TypeError, match="aligned"):
        RoIAlign(2, 1.0, 2, aligned=1)
    with pytest.raises(TypeError, match="output_size"):
        PSRoIPool(2.5, 1.0)
