"""Benchmark cases: GIoU / DIoU / CIoU losses against torchvision (CPU, 2 threads, fwd + bwd).

One million aligned box pairs, float32, as the box-regression loss of a large detection batch:
a third of the targets overlap their prediction (jittered copies), the rest lie anywhere.
Both sides compute the summed loss and its gradient with respect to the predictions
(``torch.autograd.grad``, so no ``.grad`` accumulation is timed). Ours runs the lean torch
path (`visionblocks.ops._iou_loss_torch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from visionblocks.bench.case import BenchCase, register_case

__all__ = ["CIOU_LOSS_1M", "DIOU_LOSS_1M", "GIOU_LOSS_1M"]

_N = 1_000_000


def _setup() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(2, _N, 2, generator=gen) * 600
    boxes = torch.cat([xy, xy + torch.rand(2, _N, 2, generator=gen) * 200 + 1], -1)
    pred, target = boxes[0].contiguous(), boxes[1].contiguous()
    k = _N // 3
    jitter = pred[:k] + torch.randn(k, 4, generator=gen) * 20
    target[:k] = torch.cat(
        [jitter[:, :2].minimum(jitter[:, 2:]), jitter[:, :2].maximum(jitter[:, 2:])], 1
    )
    return {"pred": pred.requires_grad_(True), "target": target}


def _grad(fn: Callable[..., torch.Tensor], state: dict[str, Any], **kwargs: Any) -> torch.Tensor:
    loss = fn(state["pred"], state["target"], reduction="sum", **kwargs)
    return torch.autograd.grad(loss, state["pred"])[0]


def _case(name: str, op: str, min_speedup: float) -> BenchCase:
    def ours(state: dict[str, Any]) -> torch.Tensor:
        from visionblocks.ops import iou_loss

        return _grad(getattr(iou_loss, op), state, impl="torch")

    def torchvision(state: dict[str, Any]) -> torch.Tensor:
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
        )
    )


GIOU_LOSS_1M = _case("giou_loss_1m", "generalized_box_iou_loss", 1.5)
DIOU_LOSS_1M = _case("diou_loss_1m", "distance_box_iou_loss", 1.0)
CIOU_LOSS_1M = _case("ciou_loss_1m", "complete_box_iou_loss", 1.0)
