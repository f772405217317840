"""Benchmark cases: `rotated_roi_align`, the torch path on CPU (1 thread).

No CPU peer is installed: rotated RoI align exists only in compiled extensions (detectron2's
``ROIAlignRotated``, mmcv's ``roi_align_rotated``), neither of which is in the environment.
So the rotated cases time ours alone, at the sizes of a rotated Faster R-CNN box head: a
2 x 256 x 50 x 68 feature map (stride 8 of a 400 x 544 image), 7 x 7 bins, ``K`` RoIs of
16 to 136 pixels a side at random angles, forward and the input gradient, with
``sampling_ratio`` 2 (mmrotate's configs) and adaptive (0, detectron2's default). One
comparison has a peer: at angle 0 the op is torchvision's ``roi_align(..., aligned=True)``
(compiled C++), which it is timed against there, without a target (a different op).

- ``rotated_roi_align_k{K}_sr{S}_fwd_bwd``: forward and ``torch.autograd.grad`` of the input.
- ``rotated_roi_align_angle0_k512_fwd_bwd``: the same at angle 0, against torchvision.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["ANGLE0_CASE", "CASES", "SIZES"]

SIZES = ((64, 2), (512, 2), (512, 0))
"""``(K, sampling_ratio)`` of the rotated cases."""
_N, _C, _H, _W, _BINS, _SCALE = 2, 256, 50, 68, 7, 0.125


def _rois(k: int, gen: torch.Generator, rotated: bool = True) -> torch.Tensor:
    centre = torch.rand(k, 2, generator=gen) * torch.tensor([_W / _SCALE, _H / _SCALE])
    sides = torch.rand(k, 2, generator=gen) * 120 + 16
    angle = torch.rand(k, 1, generator=gen) * 180 - 90
    batch = torch.randint(0, _N, (k, 1), generator=gen).float()
    return torch.cat([batch, centre, sides, angle if rotated else angle * 0], 1)


def _setup(k: int, rotated: bool = True, size: tuple[int, int] = (_H, _W)):
    def setup() -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(_N, _C, *size, generator=gen).requires_grad_(True)
        rois = _rois(k, gen, rotated)
        return {"x": x, "rois": rois, "grad": torch.randn(k, _C, _BINS, _BINS, generator=gen)}

    return setup


def _ours(ratio: int):
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        from visionblocks.ops import rotated_roi_align

        out = rotated_roi_align(state["x"], state["rois"], _BINS, _SCALE, ratio)
        return out.detach(), torch.autograd.grad(out, state["x"], state["grad"])[0]

    return run


def _torchvision(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.ops import roi_align

    r = state["rois"]
    half = r[:, 3:5] / 2
    boxes = torch.cat([r[:, :1], r[:, 1:3] - half, r[:, 1:3] + half], 1)
    out = roi_align(state["x"], boxes, _BINS, _SCALE, 2, aligned=True)
    return out.detach(), torch.autograd.grad(out, state["x"], state["grad"])[0]


def _case(k: int, ratio: int) -> BenchCase:
    return register_case(
        BenchCase(
            name=f"rotated_roi_align_k{k}_sr{ratio}_fwd_bwd",
            setup=_setup(k),
            ours=_ours(ratio),
            peer=None,
            peer_name="none installed (detectron2 / mmcv are compiled extensions)",
            description=f"rotated_roi_align {k} RoIs on {_N}x{_C}x{_H}x{_W}, 7x7 bins, "
            f"sampling_ratio {ratio}, forward + input gradient, torch path, 1 thread",
            min_speedup=None,
            memory=False,
            threads=1,
            params={"op": "rotated_roi_align", "rois": k, "sampling_ratio": ratio},
        )
    )


CASES: tuple[BenchCase, ...] = tuple(_case(k, ratio) for k, ratio in SIZES)

ANGLE0_CASE = register_case(
    BenchCase(
        name="rotated_roi_align_angle0_k512_fwd_bwd",
        setup=_setup(512, rotated=False),
        ours=_ours(2),
        peer=_torchvision,
        peer_name="torchvision roi_align (aligned=True)",
        description=f"rotated_roi_align at angle 0, 512 RoIs on {_N}x{_C}x{_H}x{_W}, 7x7 bins, "
        "sampling_ratio 2, forward + input gradient vs torchvision's roi_align, 1 thread",
        min_speedup=None,
        min_busy_speedup=None,
        memory=False,
        threads=1,
        check=same_outputs(rtol=1e-5, atol=1e-5),
        small_setup=_setup(32, rotated=False, size=(20, 24)),
        params={"op": "rotated_roi_align", "rois": 512, "sampling_ratio": 2, "angle": 0},
    )
)
