"""Multi-scale deformable attention (Deformable DETR), with mmcv's arguments and layouts.

Paths: the torch formula, one ``grid_sample`` per level (`_ms_deform_attn`: the reference,
the CPU path and what ``torch.compile`` and export record); the fused Triton kernel on CUDA
(`visionblocks.kernels.ms_deform_attn`, which reads the level sizes on the device); and, where
the level sizes are a tensor whose values the host may not read (CUDA, fake tensors, a
recorded call), the same sums as one weighted gather (`_ms_deform_attn_gather`:
``F.embedding_bag`` over the four corners of every point), so no default path waits for the
GPU. Both torch paths are plain autograd.

Convention:
    ``value`` is ``(B, keys, heads, C)``: the levels' ``H x W`` maps flattened row-major and
    concatenated in order (``keys = sum(H * W)``). ``sampling_locations[..., 0]`` is ``x``
    (width) and ``[..., 1]`` is ``y``, normalized: ``0`` is the left/top edge of the map and
    ``1`` its right/bottom edge, so pixel ``(i, j)``'s centre is at
    ``((j + 0.5) / W, (i + 0.5) / H)`` (``grid_sample``'s ``align_corners=False``). Bilinear
    interpolation with zeros outside the map: a point within one pixel outside still mixes
    in its inside neighbours; a NaN location samples zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.dispatch import (
    assert_on_device,
    asserts_on_device,
    forced_triton,
    has_values,
    recording,
    use_triton,
)
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating

__all__ = ["ms_deform_attn"]
__dir__ = public_dir(__name__, __all__)

SpatialShapes = Tensor | Sequence[Sequence[int]]
_STACK_ELEMENTS = 2**19
"""Samples (batch x heads x channels x levels x points x queries) up to which the formula
weighs all levels in one product (fewer ops); above, level by level (no copy of them all)."""
_EXACT = (torch.float32, torch.float64)  # dtypes the paths compute in
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_args(
    value: Tensor, spatial_shapes: SpatialShapes, locations: Tensor, weights: Tensor
) -> list[tuple[int, int]] | Tensor:
    """Validate; return the level sizes as host ints where the host may read them, else as a
    ``(levels, 2)`` int64 tensor. (Each shape is read once: every tensor attribute read is a
    call into torch, which an op called among many others pays for in full.)"""
    if not (
        type(value) is Tensor
        and type(locations) is Tensor
        and type(weights) is Tensor
        and value.is_floating_point()
        and locations.is_floating_point()
        and weights.is_floating_point()
    ):  # plain float tensors: ok
        check_floating("value", value)
        check_floating("sampling_locations", locations)
        check_floating("attention_weights", weights)
    vs, ls = value.shape, locations.shape
    if len(vs) != 4:
        raise ValueError(f"value must have shape (B, keys, heads, C), got {tuple(vs)}")
    if len(ls) != 6 or ls[5] != 2:
        raise ValueError(
            "sampling_locations must have shape (B, queries, heads, levels, points, 2), "
            f"got {tuple(ls)}"
        )
    if ls[0] != vs[0] or ls[2] != vs[2]:
        raise ValueError(
            f"sampling_locations must have shape ({vs[0]}, queries, {vs[2]}, levels, points, 2) "
            f"for value of shape {tuple(vs)}, got {tuple(ls)}"
        )
    if weights.shape != ls[:5]:
        raise ValueError(
            f"attention_weights must have shape {tuple(ls[:5])} (sampling_locations' "
            f"without the last dimension), got {_shape(weights)}"
        )
    device = value.device
    if not (value.is_cpu and locations.is_cpu and weights.is_cpu) and not (
        device == locations.device == weights.device
    ):
        raise ValueError(
            "value, sampling_locations and attention_weights must be on the same device, got "
            f"{device}, {locations.device} and {weights.device}"
        )
    if ls[3] < 1:
        raise ValueError(f"sampling_locations must have levels >= 1, got {tuple(ls)}")
    return check_spatial_shapes(spatial_shapes, ls[3], vs[1], device)


def check_spatial_shapes(
    spatial_shapes: SpatialShapes, levels: int, keys: int, device: torch.device
) -> list[tuple[int, int]] | Tensor:
    """Validate the level sizes of ``keys`` values on ``device``: return them as host ints
    where the host may read them, else as a ``(levels, 2)`` int64 tensor (checked on the
    device when it is a CUDA one)."""
    if isinstance(spatial_shapes, Tensor):
        if spatial_shapes.dtype not in _INTEGER_DTYPES:
            raise TypeError(
                f"spatial_shapes must be an integer tensor, got dtype {spatial_shapes.dtype}"
            )
        if spatial_shapes.shape != (levels, 2):
            raise ValueError(
                f"spatial_shapes must have shape ({levels}, 2) (levels of sampling_locations, "
                f"(H, W)), got {_shape(spatial_shapes)}"
            )
        if spatial_shapes.device not in (device, torch.device("cpu")):
            raise ValueError(
                f"spatial_shapes must be on value's device ({device}) or the CPU, got "
                f"{spatial_shapes.device}"
            )
        # Recorded calls first: has_values is not traceable.
        on_host = (
            not recording() and spatial_shapes.device.type == "cpu" and has_values(spatial_shapes)
        )
        if not on_host:
            shapes = spatial_shapes.long()
            if asserts_on_device(shapes):
                area = shapes.prod(1)
                assert_on_device(
                    (shapes.amin() >= 1) & (area.sum() == keys),
                    f"spatial_shapes: sizes must be >= 1 and sum(H * W) must equal value's "
                    f"keys ({keys})",
                )
            return shapes
        sizes = [(h, w) for h, w in spatial_shapes.tolist()]
    else:
        if not isinstance(spatial_shapes, list | tuple) and (
            isinstance(spatial_shapes, str | bytes) or not isinstance(spatial_shapes, Sequence)
        ):
            raise TypeError(
                "spatial_shapes must be an integer tensor or a sequence of (H, W) pairs, got "
                f"{type(spatial_shapes).__name__}"
            )
        sizes = []
        for pair in spatial_shapes:
            if (type(pair) is not tuple and not isinstance(pair, list | tuple)) or len(pair) != 2:
                break
            h, w = pair
            if not (type(h) is int and type(w) is int) and not (_is_size(h) and _is_size(w)):
                break
            sizes.append((h, w))
        if len(sizes) != levels or len(spatial_shapes) != levels:
            raise ValueError(
                f"spatial_shapes must be {levels} (H, W) pairs of ints (the levels of "
                f"sampling_locations), got {spatial_shapes!r}"
            )
    total = 0
    for h, w in sizes:
        if h < 1 or w < 1:
            raise ValueError(f"spatial_shapes must hold sizes >= 1, got {sizes}")
        total += h * w
    if keys != total:
        raise ValueError(
            f"value must have sum(H * W) = {total} keys for spatial_shapes {sizes}, got {keys}"
        )
    return sizes


def _is_size(x: object) -> bool:
    return isinstance(x, int | torch.SymInt) and not isinstance(x, bool)


def ms_deform_attn(
    value: Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    *,
    impl: Literal["auto", "torch", "triton"] = "auto",
) -> Tensor:
    """Multi-scale deformable attention: a weighted sum of bilinear samples of every level.

    For batch ``b``, query ``q`` and head ``n``, with ``value_l`` level ``l`` of ``value``
    as an ``H_l x W_l`` map (see the module notes):

        out[b, q, n*C:(n+1)*C] = sum_{l, p} attention_weights[b, q, n, l, p]
            * bilinear(value_l[b, :, :, n], sampling_locations[b, q, n, l, p])

    which is mmcv's ``multi_scale_deformable_attn_pytorch`` and Deformable DETR's
    ``ms_deform_attn_core_pytorch`` (``grid_sample``, bilinear, zeros padding,
    ``align_corners=False``) and what their compiled kernels compute. The attention weights
    are used as given (Deformable DETR softmaxes them over levels and points first).
    Differentiable in ``value``, ``sampling_locations`` and ``attention_weights``.

    Args:
        value (Tensor[B, keys, heads, C]): The levels' values, flattened and concatenated.
        spatial_shapes: ``(H, W)`` of each level: an integer tensor ``(levels, 2)`` (on
            ``value``'s device or the CPU) or a sequence of pairs of ints. Sizes the host
            can read (a sequence, a CPU tensor) keep every path free of host reads on CUDA.
        sampling_locations (Tensor[B, queries, heads, levels, points, 2]): ``(x, y)`` in
            ``[0, 1]`` per level (outside: zeros beyond the border).
        attention_weights (Tensor[B, queries, heads, levels, points]): Weight of each sample.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"`` (the fused kernel,
            `visionblocks.kernels.ms_deform_attn`).

    Returns:
        Tensor[B, queries, heads * C]: In the promoted dtype of the three floating inputs
        (half inputs are computed in float32).

    Raises:
        TypeError: Non-tensor or non-floating inputs; ``spatial_shapes`` neither an integer
            tensor nor a sequence.
        ValueError: Shapes that do not match (ranks, batch, heads, levels, points), sizes
            below 1, ``keys != sum(H * W)`` (for level sizes on a CUDA tensor: a device-side
            assert), tensors on different devices, or an unknown ``impl``.
        RuntimeError: ``impl="triton"`` where triton cannot run.

    Examples:
        >>> import torch
        >>> value = torch.randn(2, 4 * 6 + 2 * 3, 8, 16)  # two levels: 4x6 and 2x3
        >>> locations = torch.rand(2, 10, 8, 2, 4, 2)
        >>> weights = torch.rand(2, 10, 8, 2, 4).softmax(-1)
        >>> ms_deform_attn(value, [(4, 6), (2, 3)], locations, weights).shape
        torch.Size([2, 10, 128])
        >>> value = torch.arange(6.0).view(1, 6, 1, 1)  # one 2x3 level, one channel
        >>> centre = torch.tensor([0.5, 0.5]).view(1, 1, 1, 1, 1, 2)
        >>> ms_deform_attn(value, [(2, 3)], centre, torch.ones(1, 1, 1, 1, 1))  # mean of 1,4
        tensor([[[2.5000]]])

    References:
        Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End Object
        Detection", ICLR 2021. https://arxiv.org/abs/2010.04159
    """
    shapes = _check_args(value, spatial_shapes, sampling_locations, attention_weights)
    triton = use_triton("ms_deform_attn", impl, value, sampling_locations, attention_weights)
    args = (value, sampling_locations, attention_weights)
    dtype = value.dtype
    if not dtype == sampling_locations.dtype == attention_weights.dtype:
        dtype = torch.promote_types(
            torch.promote_types(dtype, sampling_locations.dtype), attention_weights.dtype
        )
        args = tuple(x.to(dtype) for x in args)
    if triton:
        from visionblocks.kernels.ms_deform_attn import ms_deform_attn_triton

        if not isinstance(shapes, Tensor):
            shapes = torch.tensor(shapes, dtype=torch.long)
        # From pageable host memory without waiting for the GPU (staged, no stream sync).
        shapes = shapes.to(value.device, non_blocking=True)
        fallback = None if forced_triton(impl) else _ms_deform_attn_gather
        return ms_deform_attn_triton(args[0], shapes, *args[1:], reference=fallback)
    if dtype not in _EXACT:  # half: computed in float32
        args = tuple(x.float() for x in args)
    if isinstance(shapes, Tensor):
        out = _ms_deform_attn_gather(args[0], shapes.to(value.device, non_blocking=True), *args[1:])
    else:
        out = _ms_deform_attn(args[0], shapes, *args[1:])
    return out if out.dtype == dtype else out.to(dtype)


def _ms_deform_attn(
    value: Tensor, shapes: list[tuple[int, int]], locations: Tensor, weights: Tensor
) -> Tensor:
    """The formula (inputs validated, float32 or float64, sizes on the host): per level, one
    ``grid_sample`` of all batches and heads at all ``points x queries`` (queries innermost,
    where its CPU kernel vectorizes), weighted and summed over the points."""
    b, keys, heads, c = value.shape
    _, q, _, levels, points, _ = locations.shape
    n = b * heads
    # One copy of each input into the layout grid_sample reads; split and unbind (one node
    # each in the backward) give the levels.
    maps = value.permute(0, 2, 3, 1).reshape(n, c, keys).split([h * w for h, w in shapes], 2)
    grids = (locations * 2 - 1).permute(0, 2, 3, 4, 1, 5).reshape(n, levels, points, q, 2)
    attn = weights.permute(0, 2, 3, 4, 1).reshape(n, 1, levels * points, q)
    sampled = [
        F.grid_sample(
            level_map.view(n, c, h, w),
            grid,
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        )  # (n, c, points, q)
        for (h, w), level_map, grid in zip(shapes, maps, grids.unbind(1), strict=True)
    ]
    if n * c * levels * points * q <= _STACK_ELEMENTS:  # small: fewest ops
        out = (torch.cat(sampled, 2) * attn).sum(2)
    else:  # large: no copy of all samples
        level_attn = attn.view(n, 1, levels, points, q).unbind(2)
        out = (sampled[0] * level_attn[0]).sum(2)
        for level in range(1, levels):
            out = out + (sampled[level] * level_attn[level]).sum(2)
    return out.view(b, heads * c, q).transpose(1, 2).contiguous()


def _ms_deform_attn_gather(
    value: Tensor, shapes: Tensor, locations: Tensor, weights: Tensor
) -> Tensor:
    """The same sums (inputs validated, float32 or float64) with the level sizes as a
    tensor, read on the device only: the four corners of every point as rows of ``value``
    (in its own layout) with their weights (bilinear x attention, zero outside the map),
    summed by ``F.embedding_bag``."""
    b, keys, heads, c = value.shape
    q, levels = locations.shape[1], locations.shape[3]
    device = value.device
    shapes = shapes.long()
    width = shapes[:, 1].view(levels, 1, 1, 1)
    size = shapes.flip(-1).to(value.dtype).view(levels, 1, 2)  # (W, H) per level
    area = shapes.prod(1)
    start = (area.cumsum(0) - area).view(levels, 1, 1, 1)
    pixel = locations * size - 0.5  # (B, Q, heads, levels, points, 2)
    low = pixel.floor()
    frac = pixel - low
    low_in = (low >= 0) & (low < size)
    high_in = (low >= -1) & (low < size - 1)
    # (..., points, corner: low/high, axis: x/y); corners outside weigh 0 at row 0.
    corner_w = torch.stack([torch.where(low_in, 1 - frac, 0), torch.where(high_in, frac, 0)], -2)
    corner_i = torch.stack([torch.where(low_in, low, 0), torch.where(high_in, low + 1, 0)], -2)
    corner_i = corner_i.long()
    w = corner_w[..., 1, None] * corner_w[..., 0].unsqueeze(-2)  # (..., y corner, x corner)
    w = w * weights[..., None, None]
    index = start + corner_i[..., 1, None] * width + corner_i[..., 0].unsqueeze(-2)
    # Row of key k, head n, batch i in value viewed as (B * keys * heads, C).
    batch = torch.arange(b, device=device).view(b, 1, 1, 1, 1, 1, 1) * keys
    head = torch.arange(heads, device=device).view(heads, 1, 1, 1, 1)
    rows = ((batch + index) * heads + head).view(b * q * heads, -1)
    table = value.reshape(b * keys * heads, c)
    out = F.embedding_bag(rows, table, per_sample_weights=w.view(rows.shape), mode="sum")
    return out.view(b, q, heads * c)
