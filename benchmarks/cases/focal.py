"""Benchmark cases: sigmoid focal loss against torchvision (CPU, 2 threads, forward + backward).

A RetinaNet-like batch: 50,000 anchors x 80 classes (4M logits), about one anchor in 81 of
the background class. Both sides compute the summed loss and its gradient with respect to the
logits (``torch.autograd.grad``, so no ``.grad`` accumulation is timed) and return both; the
output check compares them on a 5,000-anchor batch.

Ours is the one torch formula of `visionblocks.losses.focal` (plain autograd, exact forms);
the target is "not slower than torchvision" (``min_speedup=1.0``). Smaller sizes, at 1 and 2
threads, are points of the size sweep (`benchmarks.cases.sweep`).

Performance model (``bytes_moved``, the GB/s column): the least one call must move is to
read the logits and the targets and write the gradient (float targets: 3 x 4 bytes per
element; class indices: 2 x 4 bytes per element and 8 bytes per anchor).
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["FOCAL_LOSS_4M", "FOCAL_LOSS_4M_INDEX"]

_ANCHORS, _CLASSES = 50_000, 80
_F32, _I64 = 4, 8
Outputs = tuple[torch.Tensor, torch.Tensor]


def _setup(anchors: int = _ANCHORS) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    # Classification logits early in training: a prior bias of log(0.01 / 0.99) plus noise.
    logits = torch.randn(anchors, _CLASSES, generator=gen) * 2.0 - 4.6
    labels = torch.randint(0, _CLASSES + 1, (anchors,), generator=gen)  # C = background
    onehot = (labels.unsqueeze(1) == torch.arange(_CLASSES)).float()
    return {"logits": logits.requires_grad_(True), "labels": labels, "onehot": onehot}


def _small_setup() -> dict[str, Any]:
    return _setup(_ANCHORS // 10)


def _ours(state: dict[str, Any], targets: str) -> Outputs:
    from visionblocks.losses.focal import sigmoid_focal_loss

    x = state["logits"]
    loss = sigmoid_focal_loss(x, state[targets], reduction="sum", impl="torch")
    return loss.detach(), torch.autograd.grad(loss, x)[0]


def _torchvision(state: dict[str, Any]) -> Outputs:
    from torchvision.ops import sigmoid_focal_loss

    x = state["logits"]
    loss = sigmoid_focal_loss(x, state["onehot"], reduction="sum")
    return loss.detach(), torch.autograd.grad(loss, x)[0]


def _ours_float(state: dict[str, Any]) -> Outputs:
    return _ours(state, "onehot")


def _ours_index(state: dict[str, Any]) -> Outputs:
    return _ours(state, "labels")


# torchvision forms 1 - p_t by subtraction in float32, so on confident logits its tiny
# losses and gradients carry a large relative error: an absolute floor covers them.
_CHECK = same_outputs(rtol=1e-4, atol=1e-5)


FOCAL_LOSS_4M = register_case(
    BenchCase(
        name="focal_loss_4m",
        setup=_setup,
        ours=_ours_float,
        peer=_torchvision,
        peer_name="torchvision",
        description="sigmoid_focal_loss 50000x80 float32, one-hot float targets, sum, "
        "forward+backward, 2 threads",
        min_speedup=1.0,
        bytes_moved=3 * _ANCHORS * _CLASSES * _F32,
        check=_CHECK,
        small_setup=_small_setup,
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
        min_speedup=1.0,
        bytes_moved=2 * _ANCHORS * _CLASSES * _F32 + _ANCHORS * _I64,
        check=_CHECK,
        small_setup=_small_setup,
    )
)
