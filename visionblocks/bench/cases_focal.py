"""Benchmark cases: sigmoid focal loss against torchvision (CPU, 2 threads, forward + backward).

A RetinaNet-like batch: 50,000 anchors x 80 classes (4M logits), about one anchor in 81 of
the background class. Both sides compute the summed loss and its gradient with respect to the
logits (``torch.autograd.grad``, so no ``.grad`` accumulation is timed).
"""

from __future__ import annotations

from typing import Any

import torch

from visionblocks.bench.case import BenchCase, register_case

__all__ = ["FOCAL_LOSS_4M", "FOCAL_LOSS_4M_INDEX"]

_ANCHORS, _CLASSES = 50_000, 80


def _setup() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    # Classification logits early in training: a prior bias of log(0.01 / 0.99) plus noise.
    logits = torch.randn(_ANCHORS, _CLASSES, generator=gen) * 2.0 - 4.6
    labels = torch.randint(0, _CLASSES + 1, (_ANCHORS,), generator=gen)  # C = background
    onehot = (labels.unsqueeze(1) == torch.arange(_CLASSES)).float()
    return {"logits": logits.requires_grad_(True), "labels": labels, "onehot": onehot}


def _ours(state: dict[str, Any], targets: str) -> torch.Tensor:
    from visionblocks.losses.focal import sigmoid_focal_loss

    x = state["logits"]
    loss = sigmoid_focal_loss(x, state[targets], reduction="sum", impl="torch")
    return torch.autograd.grad(loss, x)[0]


def _torchvision(state: dict[str, Any]) -> torch.Tensor:
    from torchvision.ops import sigmoid_focal_loss

    x = state["logits"]
    loss = sigmoid_focal_loss(x, state["onehot"], reduction="sum")
    return torch.autograd.grad(loss, x)[0]


def _ours_float(state: dict[str, Any]) -> torch.Tensor:
    return _ours(state, "onehot")


def _ours_index(state: dict[str, Any]) -> torch.Tensor:
    return _ours(state, "labels")


FOCAL_LOSS_4M = register_case(
    BenchCase(
        name="focal_loss_4m",
        setup=_setup,
        ours=_ours_float,
        peer=_torchvision,
        peer_name="torchvision",
        description="sigmoid_focal_loss 50000x80 float32, one-hot float targets, sum, "
        "forward+backward, 2 threads",
        min_speedup=2.0,
    )
)

FOCAL_LOSS_4M_INDEX = register_case(
    BenchCase(
        name="focal_loss_4m_index",
        setup=_setup,
        ours=_ours_index,
        peer=_torchvision,
        peer_name="torchvision",
        description="sigmoid_focal_loss 50000x80 float32, class-index targets (torchvision: "
        "one-hot built in setup), sum, forward+backward, 2 threads",
        min_speedup=2.0,
    )
)
