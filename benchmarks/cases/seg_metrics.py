"""Benchmark cases: the segmentation metrics (`visionblocks.metrics`) against torchmetrics 1.9.

``seg_metrics_*``: a stream of 4 batches, each side's streaming metric updated with every
batch and computed once at the end (a fresh metric per call): ours `SegmentationMetrics`
(IoU, mIoU, F1, accuracy and the confusion matrix from one update), torchmetrics'
``MulticlassJaccardIndex(average="none")`` (per-class IoU only), with its default argument
validation (``tmval``, what users run) and without it (``tmfast``, ``validate_args=False``);
the check compares the per-class IoUs. Targets hold ``ignore_index=255`` on a tenth of the
pixels; predictions are class indices (``idx``) or logits (``logits``, smaller sizes). Sizes
(``B x H x W``, ``K`` classes): ``small`` 4 x 64 x 64, 5; ``voc`` 8 x 128 x 128, 21;
``cityscapes`` 4 x 256 x 512, 19; ``ade`` 8 x 512 x 512, 150.

``panoptic_quality_*``: `panoptic_quality` against torchmetrics' ``PanopticQuality``
(``return_sq_and_rq=True``) on 2 images of 256 x 256 with 20 segments each (4 stuff regions,
16 thing instances), predictions with shifted, missed and relabelled instances and 1 % pixel
noise. The target of every case is the sweep's `MIN_RATIO`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases.sweep import MIN_RATIO, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CASES", "SIZES"]

SIZES: dict[str, tuple[int, int, int, int]] = {
    "small": (4, 64, 64, 5),
    "voc": (8, 128, 128, 21),
    "cityscapes": (4, 256, 512, 19),
    "ade": (8, 512, 512, 150),
}
"""Size name → ``(B, H, W, K)`` of each of the 4 batches."""
_BATCHES, _IGNORE = 4, 255
_THINGS, _STUFFS = set(range(1, 9)), set(range(9, 13))


def _setup(size: str, logits: bool) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        b, h, w, k = SIZES[size]
        gen = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(_BATCHES):
            target = torch.randint(0, k, (b, h, w), generator=gen)
            if logits:
                preds = torch.randn(b, k, h, w, generator=gen)
            else:
                preds = torch.where(torch.rand(b, h, w, generator=gen) < 0.7, target, 0)
            target[torch.rand(b, h, w, generator=gen) < 0.1] = _IGNORE
            batches.append((preds, target))
        return {"batches": batches, "k": k}

    return setup


def _ours(state: dict[str, Any]) -> torch.Tensor:
    from visionblocks.metrics import SegmentationMetrics

    metric = SegmentationMetrics(state["k"], ignore_index=_IGNORE)
    for preds, target in state["batches"]:
        metric.update(preds, target)
    return metric.compute()["iou"]


def _torchmetrics(validate: bool) -> Callable[[dict[str, Any]], torch.Tensor]:
    def run(state: dict[str, Any]) -> torch.Tensor:
        from torchmetrics.classification import MulticlassJaccardIndex

        metric = MulticlassJaccardIndex(
            state["k"], average="none", ignore_index=_IGNORE, validate_args=validate
        )
        for preds, target in state["batches"]:
            metric.update(preds, target)
        return metric.compute()

    return run


def _point(size: str, preds: str, validate: bool, threads: int) -> BenchCase:
    b, h, w, k = SIZES[size]
    peer = "tmval" if validate else "tmfast"
    return register_case(
        BenchCase(
            name=f"seg_metrics_{size}_{preds}_{peer}_t{threads}",
            setup=_setup(size, preds == "logits"),
            ours=_ours,
            peer=_torchmetrics(validate),
            peer_name=f"torchmetrics (validate_args={validate})",
            description=f"4 updates of {b}x{h}x{w} targets, {k} classes, {preds} predictions, "
            f"then compute, {threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=same_outputs(rtol=1e-6, atol=1e-7),
            group="sweep",
            params={"op": f"seg_metrics_{preds}_{peer}", "size": size, "elements": b * h * w},
            small_setup=_setup("small", preds == "logits"),
        )
    )


def _panoptic_setup(batch: int = 2, size: int = 256) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    stuffs = torch.tensor(sorted(_STUFFS))
    target = torch.zeros(batch, size, size, 2, dtype=torch.long)
    half = size // 2
    for i, (y, x) in enumerate(((0, 0), (0, half), (half, 0), (half, half))):
        target[:, y : y + half, x : x + half, 0] = stuffs[i]
    preds = target.clone()
    for image in range(batch):
        for n in range(16):
            y, x = torch.randint(0, size - 40, (2,), generator=gen).tolist()
            hh, ww = torch.randint(16, 40, (2,), generator=gen).tolist()
            cat = 1 + n % 8
            target[image, y : y + hh, x : x + ww] = torch.tensor([cat, n])
            if n % 5 == 4:  # missed
                continue
            dy, dx = torch.randint(-3, 4, (2,), generator=gen).tolist()
            y2, x2 = max(y + dy, 0), max(x + dx, 0)
            preds[image, y2 : y2 + hh, x2 : x2 + ww] = torch.tensor([cat, 100 + n])
    noise = torch.rand(batch, size, size, generator=gen) < 0.01
    categories = torch.tensor(sorted(_THINGS | _STUFFS))
    pick = torch.randint(len(categories), (int(noise.sum()),), generator=gen)
    preds[..., 0][noise] = categories[pick]
    return {"preds": preds, "target": target}


def _panoptic_ours(state: dict[str, Any]) -> torch.Tensor:
    from visionblocks.metrics import panoptic_quality

    out = panoptic_quality(state["preds"], state["target"], _THINGS, _STUFFS)
    return torch.stack((out["pq"], out["sq"], out["rq"]))


def _panoptic_torchmetrics(state: dict[str, Any]) -> torch.Tensor:
    from torchmetrics.detection import PanopticQuality

    metric = PanopticQuality(_THINGS, _STUFFS, return_sq_and_rq=True)
    return metric(state["preds"], state["target"])


def _panoptic_case(threads: int) -> BenchCase:
    return register_case(
        BenchCase(
            name=f"panoptic_quality_2x256x256_t{threads}",
            setup=_panoptic_setup,
            ours=_panoptic_ours,
            peer=_panoptic_torchmetrics,
            peer_name="torchmetrics",
            description="panoptic quality of 2 images of 256x256, 20 segments each, 8 thing "
            f"and 4 stuff categories, {threads} thread{'s' if threads > 1 else ''}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=same_outputs(rtol=1e-6, atol=1e-7),
            group="sweep",
            params={"op": "panoptic_quality", "size": "2x256x256", "elements": 2 * 256 * 256},
            small_setup=lambda: _panoptic_setup(1, 96),
        )
    )


CASES: tuple[BenchCase, ...] = (
    *(
        _point(size, "idx", validate, t)
        for size in SIZES
        for validate in (True, False)
        for t in THREADS
    ),
    *(_point(size, "logits", False, t) for size in ("small", "voc") for t in THREADS),
    *(_panoptic_case(t) for t in THREADS),
)
"""Every case of this module."""
