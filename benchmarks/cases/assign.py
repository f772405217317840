"""Benchmark case for anchor assignment without the IoU matrix (`visionblocks.ops.assign`).

RetinaNet's matching of one image: 200,000 anchors x 500 objects, float32, thresholds 0.5 /
0.4 with low-quality matches (torchvision's RetinaNet settings). Ours is `match_anchors`
(two passes over blocks of anchors, never the ``N x M`` matrix); the peer is what a user
writes with torchvision: ``Matcher(0.5, 0.4, True)(box_iou(boxes, anchors))``, which builds
the 400 MB matrix (and its formula's temporaries). Target: peak extra memory at most a tenth
of the peer's (``max_memory_ratio`` 0.1); the results must be equal (the check compares the
matches on 20,000 x 50).

On a CUDA GPU (``visionblocks bench --device cuda``) the same problem runs twice: the Triton
kernels (``impl="triton"``) against the matrix + ``Matcher``, and against our torch path on
the GPU (the blocked reduction a user gets with ``impl="auto"``), which is what the kernels
must beat by 1.3x to be picked by default. Both check the full 200,000 x 500 result
bitwise on every run (``verify``): equal matches on the GPU are what ``impl="auto"`` waits
for before it picks the kernels.
"""

from __future__ import annotations

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CUDA_MATCH_ANCHORS", "MATCH_ANCHORS_200K_500"]

_N, _M = 200_000, 500
_HIGH, _LOW = 0.5, 0.4
Boxes = tuple[torch.Tensor, torch.Tensor]


def _random_boxes(n: int, generator: torch.Generator, low: float, high: float) -> torch.Tensor:
    """Boxes in a 1333 x 800 image, sides from ``low`` to ``high`` pixels."""
    centre = torch.rand(n, 2, generator=generator) * torch.tensor([1333.0, 800.0])
    half = (torch.rand(n, 2, generator=generator) * (high - low) + low) / 2
    return torch.cat([centre - half, centre + half], dim=-1)


def _setup(n: int = _N, m: int = _M) -> Boxes:
    generator = torch.Generator().manual_seed(0)
    return _random_boxes(n, generator, 16.0, 512.0), _random_boxes(m, generator, 8.0, 400.0)


def _small_setup() -> Boxes:
    return _setup(20_000, 50)


def _cuda_setup() -> Boxes:
    anchors, boxes = _setup()
    return anchors.cuda(), boxes.cuda()


def _match(impl: str):
    def run(state: Boxes) -> torch.Tensor:
        from visionblocks.ops import match_anchors

        anchors, boxes = state
        return match_anchors(
            anchors,
            boxes=boxes,
            high_threshold=_HIGH,
            low_threshold=_LOW,
            allow_low_quality_matches=True,
            impl=impl,
        )

    return run


_ours = _match("auto")


def _torchvision(state: Boxes) -> torch.Tensor:
    from torchvision.models.detection._utils import Matcher
    from torchvision.ops import box_iou

    anchors, boxes = state
    return Matcher(_HIGH, _LOW, allow_low_quality_matches=True)(box_iou(boxes, anchors))


MATCH_ANCHORS_200K_500 = register_case(
    BenchCase(
        name="match_anchors_200k_500",
        setup=_setup,
        ours=_ours,
        peer=_torchvision,
        peer_name="torchvision box_iou + Matcher",
        description=(
            "match_anchors 200000 anchors x 500 objects float32 (0.5/0.4, low-quality "
            "matches) vs the IoU matrix + Matcher, 2 threads"
        ),
        max_memory_ratio=0.1,
        check=same_outputs(rtol=0, atol=0),
        small_setup=_small_setup,
        params={"op": "match_anchors", "size": "200000x500"},
    )
)


def _cuda_case(name: str, peer, peer_name: str, versus: str, **target) -> BenchCase:
    """The Triton kernels on CUDA against ``peer``; all 200,000 matches compared bitwise on
    every run (``verify``)."""
    return register_case(
        BenchCase(
            name=name,
            setup=_cuda_setup,
            ours=_match("triton"),
            peer=peer,
            peer_name=peer_name,
            description=f"match_anchors 200000 x 500 float32 on CUDA, Triton kernels vs "
            f"{versus}; equal matches checked on every run",
            check=same_outputs(rtol=0, atol=0),
            verify=True,
            device="cuda",
            params={"op": "match_anchors", "size": "200000x500"},
            **target,
        )
    )


CUDA_MATCH_ANCHORS: tuple[BenchCase, ...] = (
    _cuda_case(
        "cuda_match_anchors_200k_500", _torchvision, "torchvision box_iou + Matcher",
        "the IoU matrix + Matcher", max_memory_ratio=0.1,
    ),
    _cuda_case(
        "cuda_match_anchors_200k_500_vs_torch_path", _match("torch"),
        "torch path (blocked, on the GPU)", "our blocked torch path", min_speedup=1.3,
    ),
)  # fmt: skip
"""The assignment on a CUDA GPU: the kernels against the matrix (memory) and against the
torch path (the 1.3x a kernel must earn before ``impl="auto"`` picks it)."""
