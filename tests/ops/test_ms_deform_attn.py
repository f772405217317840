"""`ms_deform_attn` and `MultiScaleDeformableAttention` against mmcv's and transformers' code.

The reference is a float64 re-expression of mmcv's ``multi_scale_deformable_attn_pytorch``
(open-mmlab/mmcv, ``mmcv/ops/multi_scale_deform_attn.py``; Deformable DETR's
``ms_deform_attn_core_pytorch`` in fundamentalvision/Deformable-DETR,
``models/ops/functions/ms_deform_attn_func.py``, is the same): one ``grid_sample`` per level
of the ``(B * heads, C, H, W)`` map at ``2 * location - 1`` (bilinear, zeros,
``align_corners=False``), the samples stacked over levels and points and summed with the
attention weights. mmcv is not installed; transformers' layer is (its state dict loads into
ours).
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from visionblocks.nn import MultiScaleDeformableAttention
from visionblocks.ops import ms_deform_attn
from visionblocks.registry import LAYERS

msda = importlib.import_module("visionblocks.ops.ms_deform_attn")  # the name is the function's


def reference(value, shapes, locations, weights):
    """mmcv's ``multi_scale_deformable_attn_pytorch``, in float64."""
    value, locations, weights = (x.double() for x in (value, locations, weights))
    b, _, heads, c = value.shape
    _, q, _, levels, points, _ = locations.shape
    per_level = value.split([h * w for h, w in shapes], 1)
    grids = 2 * locations - 1
    samples = []
    for level, (h, w) in enumerate(shapes):
        image = per_level[level].flatten(2).transpose(1, 2).reshape(b * heads, c, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)  # (B * heads, Q, P, 2)
        samples.append(
            F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    attn = weights.transpose(1, 2).reshape(b * heads, 1, q, levels * points)
    out = (torch.stack(samples, -2).flatten(-2) * attn).sum(-1)
    return out.view(b, heads * c, q).transpose(1, 2)


def _inputs(shapes, b=2, q=11, heads=3, c=5, points=4, dtype=torch.float64, seed=0, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in shapes)
    levels = len(shapes)
    value = torch.randn(b, keys, heads, c, generator=g, dtype=dtype)
    # Locations up to `spread` outside [0, 1]: corners outside the map are zeros.
    locations = torch.rand(b, q, heads, levels, points, 2, generator=g, dtype=dtype)
    locations = locations * (1 + 2 * spread) - spread
    weights = torch.rand(b, q, heads, levels, points, generator=g, dtype=dtype)
    return value, locations, weights


SHAPES = {
    "four-levels": [(9, 13), (5, 7), (3, 4), (1, 1)],
    "one-level": [(6, 6)],
    "tall-and-1x1": [(11, 2), (1, 1), (1, 7)],
}


def _paths():
    """The two torch paths: grid_sample with host sizes, the gather with a size tensor."""
    return {
        "grid_sample": lambda v, s, x, a: ms_deform_attn(v, s, x, a),
        "gather": lambda v, s, x, a: msda._ms_deform_attn_gather(v, torch.tensor(s), x, a),
    }


def _grads(fn, value, shapes, locations, weights):
    leaves = [x.detach().clone().requires_grad_() for x in (value, locations, weights)]
    out = fn(leaves[0], shapes, leaves[1], leaves[2])
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape))
    return out.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("path", ["grid_sample", "gather"])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("seed", [0, 1])
def test_values_and_gradients_equal_mmcv_reference(path, name, seed):
    shapes = SHAPES[name]
    inputs = _inputs(shapes, seed=seed, points=2 + seed)
    got, got_grads = _grads(_paths()[path], inputs[0], shapes, *inputs[1:])
    want, want_grads = _grads(reference, inputs[0], shapes, *inputs[1:])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w, what in zip(got_grads, want_grads, ("value", "locations", "weights"), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=what)


def test_level_by_level_sums_equal_the_stacked_product(monkeypatch):
    """Above `_STACK_ELEMENTS` the formula weighs each level apart: the same sums."""
    shapes = SHAPES["four-levels"]
    inputs = _inputs(shapes, seed=3)
    stacked, stacked_grads = _grads(ms_deform_attn, inputs[0], shapes, *inputs[1:])
    monkeypatch.setattr(msda, "_STACK_ELEMENTS", 0)
    split, split_grads = _grads(ms_deform_attn, inputs[0], shapes, *inputs[1:])
    torch.testing.assert_close(split, stacked, rtol=1e-13, atol=1e-13)
    for a, b in zip(split_grads, stacked_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_cpu_tensor_and_sequence_shapes_agree_in_float32():
    shapes = SHAPES["four-levels"]
    value, locations, weights = _inputs(shapes, dtype=torch.float32, seed=4)
    want = reference(value, shapes, locations, weights).float()
    for given in (shapes, torch.tensor(shapes), torch.tensor(shapes, dtype=torch.int32)):
        torch.testing.assert_close(ms_deform_attn(value, given, locations, weights), want)
    got = msda._ms_deform_attn_gather(value, torch.tensor(shapes), locations, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["grid_sample", "gather"])
def test_gradcheck_float64(path):
    shapes = [(3, 2), (1, 1)]
    value, locations, weights = _inputs(shapes, b=1, q=2, heads=2, c=2, points=2, seed=5)
    # Away from pixel centres' edges: the bilinear weights' kinks are where finite
    # differences straddle two cells.
    locations = (locations * 0.8 + 0.1).requires_grad_()
    fn = _paths()[path]
    args = (value.requires_grad_(), locations, weights.requires_grad_())
    assert torch.autograd.gradcheck(lambda v, x, a: fn(v, shapes, x, a), args)


def test_half_inputs_computed_in_float32_and_mixed_dtypes_promoted():
    shapes = SHAPES["tall-and-1x1"]
    value, locations, weights = _inputs(shapes, dtype=torch.float32, seed=6)
    want = ms_deform_attn(value, shapes, locations, weights)
    for dtype in (torch.float16, torch.bfloat16):
        got = ms_deform_attn(value.to(dtype), shapes, locations.to(dtype), weights.to(dtype))
        assert got.dtype == dtype
        half = ms_deform_attn(
            value.to(dtype).float(), shapes, locations.to(dtype).float(), weights.to(dtype).float()
        )
        torch.testing.assert_close(got.float(), half, rtol=0, atol=1e-2 * half.abs().max())
        assert not torch.equal(got.float(), want)  # the inputs were rounded, not the maths
    mixed = ms_deform_attn(value.half(), shapes, locations.double(), weights)
    assert mixed.dtype == torch.float64


def test_worked_example_and_zeros_beyond_the_border():
    value = torch.arange(6.0).view(
        1, 6, 1, 1
    )  # one 2x3 level: rows [0, 1, 2], [3, 4, 5]; x = 1 is half a pixel beyond 2
    points = torch.tensor([[0.5, 0.5], [1 / 6, 0.25], [-0.5, 0.5], [1.0, 0.25]])
    locations = points.view(1, 4, 1, 1, 1, 2)
    weights = torch.ones(1, 4, 1, 1, 1)
    for shapes in ([(2, 3)], torch.tensor([[2, 3]])):
        out = ms_deform_attn(value, shapes, locations, weights).flatten()
        torch.testing.assert_close(out, torch.tensor([2.5, 0.0, 0.0, 1.0]))
    gather = msda._ms_deform_attn_gather(value, torch.tensor([[2, 3]]), locations, weights)
    torch.testing.assert_close(gather.flatten(), torch.tensor([2.5, 0.0, 0.0, 1.0]))


def test_empty_batch_and_queries():
    shapes = [(2, 2), (1, 1)]
    for b, q in ((0, 3), (2, 0)):
        value, locations, weights = _inputs(shapes, b=b, q=q)
        for given in (shapes, torch.tensor(shapes)):
            assert ms_deform_attn(value, given, locations, weights).shape == (b, q, 3 * 5)


@pytest.mark.slow  # two dynamo compiles (~20 s); tests/package/test_compile_fullgraph.py covers the op quickly
def test_compiles_fullgraph_with_sequence_and_tensor_shapes():
    shapes = SHAPES["four-levels"]
    value, locations, weights = _inputs(shapes, dtype=torch.float32, seed=7)
    want = ms_deform_attn(value, shapes, locations, weights)
    for given in (shapes, torch.tensor(shapes)):
        torch._dynamo.reset()
        fn = torch.compile(ms_deform_attn, fullgraph=True, dynamic=True, backend="aot_eager")
        leaves = [x.clone().requires_grad_() for x in (value, locations, weights)]
        got = fn(leaves[0], given, leaves[1], leaves[2])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got.sum().backward()
        assert all(x.grad is not None and x.grad.isfinite().all() for x in leaves)


def test_cuda_size_tensor_reads_nothing_on_the_host():
    """Fake CUDA tensors: any host read raises; the sizes stay on the device (gather path),
    and the keys check is a device-side assert."""
    from tests.package.test_fake_cuda import no_driver

    shapes = SHAPES["four-levels"]
    cuda = torch.device("cuda")
    with FakeTensorMode(allow_non_fake_inputs=False):
        value, locations, weights = (x.float().to(cuda) for x in _inputs(shapes))
        for given in (torch.tensor(shapes, device=cuda), shapes, torch.tensor(shapes)):
            with no_driver():
                out = ms_deform_attn(value, given, locations, weights)
            assert out.device.type == "cuda" and out.shape == (2, 11, 15)
        with cuda:
            layer = MultiScaleDeformableAttention(16, 4, 4, 2)
        query, ref = torch.randn(2, 5, 16, device=cuda), torch.rand(2, 5, 4, 2, device=cuda)
        with no_driver():
            out = layer(query, ref, torch.randn(2, value.shape[1], 16, device=cuda), shapes)
        assert out.shape == (2, 5, 16)


def test_kernel_entry_point_gets_the_agreed_arguments(monkeypatch):
    """The Triton branch: ``ms_deform_attn_triton(value, shapes, locations, weights,
    reference=...)`` with the sizes as int64 on value's device, the gather path as fallback."""
    pytest.importorskip("triton")
    calls = []

    def entry(value, shapes, locations, weights, reference=None):
        calls.append((shapes, reference))
        return msda._ms_deform_attn_gather(value, shapes, locations, weights)

    fake = types.ModuleType("visionblocks.kernels.ms_deform_attn")
    fake.ms_deform_attn_triton = entry
    monkeypatch.setitem(sys.modules, "visionblocks.kernels.ms_deform_attn", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    shapes = SHAPES["tall-and-1x1"]
    value, locations, weights = _inputs(shapes)
    got = ms_deform_attn(value, shapes, locations, weights, impl="triton")
    torch.testing.assert_close(got, reference(value, shapes, locations, weights))
    ((sizes, fallback),) = calls
    assert sizes.dtype == torch.int64 and sizes.tolist() == [list(s) for s in shapes]
    assert fallback is None  # forced: a failing kernel raises
    from visionblocks._core.dispatch import use_impl

    with use_impl("auto"):
        monkeypatch.setattr(msda, "use_triton", lambda *args: True)
        ms_deform_attn(value, torch.tensor(shapes), locations, weights)
    assert calls[-1][1] is msda._ms_deform_attn_gather


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    shapes = SHAPES["four-levels"]
    value, locations, weights = _inputs(shapes, dtype=torch.float32, seed=8)

    class Attention(torch.nn.Module):
        def forward(self, v, x, a):
            return ms_deform_attn(v, shapes, x, a)

    path = tmp_path / "msda.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Attention(), (value, locations, weights), str(path), dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (value.numpy(), locations.numpy(), weights.numpy()))))
    want = reference(value, shapes, locations, weights).float()
    torch.testing.assert_close(torch.from_numpy(got[0]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda a: {**a, "value": a["value"].long()}, TypeError, "value must be a floating"),
        (lambda a: {**a, "value": a["value"][0]}, ValueError, r"value must have shape \(B, keys"),
        (lambda a: {**a, "value": a["value"][:, :-1]}, ValueError, "sum\\(H \\* W\\) = 30 keys"),
        (lambda a: {**a, "sampling_locations": a["sampling_locations"][..., :1]}, ValueError,
         "sampling_locations must have shape"),
        (lambda a: {**a, "sampling_locations": a["sampling_locations"][:, :, :2]}, ValueError,
         r"\(2, queries, 3, levels, points, 2\)"),
        (lambda a: {**a, "attention_weights": a["attention_weights"][..., :1]}, ValueError,
         "attention_weights must have shape"),
        (lambda a: {**a, "attention_weights": a["attention_weights"].int()}, TypeError,
         "attention_weights must be a floating"),
        (lambda a: {**a, "spatial_shapes": [(5, 4)]}, ValueError, "must be 2 \\(H, W\\) pairs"),
        (lambda a: {**a, "spatial_shapes": [(5, 4), (2, 2.0)]}, ValueError, "pairs of ints"),
        (lambda a: {**a, "spatial_shapes": [(5, 4), (0, 10)]}, ValueError, "sizes >= 1"),
        (lambda a: {**a, "spatial_shapes": "5x4"}, TypeError, "sequence of \\(H, W\\) pairs"),
        (lambda a: {**a, "spatial_shapes": torch.tensor([[5.0, 4], [2, 5]])}, TypeError,
         "integer tensor"),
        (lambda a: {**a, "spatial_shapes": torch.tensor([5, 4, 2, 5])}, ValueError,
         r"spatial_shapes must have shape \(2, 2\)"),
        (lambda a: {**a, "spatial_shapes": torch.tensor([[5, 4], [2, 4]])}, ValueError,
         "keys for spatial_shapes"),
        (lambda a: {**a, "value": a["value"].to("meta")}, ValueError, "same device"),
        (lambda a: {**a, "impl": "cuda"}, ValueError, "impl must be one of"),
    ],
)  # fmt: skip
def test_validation_names_the_argument(change, error, match):
    shapes = [(5, 4), (2, 5)]
    value, locations, weights = _inputs(shapes)
    args = {
        "value": value,
        "spatial_shapes": shapes,
        "sampling_locations": locations,
        "attention_weights": weights,
    }
    with pytest.raises(error, match=match):
        ms_deform_attn(**change(args))


# ------------------------------------------------------------------------------ the layer


def _transformers_layer(d=32, heads=4, levels=3, points=2):
    pytest.importorskip("transformers")
    from transformers.models.deformable_detr import modeling_deformable_detr as detr

    from benchmarks.cases.deformable_detr import deformable_detr_config

    config = deformable_detr_config(d_model=d, heads=heads, num_feature_levels=levels)
    theirs = detr.DeformableDetrMultiscaleDeformableAttention(config, heads, points).double()
    return theirs.eval()


@pytest.mark.parametrize("coords", [2, 4])
@pytest.mark.parametrize("shapes_as", ["list", "tensor"])
def test_layer_equals_transformers_with_its_state_dict(coords, shapes_as):
    theirs = _transformers_layer()
    g = torch.Generator().manual_seed(coords)
    with torch.no_grad():
        for p in theirs.parameters():  # not the zero init: every path of the layer counts
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    ours = MultiScaleDeformableAttention(32, 4, 3, 2).double()
    ours.load_state_dict(theirs.state_dict())
    shapes = [(6, 7), (3, 4), (1, 2)]
    keys = sum(h * w for h, w in shapes)
    query = torch.randn(2, 9, 32, generator=g, dtype=torch.float64)
    value = torch.randn(2, keys, 32, generator=g, dtype=torch.float64)
    ref = torch.rand(2, 9, 3, coords, generator=g, dtype=torch.float64)
    pad = torch.zeros(2, keys, dtype=torch.bool)
    pad[1, -5:] = True
    sizes = torch.tensor(shapes)
    want, _ = theirs(
        query,
        attention_mask=~pad,
        encoder_hidden_states=value,
        reference_points=ref,
        spatial_shapes=sizes,
        spatial_shapes_list=shapes,
        level_start_index=torch.tensor([0, 42, 54]),
    )
    given = shapes if shapes_as == "list" else sizes
    got = ours(query, ref, value, given, key_padding_mask=pad)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_layer_initialisation_is_deformable_detrs():
    pytest.importorskip("transformers")
    from transformers import DeformableDetrModel

    from benchmarks.cases.deformable_detr import deformable_detr_config

    torch.manual_seed(0)
    config = deformable_detr_config(d_model=64, layers=1, queries=5, heads=8)
    theirs = DeformableDetrModel(config).encoder.layers[0].self_attn  # after post_init
    ours = MultiScaleDeformableAttention(64, 8, 4, 4)
    torch.testing.assert_close(ours.sampling_offsets.bias, theirs.sampling_offsets.bias)
    for name in ("sampling_offsets.weight", "attention_weights.weight", "attention_weights.bias"):
        assert not ours.get_parameter(name).any() and not theirs.get_parameter(name).any()
    assert not ours.value_proj.bias.any() and not ours.output_proj.bias.any()
    bound = (6 / (64 + 64)) ** 0.5  # Xavier uniform
    assert ours.value_proj.weight.abs().max() <= bound


def test_layer_registered_and_checks_its_inputs():
    layer = LAYERS.build({"type": "ms_deform_attn", "embed_dims": 16, "num_heads": 2,
                          "num_levels": 2, "num_points": 1})  # fmt: skip
    assert isinstance(layer, MultiScaleDeformableAttention)
    assert "num_levels=2" in repr(layer)
    with pytest.raises(ValueError, match="num_heads must divide embed_dims"):
        MultiScaleDeformableAttention(10, 3)
    with pytest.raises(TypeError, match="num_points must be int"):
        MultiScaleDeformableAttention(16, 2, 2, 1.0)
    shapes = [(2, 3), (1, 1)]
    query, value = torch.randn(1, 4, 16), torch.randn(1, 7, 16)
    with pytest.raises(ValueError, match=r"reference_points must have shape \(1, 4, 2, 2\)"):
        layer(query, torch.rand(1, 4, 3, 2), value, shapes)
    with pytest.raises(ValueError, match=r"query must have shape \(B, N, 16\)"):
        layer(torch.randn(1, 4, 8), torch.rand(1, 4, 2, 2), value, shapes)
    with pytest.raises(TypeError, match="key_padding_mask must be a bool"):
        layer(query, torch.rand(1, 4, 2, 2), value, shapes, torch.zeros(1, 7))
    with pytest.raises(ValueError, match="value must have sum"):
        layer(query, torch.rand(1, 4, 2, 2), value[:, :6], shapes)
