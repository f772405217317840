"""Benchmark cases: the soft overlap losses (`visionblocks.losses.dice_loss`, `jaccard_loss`,
`tversky_loss`) against segmentation_models_pytorch's (smp) modules, forward + backward, at 1
and 2 threads.

smp builds an int64 one-hot target and takes the intersection from an L1 norm of ``p - t``;
ours sums each pixel's probability of its class into class bins (a gather and a scatter-add)
and never builds the one-hot. Both sides compute the loss of a batch of logits (per batch,
smp's only reduction) and its gradient with respect to the logits and return both; the output
check compares them at ``tiny``. Sizes (``N x C x H x W`` logits, ``C`` classes in multiclass
mode; binary mode has one channel): ``tiny`` 1 x 4 x 32 x 32, ``small`` 2 x 8 x 64 x 64,
``medium`` 4 x 19 x 128 x 128, ``large`` 8 x 19 x 512 x 512 (Cityscapes' 19 classes). Labels
are uniform over the classes (every class present: the two agree there), 5% of them
``ignore_index`` (255) in the ``_ignore`` cases. Dice runs at every size, Jaccard, Tversky and
binary Dice at ``tiny`` and ``medium``. The target is the sweep's `MIN_RATIO`.
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
    "large": (8, 19, 512, 512),
}
"""Size name → multiclass logits ``(N, C, H, W)``."""
_OPTIONS = {"tversky": {"alpha": 0.3, "beta": 0.7}}
_SMP = {"dice": "DiceLoss", "jaccard": "JaccardLoss", "tversky": "TverskyLoss"}


def _setup(mode: str, size: str, ignore: bool) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        n, c, h, w = SIZES[size]
        gen = torch.Generator().manual_seed(0)
        c = c if mode == "multiclass" else 1
        x = (torch.randn(n, c, h, w, generator=gen) * 2).requires_grad_(True)
        target = torch.randint(0, max(c, 2), (n, h, w), generator=gen)
        if ignore:
            target = target.masked_fill(torch.rand(n, h, w, generator=gen) < 0.05, 255)
        return {"x": x, "target": target}

    return setup


def _ours(loss: str, mode: str, ignore: bool) -> Callable[[dict[str, Any]], Any]:
    options = {**_OPTIONS.get(loss, {}), "ignore_index": 255 if ignore else None}

    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import visionblocks.losses

        fn = getattr(visionblocks.losses, f"{loss}_loss")
        out = fn(state["x"], state["target"], mode, **options)
        return out.detach(), torch.autograd.grad(out, state["x"])[0]

    return run


def _smp(loss: str, mode: str, ignore: bool) -> Callable[[dict[str, Any]], Any]:
    options = {**_OPTIONS.get(loss, {}), "ignore_index": 255 if ignore else None}

    def run(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import segmentation_models_pytorch.losses as smp

        out = getattr(smp, _SMP[loss])(mode, **options)(state["x"], state["target"])
        return out.detach(), torch.autograd.grad(out, state["x"])[0]

    return run


def _point(loss: str, mode: str, size: str, threads: int, ignore: bool = False) -> BenchCase:
    n, c, h, w = SIZES[size]
    c = c if mode == "multiclass" else 1
    suffix = "_ignore" if ignore else ""
    return register_case(
        BenchCase(
            name=f"{loss}_{mode}_{size}{suffix}_fwd_bwd_t{threads}",
            setup=_setup(mode, size, ignore),
            ours=_ours(loss, mode, ignore),
            peer=_smp(loss, mode, ignore),
            peer_name="smp",
            description=f"{loss} loss ({mode}{', 5% ignored' if ignore else ''}) of "
            f"{n}x{c}x{h}x{w} logits, forward + input gradient, "
            f"{threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=same_outputs(rtol=1e-4, atol=1e-6),
            group="sweep",
            params={"op": f"{loss}_{mode}{suffix}", "size": size, "elements": n * c * h * w},
            min_sample_ms=MIN_SAMPLE_MS,
            small_setup=_setup(mode, "tiny", ignore),
        )
    )


CASES: tuple[BenchCase, ...] = (
    *(_point("dice", "multiclass", size, t) for size in SIZES for t in THREADS),
    *(_point("dice", "multiclass", s, t, ignore=True) for s in ("tiny", "medium") for t in THREADS),
    *(
        _point(loss, mode, size, t)
        for loss, mode in (("jaccard", "multiclass"), ("tversky", "multiclass"), ("dice", "binary"))
        for size in ("tiny", "medium")
        for t in THREADS
    ),
)
"""Every case of this module."""
