"""Deformable convolution (v1 and, with a mask, v2; Dai et al., 2017; Zhu et al., 2019).

`deform_conv2d` runs torchvision's compiled ``torchvision::deform_conv2d`` (CPU and CUDA
kernels, autograd, a meta kernel for ``torch.compile`` and fake tensors) after checking every
shape against the others, where torchvision's kernel would fail with an assertion deep inside
or read out of bounds. Half-precision inputs are computed in float32. On CPU a value check
(`visionblocks.set_value_checks`) refuses NaN and infinite offsets: torchvision's CPU kernel
casts the sampling coordinates to ``int`` (undefined for them), reads out of bounds and
crashes the process, or returns numbers. CUDA offsets are not read on the host.

Convention:
    Offsets are ``(dy, dx)`` pairs per kernel tap, row-major over the ``kh x kw`` taps, for
    each of ``offset_groups`` groups of input channels: ``offset[:, 2 * (g * kh * kw + k)]``
    is ``dy`` of tap ``k`` in group ``g`` (torchvision's and mmcv's layout). A tap samples
    the input bilinearly at its regular position plus its offset; outside the input it reads
    zero. ``mask`` (v2) multiplies each sampled value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.amp.autocast_mode import is_autocast_available

from visionblocks._core.checks import check_int
from visionblocks._core.dispatch import reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, check_same_device, compute_dtype

__all__ = ["deform_conv2d"]
__dir__ = public_dir(__name__, __all__)

_MAX = 1024


def _pair(name: str, value: object, low: int) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
        return (check_int(name, value[0], low, _MAX), check_int(name, value[1], low, _MAX))
    check_int(name, value, low, _MAX)
    return (value, value)  # type: ignore[return-value]


def _check_4d(name: str, value: object, shape: str) -> Tensor:
    check_floating(name, value)
    if value.dim() != 4:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    return value


def _check_offset(offset: Tensor) -> None:
    """Refuse NaN or infinite offsets (undefined ``int`` casts in torchvision's CPU kernel)."""
    total = offset.detach().sum().item()  # finite unless an offset is not, or the sum overflows
    if not math.isfinite(total) and not torch.isfinite(offset).all():
        bad = torch.isfinite(offset).logical_not().nonzero()[0].tolist()
        raise ValueError(
            f"offset must hold finite values, got {offset[tuple(bad)].item()} at {tuple(bad)} "
            "(torchvision's CPU kernel reads out of bounds on it)"
        )


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    mask: Tensor | None = None,
) -> Tensor:
    """Deformable 2-D convolution: torchvision's ``deform_conv2d`` with checked inputs.

    Args:
        input (Tensor[B, C_in, H, W]): Input, floating point.
        offset (Tensor[B, 2 * G * kh * kw, H_out, W_out]): Offsets of the taps (the module's
            Convention); ``G`` (offset groups) must divide ``C_in``.
        weight (Tensor[C_out, C_in / groups, kh, kw]): Convolution weights; ``C_in`` must be a
            multiple of ``weight.shape[1]`` (the groups) and ``C_out`` of the groups.
        bias (Tensor[C_out]): Optional bias.
        stride: Stride, an int or a pair (``>= 1``).
        padding: Zero padding, an int or a pair (``>= 0``).
        dilation: Dilation, an int or a pair (``>= 1``).
        mask (Tensor[B, G * kh * kw, H_out, W_out]): Optional modulation (v2).

    Returns:
        Tensor[B, C_out, H_out, W_out]: With ``H_out = (H + 2 * pad - dil * (kh - 1) - 1) //
        stride + 1`` (the same for ``W``); the input's dtype (float16 and bfloat16 computed in
        float32, where torchvision's CPU kernel has no bfloat16).

    Raises:
        TypeError: Non-tensor or non-floating tensors, non-int sizes.
        ValueError: Shapes that do not fit together (an empty kernel too), tensors on
            different devices or of different dtypes (outside ``torch.autocast``, where all are
            cast to the input's compute dtype, as torchvision's), sizes out of range, NaN or
            infinite offsets on CPU (the module's value check).

    Examples:
        >>> import torch
        >>> x, w = torch.randn(1, 4, 8, 8), torch.randn(6, 4, 3, 3)
        >>> offset = torch.zeros(1, 2 * 9, 8, 8)
        >>> out = deform_conv2d(x, offset, w, padding=1)
        >>> out.shape, torch.allclose(out, torch.nn.functional.conv2d(x, w, padding=1), atol=1e-5)
        (torch.Size([1, 6, 8, 8]), True)
    """
    _check_4d("input", input, "(B, C_in, H, W)")
    _check_4d("weight", weight, "(C_out, C_in / groups, kh, kw)")
    _check_4d("offset", offset, "(B, 2 * offset_groups * kh * kw, H_out, W_out)")
    if bias is not None:
        check_floating("bias", bias)
    if mask is not None:
        _check_4d("mask", mask, "(B, offset_groups * kh * kw, H_out, W_out)")
    check_same_device(input=input, offset=offset, weight=weight, bias=bias, mask=mask)
    device = input.device.type
    autocast = is_autocast_available(device) and torch.is_autocast_enabled(device)
    for name, t in (("offset", offset), ("weight", weight), ("bias", bias), ("mask", mask)):
        if t is not None and t.dtype != input.dtype and not autocast:
            raise ValueError(f"{name} has dtype {t.dtype} but input has {input.dtype}")
    stride = _pair("stride", stride, 1)
    padding = _pair("padding", padding, 0)
    dilation = _pair("dilation", dilation, 1)
    batch, c_in, height, width = input.shape
    c_out, c_group, kh, kw = weight.shape
    if 0 in (c_out, c_group, kh, kw) or c_in % c_group or c_out % (c_in // c_group):
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit input with {c_in} channels: C_in must "
            "be a multiple of weight.shape[1] (C_in / groups), C_out of the groups, and the "
            "kernel not empty"
        )
    out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"the output would be empty ({out_h}x{out_w}) for input {height}x{width} with this "
            "weight, stride, padding and dilation"
        )
    taps = kh * kw
    groups = offset.shape[1] // (2 * taps)
    if groups == 0 or offset.shape[1] != 2 * groups * taps or c_in % groups:
        raise ValueError(
            f"offset must have 2 * offset_groups * {taps} channels with offset_groups dividing "
            f"C_in={c_in}, got {offset.shape[1]}"
        )
    if tuple(offset.shape) != (batch, 2 * groups * taps, out_h, out_w):
        raise ValueError(
            f"offset must have shape {(batch, 2 * groups * taps, out_h, out_w)} for this input, "
            f"weight, stride, padding and dilation, got {tuple(offset.shape)}"
        )
    if mask is not None and tuple(mask.shape) != (batch, groups * taps, out_h, out_w):
        raise ValueError(
            f"mask must have shape {(batch, groups * taps, out_h, out_w)}, got {tuple(mask.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise ValueError(f"bias must have shape ({c_out},), got {tuple(bias.shape)}")
    if reads_values(offset):
        _check_offset(offset)
    import torchvision.ops

    dtype = compute_dtype(input.dtype)  # torchvision's CPU kernel has no bfloat16

    def cast(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(dtype)

    out = torchvision.ops.deform_conv2d(
        input.to(dtype),
        offset.to(dtype),
        weight.to(dtype),
        cast(bias),
        stride=stride,
        padding=padding,
        dilation=dilation,
        mask=cast(mask),
    )
    return out.to(input.dtype)


torch.fx.wrap("deform_conv2d")
