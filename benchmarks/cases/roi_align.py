"""Benchmark cases: the RoI pooling family (`visionblocks.ops.roi_align`) against torchvision.

Ours runs torchvision's compiled kernels after our argument checks, except CPU ``roi_align``
from some size on (a gather for the input gradient, and from a larger size for the forward
too): these cases hold ours to the sweep's `MIN_RATIO` from a tiny call (where the checks
weigh most) to a Mask R-CNN box head's, forward and the input gradient, at 1 and 2 threads.
Sizes (``N x C x H x W`` features, ``K`` boxes of 8 to 136 pixels at stride 8, 7 x 7 bins,
``sampling_ratio`` 2):

- ``tiny``: 1 x 16 x 16 x 16, 4 boxes; ``small``: 1 x 64 x 32 x 40, 32 boxes;
  ``medium``: 2 x 256 x 50 x 68, 256 boxes; ``large``: 2 x 256 x 100 x 136, 512 boxes.

``roi_align`` runs at every size; ``roi_pool``, ``ps_roi_align`` and ``ps_roi_pool`` (490
channels: 10 x 7 x 7) at ``tiny`` and ``medium``. ``multiscale_roi_align_*`` times
`MultiScaleRoIAlign` on four FPN levels of a 2-image 800 x 1088 batch (512 boxes per image)
against torchvision's module: ``indexed`` is what runs on CPU (torchvision's merge),
``masked`` the sync-free merge CUDA calls take, timed on CPU for its cost (each level pools
every box; no target).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases.sweep import MIN_RATIO, MIN_SAMPLE_MS, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CASES", "SIZES"]

SIZES: dict[str, tuple[tuple[int, int, int, int], int]] = {
    "tiny": ((1, 16, 16, 16), 4),
    "small": ((1, 64, 32, 40), 32),
    "medium": ((2, 256, 50, 68), 256),
    "large": ((2, 256, 100, 136), 512),
}
"""Size name → (features ``(N, C, H, W)``, boxes ``K``)."""
_SCALE, _BINS = 0.125, 7
_OPS = {  # name → (arguments after the boxes, channels of the position-sensitive ops)
    "roi_align": ((_BINS, _SCALE, 2, False), None),
    "roi_pool": ((_BINS, _SCALE), None),
    "ps_roi_align": ((_BINS, _SCALE, 2), 490),
    "ps_roi_pool": ((_BINS, _SCALE), 490),
}


def _rois(shape: tuple[int, int, int, int], k: int, gen: torch.Generator) -> torch.Tensor:
    n, _, h, w = shape
    xy = torch.rand(k, 2, generator=gen) * torch.tensor([w / _SCALE, h / _SCALE])
    wh = torch.rand(k, 2, generator=gen) * 128 + 8
    batch = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([batch, xy, xy + wh], 1)


def _setup(op: str, size: str) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        (n, c, h, w), k = SIZES[size]
        c = _OPS[op][1] or c
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, c, h, w, generator=gen).requires_grad_(True)
        return {"x": x, "rois": _rois((n, c, h, w), k, gen)}

    return setup


def _run(fn: Callable[..., torch.Tensor], op: str) -> Callable[[dict[str, Any]], Any]:
    args = _OPS[op][0]

    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out = fn(state["x"], state["rois"], *args)
        return out.detach(), torch.autograd.grad(out.sum(), state["x"])[0]

    return run


def _ours(op: str) -> Callable[[dict[str, Any]], Any]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import visionblocks.ops

        return _run(getattr(visionblocks.ops, op), op)(state)

    return run


def _theirs(op: str) -> Callable[[dict[str, Any]], Any]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import torchvision.ops

        return _run(getattr(torchvision.ops, op), op)(state)

    return run


def _point(op: str, size: str, threads: int) -> BenchCase:
    (n, c, h, w), k = SIZES[size]
    c = _OPS[op][1] or c
    return register_case(
        BenchCase(
            name=f"{op}_{size}_fwd_bwd_t{threads}",
            setup=_setup(op, size),
            ours=_ours(op),
            peer=_theirs(op),
            peer_name="torchvision",
            description=f"{op} {k} boxes on {n}x{c}x{h}x{w}, 7x7 bins, forward + input "
            f"gradient, {threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            # roi_align's input gradient on CPU is our gather (from some size on): equal to
            # torchvision's backward to float rounding, not bitwise; the rest runs its kernels
            check=same_outputs(rtol=1e-5, atol=1e-6)
            if op == "roi_align"
            else same_outputs(rtol=0, atol=0),
            group="sweep",
            params={"op": op, "size": size, "elements": k * c * _BINS * _BINS},
            min_sample_ms=MIN_SAMPLE_MS,
            small_setup=_setup(op, "tiny"),
        )
    )


_LEVELS = (("p2", 4), ("p3", 8), ("p4", 16), ("p5", 32))
_IMAGE = (800, 1088)


def _ms_setup(image: tuple[int, int] = _IMAGE, k: int = 512, c: int = 256) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = {
        name: torch.randn(2, c, image[0] // s, image[1] // s, generator=gen).requires_grad_(True)
        for name, s in _LEVELS
    }
    boxes = []
    for _ in range(2):
        size = torch.exp(torch.rand(k, 2, generator=gen) * 4.2) * 8  # 8 to 530 pixels
        xy = torch.rand(k, 2, generator=gen) * torch.tensor([image[1], image[0]])
        boxes.append(torch.cat([xy, xy + size], 1))
    return {"x": x, "boxes": boxes, "shapes": [image, image]}


def _ms(build: Callable[[], Any], merge: str | None = None) -> Callable[[dict[str, Any]], Any]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        pool = build()
        if merge == "masked":  # the CUDA merge, on CPU tensors
            pool._merge_indexed = pool._merge_masked
        out = pool(state["x"], state["boxes"], state["shapes"])
        grads = torch.autograd.grad(out.sum(), list(state["x"].values()))
        return (out.detach(), *grads)

    return run


def _ms_ours() -> Any:
    from visionblocks.ops import MultiScaleRoIAlign

    return MultiScaleRoIAlign([n for n, _ in _LEVELS], 7, 2)


def _ms_theirs() -> Any:
    from torchvision.ops import MultiScaleRoIAlign

    return MultiScaleRoIAlign([n for n, _ in _LEVELS], 7, 2)


def _ms_case(merge: str) -> BenchCase:
    return register_case(
        BenchCase(
            name=f"multiscale_roi_align_{merge}_fwd_bwd",
            setup=_ms_setup,
            ours=_ms(_ms_ours, merge),
            peer=_ms(_ms_theirs),
            peer_name="torchvision",
            description="MultiScaleRoIAlign, 4 FPN levels of 2 x 256 x 800 x 1088 images, 512 "
            f"boxes per image, forward + feature gradients, the {merge} merge, 1 thread",
            min_speedup=MIN_RATIO if merge == "indexed" else None,
            min_busy_speedup=None,
            memory=False,
            threads=1,
            # the feature gradients come from our CPU gather: torchvision's to float rounding
            check=same_outputs(rtol=1e-5, atol=1e-6),
            group="sweep",
            params={"op": "MultiScaleRoIAlign", "size": merge},
            small_setup=lambda: _ms_setup((256, 320), 32, 8),
        )
    )


CASES: tuple[BenchCase, ...] = (
    *(_point("roi_align", size, t) for size in SIZES for t in THREADS),
    *(
        _point(op, size, t)
        for op in _OPS
        if op != "roi_align"
        for size in ("tiny", "medium")
        for t in THREADS
    ),
    _ms_case("indexed"),
    _ms_case("masked"),
)
"""Every case of this module."""
