"""Rotated-box IoU (`visionblocks.ops.rotated_box_iou`) against shapely, and its CUDA kernel.

No torch library computes rotated IoU without a compiled extension (mmcv's and detectron2's
are C++/CUDA), so the CPU peer is what a user without one writes: shapely 2's vectorised
polygon intersection of every pair, float64, polygons built from the same ``cxcywhr``
boxes. Pairwise, forward, ``N x N`` for N in `SIZES`, at 1 and 2 threads, in the ``sweep``
group: boxes of 4 to 104 pixels at random angles in an 800 x 800 image (an aerial image's
objects, most pairs apart). Ours must be at least `MIN_RATIO` of shapely's speed at every
size (`benchmarks.cases.sweep.MIN_RATIO`) and agree with it to 1e-5 (the tests' bound).

On a CUDA GPU (``visionblocks bench --device cuda``): the pairwise Triton kernel against
our torch path on the GPU, 2,000 x 2,000 boxes, the 1.3x a kernel must earn.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from benchmarks.cases.sweep import MIN_RATIO, MIN_SAMPLE_MS, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CUDA_ROTATED_IOU", "SIZES", "SWEEP_CASES"]

SIZES = (10, 30, 100, 300)
"""``N`` of the ``N x N`` sweep points."""
_CUDA_N = 2000
Boxes = tuple[torch.Tensor, torch.Tensor]


def _boxes(n: int, generator: torch.Generator) -> torch.Tensor:
    centre = torch.rand(n, 2, generator=generator) * 800
    sides = torch.rand(n, 2, generator=generator) * 100 + 4
    angle = torch.rand(n, 1, generator=generator) * 180 - 90
    return torch.cat([centre, sides, angle], dim=1)


def _setup(n: int) -> Callable[[], Boxes]:
    def setup() -> Boxes:
        gen = torch.Generator().manual_seed(0)
        return _boxes(n, gen), _boxes(n, gen)

    return setup


def _ours(impl: str) -> Callable[[Boxes], torch.Tensor]:
    def run(state: Boxes) -> torch.Tensor:
        from visionblocks.ops import rotated_box_iou

        return rotated_box_iou(*state, impl=impl)

    return run


def _polygons(boxes: torch.Tensor) -> np.ndarray:
    """shapely polygons of ``(N, 5)`` cxcywhr boxes (degrees, counter-clockwise on screen)."""
    import shapely

    cx, cy, w, h, r = boxes.double().numpy().T
    t = np.deg2rad(r)
    c, s = np.cos(t)[:, None], np.sin(t)[:, None]
    u = np.array([-0.5, 0.5, 0.5, -0.5]) * w[:, None]
    v = np.array([-0.5, -0.5, 0.5, 0.5]) * h[:, None]
    x = cx[:, None] + u * c + v * s
    y = cy[:, None] - u * s + v * c
    return shapely.polygons(np.stack([x, y], axis=-1))


def _shapely(state: Boxes) -> torch.Tensor:
    import shapely

    a, b = (_polygons(t) for t in state)
    inter = shapely.area(shapely.intersection(a[:, None], b[None, :]))
    union = shapely.area(a)[:, None] + shapely.area(b)[None, :] - inter
    return torch.from_numpy(inter / union)


def _point(n: int, threads: int) -> BenchCase:
    return register_case(
        BenchCase(
            name=f"sweep_rotated_box_iou_{n}x{n}_t{threads}",
            setup=_setup(n),
            ours=_ours("auto"),
            peer=_shapely,
            peer_name="shapely",
            description=f"rotated_box_iou pairwise {n}x{n} float32 vs shapely (float64), "
            f"{threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=same_outputs(rtol=0, atol=1e-5),
            group="sweep",
            params={"op": "rotated_box_iou", "size": f"{n}x{n}", "elements": n * n},
            min_sample_ms=MIN_SAMPLE_MS,
            count_calls=True,
        )
    )


SWEEP_CASES: tuple[BenchCase, ...] = tuple(_point(n, t) for n in SIZES for t in THREADS)
"""One sweep point per (size, threads)."""


def _cuda_setup() -> Boxes:
    gen = torch.Generator().manual_seed(0)
    return _boxes(_CUDA_N, gen).cuda(), _boxes(_CUDA_N, gen).cuda()


CUDA_ROTATED_IOU = register_case(
    BenchCase(
        name="cuda_rotated_box_iou_2k",
        setup=_cuda_setup,
        ours=_ours("triton"),
        peer=_ours("torch"),
        peer_name="torch path (on the GPU)",
        description=f"rotated_box_iou pairwise {_CUDA_N}x{_CUDA_N} float32 on CUDA, Triton "
        "kernel vs our torch path",
        min_speedup=1.3,
        memory=False,
        check=same_outputs(rtol=0, atol=2e-6),
        verify=True,
        device="cuda",
        params={"op": "rotated_box_iou", "size": f"{_CUDA_N}x{_CUDA_N}"},
    )
)
"""The pairwise kernel on a CUDA GPU against the torch path."""
