"""Rotated RoI align: bilinear average pooling of rotated boxes (rotated Faster R-CNN heads).

The torch formula (`_rotated_roi_align`: sample points, four bilinear taps each, summed
with ``F.embedding_bag``) is the reference and the CPU path; on CUDA a Triton kernel
(`visionblocks.kernels.rotated_roi_align`) runs a forward and an atomic-free backward.

Convention:
    ``rois`` is ``(K, 6)``: the batch index, then the box ``(cx, cy, w, h, r)`` in our
    ``"cxcywhr"`` format (`visionblocks.ops.rotated`): centre and size in input pixels
    (scaled by ``spatial_scale``), ``r`` in **degrees**, counter-clockwise on screen. The
    box's width axis is ``u = (cos r, -sin r)`` and its height axis ``v = (sin r, cos r)``;
    output row ``i`` runs along ``v``, column ``j`` along ``u``, from the corner at
    ``-w/2 u - h/2 v``, so ``r = 0`` is torchvision's ``roi_align`` with ``aligned=True``
    on the box ``(cx - w/2, cy - h/2, cx + w/2, cy + h/2)``. Pixel centres are at integer
    coordinates plus 0.5 (the half-pixel shift of ``aligned=True``). A negative ``w`` or
    ``h`` is read as its absolute value (the same rectangle). Other libraries:

    - detectron2 ``ROIAlignRotated`` (``detectron2/layers/roi_align_rotated.py``): rois
      ``(batch, x_ctr, y_ctr, w, h, angle)`` in degrees, counter-clockwise: the same
      numbers; the same sampling (it is always "aligned").
    - mmcv ``roi_align_rotated`` / ``RoIAlignRotated`` (``mmcv/ops/roi_align_rotated.py``):
      the angle ``t`` is in **radians**; with ``clockwise=False`` use
      ``r = t * 180 / pi``, with ``clockwise=True`` (mmrotate's configs) ``r = -t * 180 / pi``.
      Its ``aligned=True`` (the default) is this op; the legacy ``aligned=False`` (no half-pixel
      shift, sides at least 1) has no counterpart.
    - mmcv's and detectron2's ``sampling_ratio=0`` is ``sampling_ratio <= 0`` here.

    Sampling, as in both references: each of the ``ph x pw`` bins holds a ``gh x gw`` grid
    of points (``sampling_ratio`` per side, or ``gh = ceil(h / ph)`` and
    ``gw = ceil(w / pw)`` per RoI for ``sampling_ratio <= 0``); a point at ``(y, x)``
    outside ``[-1, H] x [-1, W]`` is 0, otherwise it is clamped into ``[0, H - 1] x
    [0, W - 1]`` and read bilinearly; a bin is the mean of its points (0 when it has none).

    Adaptive sampling (``sampling_ratio <= 0``) is per RoI. The kernel and the CPU formula
    are exact for every RoI. Where the formula cannot read the RoIs on the host (CUDA tensors
    without the kernel, ``torch.compile``, ``torch.export``, fake tensors) it samples a fixed
    ``ceil((H + W) / ph) x ceil((H + W) / pw)`` grid per bin and masks the points a RoI does
    not have: exact for every RoI whose sides are at most ``H + W`` feature pixels (any box
    that fits in the feature map at any angle); a larger RoI is averaged over the first
    that many points of each bin side only, unlike the references. That grid is costly on
    large maps (time and memory grow with its square): give ``sampling_ratio > 0`` there.

    The result is differentiable with respect to ``input``, not ``rois`` (as the references).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_finite, check_int, check_number, check_type
from visionblocks._core.dispatch import (
    assert_on_device,
    asserts_on_device,
    forced_triton,
    has_values,
    reads_values,
    recording,
    use_triton,
)
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_floating,
    check_same_device,
    compute_dtype,
)
from visionblocks.ops.roi_align import _MAX_SAMPLES, _check_map  # the RoI ops' limits

__all__ = ["RotatedRoIAlign", "rotated_roi_align"]
__dir__ = public_dir(__name__, __all__)

_GRID_LIMIT = 2**24
"""Sample points per bin side are clamped to this (float32 holds it exactly)."""


def _output_size(output_size: int | tuple[int, int]) -> tuple[int, int]:
    check_type("output_size", output_size, (int, tuple, list))
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    if len(output_size) != 2 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in output_size
    ):
        raise ValueError(f"output_size must be an int or two ints >= 1, got {output_size!r}")
    return int(output_size[0]), int(output_size[1])


def _check_args(input: Tensor, rois: Tensor, spatial_scale: float, sampling_ratio: int) -> None:
    check_floating("input", input)
    check_floating("rois", rois)
    _check_map("input", input)
    if rois.dim() != 2 or rois.shape[1] != 6:
        raise ValueError(
            "rois must have shape (K, 6) (batch index, cx, cy, w, h, angle), "
            f"got {tuple(rois.shape)}"
        )
    check_same_device(input=input, rois=rois)
    check_finite(
        "spatial_scale", check_number("spatial_scale", spatial_scale, 0.0, low_inclusive=False)
    )
    check_int("sampling_ratio", sampling_ratio, None, _MAX_SAMPLES)


def _check_values(rois: Tensor, batch: int) -> None:
    """RoIs finite, batch indices integers in ``[0, batch)`` (CPU: raise; CUDA: assert)."""
    message = (
        f"rotated_roi_align: rois must be finite, with integer batch indices in [0, {batch}) "
        f"(input holds {batch} images)"
    )
    if reads_values(rois) or asserts_on_device(rois):
        index = rois[:, 0].detach()
        ok = rois.detach().isfinite().all(1) & (index >= 0) & (index < batch)
        ok = ok & (index == index.trunc())
        if rois.is_cuda:
            assert_on_device(ok, message)
        elif not bool(ok.all()):
            bad = int((~ok).nonzero()[0, 0])
            raise ValueError(f"{message}; row {bad} is {rois[bad].tolist()}")


def _frames(
    rois: Tensor, spatial_scale: float, output_size: tuple[int, int], sampling_ratio: int,
    dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """Per RoI ``(K, 12)`` in ``dtype``: batch, cx, cy, cos, sin, start_w, start_h, bin_w,
    bin_h, gw, gh, count; the references' arithmetic (the centre shifted by half a pixel)."""
    rois = rois.detach().to(dtype)
    ph, pw = output_size
    cx = rois[:, 1] * spatial_scale - 0.5
    cy = rois[:, 2] * spatial_scale - 0.5
    width = (rois[:, 3] * spatial_scale).abs()
    height = (rois[:, 4] * spatial_scale).abs()
    theta = (rois[:, 5].to(torch.float64) * (math.pi / 180.0)).to(dtype)
    bin_w, bin_h = width / pw, height / ph
    if sampling_ratio > 0:
        gw = gh = torch.full_like(width, float(sampling_ratio))
    else:  # NaN sizes (value checks off) sample nothing
        gw = torch.nan_to_num(torch.ceil(width / pw), nan=0.0).clamp(max=_GRID_LIMIT)
        gh = torch.nan_to_num(torch.ceil(height / ph), nan=0.0).clamp(max=_GRID_LIMIT)
    count = (gw * gh).clamp(min=1.0)
    columns = (rois[:, 0], cx, cy, theta.cos(), theta.sin(), -width / 2, -height / 2)
    return torch.stack((*columns, bin_w, bin_h, gw, gh, count), 1)


def _grid_bound(
    frames: Tensor, input: Tensor, output_size: tuple[int, int], sampling_ratio: int
) -> tuple[int, int]:
    """Sample points per bin side the formula lays out: ``sampling_ratio``; for adaptive
    sampling the RoIs' maximum where they can be read on the host, else the fixed bound
    of the module notes."""
    if sampling_ratio > 0:
        return sampling_ratio, sampling_ratio
    if not recording() and frames.device.type == "cpu" and has_values(frames):
        gw, gh = frames[:, 9:11].amax(0).tolist() if frames.shape[0] else (1, 1)
        if max(gw, gh) > _MAX_SAMPLES:
            raise ValueError(
                f"rois take up to {int(gh)} x {int(gw)} sample points per bin with "
                "sampling_ratio <= 0 (ceil(side * spatial_scale / bins) per side); at most "
                f"{_MAX_SAMPLES} per side: give a sampling_ratio in [1, {_MAX_SAMPLES}]"
            )
        return max(int(gh), 1), max(int(gw), 1)  # not 0: F.embedding_bag needs a bag
    span = input.shape[-2] + input.shape[-1]
    return -(-span // output_size[0]), -(-span // output_size[1])


def rotated_roi_align(
    input: Tensor,
    rois: Tensor,
    output_size: int | tuple[int, int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    *,
    impl: Literal["auto", "torch", "triton"] = "auto",
) -> Tensor:
    """RoI align of rotated boxes: a ``ph x pw`` grid of bilinear averages per RoI.

    detectron2's ``ROIAlignRotated`` and mmcv's ``roi_align_rotated`` (``aligned=True``)
    with the angle in our convention (see the module notes for both conversions).

    Args:
        input (Tensor[N, C, H, W]): Feature maps, floating point.
        rois (Tensor[K, 6]): ``(batch index, cx, cy, w, h, angle)``, angle in degrees,
            counter-clockwise on screen; coordinates in the units ``spatial_scale`` maps to
            ``input`` pixels.
        output_size: ``ph`` or ``(ph, pw)``, bins per RoI.
        spatial_scale: Factor from RoI coordinates to ``input`` pixels (> 0), e.g. 1/16.
        sampling_ratio: Sample points per bin side (at most 1024); ``<= 0``: ``ceil(side /
            bins)`` per RoI (at most 1024 where the RoIs are read on the host).
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``
            (`visionblocks.kernels.rotated_roi_align`).

    Returns:
        Tensor[K, C, ph, pw]: In ``input``'s dtype (half inputs computed in float32),
        differentiable with respect to ``input``.

    Raises:
        TypeError: Non-tensor or non-floating inputs, non-int ``output_size`` or
            ``sampling_ratio``, non-number ``spatial_scale``.
        ValueError: Wrong shapes or devices, ``output_size < 1``, ``spatial_scale`` not
            finite and > 0, ``sampling_ratio > 1024`` (or adaptive sampling past it on
            CPU), non-finite RoIs or batch indices not integers in ``[0, N)`` (a value
            check: CPU raises, CUDA asserts on the device), an unknown ``impl``.
        RuntimeError: ``impl="triton"`` where triton cannot run.

    Examples:
        >>> import torch
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> rois = torch.tensor([[0, 2.0, 2.0, 2.0, 2.0, 0.0]])  # the centre 2x2 pixels
        >>> rotated_roi_align(x, rois, 2, sampling_ratio=1)[0, 0]
        tensor([[ 5.,  6.],
                [ 9., 10.]])
        >>> quarter = torch.tensor([[0, 2.0, 2.0, 2.0, 2.0, 90.0]])  # turned 90 degrees
        >>> rotated_roi_align(x, quarter, 2, sampling_ratio=1)[0, 0]
        tensor([[ 9.,  5.],
                [10.,  6.]])
    """
    _check_args(input, rois, spatial_scale, sampling_ratio)
    size = _output_size(output_size)
    triton = use_triton("rotated_roi_align", impl, input, rois)
    _check_values(rois, input.shape[0])
    frames = _frames(rois, spatial_scale, size, sampling_ratio, compute_dtype(input.dtype))
    grid = _grid_bound(frames, input, size, sampling_ratio)
    check_allocation(
        "the sample points of rotated_roi_align (output_size, sampling_ratio)",
        (rois.shape[0], *size, *grid, 4), torch.int64,
    )  # fmt: skip
    args = (input, frames, size, grid)
    if triton:
        from visionblocks.kernels.rotated_roi_align import rotated_roi_align_triton

        fallback = None if forced_triton(impl) else _rotated_roi_align
        return rotated_roi_align_triton(*args, reference=fallback)
    return _rotated_roi_align(*args)


def _rotated_roi_align(
    input: Tensor, frames: Tensor, output_size: tuple[int, int], grid: tuple[int, int]
) -> Tensor:
    """The formula: ``grid = (gh, gw)`` sample points per bin side (those past a RoI's own
    count masked), four bilinear taps each, weighted sums of rows of the channels-last
    input (plus one zero row for the taps left out) by ``F.embedding_bag``."""
    n, c, height, width = input.shape
    (ph, pw), (grid_h, grid_w), dtype = output_size, grid, frames.dtype
    k = frames.shape[0]
    batch, cx, cy, cos, sin, start_w, start_h, bin_w, bin_h, gw, gh, count = (
        f.view(k, 1, 1, 1, 1) for f in frames.unbind(1)
    )
    arange = lambda m: torch.arange(m, device=input.device, dtype=dtype)  # noqa: E731
    bins_y, bins_x = arange(ph).view(1, ph, 1, 1, 1), arange(pw).view(1, 1, pw, 1, 1)
    iy, ix = arange(grid_h).view(1, 1, 1, grid_h, 1), arange(grid_w).view(1, 1, 1, 1, grid_w)
    # (K, ph, pw, gh, gw) points, evaluated in the references' order.
    yy = start_h + bins_y * bin_h + (iy + 0.5) * bin_h / gh
    xx = start_w + bins_x * bin_w + (ix + 0.5) * bin_w / gw
    y = yy * cos - xx * sin + cy
    x = yy * sin + xx * cos + cx
    keep = (iy < gh) & (ix < gw) & (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    y = torch.where(keep, y, 0).clamp(0, height - 1)
    x = torch.where(keep, x, 0).clamp(0, width - 1)
    y0, x0 = y.floor(), x.floor()
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    y0, x0 = y0.long(), x0.long()
    y1, x1 = (y0 + 1).clamp(max=height - 1), (x0 + 1).clamp(max=width - 1)
    base = batch.long() * (height * width)
    taps = torch.stack(
        [base + y0 * width + x0, base + y0 * width + x1, base + y1 * width + x0,
         base + y1 * width + x1], -1,
    )  # fmt: skip
    weights = torch.stack([hy * hx, hy * lx, ly * hx, ly * lx], -1)
    keep, bags = keep.unsqueeze(-1), (k * ph * pw, grid_h * grid_w * 4)
    taps = torch.where(keep, taps, n * height * width).view(bags)
    weights = torch.where(keep, weights, 0).view(bags)
    rows = input.new_empty(n * height * width + 1, c, dtype=dtype)  # one copy, channels last
    rows[:-1].view(n, height, width, c).copy_(input.permute(0, 2, 3, 1))
    rows[-1] = 0
    out = F.embedding_bag(taps, rows, per_sample_weights=weights, mode="sum")
    out = out.view(k, ph, pw, c) / count.view(k, 1, 1, 1)
    return out.permute(0, 3, 1, 2).contiguous().to(input.dtype)


class RotatedRoIAlign(nn.Module):
    """Module form of `rotated_roi_align` (detectron2's ``ROIAlignRotated``).

    Args:
        output_size: ``ph`` or ``(ph, pw)``.
        spatial_scale: Factor from RoI coordinates to input pixels (> 0).
        sampling_ratio: Sample points per bin side; ``<= 0``: adaptive.

    Examples:
        >>> layer = RotatedRoIAlign(7, spatial_scale=1 / 16, sampling_ratio=2)
        >>> rois = torch.tensor([[0, 64.0, 64.0, 96.0, 32.0, 30.0]])
        >>> layer(torch.randn(1, 8, 16, 16), rois).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(
        self,
        output_size: int | tuple[int, int],
        spatial_scale: float = 1.0,
        sampling_ratio: int = -1,
    ) -> None:
        super().__init__()
        self.output_size = _output_size(output_size)
        check_finite(
            "spatial_scale", check_number("spatial_scale", spatial_scale, 0.0, low_inclusive=False)
        )
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = check_int("sampling_ratio", sampling_ratio, None, _MAX_SAMPLES)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return rotated_roi_align(
            input, rois, self.output_size, self.spatial_scale, self.sampling_ratio
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}"
        )
