"""Benchmark cases for the box IoU family (`visionblocks.ops.boxes`) against torchvision.

3000×3000 pairwise IoU, GIoU, DIoU and CIoU, float32, forward only — the matching cost of a
DETR-style detector with a few thousand queries × targets, or of an evaluation. Both sides
run one broadcast torch formula that materialises a few ``N×M`` temporaries (torchvision's
are ``N×M×2`` with an inner dimension of 2; ours are ``N×M`` per coordinate, from
contiguous columns). Target: never slower than torchvision (``min_speedup`` 0.9: a 10%
allowance for timing noise). ``pairwise_giou_3000_fwd_bwd`` adds the backward pass. The
output check compares the matrices (the gradients for ``_fwd_bwd``) on 1000×1000 boxes.
The sizes sweep (10×10 to 100000×50, 1 and 2 threads) is in ``benchmarks/cases/sweep.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs
from visionblocks.ops import boxes as ours

__all__ = [
    "PAIRWISE_CIOU_3000",
    "PAIRWISE_DIOU_3000",
    "PAIRWISE_GIOU_3000",
    "PAIRWISE_GIOU_3000_FWD_BWD",
    "PAIRWISE_IOU_3000",
]

_N = 3000
Boxes = tuple[torch.Tensor, torch.Tensor]


def _random_boxes(n: int, generator: torch.Generator, requires_grad: bool) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=generator) * 600
    wh = torch.rand(n, 2, generator=generator) * 200 + 1
    return torch.cat([xy, xy + wh], dim=-1).requires_grad_(requires_grad)


def _setup(requires_grad: bool = False, n: int = _N) -> Boxes:
    generator = torch.Generator().manual_seed(0)
    return (
        _random_boxes(n, generator, requires_grad),
        _random_boxes(n, generator, requires_grad),
    )


def _setup_grad() -> Boxes:
    return _setup(requires_grad=True)


def _small_setup() -> Boxes:
    return _setup(n=_N // 3)


def _small_setup_grad() -> Boxes:
    return _setup(requires_grad=True, n=_N // 3)


def _pair(op: str) -> tuple[Callable[[Boxes], torch.Tensor], Callable[[Boxes], torch.Tensor]]:
    """Our ``op`` and torchvision's, as case functions (torchvision imported lazily)."""

    def run_ours(state: Boxes) -> torch.Tensor:
        return getattr(ours, op)(*state)

    def run_torchvision(state: Boxes) -> torch.Tensor:
        import torchvision.ops

        return getattr(torchvision.ops, op)(*state)

    run_ours.__name__ = f"_ours_{op}"
    run_torchvision.__name__ = f"_torchvision_{op}"
    return run_ours, run_torchvision


def _fwd_bwd(fn: Callable[[Boxes], torch.Tensor]) -> Callable[[Boxes], tuple[torch.Tensor, ...]]:
    def run(state: Boxes) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(state).sum(), state)

    run.__name__ = f"{fn.__name__}_fwd_bwd"
    return run


def _forward_case(name: str, op: str) -> BenchCase:
    run_ours, run_torchvision = _pair(op)
    return register_case(
        BenchCase(
            name=name,
            setup=_setup,
            ours=run_ours,
            peer=run_torchvision,
            peer_name="torchvision",
            description=f"{op} 3000x3000 float32, forward, 2 threads",
            min_speedup=0.9,
            check=same_outputs(rtol=1e-5, atol=1e-5),
            small_setup=_small_setup,
        )
    )


PAIRWISE_IOU_3000 = _forward_case("pairwise_iou_3000", "box_iou")
PAIRWISE_GIOU_3000 = _forward_case("pairwise_giou_3000", "generalized_box_iou")
PAIRWISE_DIOU_3000 = _forward_case("pairwise_diou_3000", "distance_box_iou")
PAIRWISE_CIOU_3000 = _forward_case("pairwise_ciou_3000", "complete_box_iou")

_GIOU = _pair("generalized_box_iou")
PAIRWISE_GIOU_3000_FWD_BWD = register_case(
    BenchCase(
        name="pairwise_giou_3000_fwd_bwd",
        setup=_setup_grad,
        ours=_fwd_bwd(_GIOU[0]),
        peer=_fwd_bwd(_GIOU[1]),
        peer_name="torchvision",
        description="generalized_box_iou 3000x3000 float32, forward+backward, 2 threads",
        min_speedup=0.9,
        check=same_outputs(rtol=1e-4, atol=1e-5),
        small_setup=_small_setup_grad,
    )
)
