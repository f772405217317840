"""Size sweep: box IoUs and the detection losses against torchvision at every size, 1 and 2 threads.

"Never slower than the peer at any size" (the design's speed rule) is checked here point by
point, one case per ``(op, size, threads)``, in the ``sweep`` group (``--group sweep``):

- ``box_iou`` and ``generalized_box_iou``, pairwise, forward: ``N×N`` for N in 10, 100, 1000,
  3000, and the target-assignment shapes ``2000×8``, ``20000×10``, ``100000×50`` (anchors ×
  ground-truth boxes of one image: a small detector, RetinaNet at 640 px, a large image).
- ``generalized_box_iou_loss``, aligned pairs, ``reduction="sum"``, forward + backward
  (gradient with respect to the predictions): 10 to 10^6 pairs, one point per decade.
- ``sigmoid_focal_loss``, float targets (one-hot of 80 classes, as RetinaNet's), ``"sum"``,
  forward + backward: 10 to 10^7 logits, one point per decade.

Each side returns what it computed, so the output check compares them (on at most 10^5
elements: ``small_setup``). Calls of microseconds are timed in calibrated loops of at least
`MIN_SAMPLE_MS` per sample (``BenchCase.min_sample_ms``), and the Python-level calls of one
call of each side are counted with cProfile (``count_calls``): what decides speed at tiny sizes.
The target is `MIN_RATIO` (ours at least 0.9 times the peer's speed, the noise margin of a
shared machine); ``benchmarks/plot.py`` draws ratio against size with that line. No memory
measurement (a fresh process per point and side would take longer than the sweep).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["MIN_RATIO", "MIN_SAMPLE_MS", "SWEEP_CASES", "THREADS"]

MIN_RATIO = 0.9
"""Speed target of every point: ours at least this fraction of the peer's speed."""
MIN_SAMPLE_MS = 5.0
"""Shortest timed sample: tiny calls are timed in loops at least this long."""
THREADS = (1, 2)
_CHECK_LIMIT = 100_000  # elements of the inputs the output check uses at most
_CLASSES = 80

PAIRWISE_SHAPES = ((10, 10), (100, 100), (1000, 1000), (3000, 3000), (2000, 8), (20000, 10),
                   (100000, 50))  # fmt: skip
GIOU_LOSS_SIZES = tuple(10**k for k in range(1, 7))
FOCAL_SIZES = tuple(10**k for k in range(1, 8))


def _boxes(n: int, generator: torch.Generator, requires_grad: bool = False) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=generator) * 600
    wh = torch.rand(n, 2, generator=generator) * 200 + 1
    return torch.cat([xy, xy + wh], dim=-1).requires_grad_(requires_grad)


def _pairwise_setup(n: int, m: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        return _boxes(n, gen), _boxes(m, gen)

    return setup


def _loss_pairs_setup(n: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        target = _boxes(n, gen)
        # Predictions near their targets, as a trained regressor's: IoUs spread over (0, 1].
        jitter = torch.randn(n, 4, generator=gen) * 20
        pred = torch.cat([target[:, :2] + jitter[:, :2], target[:, 2:] + jitter[:, 2:]], dim=1)
        pred = torch.cat([pred[:, :2], torch.maximum(pred[:, 2:], pred[:, :2] + 1)], dim=1)
        return pred.requires_grad_(True), target

    return setup


def _focal_setup(n: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(n, generator=gen) * 2.0 - 4.6  # a prior bias, as RetinaNet's
        positive = torch.randint(0, _CLASSES + 1, (n,), generator=gen) == 0  # ~1 in 81
        return logits.requires_grad_(True), positive.float()

    return setup


def _ours_pairwise(op: str) -> Callable[[Any], torch.Tensor]:
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        from visionblocks.ops import boxes

        return getattr(boxes, op)(*state)

    run.__name__ = f"_ours_{op}"
    return run


def _torchvision_pairwise(op: str) -> Callable[[Any], torch.Tensor]:
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        import torchvision.ops

        return getattr(torchvision.ops, op)(*state)

    run.__name__ = f"_torchvision_{op}"
    return run


def _ours_giou_loss(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.ops import generalized_box_iou_loss

    loss = generalized_box_iou_loss(*state, reduction="sum")
    return loss.detach(), torch.autograd.grad(loss, state[0])[0]


def _torchvision_giou_loss(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from torchvision.ops import generalized_box_iou_loss

    loss = generalized_box_iou_loss(*state, reduction="sum")
    return loss.detach(), torch.autograd.grad(loss, state[0])[0]


def _ours_focal(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.losses import sigmoid_focal_loss

    loss = sigmoid_focal_loss(*state, reduction="sum")
    return loss.detach(), torch.autograd.grad(loss, state[0])[0]


def _torchvision_focal(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from torchvision.ops import sigmoid_focal_loss

    loss = sigmoid_focal_loss(*state, reduction="sum")
    return loss.detach(), torch.autograd.grad(loss, state[0])[0]


def _decade(n: int) -> str:
    k = len(str(n)) - 1
    return f"1e{k}" if n == 10**k else str(n)


def _point(
    op: str,
    label: str,
    size: str,
    elements: int,
    threads: int,
    setup: Callable[[], Any],
    small_setup: Callable[[], Any] | None,
    ours: Callable[[Any], Any],
    peer: Callable[[Any], Any],
    what: str,
    check: Callable[[Any, Any], None],
) -> BenchCase:
    return register_case(
        BenchCase(
            name=f"sweep_{label}_{size}_t{threads}",
            setup=setup,
            ours=ours,
            peer=peer,
            peer_name="torchvision",
            description=f"{op} {size} float32, {what}, {threads} thread{'s' * (threads > 1)}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=check,
            small_setup=small_setup,
            group="sweep",
            params={"op": op, "size": size, "elements": elements},
            min_sample_ms=MIN_SAMPLE_MS,
            count_calls=True,
        )
    )


def _register() -> list[BenchCase]:
    pairwise_check = same_outputs(rtol=1e-5, atol=1e-5)
    # torchvision forms 1 - p_t by subtraction: an absolute floor covers its tiny values.
    loss_check = same_outputs(rtol=1e-4, atol=1e-5)
    points = []  # (op, label, size, elements, setup, small_setup, ours, peer, what, check)
    for op, label in (("box_iou", "box_iou"), ("generalized_box_iou", "giou")):
        for n, m in PAIRWISE_SHAPES:
            small = _pairwise_setup(min(n, _CHECK_LIMIT // m), m) if n * m > _CHECK_LIMIT else None
            ours, peer = _ours_pairwise(op), _torchvision_pairwise(op)
            points.append((op, label, f"{n}x{m}", n * m, _pairwise_setup(n, m), small, ours, peer,
                           "pairwise, forward", pairwise_check))  # fmt: skip
    for n in GIOU_LOSS_SIZES:
        small = _loss_pairs_setup(_CHECK_LIMIT // 4) if 4 * n > _CHECK_LIMIT else None
        points.append(("generalized_box_iou_loss", "giou_loss", _decade(n), n,
                       _loss_pairs_setup(n), small, _ours_giou_loss, _torchvision_giou_loss,
                       "aligned pairs, sum, forward+backward", loss_check))  # fmt: skip
    for n in FOCAL_SIZES:
        small = _focal_setup(_CHECK_LIMIT) if n > _CHECK_LIMIT else None
        points.append(("sigmoid_focal_loss", "focal", _decade(n), n, _focal_setup(n), small,
                       _ours_focal, _torchvision_focal, "float targets, sum, forward+backward",
                       loss_check))  # fmt: skip
    return [_point(*point[:4], threads, *point[4:]) for point in points for threads in THREADS]


SWEEP_CASES = _register()
"""Every point of the sweep, registered as ``sweep_<op>_<size>_t<threads>``."""
