"""Benchmark cases: GIoU / DIoU / CIoU losses against torchvision (CPU, 2 threads, fwd + bwd).

One million aligned box pairs, float32, as the box-regression loss of a large detection batch:
a third of the targets overlap their prediction (jittered copies), the rest lie anywhere.
Both sides compute the summed loss and its gradient with respect to the predictions
(``torch.autograd.grad``, so no ``.grad`` accumulation is timed) and return both; the output
check compares them on 100,000 pairs. Ours runs its one torch formula (``impl="torch"``,
plain autograd), as torchvision does; target: never slower (``min_speedup`` 0.9, a 10%
allowance for timing noise).

Performance model (``bytes_moved``, the GB/s column): the least one call must move is to
read both boxes and write the gradient, 3 x 16 bytes per pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["CIOU_LOSS_1M", "DIOU_LOSS_1M", "GIOU_LOSS_1M"]

_N = 1_000_000
_BOX_BYTES = 16  # 4 float32 coordinates
Outputs = tuple[torch.Tensor, torch.Tensor]


def _setup(n: int = _N) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(2, n, 2, generator=gen) * 600
    boxes = torch.cat([xy, xy + torch.rand(2, n, 2, generator=gen) * 200 + 1], -1)
    pred, target = boxes[0].contiguous(), boxes[1].contiguous()
    k = n // 3
    jitter = pred[:k] + torch.randn(k, 4, generator=gen) * 20
    target[:k] = torch.cat(
        [jitter[:, :2].minimum(jitter[:, 2:]), jitter[:, :2].maximum(jitter[:, 2:])], 1
    )
    return {"pred": pred.requires_grad_(True), "target": target}


def _small_setup() -> dict[str, torch.Tensor]:
    return _setup(_N // 10)


def _grad(fn: Callable[..., torch.Tensor], state: dict[str, Any], **kwargs: Any) -> Outputs:
    loss = fn(state["pred"], state["target"], reduction="sum", **kwargs)
    return loss.detach(), torch.autograd.grad(loss, state["pred"])[0]


def _case(name: str, op: str, min_speedup: float) -> BenchCase:
    def ours(state: dict[str, Any]) -> Outputs:
        from visionblocks.losses import iou as iou_loss

        return _grad(getattr(iou_loss, op), state, impl="torch")

    def torchvision(state: dict[str, Any]) -> Outputs:
        import torchvision.ops

        return _grad(getattr(torchvision.ops, op), state)

    ours.__name__ = f"_ours_{name}"
    torchvision.__name__ = f"_torchvision_{name}"
    return register_case(
        BenchCase(
            name=name,
            setup=_setup,
            ours=ours,
            peer=torchvision,
            peer_name="torchvision",
            description=f"{op} 1M float32 box pairs, sum, forward+backward (pred), 2 threads",
            min_speedup=min_speedup,
            bytes_moved=3 * _BOX_BYTES * _N,
            check=same_outputs(rtol=1e-4, atol=1e-5),
            small_setup=_small_setup,
        )
    )


GIOU_LOSS_1M = _case("giou_loss_1m", "generalized_box_iou_loss", 0.9)
DIOU_LOSS_1M = _case("diou_loss_1m", "distance_box_iou_loss", 0.9)
CIOU_LOSS_1M = _case("ciou_loss_1m", "complete_box_iou_loss", 0.9)
