"""Local filtering and local attention as the papers write them: ``F.unfold``, in float64.

Both ops look at every pixel's ``k x k`` neighbourhood. ``F.unfold(x, k, dilation=d,
padding=d*(k//2), stride=s)`` gathers it: column ``h*Wo + w`` holds, for every channel and
tap ``t = i*k + j``, input pixel ``(h*s + (i - k//2)*d, w*s + (j - k//2)*d)``, zero outside
the image. Everything else is a product and a sum over the taps:

- **local filter** (involution, dynamic filters): channel ``c`` of group ``g = c // (C/G)``
  is weighted by that group's per-pixel kernel, ``out = sum_t kernels[g, t] * window[c, t]``
  (Li et al., "Involution", CVPR 2021, Fig. 2 / Alg. 1);
- **local attention** (stand-alone self-attention): per head of ``D = C / heads`` channels,
  ``logits[t] = q . k_window[t] / sqrt(D)``, taps outside the image left out of the softmax
  (logit ``-inf``), ``out = sum_t softmax(logits)[t] * v_window[t]`` (Ramachandran et al.,
  NeurIPS 2019, eq. 2). The op has no relative position bias, so neither has this.

The k*k-times unfolded tensors are built on purpose: this is the oracle the fast paths are
compared against (values, and gradients through autograd), not a fast path. Inputs of any
floating dtype are computed in float64.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor


def local_filter(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int = 1, stride: int = 1
) -> Tensor:
    """``out (B, C, Ho, Wo)`` of ``x (B, C, H, W)`` and ``kernels (B, G*k*k, Ho, Wo)``, float64."""
    x, kernels = x.double(), kernels.double()
    b, c = x.shape[:2]
    ho, wo = kernels.shape[2:]
    taps = kernel_size * kernel_size
    groups = kernels.shape[1] // taps
    if x.numel() == 0 or kernels.numel() == 0:  # F.unfold rejects empty inputs
        return (x.sum() + kernels.sum()) * x.new_zeros(b, c, ho, wo)
    padding = dilation * (kernel_size // 2)
    window = F.unfold(x, kernel_size, dilation=dilation, padding=padding, stride=stride)
    window = window.view(b, groups, c // groups, taps, ho, wo)
    weights = kernels.view(b, groups, 1, taps, ho, wo)
    return (window * weights).sum(3).view(b, c, ho, wo)


def local_attention2d(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int = 1, num_heads: int = 1
) -> Tensor:
    """Multi-head attention of every pixel of ``q (B, C, H, W)`` over its window, float64."""
    q, k, v = q.double(), k.double(), v.double()
    b, c, h, w = q.shape
    depth, taps = c // num_heads, kernel_size * kernel_size
    if q.numel() == 0:
        return (q.sum() + k.sum() + v.sum()) * q.new_zeros(b, c, h, w)
    padding = dilation * (kernel_size // 2)

    def windows(x: Tensor) -> Tensor:  # (B, heads, D, taps, H*W)
        cols = F.unfold(x, kernel_size, dilation=dilation, padding=padding)
        return cols.view(b, num_heads, depth, taps, h * w)

    queries = q.reshape(b, num_heads, depth, 1, h * w)
    logits = (queries * windows(k)).sum(2) / math.sqrt(max(depth, 1))  # (B, heads, taps, H*W)
    ones = q.new_ones(1, 1, h, w)
    inside = F.unfold(ones, kernel_size, dilation=dilation, padding=padding).view(taps, h * w)
    attn = logits.masked_fill(inside == 0, -math.inf).softmax(2)
    return (attn.unsqueeze(2) * windows(v)).sum(3).reshape(b, c, h, w)
