"""`deform_conv2d`: torchvision's kernel (same values and gradients), checked inputs, half
precision computed in float32, compile and fake CUDA."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops
from torch._subclasses.fake_tensor import FakeTensorMode

from visionblocks.ops import deform_conv2d


def _inputs(dtype=torch.float64, mask=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 10, generator=g, dtype=dtype)
    offset = torch.randn(2, 2 * 2 * 9, 5, 5, generator=g, dtype=dtype)
    weight = torch.randn(6, 2, 3, 3, generator=g, dtype=dtype)
    bias = torch.randn(6, generator=g, dtype=dtype)
    m = torch.rand(2, 2 * 9, 5, 5, generator=g, dtype=dtype) if mask else None
    return x, offset, weight, bias, m


@pytest.mark.parametrize("mask", [True, False])
def test_equals_torchvision_with_gradients(mask):
    x, offset, weight, bias, m = _inputs(mask=mask)
    leaves = [t.clone().requires_grad_() for t in (x, offset, weight, bias)]
    peer = [t.clone().requires_grad_() for t in (x, offset, weight, bias)]
    ours = deform_conv2d(*leaves, stride=2, padding=(1, 2), dilation=(1, 2), mask=m)
    ref = torchvision.ops.deform_conv2d(*peer, stride=2, padding=(1, 2), dilation=(1, 2), mask=m)
    assert torch.equal(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    for a, b in zip(leaves, peer, strict=True):
        assert torch.equal(a.grad, b.grad)


def test_zero_offsets_are_a_convolution():
    x, _, weight, bias, _ = _inputs(mask=False)
    offset = torch.zeros(2, 2 * 9, 9, 10, dtype=torch.float64)
    out = deform_conv2d(x, offset, weight, bias, padding=1)
    ref = torch.nn.functional.conv2d(x, weight, bias, padding=1, groups=2)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    x, offset, weight, bias, m = (t.to(dtype) for t in _inputs())
    out = deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=m)
    ref = torchvision.ops.deform_conv2d(
        *(t.float() for t in (x, offset, weight, bias)), stride=2, padding=1, mask=m.float()
    )
    assert out.dtype == dtype and torch.equal(out, ref.to(dtype))


def test_compiles_and_runs_on_fake_cuda():
    x, offset, weight, bias, m = (t.float() for t in _inputs())
    fn = torch.compile(
        lambda x, o, w, b, m: deform_conv2d(x, o, w, b, stride=2, padding=1, mask=m),
        fullgraph=True,
        backend="aot_eager",
    )
    torch.testing.assert_close(
        fn(x, offset, weight, bias, m), deform_conv2d(x, offset, weight, bias, 2, 1, mask=m)
    )
    with FakeTensorMode():
        fake = [torch.empty(t.shape, device="cuda") for t in (x, offset, weight, bias, m)]
        assert deform_conv2d(*fake[:4], stride=2, padding=1, mask=fake[4]).shape == (2, 6, 5, 5)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"offset": torch.zeros(2, 17, 5, 5)}, "offset must have 2 \\* offset_groups \\* 9"),
        ({"offset": torch.zeros(2, 36, 4, 5)}, r"offset must have shape \(2, 36, 5, 5\)"),
        ({"weight": torch.zeros(6, 3, 3, 3)}, "does not fit input with 4 channels"),
        ({"mask": torch.zeros(2, 9, 5, 5)}, r"mask must have shape \(2, 18, 5, 5\)"),
        ({"bias": torch.zeros(5)}, r"bias must have shape \(6,\)"),
        (
            {"weight": torch.zeros(6, 2, 3, 3, dtype=torch.float64)},
            "weight has dtype torch.float64",
        ),
        ({"stride": 0}, "stride must be in"),
        ({"padding": (1, 2, 3)}, "padding must be an int or a pair"),
        ({"input": torch.zeros(2, 4, 1, 1), "padding": 0}, "the output would be empty"),
    ],
)
def test_errors_name_the_argument(change, match):
    x, offset, weight, bias, m = (t.float() for t in _inputs())
    kwargs = {"input": x, "offset": offset, "weight": weight, "bias": bias, "mask": m,
              "stride": 2, "padding": 1, **change}  # fmt: skip
    with pytest.raises(ValueError, match=match):
        deform_conv2d(**kwargs)


def test_empty_kernel_is_refused():
    """A weight with ``kh = 0`` divided by zero while the offset channels were counted."""
    x = torch.randn(1, 4, 8, 8)
    with pytest.raises(ValueError, match="kernel not empty"):
        deform_conv2d(x, torch.zeros(1, 0, 10, 8), torch.randn(6, 4, 0, 3), padding=1)


def test_meta_tensors_give_the_shape():
    """Meta tensors run torchvision's meta kernel (autocast was asked about the meta device)."""
    x, offset, weight, bias, m = (t.float().to("meta") for t in _inputs())
    out = deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=m)
    assert out.device.type == "meta" and out.shape == (2, 6, 5, 5)


_NAN_OFFSETS = """
import torch
from visionblocks.ops import deform_conv2d
x, w = torch.randn(1, 4, 8, 8), torch.randn(6, 4, 3, 3)
one = torch.zeros(1, 18, 8, 8)
one[0, 4, 2, 3] = float("nan")
for offset in (torch.full((1, 18, 8, 8), float("nan")), one):
    try:
        deform_conv2d(x, offset, w, padding=1)
    except ValueError as e:
        print("refused:", e)
"""


def test_nan_offsets_do_not_crash_the_process():
    """torchvision's CPU kernel casts NaN sampling coordinates to ``int`` and reads out of
    bounds: all-NaN offsets were a segmentation fault, one NaN gave finite numbers (run in a
    subprocess)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _NAN_OFFSETS], capture_output=True, text=True)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.count("refused: offset must hold finite values, got nan") == 2
    assert "at (0, 4, 2, 3)" in run.stdout


@pytest.mark.parametrize("value", [float("inf"), -float("inf")])
def test_infinite_offsets_are_refused_on_cpu(value):
    """An infinite offset is an undefined ``int`` cast in torchvision's CPU kernel (NaN: the
    subprocess test above); with value checks off the kernel runs unchecked."""
    import visionblocks

    x, offset, weight, bias, m = (t.float() for t in _inputs())
    offset[1, 7, 2, 3] = value
    with pytest.raises(ValueError, match=r"offset must hold finite values, got .* \(1, 7, 2, 3\)"):
        deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=m)
    offset[1, 7, 2, 3] = 1e38  # large but finite: read as outside the input
    deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=m)
    deform_conv2d(x.double(), offset.double().fill_(1e308), weight.double(), padding=1,
                  stride=2)  # fmt: skip
    with visionblocks.value_checks(False):
        offset[1, 7, 2, 3] = float("inf")
        deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=m)
