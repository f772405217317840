"""The multi-scale deformable attention layer of Deformable DETR
(`visionblocks.ops.ms_deform_attn.ms_deform_attn`).

`MultiScaleDeformableAttention` has the submodules, names and initialisation of mmcv's
``MultiScaleDeformableAttention``, Deformable DETR's ``MSDeformAttn`` and transformers'
``DeformableDetrMultiscaleDeformableAttention`` (``sampling_offsets``,
``attention_weights``, ``value_proj``, ``output_proj``), so their state dicts load as they
are; inputs are batch-first and the layer returns the projected attention only (no residual,
dropout or norm: the transformer layer around it adds those).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_int
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import (
    check_device,
    check_floating,
    check_tensor,
    compute_dtype,
)
from visionblocks.nn._limits import MAX_CHANNELS
from visionblocks.ops.ms_deform_attn import SpatialShapes, check_spatial_shapes, ms_deform_attn

__all__ = ["MultiScaleDeformableAttention"]
__dir__ = public_dir(__name__, __all__)


@LAYERS.register(name="ms_deform_attn")
class MultiScaleDeformableAttention(nn.Module):
    """Multi-scale deformable attention (Deformable DETR's ``MSDeformAttn``).

    Each query predicts, per head, level and point, an offset from its reference point
    (``sampling_offsets``) and a weight (``attention_weights``, softmaxed over the
    ``levels * points`` of its head); `ms_deform_attn` samples the projected values
    (``value_proj``) there, and ``output_proj`` maps the heads back to ``embed_dims``.
    Offsets are in pixels of each level for reference points ``(x, y)``, and in
    ``0.5 / num_points`` of the box for reference boxes ``(cx, cy, w, h)``. The
    initialisation is Deformable DETR's: offsets start on ``num_points`` rings in
    ``num_heads`` directions, weights uniform.

    Args:
        embed_dims: Channels ``D`` of queries, values and output.
        num_heads: Attention heads (must divide ``embed_dims``).
        num_levels: Feature levels ``L``.
        num_points: Sampling points per head and level.

    Shape:
        - query: ``(B, Q, D)``; reference_points: ``(B, Q, L, 2)`` normalized ``(x, y)``
          or ``(B, Q, L, 4)`` normalized ``(cx, cy, w, h)``; value: ``(B, keys, D)``, the
          levels flattened and concatenated; key_padding_mask: ``(B, keys)`` bool, True
          at padding (those values are zeroed).
        - Output: ``(B, Q, D)``.

    Raises:
        TypeError: Non-int sizes; in ``forward``, non-tensor or non-floating inputs, a
            non-bool ``key_padding_mask``.
        ValueError: Sizes below 1 or ``num_heads`` not dividing ``embed_dims``; in
            ``forward``, shapes that do not match the layer or each other (see
            `ms_deform_attn` for ``spatial_shapes``).

    Examples:
        >>> import torch
        >>> layer = MultiScaleDeformableAttention(32, num_heads=4, num_levels=2, num_points=3)
        >>> shapes = [(8, 10), (4, 5)]
        >>> value = torch.randn(2, 8 * 10 + 4 * 5, 32)
        >>> query, reference = torch.randn(2, 7, 32), torch.rand(2, 7, 2, 2)
        >>> layer(query, reference, value, shapes).shape
        torch.Size([2, 7, 32])

    References:
        Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End Object
        Detection", ICLR 2021. https://arxiv.org/abs/2010.04159
    """

    def __init__(
        self, embed_dims: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4
    ) -> None:
        super().__init__()
        for name, value in (
            ("embed_dims", embed_dims),
            ("num_heads", num_heads),
            ("num_levels", num_levels),
            ("num_points", num_points),
        ):
            check_int(name, value, 1, MAX_CHANNELS)
        if embed_dims % num_heads:
            raise ValueError(
                f"num_heads must divide embed_dims, got num_heads={num_heads}, "
                f"embed_dims={embed_dims}"
            )
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points = num_levels, num_points
        samples = num_heads * num_levels * num_points
        self.sampling_offsets = nn.Linear(embed_dims, samples * 2)
        self.attention_weights = nn.Linear(embed_dims, samples)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Deformable DETR's initialisation: zero offset weights with the point ``i`` of head
        ``n`` at ``(i + 1)`` times the direction ``2 pi n / heads`` (scaled so that its
        larger coordinate is 1), zero attention logits, Xavier-uniform projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angle = torch.arange(self.num_heads, dtype=torch.float64) * (2 * math.pi / self.num_heads)
        direction = torch.stack([angle.cos(), angle.sin()], -1)
        direction = direction / direction.abs().amax(-1, keepdim=True)
        ring = torch.arange(1, self.num_points + 1, dtype=torch.float64).view(1, 1, -1, 1)
        grid = direction.view(self.num_heads, 1, 1, 2) * ring
        self.sampling_offsets.bias.copy_(grid.expand(-1, self.num_levels, -1, -1).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        value: Tensor,
        spatial_shapes: SpatialShapes,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Attend each query to ``num_points`` samples per head and level around its
        reference point (see the class notes for the shapes)."""
        self._check(query, reference_points, value, key_padding_mask)
        device = self.value_proj.weight.device
        sizes = check_spatial_shapes(spatial_shapes, self.num_levels, value.shape[1], device)
        b, q, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        v = self.value_proj(value)
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask[..., None], 0.0)
        v = v.view(b, value.shape[1], heads, -1)
        # Locations in float32 at least: a half one is off by a pixel's fraction on large maps.
        cdt = compute_dtype(torch.promote_types(query.dtype, reference_points.dtype))
        offsets = self.sampling_offsets(query).view(b, q, heads, levels, points, 2).to(cdt)
        weights = self.attention_weights(query).view(b, q, heads, levels * points)
        weights = weights.softmax(-1).view(b, q, heads, levels, points)
        ref = reference_points.to(cdt)[:, :, None, :, None]
        if reference_points.shape[-1] == 2:
            if isinstance(sizes, Tensor):
                size = sizes.flip(-1).to(offsets.dtype)
            else:
                size = torch.tensor([(w, h) for h, w in sizes], dtype=offsets.dtype)
            # Host sizes travel from pageable memory without waiting for the GPU.
            size = size.to(offsets.device, non_blocking=True)
            locations = ref + offsets / size[:, None]
        else:
            locations = ref[..., :2] + offsets * ref[..., 2:] * (0.5 / points)
        out = ms_deform_attn(v, sizes, locations, weights).to(v.dtype)
        return self.output_proj(out)

    def _check(
        self, query: Tensor, reference_points: Tensor, value: Tensor, mask: Tensor | None
    ) -> None:
        d, levels, device = self.embed_dims, self.num_levels, self.value_proj.weight.device
        for name, x in (("query", query), ("value", value)):
            check_floating(name, x)
            check_device(name, x, device, "the layer's weights")
            if x.dim() != 3 or x.shape[-1] != d:
                raise ValueError(f"{name} must have shape (B, N, {d}), got {tuple(x.shape)}")
        b, q = query.shape[:2]
        if value.shape[0] != b:
            raise ValueError(
                f"value must have shape ({b}, keys, {d}) for query of shape "
                f"{tuple(query.shape)}, got {tuple(value.shape)}"
            )
        check_floating("reference_points", reference_points)
        check_device("reference_points", reference_points, device, "the layer's weights")
        if reference_points.shape not in ((b, q, levels, 2), (b, q, levels, 4)):
            raise ValueError(
                f"reference_points must have shape ({b}, {q}, {levels}, 2) or "
                f"({b}, {q}, {levels}, 4), got {tuple(reference_points.shape)}"
            )
        if mask is not None:
            check_tensor("key_padding_mask", mask)
            if mask.dtype != torch.bool:
                raise TypeError(f"key_padding_mask must be a bool tensor, got dtype {mask.dtype}")
            check_device("key_padding_mask", mask, device, "the layer's weights")
            if mask.shape != value.shape[:2]:
                raise ValueError(
                    f"key_padding_mask must have shape {tuple(value.shape[:2])} (value's "
                    f"batch and keys), got {tuple(mask.shape)}"
                )

    def extra_repr(self) -> str:
        return (
            f"embed_dims={self.embed_dims}, num_heads={self.num_heads}, "
            f"num_levels={self.num_levels}, num_points={self.num_points}"
        )
