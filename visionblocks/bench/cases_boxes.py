"""Benchmark cases for the box IoU family (`visionblocks.ops.boxes`) against torchvision.

``pairwise_giou_3000``: 3000×3000 pairwise GIoU, float32, forward only — the matching cost
of a DETR-style detector with a few thousand queries × targets, or of an evaluation.
torchvision materialises several ``N×M×2`` temporaries; ours computes chunks of rows with
in-place ops on cache-sized temporaries, so beyond the ``N×M`` output (34 MiB) it needs a few
MiB. ``pairwise_giou_3000_fwd_bwd`` adds the backward pass (both sides keep ``N×M`` tensors
for it, so the memory target there is looser). ``pairwise_ciou_3000`` covers the longest
formula.
"""

from __future__ import annotations

import torch

from visionblocks.bench.case import BenchCase, register_case
from visionblocks.ops.boxes import complete_box_iou, generalized_box_iou

_N = 3000


def _random_boxes(n: int, generator: torch.Generator, requires_grad: bool) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=generator) * 600
    wh = torch.rand(n, 2, generator=generator) * 200 + 1
    return torch.cat([xy, xy + wh], dim=-1).requires_grad_(requires_grad)


def _setup(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        _random_boxes(_N, generator, requires_grad),
        _random_boxes(_N, generator, requires_grad),
    )


def _setup_grad() -> tuple[torch.Tensor, torch.Tensor]:
    return _setup(requires_grad=True)


def _tv_giou(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from torchvision.ops import generalized_box_iou as tv_generalized_box_iou

    return tv_generalized_box_iou(*state)


def _tv_ciou(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from torchvision.ops import complete_box_iou as tv_complete_box_iou

    return tv_complete_box_iou(*state)


def _ours_giou(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return generalized_box_iou(*state)


def _ours_ciou(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return complete_box_iou(*state)


def _fwd_bwd(fn):
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(state).sum(), state)

    return run


PAIRWISE_GIOU_3000 = register_case(
    BenchCase(
        name="pairwise_giou_3000",
        setup=_setup,
        ours=_ours_giou,
        peer=_tv_giou,
        peer_name="torchvision",
        description="generalized_box_iou 3000x3000 float32, forward, 2 threads",
        min_speedup=1.0,
        max_memory_ratio=0.5,
    )
)

PAIRWISE_GIOU_3000_FWD_BWD = register_case(
    BenchCase(
        name="pairwise_giou_3000_fwd_bwd",
        setup=_setup_grad,
        ours=_fwd_bwd(_ours_giou),
        peer=_fwd_bwd(_tv_giou),
        peer_name="torchvision",
        description="generalized_box_iou 3000x3000 float32, forward+backward, 2 threads",
        min_speedup=1.0,
        max_memory_ratio=0.8,
    )
)

PAIRWISE_CIOU_3000 = register_case(
    BenchCase(
        name="pairwise_ciou_3000",
        setup=_setup,
        ours=_ours_ciou,
        peer=_tv_ciou,
        peer_name="torchvision",
        description="complete_box_iou 3000x3000 float32, forward, 2 threads",
        min_speedup=1.0,
        max_memory_ratio=0.5,
    )
)
