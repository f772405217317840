"""Benchmark cases: the Lovász loss (`visionblocks.losses.lovasz_loss`) against
segmentation_models_pytorch's ``LovaszLoss`` (smp), forward + backward, at 1 and 2 threads.

smp loops in Python over the classes (and, with ``per_image``, over the images), one sort
each; ours sorts every class's pixel errors in one batched sort. Both sides compute the loss
of a batch of logits (``per_image=False``, smp's default) and its gradient with respect to the
logits (``torch.autograd.grad``) and return both; the output check compares them at ``tiny``.
Sizes (``N x C x H x W`` logits, ``C`` classes in multiclass mode; binary mode has one
channel and 0/1 targets): ``tiny`` 1 x 4 x 32 x 32, ``small`` 2 x 8 x 64 x 64, ``medium``
4 x 19 x 128 x 128, ``large`` 8 x 19 x 256 x 256 (Cityscapes' 19 classes). Labels are uniform
over the classes, so every class is present (smp skips the sort of an absent class; ours
sorts a constant row for it). The target is the sweep's `MIN_RATIO`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases.sweep import MIN_RATIO, MIN_SAMPLE_MS, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CASES", "SIZES"]

SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (1, 4, 32, 32),
    "small": (2, 8, 64, 64),
    "medium": (4, 19, 128, 128),
    "large": (8, 19, 256, 256),
}
"""Size name → multiclass logits ``(N, C, H, W)``."""
MODES = ("multiclass", "binary")


def _setup(mode: str, size: str) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        n, c, h, w = SIZES[size]
        gen = torch.Generator().manual_seed(0)
        c = c if mode == "multiclass" else 1
        x = (torch.randn(n, c, h, w, generator=gen) * 2).requires_grad_(True)
        target = torch.randint(0, max(c, 2), (n, h, w), generator=gen)
        return {"x": x, "target": target}

    return setup


def _ours(mode: str) -> Callable[[dict[str, Any]], Any]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        from visionblocks.losses import lovasz_loss

        loss = lovasz_loss(state["x"], state["target"], mode)
        return loss.detach(), torch.autograd.grad(loss, state["x"])[0]

    return run


def _smp(mode: str) -> Callable[[dict[str, Any]], Any]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        from segmentation_models_pytorch.losses import LovaszLoss

        loss = LovaszLoss(mode)(state["x"], state["target"])
        return loss.detach(), torch.autograd.grad(loss, state["x"])[0]

    return run


def _point(mode: str, size: str, threads: int) -> BenchCase:
    n, c, h, w = SIZES[size]
    c = c if mode == "multiclass" else 1
    return register_case(
        BenchCase(
            name=f"lovasz_{mode}_{size}_fwd_bwd_t{threads}",
            setup=_setup(mode, size),
            ours=_ours(mode),
            peer=_smp(mode),
            peer_name="smp",
            description=f"Lovász loss ({mode}) of {n}x{c}x{h}x{w} logits, forward + input "
            f"gradient, {threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=same_outputs(rtol=1e-4, atol=1e-6),
            group="sweep",
            params={"op": f"lovasz_{mode}", "size": size, "elements": n * c * h * w},
            min_sample_ms=MIN_SAMPLE_MS,
            small_setup=_setup(mode, "tiny"),
        )
    )


CASES: tuple[BenchCase, ...] = tuple(
    _point(mode, size, t) for mode in MODES for size in SIZES for t in THREADS
)
"""Every case of this module."""
