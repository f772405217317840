"""The RoI pooling family against torchvision: values, gradients, MultiScaleRoIAlign (both
merges), compile, no host reads on fake CUDA tensors, errors the conformance specs do not
word. The Triton backward: tests/kernels/test_roi_align_kernel.py."""

from __future__ import annotations

import importlib
import math
import re

import pytest
import torch
import torchvision.ops as tv
from torch._subclasses.fake_tensor import FakeTensorMode

from visionblocks.ops import MultiScaleRoIAlign, ps_roi_align, ps_roi_pool, roi_align, roi_pool
from visionblocks.ops.multiscale_roi_align import _level_scale
from visionblocks.ops.roi_align import _rois

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
    [(["p2", "p3", "p4", "p5"], 7, 2), (["p3", "p4"], (3, 5), -1), (["p3"], 4, 2)],
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


def test_multiscale_takes_the_levels_finest_first_whatever_the_dict_order():
    """torchvision takes the levels in ``x``'s order: a coarse level listed first gives every
    box a level index below 0, clamped away, and all zeros. Here the result is the same
    whatever the order, bitwise torchvision's in the usual (finest first) order."""
    x, boxes, shapes = _features(), _boxes(), [(256, 256), (250, 240)]
    names = ["p2", "p3", "p4"]
    finest_first = {k: x[k] for k in names}
    coarse_first = {k: x[k] for k in reversed(names)}
    ref = tv.MultiScaleRoIAlign(names, 3, 2)(finest_first, boxes, shapes)
    assert not tv.MultiScaleRoIAlign(names, 3, 2)(coarse_first, boxes, shapes).any()
    for order in (names, names[::-1]):  # featmap_names' order does not matter either
        pool = MultiScaleRoIAlign(order, 3, 2)
        for feats in (finest_first, coarse_first):
            assert torch.equal(pool(feats, boxes, shapes), ref)
            torch.testing.assert_close(  # the sync-free merge (CUDA, tracing)
                torch.compile(pool, fullgraph=True)(feats, boxes, shapes), ref
            )


def test_multiscale_refuses_levels_that_skip_a_stride():
    """The level mapping indexes the levels from the finest by ``log2(stride)``: with a
    stride missing (p2, p4) torchvision pools p3-sized boxes from p4 and returns zeros for
    p4-sized ones. Refused, naming the strides."""
    x, boxes, shapes = _features(), _boxes(), [(256, 256), (256, 256)]
    ref = tv.MultiScaleRoIAlign(["p2", "p4"], 3, 2)(x, boxes, shapes)
    assert (ref.flatten(1).abs().sum(1) == 0).any()  # the silent zeros
    for names in (["p2", "p4"], ["p2", "p3", "p5"]):
        with pytest.raises(ValueError, match=r"strides double .* got strides \{'p2': 4\.0"):
            MultiScaleRoIAlign(names, 3, 2)(x, boxes, shapes)
    with pytest.raises(ValueError, match=r"got strides \{'a': 4\.0, 'b': 4\.0\}"):  # twice
        MultiScaleRoIAlign(["a", "b"], 3, 2)({"a": x["p2"], "b": x["p2"]}, boxes, shapes)


def test_multiscale_checks_image_shapes_and_levels():
    pool = MultiScaleRoIAlign(["p2", "p3"], 3, 2)
    x, boxes = {k: v[:1] for k, v in _features().items()}, [torch.tensor([[0.0, 0, 100, 100]])]
    for shapes in ([(0, 0)], [(-256, 256)], "256", 256, [(256.0, 256)], [(256,)], [(256, 256)] * 2,
                   [(True, 256)], None):  # fmt: skip
        with pytest.raises(
            ValueError,
            match=r"image_shapes must be a list of \(height, width\) pairs of ints >= 1, one "
            r"per image of x \(1\), got ",
        ):
            pool(x, boxes, shapes)
    assert pool(x, boxes, (torch.Size([256, 240]),)).shape == (1, 5, 3, 3)
    for bad, shape in ((x["p3"][:, :4], "(1, 4, 32, 32)"), (torch.cat([x["p3"]] * 2), "(2, 5")):
        with pytest.raises(
            ValueError,
            match=r"same N and C on one device, got x\['p3'\] of shape " + re.escape(shape),
        ):
            pool({"p2": x["p2"], "p3": bad}, boxes, [(256, 256)])
    for empty in (x["p3"][:, :, :0], x["p3"][..., :0]):  # an empty map crashes torchvision
        with pytest.raises(ValueError, match=r"x\['p3'\] must have shape \(N, C, H, W\) with H"):
            pool({"p2": x["p2"], "p3": empty}, boxes, [(256, 256)])


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
        ValueError, match=r"boxes\[:, 0\] must hold integer batch indices of input, in \[0, 1\]"
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


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape", [(1, 4, 0, 5), (1, 4, 5, 0), (1, 4, 0, 0)])
@pytest.mark.parametrize("k", [1, 0])
def test_empty_feature_maps_are_refused(name, shape, k):
    """torchvision's kernels crash the process (or read out of bounds) on ``H`` or ``W`` 0:
    refused by shape before any kernel, with or without boxes (as `rotated_roi_align`)."""
    ours, _, args = OPS[name]
    rois = torch.tensor([[0.0, 0, 0, 2, 2]])[:k]
    for boxes in (rois, [rois[:, 1:]]):
        with pytest.raises(
            ValueError,
            match=r"input must have shape \(N, C, H, W\) with H, W >= 1, got "
            + re.escape(str(shape)),
        ):
            ours(torch.zeros(shape), boxes, *args)


@pytest.mark.parametrize("many", [False, True], ids=["list_read", "reduction"])
def test_fractional_batch_indices_are_refused_on_cpu(many):
    """torchvision truncates a batch index of 0.99 to image 0: refused by every op, in the
    value check's existing read (a few boxes: the list; many: the reductions)."""
    x = torch.randn(2, 4, 5, 5)
    head = [[1.0, 0.0, 0.0, 2.0, 2.0]] * (80 if many else 0)
    for index in (0.99, 1.5, -0.5):
        rois = torch.tensor([*head, [index, 0.0, 0.0, 2.0, 2.0]])
        for ours, _, args in OPS.values():
            with pytest.raises(
                ValueError,
                match=rf"boxes\[:, 0\] must hold integer batch indices of input, in \[0, 1\], "
                rf"got \[{index}",
            ):
                ours(x, rois, *args)
    assert torch.equal(roi_align(x, torch.tensor([*head, [1.0, 0, 0, 2, 2]]), 1)[-1:],
                       roi_align(x[1:], torch.tensor([[0.0, 0, 0, 2, 2]]), 1))  # fmt: skip


@pytest.mark.parametrize("many", [False, True], ids=["list_read", "reduction"])
def test_adaptive_sampling_is_capped_like_sampling_ratio(many):
    """``sampling_ratio <= 0`` takes ``ceil(side * spatial_scale / bins)`` samples per bin
    side: a huge finite box made torchvision size a table past ``std::vector``'s limit (or
    past memory). Capped at 1024, as ``sampling_ratio``, naming both arguments."""
    x = torch.zeros(1, 4, 4, 4)
    head = [[0.0, 0.0, 0.0, 2.0, 2.0]] * (80 if many else 0)
    for row in ([0.0, 0.0, 0.0, 1e9, 1e9], [0.0, 5.0, 0.0, 5.0 + 2 * 1024 + 1, 3.0]):
        with pytest.raises(
            ValueError, match=r"boxes up to .* take more than 1024 samples per bin side with "
            r"sampling_ratio <= 0",
        ):  # fmt: skip
            roi_align(x, torch.tensor([*head, row]), (3, 2), 1.0, -1)
        assert roi_align(x, torch.tensor([*head, row]), (3, 2), 1.0, 2).shape[-2:] == (3, 2)
    for ours, args in ((roi_align, (1.0, 0, True)), (ps_roi_align, (1.0, -1))):
        with pytest.raises(ValueError, match="sampling_ratio in \\[1, 1024\\]"):
            ours(x, [torch.tensor([[0.0, 0.0, 1e9, 1e9]])], 2, *args)
    edge = torch.tensor([*head, [0.0, 0.0, 0.0, 2048.0, 1.0]])  # 1024 per side: allowed
    torch.testing.assert_close(
        roi_align(x + 1, edge, (1, 2), 1.0, -1), tv.roi_align(x + 1, edge, (1, 2), 1.0, -1)
    )
    with pytest.raises(ValueError, match="at most 28672 wide"):  # the finest level, 1 / 4
        MultiScaleRoIAlign(["p2", "p3"], 7, -1)(
            _features(1), [torch.tensor([[0.0, 0.0, 1e9, 1e9]])], [(256, 256)]
        )


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


# The CPU gather backward (visionblocks.ops._roi_align_gather): roi_align, sampling_ratio > 0.

ROI_MODULE = importlib.import_module("visionblocks.ops.roi_align")
ALWAYS = {"one thread": 0, "threads": 0}  # every roi_align call with sr > 0 gathers


def _edge_rois(dtype):
    """Boxes on both images: inside, past every border, fully outside (left, below), smaller
    than a pixel, degenerate, and two that overlap (pixels read by several samples)."""
    boxes = [
        [0, 1.0, 2.0, 9.0, 8.0],
        [1, -6.0, -3.0, 5.0, 4.0],
        [1, 10.0, 7.0, 40.0, 31.0],
        [0, -30.0, 2.0, -12.0, 9.0],
        [1, 3.0, 35.0, 9.0, 50.0],
        [0, 4.3, 5.1, 4.6, 5.3],
        [1, 7.2, 2.2, 7.2, 2.2],
        [0, 0.0, 0.0, 33.0, 25.0],
        [0, 2.5, 1.5, 30.0, 20.0],
    ]
    return torch.tensor(boxes, dtype=dtype)


def _close(got, want, dtype):
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    scale = want.abs().max().item() or 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("forward", [False, True], ids=["tv_forward", "gather_forward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize(("size", "sr"), [((3, 4), 2), (2, 1), ((5, 3), 3)])
def test_gather_equals_torchvision(dtype, aligned, size, sr, forward, monkeypatch):
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", ALWAYS)
    if forward:
        monkeypatch.setattr(ROI_MODULE, "_GATHER_FORWARD_MIN_WORK", ALWAYS)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 13, 17, generator=gen, dtype=dtype)
    rois = _edge_rois(dtype)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = roi_align(a, rois, size, 0.5, sr, aligned)
    ref = tv.roi_align(b, rois, size, 0.5, sr, aligned)
    assert type(out.grad_fn).__name__ == "_RoIAlignBackward"  # the gather, not torchvision's
    if forward:  # the samples added in another order: equal to rounding, not bitwise
        _close(out, ref, dtype)
        assert not torch.equal(out, ref) or dtype == torch.float64
        with torch.no_grad():  # without a gradient: torchvision's forward, bitwise
            torch.testing.assert_close(
                roi_align(x, rois, size, 0.5, sr, aligned), ref.detach(), rtol=0, atol=0
            )
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=0)  # torchvision's forward
    grad = torch.randn(ref.shape, generator=gen, dtype=dtype)
    out.backward(grad)
    ref.backward(grad)
    _close(a.grad, b.grad, dtype)


def test_gather_takes_no_boxes(monkeypatch):
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", ALWAYS)
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    out = roi_align(x, torch.zeros(0, 5), (2, 3), 1.0, 2)
    assert out.shape == (0, 4, 2, 3)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("aligned", [False, True])
def test_gather_gradcheck_float64(aligned):
    from visionblocks.ops._roi_align_gather import roi_align_gather

    x = torch.rand(2, 3, 6, 7, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor(
        [[0.0, 0.6, 0.7, 8.3, 7.9], [1.0, 2.2, 1.3, 5.1, 9.4], [0.0, 3.1, 3.2, 3.4, 3.3]],
        dtype=torch.float64,
    )
    assert torch.autograd.gradcheck(
        lambda t: roi_align_gather(t, rois, 0.7, 2, 3, 2, aligned), (x,)
    )


def test_gather_backward_is_bitwise_repeatable(monkeypatch):
    """Many overlapping boxes: each pixel's gradient adds dozens of terms, in a fixed order
    (stable sort), also under deterministic algorithms and on 2 threads."""
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", ALWAYS)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 20, 24, generator=gen)
    xy = torch.rand(200, 2, generator=gen) * 10
    rois = torch.cat([(torch.arange(200) % 2)[:, None].float(), xy, xy + 12], 1)
    grad = torch.randn(200, 16, 7, 7, generator=gen)
    threads = torch.get_num_threads()
    grads = []
    try:
        for n, deterministic in ((1, False), (2, False), (2, True)):
            torch.set_num_threads(n)
            with DeterministicAlgorithms(deterministic):
                a = x.clone().requires_grad_(True)
                roi_align(a, rois, 7, 1.0, 2).backward(grad)
                grads.append(a.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


class DeterministicAlgorithms:
    def __init__(self, on):
        self.on, self.before = on, torch.are_deterministic_algorithms_enabled()

    def __enter__(self):
        torch.use_deterministic_algorithms(self.on)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.before)


@pytest.fixture
def threads():
    """Sets torch's intra-op threads for the test; restores them after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_dispatch_gathers_from_the_threshold(monkeypatch, threads):
    """The rule is K * C * PH * PW * sr**2 against the threshold of the pass and thread
    count: gathers at it, torchvision's kernel below it and for sampling_ratio <= 0; impl
    "torch" is this path too, "triton" is not."""
    import visionblocks.ops._roi_align_gather as gather

    calls = []
    real = gather.roi_align_gather

    def counted(*args, **kwargs):
        calls.append(args[1].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gather, "roi_align_gather", counted)
    work = 3 * 4 * 2 * 3 * 2 * 2  # K=3, C=4, 2x3 bins, sr=2
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", {"one thread": work, "threads": 2 * work})
    x = torch.randn(1, 4, 9, 9)
    rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 7.0]] * 6)
    leaf = x.clone().requires_grad_(True)
    threads(1)
    out = roi_align(leaf, rois[:3], (2, 3), 1.0, 2)  # at the threshold
    out.sum().backward()
    roi_align(leaf, rois[:2], (2, 3), 1.0, 2)  # below it
    roi_align(x, rois, (2, 3), 1.0, 2)  # no gradient wanted: torchvision's
    with torch.no_grad():
        roi_align(leaf, rois, (2, 3), 1.0, 2)
    roi_align(leaf, rois, (2, 3), 1.0, -1)  # adaptive sampling: torchvision's
    roi_align(leaf, rois, (2, 3), 1.0, 2, impl="torch")  # the CPU torch path: gathers
    assert calls == [3, 6]
    MultiScaleRoIAlign(["a"], (2, 3), 2)({"a": leaf}, [rois[:3, 1:]], [(9, 9)])
    assert calls == [3, 6, 3]
    threads(2)
    roi_align(leaf, rois[:5], (2, 3), 1.0, 2)  # below the threshold of several threads
    roi_align(leaf, rois, (2, 3), 1.0, 2)  # at it
    roi_align(leaf, rois, (2, 3), 1.0, 2, impl="triton").sum().backward()  # the Triton backward
    assert calls == [3, 6, 3, 6]


def test_gather_compiles_fullgraph(monkeypatch, threads):
    """Traced with its gather backward (the threshold of several threads applies while
    compiling): bitwise the eager gather's gradient (2 threads), which is not torchvision's."""
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", {"one thread": 10**9, "threads": 0})
    threads(2)
    gen = torch.Generator().manual_seed(4)
    x, rois = torch.randn(2, 8, 13, 17, generator=gen), make_rois()
    grad = torch.randn(rois.shape[0], 8, 2, 3, generator=gen)
    fn = torch.compile(
        lambda a, b: roi_align(a, b, (2, 3), 0.5, 3),
        fullgraph=True,
        dynamic=True,
        backend="aot_eager",
    )
    leaves = [x.clone().requires_grad_(True) for _ in range(3)]
    outs = [fn(leaves[0], rois), roi_align(leaves[1], rois, (2, 3), 0.5, 3)]
    outs.append(tv.roi_align(leaves[2], rois, (2, 3), 0.5, 3))
    for out in outs:
        torch.testing.assert_close(out, outs[2], rtol=0, atol=0)
        out.backward(grad)
    assert torch.equal(leaves[0].grad, leaves[1].grad)
    assert not torch.equal(leaves[1].grad, leaves[2].grad)


def test_dispatch_gathers_the_forward_from_its_threshold(monkeypatch, threads):
    """With a gradient the forward gathers from its own (higher) threshold; without one the
    forward is torchvision's kernel at any size (on its own, the gather is slower on small
    maps)."""
    import visionblocks.ops._roi_align_gather as gather

    calls = []
    real = gather.roi_align_gather

    def counted(*args, forward=False):
        calls.append((args[1].shape[0], forward))
        return real(*args, forward=forward)

    monkeypatch.setattr(gather, "roi_align_gather", counted)
    work = 3 * 4 * 2 * 3 * 2 * 2  # K=3, C=4, 2x3 bins, sr=2
    monkeypatch.setattr(ROI_MODULE, "_GATHER_MIN_WORK", {"one thread": 1, "threads": 1})
    monkeypatch.setattr(
        ROI_MODULE, "_GATHER_FORWARD_MIN_WORK", {"one thread": work, "threads": 2 * work}
    )
    x = torch.randn(1, 4, 9, 9)
    leaf = x.clone().requires_grad_(True)
    rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 7.0]] * 6)
    threads(1)
    reference = tv.roi_align(x, rois, (2, 3), 1.0, 2)
    out = roi_align(x, rois, (2, 3), 1.0, 2)  # no gradient: torchvision's, bitwise
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert calls == []
    _close(roi_align(leaf, rois[:3], (2, 3), 1.0, 2), reference[:3], torch.float32)  # at it
    roi_align(leaf, rois[:2], (2, 3), 1.0, 2)  # below it: the backward only
    assert calls == [(3, True), (2, False)]
    threads(2)
    roi_align(leaf, rois[:3], (2, 3), 1.0, 2)  # the threshold of several threads: below
    roi_align(leaf, rois, (2, 3), 1.0, 2)
    assert calls == [(3, True), (2, False), (3, False), (6, True)]
