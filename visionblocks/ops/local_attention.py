"""Local (neighbourhood) attention over 2-D feature maps: every pixel attends to its window.

Paths as for `visionblocks.ops.local.local_filter2d`: the torch formula (`_local_attention`,
plain autograd, which keeps the ``(B, heads, k*k, H, W)`` weights), the fused Triton kernels
on CUDA, and on CPU with ``impl="auto"`` a chunked rewrite (no double backward, nothing
``k*k`` times the input kept). Results are contiguous NCHW.

Convention:
    Windows are centred and clipped, never shifted: tap ``t = i*k + j`` (row-major,
    ``0 <= i, j < k``) of query pixel ``(h, w)`` is key/value pixel
    ``(h + (i - k//2)*d, w + (j - k//2)*d)`` for dilation ``d``. Taps outside the image are
    **masked out of the softmax** (a pixel near the border attends to fewer keys), not zero
    keys with logit 0; so a window past the image equals a smaller one, which is what runs.
    Only odd ``k``. The centre tap always exists, so every softmax is well defined (a
    ``1 x 1`` image returns ``v``). Unlike neighbourhood attention (NATTEN), windows at the
    border are not shifted back inside the image.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import check_type
from visionblocks._core.dispatch import forced_triton, use_triton
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, check_same_shape, compute_dtype
from visionblocks.ops._local_attention_torch import LocalAttentionFunction
from visionblocks.ops.local import check_window, cpu_fast_path, effective_window

__all__ = ["local_attention2d"]
__dir__ = public_dir(__name__, __all__)


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be int, got bool ({value!r})")
    check_type(name, value, int)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _check_args(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
) -> None:
    """Validate the arguments of `local_attention2d`."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_floating(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, C, H, W), got {tuple(x.shape)}")
    check_same_shape("q", q, "k", k)
    check_same_shape("q", q, "v", v)
    if not q.device == k.device == v.device:
        raise ValueError(
            f"q, k and v must be on the same device, got {q.device}, {k.device} and {v.device}"
        )
    check_window(kernel_size, dilation)
    _check_int("num_heads", num_heads)
    if q.shape[1] % num_heads:
        raise ValueError(
            f"num_heads must divide the channels C = {q.shape[1]}, got num_heads={num_heads}"
        )


def local_attention2d(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel_size: int,
    dilation: int = 1,
    num_heads: int = 1,
    *,
    impl: Literal["auto", "torch", "triton"] = "auto",
) -> Tensor:
    """Multi-head attention of every pixel over its (dilated) ``k x k`` neighbourhood.

    Channels split into ``num_heads`` heads of ``D = C / num_heads``; for head ``n``,
    query pixel ``p`` and its window taps ``t`` (pixel ``p + o_t``, see the module notes):

        logits[n, t, p] = sum_D q[n, :, p] * k[n, :, p + o_t] / sqrt(D)
        attn = softmax over the taps inside the image (outside: masked, weight 0)
        out[n, :, p] = sum_t attn[n, t, p] * v[n, :, p + o_t]

    This equals unfolding ``k`` and ``v`` with ``F.unfold(x, k, dilation=d, padding=d*(k//2))``
    and masking the padded taps with ``-inf`` before the softmax, without building the
    unfolded tensors. Differentiable in ``q``, ``k`` and ``v`` (see the module notes).

    Args:
        q (Tensor[B, C, H, W]): Queries, floating point.
        k (Tensor[B, C, H, W]): Keys, same shape.
        v (Tensor[B, C, H, W]): Values, same shape.
        kernel_size: Window side ``k``, odd.
        dilation: Spacing ``d`` between window taps.
        num_heads: Heads; must divide ``C``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (fused kernels,
            `visionblocks.kernels.local_attention`).

    Returns:
        Tensor[B, C, H, W]: In the promoted dtype of ``q``, ``k`` and ``v`` (half inputs are
        computed in float32; ``torch.autocast`` lowers nothing).

    Raises:
        TypeError: Non-tensor or non-floating (e.g. integer) inputs, or non-int
            ``kernel_size``/``dilation``/``num_heads``.
        ValueError: Inputs not 4-D or of different shapes or devices, an even
            ``kernel_size``, ``dilation``/``num_heads < 1``, ``num_heads`` not dividing ``C``,
            or an unknown ``impl``.
        RuntimeError: ``impl="triton"`` where triton cannot run.

    Examples:
        >>> import torch
        >>> q, k, v = torch.randn(3, 2, 16, 9, 9).unbind(0)
        >>> local_attention2d(q, k, v, kernel_size=3, num_heads=4).shape
        torch.Size([2, 16, 9, 9])
        >>> x = torch.randn(1, 4, 1, 1)  # a 1x1 image: the pixel attends to itself only
        >>> torch.equal(local_attention2d(x, x, x, 7), x)
        True
        >>> ones = torch.ones(1, 1, 3, 3)  # equal logits: a mean over the taps inside
        >>> v = torch.arange(9.0).view(1, 1, 3, 3)
        >>> local_attention2d(ones, ones, v, 3)[0, 0]
        tensor([[2.0000, 2.5000, 3.0000],
                [3.5000, 4.0000, 4.5000],
                [5.0000, 5.5000, 6.0000]])

    References:
        Ramachandran et al., "Stand-Alone Self-Attention in Vision Models", NeurIPS 2019.
        https://arxiv.org/abs/1906.05909
    """
    _check_args(q, k, v, kernel_size, dilation, num_heads)
    triton = use_triton("local_attention2d", impl, q, k, v)
    # Taps beyond the image are masked: a window past it equals a smaller one (no huge sizes).
    kernel_size, dilation = effective_window(kernel_size, dilation, *q.shape[-2:])
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    args = (q, k, v, kernel_size, dilation, num_heads)
    if triton:
        from visionblocks.kernels.local_attention import local_attention2d_triton

        fallback = None if forced_triton(impl) else _local_attention
        return local_attention2d_triton(*args, reference=fallback)
    if cpu_fast_path(impl, q):
        return LocalAttentionFunction.apply(*args)
    return _local_attention(*args)


def _local_attention(
    q: Tensor, k: Tensor, v: Tensor, kernel_size: int, dilation: int, num_heads: int
) -> Tensor:
    """The formula of `local_attention2d` (inputs validated, one dtype): one shifted view
    of the padded keys (values) per tap, taps outside the image at ``-inf`` (half in float32)."""
    b, c, h, w = q.shape
    depth, half, cdt = c // num_heads, kernel_size // 2, compute_dtype(q.dtype)
    pad = dilation * half
    heads = (b, num_heads, depth, h, w)
    padded = (b, num_heads, depth, h + 2 * pad, w + 2 * pad)
    queries = q.to(cdt).contiguous().view(heads) / math.sqrt(max(depth, 1))
    keys, values = (F.pad(x.to(cdt).contiguous(), (pad,) * 4).view(padded) for x in (k, v))
    offsets = [(i * dilation, j * dilation) for i in range(kernel_size) for j in range(kernel_size)]
    logits = torch.stack(
        [(queries * keys[..., y : y + h, z : z + w]).sum(2) for y, z in offsets], 2
    )
    # Tap (i, j) of pixel (y, z) is inside the image iff row and column are: (k, k, H, W).
    shift = (torch.arange(kernel_size, device=q.device) - half) * dilation
    rows = torch.arange(h, device=q.device) + shift[:, None]
    cols = torch.arange(w, device=q.device) + shift[:, None]
    inside = ((rows >= 0) & (rows < h))[:, None, :, None] & ((cols >= 0) & (cols < w))[
        None, :, None
    ]
    attn = logits.masked_fill(~inside.view(kernel_size * kernel_size, h, w), -math.inf).softmax(2)
    out = attn.new_zeros(())
    for weight, (y, z) in zip(attn.unsqueeze(3).unbind(2), offsets, strict=True):
        out = out.addcmul(weight, values[..., y : y + h, z : z + w])
    return out.reshape(b, c, h, w).to(q.dtype)
