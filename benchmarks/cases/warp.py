"""Benchmark cases: `warp_affine` against kornia's ``warp_affine`` (CPU, 2 threads, forward).

A batch of 8 RGB 512×512 float32 images, bilinear, zero padding, output of the same size,
rotated by 30° and scaled by 0.8 about the image centre.

- ``warp_affine_8x3x512``: one matrix for the whole batch (ours: ``(2, 3)``; kornia: its
  ``(1, 2, 3)`` broadcast, which builds one grid and expands it, as ours does).
- ``warp_affine_8x3x512_per_sample``: eight different matrices ``(8, 2, 3)`` (angles 0°–35°).

kornia runs with its default ``align_corners=True``, which in kornia means OpenCV's pixel
convention (pixel centres on integers) — the same outputs as ours up to float32 rounding
(``tests/ops/test_warp.py`` checks it). kornia ends in ``F.grid_sample``; ours, on CPU,
calls OpenCV's ``cv2.warpAffine`` per channel plane (on OpenCV's threads, as many as its
default: the machine's cores), or ``F.grid_sample`` without OpenCV. The output check compares
the warped images (two 128×128 images; values in ``[0, 1]``, so an absolute tolerance).
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs
from visionblocks.ops.warp import affine_matrix, warp_affine

__all__ = ["WARP_AFFINE_8X3X512", "WARP_AFFINE_8X3X512_PER_SAMPLE"]

_B, _C, _H, _W = 8, 3, 512, 512


def _setup_shared(b: int = _B, h: int = _H, w: int = _W) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    img = torch.rand(b, _C, h, w, generator=gen)
    center = ((w - 1) / 2, (h - 1) / 2)
    return {"img": img, "matrix": affine_matrix(angle=30.0, scale=0.8, center=center)}


def _setup_per_sample(b: int = _B, h: int = _H, w: int = _W) -> dict[str, Any]:
    state = _setup_shared(b, h, w)
    angles = torch.linspace(0.0, 35.0, b)
    center = ((w - 1) / 2, (h - 1) / 2)
    state["matrix"] = affine_matrix(angle=angles, scale=0.8, center=center)
    return state


def _small_shared() -> dict[str, Any]:
    return _setup_shared(2, 128, 128)


def _small_per_sample() -> dict[str, Any]:
    return _setup_per_sample(2, 128, 128)


def _ours(state: dict[str, Any]) -> torch.Tensor:
    return warp_affine(state["img"], state["matrix"])


def _kornia(state: dict[str, Any]) -> torch.Tensor:
    from kornia.geometry.transform import warp_affine as kornia_warp_affine

    img, matrix = state["img"], state["matrix"]
    if matrix.dim() == 2:
        matrix = matrix[None]
    return kornia_warp_affine(img, matrix, tuple(img.shape[-2:]), align_corners=True)


_CHECK = same_outputs(rtol=0.0, atol=1e-4)


WARP_AFFINE_8X3X512 = register_case(
    BenchCase(
        name="warp_affine_8x3x512",
        setup=_setup_shared,
        ours=_ours,
        peer=_kornia,
        peer_name="kornia",
        description="warp_affine 8x3x512x512 float32, bilinear, zeros, one rotation+scale "
        "matrix for the batch, forward, 2 threads",
        min_speedup=1.5,
        check=_CHECK,
        small_setup=_small_shared,
    )
)

WARP_AFFINE_8X3X512_PER_SAMPLE = register_case(
    BenchCase(
        name="warp_affine_8x3x512_per_sample",
        setup=_setup_per_sample,
        ours=_ours,
        peer=_kornia,
        peer_name="kornia",
        description="warp_affine 8x3x512x512 float32, bilinear, zeros, 8 rotation+scale "
        "matrices, forward, 2 threads",
        min_speedup=1.5,
        check=_CHECK,
        small_setup=_small_per_sample,
    )
)
