"""Conformance specs: `ms_deform_attn` and `MultiScaleDeformableAttention` (two levels, 3x4 and
1x2: 14 keys)."""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import ops
from visionblocks.nn import MultiScaleDeformableAttention

_SHAPES = [(3, 4), (1, 2)]


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


_OP = {
    "value": lambda: _rand(2, 14, 2, 3) - 0.5,
    "sampling_locations": lambda: _rand(2, 5, 2, 2, 3, 2, seed=1),
    "attention_weights": lambda: _rand(2, 5, 2, 2, 3, seed=2),
}
_TENSORS = [Arg(name, "tensor") for name in _OP]


def _layer() -> MultiScaleDeformableAttention:
    torch.manual_seed(0)
    layer = MultiScaleDeformableAttention(8, num_heads=2, num_levels=2, num_points=3)
    with torch.no_grad():  # attention logits that are not all zero
        layer.attention_weights.weight.normal_()
    return layer


SPECS = [
    # spatial_shapes as a list (the "list" of a tensor is a legitimate value) or a tensor.
    Spec(ops.ms_deform_attn, call(ops.ms_deform_attn, **_OP, spatial_shapes=_SHAPES, impl="auto"),
         args=[*_TENSORS, Arg("spatial_shapes", "sequence"), Arg("impl", "choice")],
         equivalences=("noncontiguous", "channels_last", "half", "bfloat16")),
    Spec(ops.ms_deform_attn,
         call(ops.ms_deform_attn, **_OP, spatial_shapes=lambda: torch.tensor(_SHAPES)),
         args=[Arg("spatial_shapes", "int_tensor", accept={"list"})],
         equivalences=("noncontiguous",), label="tensor shapes"),
    Spec(MultiScaleDeformableAttention, lambda: (MultiScaleDeformableAttention, {
            "embed_dims": 8, "num_heads": 2, "num_levels": 2, "num_points": 3}),
         args=[Arg(name, "int") for name in ("embed_dims", "num_heads", "num_levels",
                                              "num_points")]),
    Spec(MultiScaleDeformableAttention, lambda: (_layer(), {
            "query": _rand(2, 5, 8, seed=3), "reference_points": _rand(2, 5, 2, 2, seed=4),
            "value": _rand(2, 14, 8, seed=5), "spatial_shapes": _SHAPES,
            "key_padding_mask": _rand(2, 14, seed=6) > 0.8}),
         args=[Arg("query", "tensor"), Arg("reference_points", "tensor"), Arg("value", "tensor"),
               Arg("spatial_shapes", "sequence"),
               # A bool mask: NaN and inf do not exist for it.
               Arg("key_padding_mask", "tensor", optional=True, skip={"nan", "inf"})],
         forward=True, equivalences=("noncontiguous", "half", "bfloat16")),
]  # fmt: skip
