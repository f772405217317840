"""Multi-scale deformable attention: transformers' Deformable DETR with ours swapped in, and
the op against mmcv's torch formula.

The client is Hugging Face transformers' ``DeformableDetrModel`` (random weights, built from
a ``DeformableDetrConfig`` with a small ResNet backbone config: nothing is downloaded). Its
attention core is the ``MultiScaleDeformableAttention`` module of
``transformers/models/deformable_detr/modeling_deformable_detr.py``, whose ``forward``
(value, spatial shapes as a tensor and a list, level starts, locations, weights,
``im2col_step``) is mmcv's ``grid_sample`` formula; `visionblocks_in_transformers` puts
`visionblocks.ops.ms_deform_attn` there (with the shapes' list: sizes on the host) for the
duration of a ``with`` block.

Cases (the workload only where transformers is installed):

- ``workload_deformable_detr_fwd_bwd``: one forward and backward of the model (d_model 256,
  8 heads, 4 levels, 4 points, 2 encoder and 2 decoder layers, 100 queries) on 2 images of
  320 x 384 (levels 40x48 to 5x6: 2550 keys), dropout off; peer: transformers as it is.
  The check compares the last hidden states and the encoder's within 1e-5.
- ``ms_deform_attn_<size>_fwd_bwd`` (micro): the op, forward and the gradients of value,
  locations and weights, against mmcv's ``multi_scale_deformable_attn_pytorch`` re-expressed
  here (`mmcv_ms_deform_attn`, the same code as transformers' module) at sizes from a toy
  to a Deformable DETR encoder on an 800-pixel image; ``..._fwd``: forward only.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import assert_same, same_outputs

__all__ = [
    "DEFORMABLE_DETR_CASES",
    "deformable_detr_config",
    "mmcv_ms_deform_attn",
    "visionblocks_in_transformers",
]


def mmcv_ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: list[tuple[int, int]],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """The peer: mmcv's ``multi_scale_deformable_attn_pytorch`` (open-mmlab/mmcv,
    ``mmcv/ops/multi_scale_deform_attn.py``; transformers' module runs the same code): per
    level a ``(B * heads, C, H, W)`` copy and ``grid_sample``, then the samples stacked and
    summed with the weights."""
    b, _, heads, c = value.shape
    _, q, _, levels, points, _ = sampling_locations.shape
    per_level = value.split([h * w for h, w in spatial_shapes], 1)
    grids = 2 * sampling_locations - 1
    samples = []
    for level, (h, w) in enumerate(spatial_shapes):
        image = per_level[level].flatten(2).transpose(1, 2).reshape(b * heads, c, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        samples.append(
            F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    attn = attention_weights.transpose(1, 2).reshape(b * heads, 1, q, levels * points)
    out = (torch.stack(samples, -2).flatten(-2) * attn).sum(-1).view(b, heads * c, q)
    return out.transpose(1, 2).contiguous()


@contextmanager
def visionblocks_in_transformers() -> Iterator[None]:
    """Within the block, transformers' Deformable DETR attention core is
    `visionblocks.ops.ms_deform_attn`; the original ``forward`` is back on exit.

    Examples:
        >>> import pytest
        >>> detr = pytest.importorskip("transformers.models.deformable_detr.modeling_deformable_detr")
        >>> before = detr.MultiScaleDeformableAttention.forward
        >>> with visionblocks_in_transformers():
        ...     detr.MultiScaleDeformableAttention.forward is before
        False
        >>> detr.MultiScaleDeformableAttention.forward is before
        True
    """
    from transformers.models.deformable_detr import modeling_deformable_detr as detr

    from visionblocks.ops import ms_deform_attn

    def forward(
        self,
        value,
        value_spatial_shapes,
        value_spatial_shapes_list,
        level_start_index,
        sampling_locations,
        attention_weights,
        im2col_step,
    ):
        shapes = [(int(h), int(w)) for h, w in value_spatial_shapes_list]
        return ms_deform_attn(value, shapes, sampling_locations, attention_weights)

    cls = detr.MultiScaleDeformableAttention
    original = cls.__dict__["forward"]
    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = original


def deformable_detr_config(
    d_model: int = 256, layers: int = 2, queries: int = 100, heads: int = 8, **kwargs: Any
) -> Any:
    """A ``DeformableDetrConfig`` that builds offline: a small ResNet backbone config
    (``BasicLayer``, one block per stage, stages 2 to 4 plus one extra level), no dropout."""
    from transformers import DeformableDetrConfig, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=32,
        hidden_sizes=[32, 64, 128, 256],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    options = {
        "backbone_config": backbone,
        "d_model": d_model,
        "encoder_layers": layers,
        "decoder_layers": layers,
        "encoder_ffn_dim": 4 * d_model,
        "decoder_ffn_dim": 4 * d_model,
        "encoder_attention_heads": heads,
        "decoder_attention_heads": heads,
        "num_queries": queries,
        "num_feature_levels": 4,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
    }
    return DeformableDetrConfig(**{**options, **kwargs})


def _model_setup(size: tuple[int, int], images: int) -> dict[str, Any]:
    from transformers import DeformableDetrModel

    torch.manual_seed(0)
    model = DeformableDetrModel(deformable_detr_config()).train()
    pixels = torch.rand(images, 3, *size, generator=torch.Generator().manual_seed(0))
    return {"model": model, "pixels": pixels}


def _step(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    model = state["model"]
    out = model(pixel_values=state["pixels"])
    loss = out.last_hidden_state.square().mean() + out.encoder_last_hidden_state.square().mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {
        "last_hidden_state": out.last_hidden_state.detach(),
        "encoder_last_hidden_state": out.encoder_last_hidden_state.detach(),
    }


def _step_ours(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    with visionblocks_in_transformers():
        return _step(state)


def _check_model(ours: Any, peer: Any) -> None:
    assert_same(ours, peer, rtol=0.0, atol=1e-5)


_SIZES = {
    # name: (batch, levels' (H, W), queries, heads, channels per head, points)
    "tiny": (1, [(8, 8), (4, 4)], 16, 2, 8, 2),
    "small": (1, [(16, 16), (8, 8), (4, 4), (2, 2)], 50, 4, 16, 4),
    "decoder": (2, [(32, 40), (16, 20), (8, 10), (4, 5)], 300, 8, 32, 4),
    "encoder": (2, [(32, 40), (16, 20), (8, 10), (4, 5)], 1700, 8, 32, 4),
    "encoder_800": (1, [(100, 134), (50, 67), (25, 34), (13, 17)], 17821, 8, 32, 4),
}
"""Deformable DETR's attention at ``tiny`` to an encoder layer on an 800 x 1066 image."""


def _op_setup(size: str, small: bool = False) -> dict[str, Any]:
    b, shapes, q, heads, c, points = _SIZES[size]
    if small:
        q = min(q, 40)
    g = torch.Generator().manual_seed(0)
    keys, levels = sum(h * w for h, w in shapes), len(shapes)
    return {
        "shapes": shapes,
        "tensors": (
            torch.randn(b, keys, heads, c, generator=g),
            torch.rand(b, q, heads, levels, points, 2, generator=g) * 1.2 - 0.1,
            torch.rand(b, q, heads, levels, points, generator=g).softmax(-1),
        ),
    }


def _op(fn: Any, backward: bool, state: dict[str, Any]) -> Any:
    value, locations, weights = state["tensors"]
    if not backward:
        return fn(value, state["shapes"], locations, weights)
    leaves = [x.detach().requires_grad_() for x in (value, locations, weights)]
    out = fn(leaves[0], state["shapes"], leaves[1], leaves[2])
    return torch.autograd.grad(out, leaves, torch.ones_like(out))


def _ours(value, shapes, locations, weights):
    from visionblocks.ops import ms_deform_attn

    return ms_deform_attn(value, shapes, locations, weights)


def _cases() -> list[BenchCase]:
    cases = []
    for size, (b, shapes, q, heads, c, points) in _SIZES.items():
        for backward in (True, False):
            what = "forward and the gradients of value, locations and weights" if backward else (
                "forward"
            )  # fmt: skip
            cases.append(
                BenchCase(
                    name=f"ms_deform_attn_{size}_fwd{'_bwd' if backward else ''}",
                    setup=functools.partial(_op_setup, size),
                    ours=functools.partial(_op, _ours, backward),
                    peer=functools.partial(_op, mmcv_ms_deform_attn, backward),
                    peer_name="mmcv (torch formula)",
                    description=f"ms_deform_attn {what}: batch {b}, levels {shapes}, {q} "
                    f"queries, {heads} heads of {c} channels, {points} points; float32, 2 threads",
                    min_speedup=1.0,
                    memory=size in ("encoder", "encoder_800"),
                    check=same_outputs(rtol=1e-5, atol=1e-5),
                    small_setup=functools.partial(_op_setup, size, True),
                    params={"op": "ms_deform_attn", "size": size, "backward": backward},
                )
            )
    if importlib.util.find_spec("transformers"):
        cases.append(
            BenchCase(
                name="workload_deformable_detr_fwd_bwd",
                setup=functools.partial(_model_setup, (320, 384), 2),
                ours=_step_ours,
                peer=_step,
                peer_name="transformers",
                description="transformers DeformableDetrModel (random weights; d_model 256, 8 "
                "heads, 4 levels, 4 points, 2+2 layers, 100 queries) forward and backward on 2 "
                "images 320x384; ours: visionblocks.ops.ms_deform_attn as its attention core; "
                "2 threads",
                min_speedup=1.0,
                memory=False,
                check=_check_model,
                small_setup=functools.partial(_model_setup, (128, 160), 1),
                group="workload",
                verify=True,
            )
        )
    return cases


DEFORMABLE_DETR_CASES: list[BenchCase] = [register_case(case) for case in _cases()]
"""``ms_deform_attn_<size>_fwd[_bwd]`` and, where transformers is installed,
``workload_deformable_detr_fwd_bwd``."""
