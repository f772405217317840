"""Benchmark cases for the Triton kernels on a CUDA GPU (``visionblocks bench --device cuda``).

The sizes of the CPU cases, on the GPU: ours is the fused kernel (``impl="triton"``), the
peer torchvision's op (focal, GIoU) or our torch path (local ops, whose ``F.unfold`` form
is the torch path's own reference). Each case states the bytes its kernels must read and
write at least (``bytes_moved``), so the table shows the achieved GB/s against the
device's measured copy bandwidth; `PERFORMANCE_MODEL` and the kernels reference page give
the figures behind it.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case

__all__ = ["PERFORMANCE_MODEL"]

_F32 = 4
_ANCHORS, _CLASSES = 50_000, 80
_PAIRS = 1_000_000
_B, _C, _H, _W, _K, _G, _HEADS = 2, 64, 128, 128, 7, 16, 8
# Deformable DETR's encoder on an 800 x 1200 image: 4 levels, every key a query.
_MSDA_LEVELS = ((100, 150), (50, 75), (25, 38), (13, 19))
_MSDA_KEYS = sum(h * w for h, w in _MSDA_LEVELS)
_MSDA_VALUE = 2 * _MSDA_KEYS * 8 * 32  # B = 2, 8 heads of 32 channels; also the output
_MSDA_SAMPLES = 2 * _MSDA_KEYS * 8 * 4 * 4  # 4 levels x 4 points per query and head

PERFORMANCE_MODEL: dict[str, int] = {
    # Focal, forward + backward, sum: forward reads x (and float targets), backward reads
    # them again and writes the gradient; class indices are 8 bytes per row.
    "cuda_focal_loss_4m": _ANCHORS * _CLASSES * _F32 * 5,
    "cuda_focal_loss_4m_index": _ANCHORS * _CLASSES * _F32 * 3 + 2 * _ANCHORS * 8,
    # GIoU forward + backward (pred only): 2 x 16 B in, 4 B out; 2 x 16 B + 4 B in, 16 B out.
    "cuda_giou_loss_1m": _PAIRS * (36 + 52),
    # Local filter forward + both gradients: each pass reads two of (x, kernels, grad_out)
    # and writes the third's shape; the kernels tensor (G k^2 = 784 channels) dominates.
    "cuda_local_filter_fwd_bwd": 3 * (2 * _B * _C * _H * _W + _B * _G * _K * _K * _H * _W) * _F32,
    # Local attention forward (q, k, v in; out and log-sum-exp out) + backward (two kernels,
    # each reading five planes-sets and writing one or two).
    "cuda_local_attention_fwd_bwd": (
        (4 * _B * _C * _H * _W + _B * _HEADS * _H * _W)
        + (6 * _B * _C * _H * _W + 2 * _B * _HEADS * _H * _W)
        + (6 * _B * _C * _H * _W + 2 * _B * _HEADS * _H * _W)
    )
    * _F32,
    # Deformable attention forward (value, locations, weights in; output out) + backward
    # (the same and grad_out in; the three gradients out): value and output V elements
    # each, locations 2 S, weights S. The gathers' re-reads of value and grad_out and the
    # backward's bucket sort are not counted.
    "cuda_ms_deform_attn_fwd_bwd": (5 * _MSDA_VALUE + 9 * _MSDA_SAMPLES) * _F32,
}
"""Case name → least bytes one call reads and writes (float32)."""


def _focal_setup() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(_ANCHORS, _CLASSES, generator=gen) * 2.0 - 4.6
    labels = torch.randint(0, _CLASSES + 1, (_ANCHORS,), generator=gen)
    onehot = (labels.unsqueeze(1) == torch.arange(_CLASSES)).float()
    return {
        "logits": logits.cuda().requires_grad_(True),
        "labels": labels.cuda(),
        "onehot": onehot.cuda(),
    }


def _focal_ours(targets: str):
    def run(state: dict[str, Any]) -> torch.Tensor:
        from visionblocks.losses.focal import sigmoid_focal_loss

        x = state["logits"]
        loss = sigmoid_focal_loss(x, state[targets], reduction="sum", impl="triton")
        return torch.autograd.grad(loss, x)[0]

    return run


def _focal_peer(state: dict[str, Any]) -> torch.Tensor:
    from torchvision.ops import sigmoid_focal_loss

    x = state["logits"]
    return torch.autograd.grad(sigmoid_focal_loss(x, state["onehot"], reduction="sum"), x)[0]


def _giou_setup() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(2, _PAIRS, 2, generator=gen) * 600
    boxes = torch.cat([xy, xy + torch.rand(2, _PAIRS, 2, generator=gen) * 200 + 1], -1).cuda()
    return boxes[0].clone().requires_grad_(True), boxes[1].clone()


def _giou(impl: str | None):
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        pred, target = state
        if impl is None:
            from torchvision.ops import generalized_box_iou_loss as loss_fn

            loss = loss_fn(pred, target, reduction="sum")
        else:
            from visionblocks.losses.iou import generalized_box_iou_loss

            loss = generalized_box_iou_loss(pred, target, reduction="sum", impl=impl)
        return torch.autograd.grad(loss, pred)[0]

    return run


def _local_setup(kernel_channels: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(_B, _C, _H, _W, generator=gen)
    b = torch.randn(_B, kernel_channels, _H, _W, generator=gen) / _K
    c = torch.randn(_B, _C, _H, _W, generator=gen)
    return [t.cuda().requires_grad_(True) for t in (a, b, c)]


def _local_filter(impl: str):
    def run(state: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        from visionblocks.ops.local import local_filter2d

        x, kernels, grad_out = state
        out = local_filter2d(x, kernels, _K, impl=impl)
        return torch.autograd.grad(out, (x, kernels), grad_out.detach())

    return run


def _local_attention(impl: str):
    def run(state: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        from visionblocks.ops.local_attention import local_attention2d

        q, k, v = state
        out = local_attention2d(q, k, v, _K, 1, _HEADS, impl=impl)
        return torch.autograd.grad(out.square().sum(), (q, k, v))

    return run


def _msda_setup() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    b, q, heads, c = 2, _MSDA_KEYS, 8, 32
    value = torch.randn(b, _MSDA_KEYS, heads, c, generator=gen)
    loc = torch.rand(b, q, heads, len(_MSDA_LEVELS), 4, 2, generator=gen)
    weights = torch.rand(b, q, heads, len(_MSDA_LEVELS), 4, generator=gen).softmax(-1)
    state = {
        k: t.cuda().requires_grad_(True) for k, t in (("v", value), ("x", loc), ("a", weights))
    }
    state["grad"] = torch.randn(b, q, heads * c, generator=gen).cuda()
    return state


def _msda(impl: str | None):
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        inputs = (state["v"], state["x"], state["a"])
        if impl is None:
            from benchmarks.cases.deformable_detr import mmcv_ms_deform_attn

            out = mmcv_ms_deform_attn(inputs[0], list(_MSDA_LEVELS), *inputs[1:])
        else:
            from visionblocks.ops.ms_deform_attn import ms_deform_attn

            out = ms_deform_attn(inputs[0], list(_MSDA_LEVELS), *inputs[1:], impl=impl)
        return torch.autograd.grad(out, inputs, state["grad"])

    return run


def _case(name: str, **kwargs: Any) -> BenchCase:
    return register_case(
        BenchCase(
            name=name, device="cuda", memory=False, bytes_moved=PERFORMANCE_MODEL[name], **kwargs
        )
    )


_case(
    "cuda_focal_loss_4m",
    setup=_focal_setup,
    ours=_focal_ours("onehot"),
    peer=_focal_peer,
    peer_name="torchvision",
    description="sigmoid_focal_loss 50000x80 float32 on CUDA, float targets, sum, fwd+bwd",
    min_speedup=1.0,
)
_case(
    "cuda_focal_loss_4m_index",
    setup=_focal_setup,
    ours=_focal_ours("labels"),
    peer=_focal_peer,
    peer_name="torchvision",
    description="sigmoid_focal_loss 50000x80 float32 on CUDA, class indices, sum, fwd+bwd",
    min_speedup=1.0,
)
_case(
    "cuda_giou_loss_1m",
    setup=_giou_setup,
    ours=_giou("triton"),
    peer=_giou(None),
    peer_name="torchvision",
    description="generalized_box_iou_loss 1M float32 pairs on CUDA, sum, fwd+bwd (pred)",
    min_speedup=1.0,
)
_case(
    "cuda_local_filter_fwd_bwd",
    setup=lambda: _local_setup(_G * _K * _K),
    ours=_local_filter("triton"),
    peer=_local_filter("torch"),
    peer_name="torch path",
    description=f"local_filter2d x {_B}x{_C}x{_H}x{_W} float32, k={_K}, G={_G} on CUDA, fwd+bwd",
    min_speedup=1.0,
)
_case(
    "cuda_local_attention_fwd_bwd",
    setup=lambda: _local_setup(_C),
    ours=_local_attention("triton"),
    peer=_local_attention("torch"),
    peer_name="torch path",
    description=f"local_attention2d {_B}x{_C}x{_H}x{_W} float32, k={_K}, {_HEADS} heads on "
    "CUDA, fwd+bwd",
    min_speedup=1.0,
)
_case(
    "cuda_ms_deform_attn_fwd_bwd",
    setup=_msda_setup,
    ours=_msda("triton"),
    peer=_msda(None),
    peer_name="mmcv formula",
    description=f"ms_deform_attn 2x{_MSDA_KEYS} queries and keys, 8 heads x 32, 4 levels x 4 "
    "points float32 on CUDA, fwd+bwd",
    min_speedup=1.0,
)
