"""Sliding-window (unfold-based) local ops: neighbourhoods and per-pixel dynamic filters.

`sliding_windows` materialises every pixel's ``k x k`` neighbourhood, ``k*k`` times the
input's memory. `local_filter2d` computes a weighted sum of neighbourhoods without building
them: its torch formula (one shifted view per tap, plain autograd) runs for
``impl="torch"``, ``torch.compile`` and ``torch.export``; eager CPU calls with
``impl="auto"`` run a chunked rewrite (no double backward) and CUDA a fused Triton kernel
(`visionblocks.kernels.local_filter`). Results are contiguous NCHW, also for channels_last.

Convention:
    Windows are centred: tap ``t = i*k + j`` (row-major, ``0 <= i, j < k``) of the window at
    output pixel ``(h, w)`` reads input pixel ``(h*s + (i - k//2)*d, w*s + (j - k//2)*d)``
    for dilation ``d`` and stride ``s``; positions outside the image read zero. Only odd
    ``k``. With stride ``s`` the output is ``(ceil(H / s), ceil(W / s))``: windows centred
    on every ``s``-th pixel, as ``F.unfold(x, k, dilation=d, padding=d*(k//2), stride=s)``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import check_type
from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import forced_triton, recording, use_triton
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_floating,
    check_tensor,
    compute_dtype,
)
from visionblocks.ops._local_filter_torch import LocalFilterFunction

__all__ = ["local_filter2d", "sliding_windows"]
__dir__ = public_dir(__name__, __all__)


def check_window(kernel_size: int, dilation: int, stride: int = 1) -> None:
    """Validate a window: odd ``kernel_size >= 1``, ``dilation >= 1``, ``stride >= 1`` (ints).

    Examples:
        >>> check_window(4, 1)
        Traceback (most recent call last):
        ...
        ValueError: kernel_size must be odd (windows are centred), got 4
    """
    for name, value in (("kernel_size", kernel_size), ("dilation", dilation), ("stride", stride)):
        if isinstance(value, bool):
            raise TypeError(f"{name} must be int, got bool ({value!r})")
        check_type(name, value, int)
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (windows are centred), got {kernel_size}")


def effective_window(kernel_size: int, dilation: int, height: int, width: int) -> tuple[int, int]:
    """The smallest ``(kernel_size, dilation)`` that reads the same pixels of an image.

    Taps past the image read zeros (or are masked), so absurd sizes (``dilation=10**9``)
    need no absurd padding.

    Examples:
        >>> effective_window(7, 10**9, 5, 4)
        (1, 5)
        >>> effective_window(10**9 + 1, 1, 5, 4)
        (9, 1)
    """
    extent = max(height, width, 1)
    dilation = min(dilation, extent)
    half = min(kernel_size // 2, (extent - 1) // dilation)
    return 2 * half + 1, dilation


def _check_image(name: str, x: Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must have shape (B, C, H, W), got {tuple(x.shape)}")


def sliding_windows(x: Tensor, kernel_size: int, dilation: int = 1) -> Tensor:
    """Every pixel's zero-padded ``k x k`` neighbourhood (the unfold view, materialised).

    ``windows[b, c, i*k + j, h, w] = x[b, c, h + (i - k//2)*d, w + (j - k//2)*d]``, zero
    outside the image: ``F.unfold(x, k, dilation=d, padding=d*(k//2))`` reshaped, for any
    dtype; differentiable.

    Args:
        x (Tensor[B, C, H, W]): Input, any dtype.
        kernel_size: Window side ``k``, odd.
        dilation: Spacing ``d`` between window taps.

    Returns:
        Tensor[B, C, k*k, H, W]: A new tensor in ``x``'s dtype (also under ``torch.autocast``).

    Raises:
        TypeError: ``x`` not a tensor, or non-int ``kernel_size``/``dilation``.
        ValueError: ``x`` not 4-D, an even or non-positive ``kernel_size``, ``dilation < 1``,
            or a ``kernel_size`` so large that no machine could hold the result.

    Examples:
        >>> import torch
        >>> x = torch.arange(9.0).view(1, 1, 3, 3)
        >>> w = sliding_windows(x, 3)
        >>> w[0, 0, :, 1, 1]  # the centre pixel sees the whole image
        tensor([0., 1., 2., 3., 4., 5., 6., 7., 8.])
        >>> w[0, 0, :, 0, 0]  # a corner sees zeros outside
        tensor([0., 0., 0., 0., 0., 1., 0., 3., 4.])
    """
    check_tensor("x", x)
    _check_image("x", x)
    check_window(kernel_size, dilation)
    b, c, h, w = x.shape
    check_allocation("the windows", (b, c, kernel_size * kernel_size, h, w), x.dtype)
    if x.numel() == 0:  # F.pad / unfold reject empty spatial dims
        return x.new_zeros(b, c, kernel_size * kernel_size, h, w)
    dilation = effective_window(kernel_size, dilation, h, w)[1]
    pad, span = dilation * (kernel_size // 2), dilation * (kernel_size - 1) + 1
    xp = F.pad(x, (pad, pad, pad, pad))
    win = xp.unfold(2, span, 1).unfold(3, span, 1)[..., ::dilation, ::dilation]
    return win.permute(0, 1, 4, 5, 2, 3).reshape(b, c, kernel_size * kernel_size, h, w)


def local_filter2d(
    x: Tensor,
    kernels: Tensor,
    kernel_size: int,
    dilation: int = 1,
    *,
    stride: int = 1,
    impl: Literal["auto", "torch", "triton"] = "auto",
) -> Tensor:
    """Filter every pixel with its own ``k x k`` kernel, shared by a group of channels.

    ``out[b, c, h, w] = sum_ij kernels[b, g*k*k + i*k + j, h, w] * x[b, c, h*s + (i - k//2)*d,
    w*s + (j - k//2)*d]`` with ``g = c // (C // G)``, zero outside the image: the dynamic
    filter of involution (``G`` groups), dynamic filter networks and CARAFE-style
    reassembly (``G = 1``), or a per-pixel depthwise filter (``G = C``); the windowed sum of
    `sliding_windows` (see the example) without building it; differentiable in ``x`` and
    ``kernels``. Module form: `visionblocks.nn.LocalFilter2d` (``local_filter``: a deprecated
    alias, removed in 0.3).

    Args:
        x (Tensor[B, C, H, W]): Input, floating point.
        kernels (Tensor[B, G*k*k, Ho, Wo]): Per-pixel kernels, floating point; ``G`` divides
            ``C``; ``(Ho, Wo) = (ceil(H / s), ceil(W / s))`` (``(H, W)`` at stride 1).
        kernel_size: Window side ``k``, odd.
        dilation: Spacing ``d`` between window taps.
        stride: Output stride ``s`` (windows centred on every ``s``-th pixel).
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (fused kernel,
            `visionblocks.kernels.local_filter`).

    Returns:
        Tensor[B, C, Ho, Wo]: In the promoted dtype of ``x`` and ``kernels`` (half inputs
        accumulate in float32; ``torch.autocast`` lowers nothing).

    Raises:
        TypeError: Non-tensor or non-floating (e.g. integer) inputs, or non-int
            ``kernel_size``/``dilation``/``stride``.
        ValueError: Inputs not 4-D, an even ``kernel_size``, ``dilation``/``stride < 1``,
            ``kernels`` not ``G*k*k`` channels with ``G`` dividing ``C``, mismatched sizes or
            devices, or an unknown ``impl``.
        RuntimeError: ``impl="triton"`` where triton cannot run.

    Examples:
        >>> import torch
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> ones = torch.ones(1, 9, 4, 4)  # a 3x3 box sum at every pixel
        >>> local_filter2d(x, ones, 3)[0, 0]
        tensor([[10., 18., 24., 18.],
                [27., 45., 54., 39.],
                [51., 81., 90., 63.],
                [42., 66., 72., 50.]])
        >>> x = torch.randn(2, 8, 5, 5)
        >>> kernels = torch.randn(2, 2 * 9, 5, 5)  # G = 2 groups of 4 channels
        >>> ref = (sliding_windows(x, 3).view(2, 2, 4, 9, 5, 5)
        ...        * kernels.view(2, 2, 1, 9, 5, 5)).sum(3).view(2, 8, 5, 5)
        >>> torch.allclose(local_filter2d(x, kernels, 3), ref, atol=1e-5)
        True

    References:
        Li et al., "Involution: Inverting the Inherence of Convolution for Visual
        Recognition", CVPR 2021. https://arxiv.org/abs/2103.06255
    """
    check_floating("x", x)
    check_floating("kernels", kernels)
    _check_image("x", x)
    _check_image("kernels", kernels)
    check_window(kernel_size, dilation, stride)
    b, c, h, w = x.shape
    taps = kernel_size * kernel_size
    out_size = (-(-h // stride), -(-w // stride))
    groups = kernels.shape[1] // taps
    if kernels.shape[1] % taps or groups == 0 or c % groups:
        raise ValueError(
            f"kernels must have G*k*k channels with G dividing C = {c} (k*k = {taps}), "
            f"got {kernels.shape[1]} channels"
        )
    if kernels.shape[0] != b or tuple(kernels.shape[2:]) != out_size:
        raise ValueError(
            f"kernels must have shape ({b}, G*{taps}, {out_size[0]}, {out_size[1]}) for x of "
            f"shape {tuple(x.shape)} and stride {stride}, got {tuple(kernels.shape)}"
        )
    if x.device != kernels.device:
        raise ValueError(
            f"x and kernels must be on the same device, got {x.device} and {kernels.device}"
        )
    triton = use_triton("local_filter", impl, x, kernels)
    dilation = effective_window(kernel_size, dilation, h, w)[1]
    dtype = torch.promote_types(x.dtype, kernels.dtype)
    x, kernels = x.to(dtype), kernels.to(dtype)
    args = (x, kernels, kernel_size, dilation, stride)
    if triton:
        from visionblocks.kernels.local_filter import local_filter_triton

        return local_filter_triton(*args, reference=None if forced_triton(impl) else _local_filter)
    if cpu_fast_path(impl, x):
        return LocalFilterFunction.apply(*args)
    return _local_filter(*args)


def cpu_fast_path(impl: str, x: Tensor) -> bool:
    """Whether to run the chunked CPU rewrite: eager (not recorded) CPU calls given
    ``impl="auto"``; the process default only decides about triton."""
    return impl == "auto" and x.device.type == "cpu" and not recording()


def _local_filter(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int, stride: int
) -> Tensor:
    """The formula of `local_filter2d` (inputs validated, one dtype): per tap, a strided
    view of the zero-padded input times the tap's kernel, added up (half in float32)."""
    b, c, h, w = x.shape
    ho, wo = kernels.shape[2:]
    taps = kernel_size * kernel_size
    groups = kernels.shape[1] // taps
    cdt = compute_dtype(x.dtype)
    pad = dilation * (kernel_size // 2)
    xp = F.pad(x.to(cdt).contiguous(), (pad, pad, pad, pad))
    xp = xp.view(b, groups, c // groups, h + 2 * pad, w + 2 * pad)
    weights = kernels.to(cdt).contiguous().view(b, groups, taps, 1, ho, wo).unbind(2)
    out = xp.new_zeros(())
    for t, weight in enumerate(weights):
        y, z = (t // kernel_size) * dilation, (t % kernel_size) * dilation
        window = xp[..., y : y + stride * ho : stride, z : z + stride * wo : stride]
        out = out.addcmul(weight, window)
    return out.reshape(b, c, ho, wo).to(x.dtype)


_DEPRECATED = {"local_filter": ("local_filter2d", "0.3")}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
