"""Launch guards, launch-shape logic past CUDA's limits, and the fallback after a failure.

The launch-shape logic is tested without launching; the fallback with a kernel whose launch
raises (a simulated compile error), under the interpreter on CPU.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from tests.conftest import _NO_TRITON, _REASON, _TRITON_RUNNABLE
from tests.helpers import assert_close
from visionblocks._core import dispatch
from visionblocks.kernels import _launch
from visionblocks.kernels._launch import (
    GRID_LIMITS,
    KernelFailure,
    LaunchLimitError,
    check_grid,
    launch,
    prepare,
)

needs_triton = pytest.mark.skipif(bool(_REASON), reason=f"triton: {_REASON}")
runs_kernels = pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)


@pytest.fixture(autouse=True)
def _forget_failures():
    dispatch._failures.clear()
    yield
    dispatch._failures.clear()


def test_check_grid_accepts_the_limits_and_names_the_axis_past_them():
    assert check_grid("op", GRID_LIMITS) == GRID_LIMITS
    for axis in range(3):
        grid = [1, 1, 1]
        grid[axis] = GRID_LIMITS[axis] + 1
        with pytest.raises(ValueError, match=f"op: grid axis {axis} has {grid[axis]} programs"):
            check_grid("op", grid)
    with pytest.raises(ValueError, match="positive int"):
        check_grid("op", (0,))
    with pytest.raises(ValueError, match="1 to 3 axes"):
        check_grid("op", (1, 1, 1, 1))


def test_prepare_copies_only_misaligned_or_strided_tensors():
    x = torch.arange(32.0)
    assert prepare(x) is x
    view = x[1:]  # 4 bytes in
    out = prepare(view)
    assert out.data_ptr() % _launch.ALIGNMENT == 0
    assert torch.equal(out, view)
    t = torch.randn(4, 6).t()
    assert prepare(t).is_contiguous()


@needs_triton
def test_local_filter_grids_fold_every_axis_into_axis_0():
    from visionblocks.kernels.local_filter import gather_grid, grad_kernels_grid

    # Depthwise with 131,072 groups: b*g alone is past the 65,535 limit of axes 1 and 2.
    programs, n_pb, n_cb = gather_grid((64, 2048, 7, 7), groups=2048)
    assert (n_pb, n_cb) == (1, 1)
    assert check_grid("local_filter", (programs,)) == (64 * 2048,)
    programs, _ = grad_kernels_grid(64, 2048, 49, (7, 7))
    assert programs == 64 * 2048 * 49 <= GRID_LIMITS[0]
    # A 40,000 x 40,000 plane still indexes in int32; 50,000 x 50,000 does not.
    assert gather_grid((1, 1, 40_000, 40_000), 1)[0] == -(-(40_000**2) // 128)
    with pytest.raises(LaunchLimitError, match="more than 2\\*\\*31 - 1 pixels"):
        gather_grid((1, 1, 50_000, 50_000), 1)


@needs_triton
def test_local_attention_plan_bounds_tiles_and_folds_heads():
    from visionblocks.kernels.local_attention import plan

    for depth in (1, 16, 17, 32, 33, 64, 65, 4096, 100_000):
        p = plan((1, depth, 4, 4), num_heads=1)
        assert p["BLOCK_D"] * p["BLOCK_P"] == 2048  # registers bounded at any channel count
        assert p["SPLIT"] == (depth > 64)
        p64 = plan((1, depth, 4, 4), num_heads=1, float64=True)
        assert p64["BLOCK_D"] * p64["BLOCK_P"] == 1024
    p = plan((256, 512, 8, 8), num_heads=512)  # 131,072 (batch, head) pairs
    assert check_grid("local_attention2d", (p["programs"],))
    with pytest.raises(LaunchLimitError):
        plan((1, 8, 50_000, 50_000), num_heads=1)


@needs_triton
def test_focal_operands_take_few_dtypes_and_keep_broadcast_weights_unexpanded():
    from visionblocks.kernels.focal import canonical_inputs

    x = torch.randn(6, 5, dtype=torch.float16)
    _, t, _, _, _ = canonical_inputs(x, torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32), None)
    assert t.dtype == torch.int64
    _, t, w, sr, sc = canonical_inputs(x, torch.rand(6, 5) > 0.5, None)
    assert t.dtype == torch.uint8 and w.numel() == 1 and (sr, sc) == (0, 0)
    _, t, _, _, _ = canonical_inputs(x, torch.rand(6, 5, dtype=torch.float64), None)
    assert t.dtype == torch.float32  # neither x's dtype nor the compute dtype: cast
    per_class = torch.rand(5, dtype=torch.float16).expand(6, 5)
    _, _, w, sr, sc = canonical_inputs(x, torch.rand(6, 5), per_class)
    assert w.shape == (1, 5) and w.dtype == torch.float32 and (sr, sc) == (0, 1)
    per_row = torch.rand(6, 1).expand(6, 5)
    _, _, w, sr, sc = canonical_inputs(x, torch.rand(6, 5), per_row)
    assert w.shape == (6, 1) and (sr, sc) == (1, 0)


@needs_triton
def test_recorded_specialization_checks_every_argument_and_names_it():
    from benchmarks.kernel_specs import specialization
    from visionblocks.kernels.iou import _iou_loss_fwd_kernel as kernel

    boxes = torch.zeros(4, 4)
    args = {"p_ptr": boxes, "g_ptr": boxes, "loss_ptr": torch.zeros(4), "n": 4, "eps": 1e-7}
    consts = {"MODE": 0, "CDT": None, "BLOCK": 256}
    spec = specialization(kernel, {**args, **consts})
    assert dict(spec.signature)["n"] == "i64" and dict(spec.signature)["p_ptr"] == "*fp32"
    with pytest.raises(ValueError, match="g_ptr must start 16-byte aligned"):
        specialization(kernel, {**args, "g_ptr": torch.zeros(20)[1:17].view(4, 4), **consts})
    with pytest.raises(ValueError, match="g_ptr has unsupported dtype torch.int16"):
        specialization(kernel, {**args, "g_ptr": boxes.to(torch.int16), **consts})
    with pytest.raises(ValueError, match="g_ptr is on meta"):
        specialization(kernel, {**args, "g_ptr": boxes.to("meta"), **consts})
    with pytest.raises(ValueError, match="missing argument 'eps'"):
        specialization(kernel, {k: v for k, v in {**args, **consts}.items() if k != "eps"})


@needs_triton
def test_int32_arguments_past_their_range_are_refused_not_wrapped():
    from visionblocks.kernels.local_filter import _grad_kernels_kernel as real

    class Kernel:  # launches nothing: the guard must refuse before
        fn = real.fn

        def __getitem__(self, grid):
            raise AssertionError("launched")

    t = torch.zeros(4)
    sizes = dict.fromkeys(("C", "G", "CG", "H", "W", "HO", "WO", "KS", "DIL", "STRIDE", "N_PB"), 1)
    args = {
        "x_ptr": t,
        "go_ptr": t,
        "gk_ptr": t,
        **sizes,
        "CDT": None,
        "BLOCK_C": 1,
        "BLOCK_P": 128,
    }
    with pytest.raises(ValueError, match=r"C = 2147483648 does not fit its type i32"):
        launch("local_filter", Kernel(), (1,), **{**args, "C": 2**31})
    with pytest.raises(TypeError, match="H must be an int, got True"):
        launch("local_filter", Kernel(), (1,), **{**args, "H": True})
    with pytest.raises(ValueError, match="missing argument 'W'"):
        launch("local_filter", Kernel(), (1,), **{k: v for k, v in args.items() if k != "W"})


class _Broken:
    """A kernel whose launch fails as a compile error would."""

    def __init__(self, real):
        self.fn = real.fn

    def __getitem__(self, grid):
        def run(**kwargs):
            raise RuntimeError("simulated compile error: invalid PTX")

        return run


def _focal_args(x, targets):
    return (x, targets, None, 0.25, 2.0, None, True, x.dtype)


def _focal_reference(*args):
    from visionblocks.losses.focal import _focal_rows  # the formula, as the op passes it

    return _focal_rows(*args)


@runs_kernels
def test_a_failing_forward_kernel_warns_once_and_falls_back(monkeypatch):
    from visionblocks.kernels import focal

    monkeypatch.setattr(focal, "_focal_fwd_kernel", _Broken(focal._focal_fwd_kernel))
    x = torch.randn(5, 3)
    t = torch.rand(5, 3)
    expected, _ = _focal_reference(*_focal_args(x, t))
    entry = focal.sigmoid_focal_loss_triton
    with pytest.warns(RuntimeWarning) as record:
        loss, _ = entry(*_focal_args(x, t), reference=_focal_reference)
    assert len(record) == 1
    message = str(record[0].message)
    assert "'sigmoid_focal_loss' failed on cpu" in message
    assert "simulated compile error" in message and "report this" in message
    assert_close(loss, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call stays silent
        loss, _ = entry(*_focal_args(x, t), reference=_focal_reference)
    assert_close(loss, expected)
    assert "simulated compile error" in dispatch._failures[("sigmoid_focal_loss", "cpu")]
    with pytest.raises(KernelFailure, match="simulated compile error"):
        entry(*_focal_args(x, t))  # no reference: impl="triton" forced


def test_a_launch_limit_falls_back_without_being_remembered():
    """A shape past a kernel's indexing (`LaunchLimitError`) concerns that call only."""

    @_launch.with_fallback("some_op")
    def entry(x, reference=None):
        raise LaunchLimitError("some_op", "pixel indexing", ValueError("a huge plane"))

    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        assert torch.equal(entry(x, reference=lambda t: t * 2), x * 2)
    assert not dispatch._failures
    with pytest.raises(LaunchLimitError, match="a huge plane"):
        entry(x)


@runs_kernels
def test_a_failing_backward_kernel_falls_back_to_the_torch_gradient(monkeypatch):
    from visionblocks.kernels import focal
    from visionblocks.losses.focal import sigmoid_focal_loss

    monkeypatch.setattr(focal, "_focal_bwd_kernel", _Broken(focal._focal_bwd_kernel))
    x = torch.randn(5, 3, requires_grad=True)
    t = torch.tensor([0, 2, 1, 3, 0])
    (expected,) = torch.autograd.grad(sigmoid_focal_loss(x, t, reduction="sum", impl="torch"), x)
    args = (x, t, None, 0.25, 2.0, None, True, x.dtype)
    loss, _ = focal.sigmoid_focal_loss_triton(*args, reference=_focal_reference)
    with pytest.warns(RuntimeWarning, match="failed on cpu"):
        (grad,) = torch.autograd.grad(loss, x)
    assert_close(grad, expected)
    loss = sigmoid_focal_loss(x, t, reduction="sum", impl="triton")  # forced: raises
    with pytest.raises(KernelFailure, match="_focal_bwd_kernel of 'sigmoid_focal_loss' failed"):
        torch.autograd.grad(loss, x)


@runs_kernels
@pytest.mark.parametrize(
    "op",
    ["sigmoid_focal_loss", "local_filter", "local_attention2d", "generalized_box_iou_loss",
     "rotated_box_iou", "best_box_iou", "match_anchors", "rotated_roi_align", "ms_deform_attn"],
)  # fmt: skip
def test_every_op_falls_back_when_its_kernel_fails(op, monkeypatch):
    """Each op passes its formula to its kernel entry: under "auto" (as on a GPU) a broken
    kernel warns and gives the formula's result, gradients included; forced, it raises."""
    from visionblocks.kernels import assign, focal, iou, local_attention, local_filter, rotated_iou
    from visionblocks.kernels import ms_deform_attn as msda
    from visionblocks.kernels import rotated_roi_align as rroi
    from visionblocks.losses.focal import sigmoid_focal_loss
    from visionblocks.losses.iou import generalized_box_iou_loss
    from visionblocks.ops import best_box_iou, match_anchors, rotated_box_iou
    from visionblocks.ops.local import local_filter2d as lf
    from visionblocks.ops.local_attention import local_attention2d
    from visionblocks.ops.ms_deform_attn import ms_deform_attn
    from visionblocks.ops.rotated_roi_align import rotated_roi_align

    boxes = (torch.tensor([[0.0, 0, 2, 2], [1, 1, 4, 5]]), torch.tensor([[1.0, 1, 3, 3]]))
    module, names, where, inputs, call = {
        "sigmoid_focal_loss": (
            focal, ["_focal_fwd_kernel", "_focal_bwd_kernel"], "losses.focal",
            (torch.randn(4, 3), torch.tensor([0, 2, 3, 1])),
            lambda impl, *a: sigmoid_focal_loss(*a, reduction="sum", impl=impl),
        ),
        "local_filter": (
            local_filter, ["_gather_kernel", "_grad_kernels_kernel"], "ops.local",
            (torch.randn(1, 2, 4, 4), torch.randn(1, 9, 4, 4)),
            lambda impl, *a: lf(*a, 3, impl=impl),
        ),
        "local_attention2d": (
            local_attention, ["_fwd_kernel", "_bwd_q_kernel", "_bwd_kv_kernel"],
            "ops.local_attention", tuple(torch.randn(1, 4, 3, 3) for _ in range(3)),
            lambda impl, *a: local_attention2d(*a, 3, impl=impl),
        ),
        "generalized_box_iou_loss": (
            iou, ["_iou_loss_fwd_kernel", "_iou_loss_bwd_kernel"], "losses.iou",
            (boxes[0][:1], boxes[1]), lambda impl, *a: generalized_box_iou_loss(*a, impl=impl),
        ),
        "rotated_box_iou": (
            rotated_iou, ["_rotated_iou_kernel"], "ops._rotated_overlap",
            (torch.tensor([[1.0, 1, 2, 2, 30]]), torch.tensor([[1.0, 1, 2, 3, 0]])),
            lambda impl, *a: rotated_box_iou(*a, impl=impl),
        ),
        "best_box_iou": (
            assign, ["_best_iou_kernel"], "ops.assign", boxes,
            lambda impl, *a: torch.cat([v.double() for v in best_box_iou(*a, impl=impl)]),
        ),
        "match_anchors": (
            assign, ["_reaches_kernel"], "ops.assign", boxes,
            lambda impl, a, b: match_anchors(a, boxes=b, high_threshold=0.5, low_threshold=0.4,
                                             allow_low_quality_matches=True, impl=impl),
        ),
        "rotated_roi_align": (
            rroi, ["_rroi_fwd_kernel", "_rroi_bwd_kernel"], "ops.rotated_roi_align",
            (torch.randn(1, 2, 4, 5), torch.tensor([[0, 2.0, 2.0, 3.0, 2.0, 30.0]])),
            lambda impl, *a: rotated_roi_align(*a, 2, impl=impl),
        ),
        "ms_deform_attn": (
            msda, ["_msda_fwd_kernel", "_msda_sample_kernel", "_msda_value_kernel"],
            "ops.ms_deform_attn",
            (torch.randn(1, 5, 2, 3), torch.rand(1, 4, 2, 2, 2, 2), torch.rand(1, 4, 2, 2, 2)),
            lambda impl, v, x, a: ms_deform_attn(v, torch.tensor([[2, 2], [1, 1]]), x, a,
                                                 impl=impl),
        ),
    }[op]  # fmt: skip
    for name in names:
        monkeypatch.setattr(module, name, _Broken(getattr(module, name)))
    differentiable = op not in ("best_box_iou", "match_anchors")
    inputs = tuple(t.requires_grad_(differentiable and t.is_floating_point()) for t in inputs)
    expected = call("torch", *inputs)
    with pytest.raises(KernelFailure):
        out = call("triton", *inputs)
        if out.requires_grad:
            out.sum().backward()
    # "auto" never picks triton on CPU; decide as "auto" would on a GPU.
    # by module: visionblocks.ops.rotated_roi_align (an attribute) is the op, not its module
    op_module = importlib.import_module(f"visionblocks.{where}")
    monkeypatch.setattr(op_module, "use_triton", lambda *a, **k: True)
    with pytest.warns(RuntimeWarning, match=f"'{op}' failed on cpu"):
        out = call("auto", *inputs)
    assert_close(out, expected)
    if differentiable:  # the backward falls back too
        wanted = [t for t in inputs if t.requires_grad]
        grads = torch.autograd.grad(out.sum(), wanted, allow_unused=True)
        ref = torch.autograd.grad(expected.sum(), wanted, allow_unused=True)
        for g, r in zip(grads, ref):
            assert (g is None) == (r is None)
            if g is not None:
                assert_close(g, r)
