"""Launch guards, launch-shape logic past CUDA's limits, and the fallback after a failure.

The launch-shape logic is tested without launching; the fallback with a kernel whose launch
raises (a simulated compile error), under the interpreter on CPU.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from tests.helpers import assert_close
from visionblocks import kernels
from visionblocks.kernels import _fallback, _launch
from visionblocks.kernels._dispatch import resolve_impl, run_fused
from visionblocks.kernels._launch import (
    GRID_LIMITS,
    KernelFailure,
    LaunchLimitError,
    check_grid,
    prepare,
    specialization,
)
from visionblocks.kernels._support import capability_reason, triton_version, unsupported_reason

RUNNABLE = kernels.triton_available() and (torch.cuda.is_available() or kernels.interpret_mode())
needs_triton = pytest.mark.skipif(
    not kernels.triton_available(), reason=f"triton: {kernels.triton_unavailable_reason()}"
)
runs_kernels = pytest.mark.skipif(not RUNNABLE, reason="triton cannot run kernels here")


@pytest.fixture(autouse=True)
def _forget_failures():
    _fallback.reset_failures()
    yield
    _fallback.reset_failures()


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
def test_specialization_checks_every_argument_and_names_it():
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
    with pytest.raises(TypeError, match="n must be an int, got True"):
        specialization(kernel, {**args, "n": True, **consts})
    with pytest.raises(ValueError, match="missing argument 'eps'"):
        specialization(kernel, {k: v for k, v in {**args, **consts}.items() if k != "eps"})


@needs_triton
def test_int32_arguments_past_their_range_are_refused_not_wrapped():
    from visionblocks.kernels.local_filter import _grad_kernels_kernel as kernel

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
    specialization(kernel, args)
    with pytest.raises(ValueError, match=r"C = 2147483648 does not fit its type i32"):
        specialization(kernel, {**args, "C": 2**31})


def test_capability_table():
    assert capability_reason((7, 0), [torch.float32]).startswith("the kernels need compute")
    for cc in ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0)):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            assert capability_reason(cc, [dtype], triton=(3, 3)) == ""


def test_triton_before_3_3_keeps_bfloat16_off_turing():
    # triton 3.0-3.2 emit sm_80's cvt.f32.bf16, which ptxas refuses for sm_75 (every
    # release compiled offline); the dispatcher must route those calls to torch.
    for version in ((3, 0), (3, 1), (3, 2)):
        reason = capability_reason((7, 5), [torch.float32, torch.bfloat16], triton=version)
        assert reason == (
            f"torch.bfloat16 needs compute capability 8.0 or newer with triton "
            f"{version[0]}.{version[1]} (3.3 or newer: 7.5); this GPU has 7.5"
        )
        for dtype in (torch.float16, torch.float32, torch.float64):
            assert capability_reason((7, 5), [dtype], triton=version) == ""
        assert capability_reason((8, 0), [torch.bfloat16], triton=version) == ""
    assert capability_reason((7, 5), [torch.bfloat16], triton=(3, 3)) == ""
    assert capability_reason((7, 5), [torch.bfloat16], triton=(4, 0)) == ""


def test_triton_version_reads_the_imported_module_then_the_metadata(monkeypatch):
    import importlib.metadata
    import types

    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.2.0+git1"))
    assert triton_version() == (3, 2)
    assert capability_reason((7, 5), [torch.bfloat16]).endswith("this GPU has 7.5")
    monkeypatch.delitem(sys.modules, "triton")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.9.0")
    assert triton_version() == (3, 9)

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert triton_version() is None
    assert capability_reason((7, 5), [torch.bfloat16]) == ""


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
    with pytest.warns(RuntimeWarning) as record:
        loss, _ = run_fused("sigmoid_focal_loss", "auto", _focal_reference, *_focal_args(x, t))
    assert len(record) == 1
    message = str(record[0].message)
    assert "'sigmoid_focal_loss' failed on cpu" in message
    assert "simulated compile error" in message and "report this" in message
    assert_close(loss, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call stays silent
        loss, _ = run_fused("sigmoid_focal_loss", "auto", _focal_reference, *_focal_args(x, t))
    assert_close(loss, expected)
    assert "simulated compile error" in unsupported_reason("sigmoid_focal_loss", [x])
    with pytest.raises(KernelFailure, match="simulated compile error"):
        run_fused("sigmoid_focal_loss", "triton", _focal_reference, *_focal_args(x, t))


@runs_kernels
def test_a_failing_backward_kernel_falls_back_to_the_torch_gradient(monkeypatch):
    from visionblocks.kernels import focal
    from visionblocks.losses.focal import sigmoid_focal_loss

    monkeypatch.setattr(focal, "_focal_bwd_kernel", _Broken(focal._focal_bwd_kernel))
    x = torch.randn(5, 3, requires_grad=True)
    t = torch.tensor([0, 2, 1, 3, 0])
    (expected,) = torch.autograd.grad(sigmoid_focal_loss(x, t, reduction="sum", impl="torch"), x)
    loss, _ = run_fused(
        "sigmoid_focal_loss", "auto", _focal_reference, x, t, None, 0.25, 2.0, None, True, x.dtype
    )
    with pytest.warns(RuntimeWarning, match="failed on cpu"):
        (grad,) = torch.autograd.grad(loss, x)
    assert_close(grad, expected)
    loss = sigmoid_focal_loss(x, t, reduction="sum", impl="triton")  # forced: raises
    with pytest.raises(KernelFailure, match="_focal_bwd_kernel of 'sigmoid_focal_loss' failed"):
        torch.autograd.grad(loss, x)


@runs_kernels
@pytest.mark.parametrize("op", ["local_filter", "local_attention2d", "generalized_box_iou_loss"])
def test_every_op_falls_back_when_its_kernel_fails(op, monkeypatch):
    from visionblocks.kernels import iou, local_attention, local_filter
    from visionblocks.ops.iou_loss import generalized_box_iou_loss
    from visionblocks.ops.local import local_filter2d as lf
    from visionblocks.ops.local_attention import local_attention2d

    module, names, op_module = {
        "local_filter": (local_filter, ["_gather_kernel", "_grad_kernels_kernel"], "local"),
        "local_attention2d": (
            local_attention,
            ["_fwd_kernel", "_bwd_q_kernel", "_bwd_kv_kernel"],
            "local_attention",
        ),
        "generalized_box_iou_loss": (
            iou,
            ["_iou_loss_fwd_kernel", "_iou_loss_bwd_kernel"],
            "iou_loss",
        ),
    }[op]
    for name in names:
        monkeypatch.setattr(module, name, _Broken(getattr(module, name)))
    if op == "local_filter":
        inputs = (torch.randn(1, 2, 4, 4), torch.randn(1, 9, 4, 4))
        call = lambda impl, *a: lf(*a, 3, impl=impl)  # noqa: E731
    elif op == "local_attention2d":
        inputs = tuple(torch.randn(1, 4, 3, 3) for _ in range(3))
        call = lambda impl, *a: local_attention2d(*a, 3, impl=impl)  # noqa: E731
    else:
        inputs = (torch.tensor([[0.0, 0, 2, 2]]), torch.tensor([[1.0, 1, 3, 3]]))
        call = lambda impl, *a: generalized_box_iou_loss(*a, impl=impl)  # noqa: E731
    inputs = tuple(t.requires_grad_(True) for t in inputs)
    expected = call("torch", *inputs)
    with pytest.raises(KernelFailure):
        call("triton", *inputs)
    # "auto" never picks triton on CPU; force the fused path as "auto" would on a GPU.
    monkeypatch.setattr(f"visionblocks.ops.{op_module}.resolve_impl", lambda *a: "triton")
    with pytest.warns(RuntimeWarning, match=f"'{op}' failed on cpu"):
        out = call("auto", *inputs)
    assert_close(out, expected)
    assert resolve_impl("torch", op, *inputs) == "torch"
