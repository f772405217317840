"""Plain-torch forms of the local ops for ``torch.export`` and TorchScript (private).

The ops' threaded CPU path cannot be exported (work done in pool threads is not traced) nor
scripted, so the layers of `visionblocks.nn` call these instead: the same maths on the
``F.unfold`` windows, ``k*k`` times the memory, one traceable graph.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["local_attention_plain", "local_filter_plain"]


def _windows(x: Tensor, kernel_size: int, dilation: int) -> Tensor:
    """``(B, C, k*k, H, W)``: `sliding_windows` without its checks and size clamp (which
    would specialise symbolic sizes)."""
    b, c, h, w = x.shape
    pad = dilation * (kernel_size // 2)
    cols = F.unfold(x, kernel_size, dilation=dilation, padding=pad)
    return cols.reshape(b, c, kernel_size * kernel_size, h, w)


def local_filter_plain(
    x: Tensor, kernels: Tensor, kernel_size: int, dilation: int = 1, stride: int = 1
) -> Tensor:
    """`visionblocks.ops.local.local_filter2d` on the unfolded windows (inputs not checked)."""
    dtype = torch.promote_types(x.dtype, kernels.dtype)
    x, kernels = x.to(dtype), kernels.to(dtype)
    b, c = x.shape[:2]
    taps = kernel_size * kernel_size
    groups = kernels.shape[1] // taps
    windows = _windows(x, kernel_size, dilation)[..., ::stride, ::stride]
    ho, wo = windows.shape[-2:]
    windows = windows.reshape(b, groups, c // groups, taps, ho, wo)
    out = (windows * kernels.reshape(b, groups, 1, taps, ho, wo)).sum(3)
    return out.reshape(b, c, ho, wo)


def local_attention_plain(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int = 1, num_heads: int = 1
) -> Tensor:
    """`visionblocks.ops.local_attention.local_attention2d` on the unfolded windows: taps
    outside the image masked with ``-inf`` before the softmax (inputs not checked)."""
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    b, c, h, w = q.shape
    taps, depth = kernel_size * kernel_size, c // num_heads
    shape = (b, num_heads, depth, taps, h, w)
    keys = _windows(k, kernel_size, dilation).reshape(shape)
    values = _windows(v, kernel_size, dilation).reshape(shape)
    inside = _windows(q.new_ones(1, 1, h, w), kernel_size, dilation) > 0
    queries = q.reshape(b, num_heads, depth, 1, h, w)
    logits = (queries * keys).sum(2) / math.sqrt(depth)  # (B, heads, taps, H, W)
    logits = logits.masked_fill(~inside.reshape(1, 1, taps, h, w), float("-inf"))
    attn = torch.softmax(logits, dim=2)
    out = (attn.unsqueeze(2) * values).sum(3)
    return out.reshape(b, c, h, w).to(dtype)
