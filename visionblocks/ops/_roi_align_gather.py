"""CPU `roi_align` for a fixed ``sampling_ratio > 0``: torchvision's forward, and the input
gradient as a gather instead of its scatter.

The gradient of input pixel ``q`` (a row of the ``(N * H * W, C)`` channels-last gradient) is
the weighted sum of the output bins whose bilinear samples read ``q``: the entries ``(bin,
corner)`` of the ``4 * sr * sr`` corners of each bin's samples, stably sorted by the pixel
they read, make one bag per pixel over the rows of the channels-last output gradient, summed
by one ``F.embedding_bag``. No scatter and a fixed order of additions: bitwise reproducible.

The samples follow torchvision (``roi_align_kernel.cpp``, ``roi_align_common.h`` of
pytorch/vision): ``y = start + p * bin + (i + 0.5) * bin / sr``; outside ``[-1, H]`` a sample
reads 0; inside, ``y <= 0`` reads row 0 and a low corner at or past ``H - 1`` reads row
``H - 1`` alone; ``aligned=False`` stretches rois to at least one pixel; a bin is the mean of
its ``sr * sr`` samples.

The forward can be the transpose of the same gather (``forward=True``, chosen only for calls
that need the gradient, whose samples it then finds once for both passes): one bag of ``4 *
sr * sr`` weighted rows of the channels-last input per output bin. It adds the samples in
another order than torchvision's kernel (equal to float rounding); otherwise the forward is
torchvision's kernel, bitwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


def _axis(start: Tensor, bin_size: Tensor, bins: int, sr: int, limit: int) -> tuple[Tensor, Tensor]:
    """Corner indices (int64) and weights along one axis, ``(K, bins, sr, 2)`` each."""
    p = torch.arange(bins, dtype=start.dtype, device=start.device).view(1, bins, 1)
    i = (torch.arange(sr, dtype=start.dtype, device=start.device) + 0.5).view(1, 1, sr)
    start, bin_size = start.view(-1, 1, 1), bin_size.view(-1, 1, 1)
    t = start + p * bin_size + i * bin_size / sr  # the kernel's order of operations
    valid = (t >= -1) & (t <= limit)
    t = torch.where(valid, t.clamp(min=0), 0)
    low = t.floor()
    edge = low >= limit - 1
    low = torch.where(edge, limit - 1, low)
    frac = torch.where(edge, 0, t - low)
    weights = torch.stack([1 - frac, frac], -1) * valid.unsqueeze(-1)
    index = torch.stack([low, torch.where(edge, low, low + 1)], -1).long()
    return index, weights


def _samples(
    rois: Tensor, shape: torch.Size, size: tuple[int, int], scale: float, sr: int, aligned: bool
) -> tuple[Tensor, Tensor]:
    """Input pixels ``(K * PH * PW, 4 * sr * sr)`` each bin reads, and their weights (the
    mean included)."""
    _, _, h, w = shape
    ph, pw = size
    k = rois.shape[0]
    offset = 0.5 if aligned else 0.0
    start = rois[:, 1:3] * scale - offset  # (K, 2): x, y
    extent = rois[:, 3:5] * scale - offset - start
    if not aligned:
        extent = extent.clamp(min=1)
    iy, wy = _axis(start[:, 1], extent[:, 1] / ph, ph, sr, h)
    ix, wx = _axis(start[:, 0], extent[:, 0] / pw, pw, sr, w)
    # (K, PH, PW, sample y, sample x, corner y, corner x)
    iy, wy = iy.view(k, ph, 1, sr, 1, 2, 1), wy.view(k, ph, 1, sr, 1, 2, 1)
    ix, wx = ix.view(k, 1, pw, 1, sr, 1, 2), wx.view(k, 1, pw, 1, sr, 1, 2)
    base = (rois[:, 0].long() * (h * w)).view(k, 1, 1, 1, 1, 1, 1)
    pixels = (base + iy * w + ix).view(k * ph * pw, 4 * sr * sr)
    return pixels, (wy * (wx / (sr * sr))).view(pixels.shape)


class _RoIAlign(torch.autograd.Function):
    """torchvision's forward or the gather (``gather``); the input gradient as a gather."""

    @staticmethod
    def forward(ctx, input, rois, scale, ph, pw, sr, aligned, gather):  # type: ignore[override]
        ctx.args = (input.shape, (ph, pw), scale, sr, aligned)
        if not gather:
            ctx.save_for_backward(rois)  # the samples are found in the backward
            return torch.ops.torchvision.roi_align(input, rois, scale, ph, pw, sr, aligned)
        n, c, h, w = input.shape
        pixels, weights = _samples(rois, *ctx.args)
        ctx.save_for_backward(pixels, weights)  # found once for both passes
        table = input.permute(0, 2, 3, 1).reshape(n * h * w, c)  # channels-last rows
        out = F.embedding_bag(pixels, table, mode="sum", per_sample_weights=weights)
        return out.view(rois.shape[0], ph, pw, c).permute(0, 3, 1, 2).contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        saved = ctx.saved_tensors
        pixels, weights = saved if len(saved) == 2 else _samples(*saved, *ctx.args)
        n, c, h, w = ctx.args[0]
        # sorted as one row of a 2-D tensor: serially (a 1-D sort takes a parallel radix
        # sort, whose barriers stall on a busy machine)
        sorted_pixels, order = torch.sort(pixels.view(1, -1), stable=True)
        offsets = torch.searchsorted(sorted_pixels[0], torch.arange(n * h * w))
        order = order[0]
        g = F.embedding_bag(
            order.div(pixels.shape[1], rounding_mode="floor"),  # the bin of each entry
            grad.permute(0, 2, 3, 1).reshape(-1, c),
            offsets,
            mode="sum",
            per_sample_weights=weights.view(-1)[order],
        )
        # channels-last strides, as computed: no copy (the layers before accept any strides)
        return g.view(n, h, w, c).permute(0, 3, 1, 2), *[None] * 7


def roi_align_gather(
    input: Tensor,
    rois: Tensor,
    scale: float,
    ph: int,
    pw: int,
    sr: int,
    aligned: bool,
    forward: bool = False,
) -> Tensor:
    """torchvision's ``roi_align`` (CPU, ``sr > 0``, ``rois`` ``(K, 5)`` of ``input``'s
    dtype) whose input gradient gathers; with ``forward``, the forward gathers too."""
    import torchvision.ops  # noqa: F401  (registers torch.ops.torchvision)

    return _RoIAlign.apply(input, rois, scale, ph, pw, sr, aligned, forward)
