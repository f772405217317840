"""Conformance specs: activation checkpointing (``visionblocks.training.set_grad_checkpointing``)
and the forward of layers built with ``grad_checkpointing=True``.

The ``grad_checkpointing`` option of the backbone builders and of the layers' constructors is
spec'd with them (``specs_models_nn.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tests.conformance.framework import Arg, Spec
from visionblocks._core.checkpointing import set_grad_checkpointing
from visionblocks.nn import Involution2d, LocalAttention2d

ALL = ("noncontiguous", "channels_last", "half", "bfloat16")


def _net() -> nn.Module:
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    return nn.Sequential(block, nn.Conv2d(4, 4, 3))


def _call() -> tuple[Any, dict[str, Any]]:
    return set_grad_checkpointing, {"module": _net(), "enable": ["0"]}


def _x() -> Tensor:
    return torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(0))


def _layer(build: Any) -> Any:
    """A build function for ``layer(x)`` in training mode (through the checkpoint)."""

    def make() -> tuple[Any, dict[str, Any]]:
        torch.manual_seed(0)
        return build(), {"x": _x()}

    return make


SPECS: list[Spec] = [
    Spec(
        set_grad_checkpointing,
        _call,
        args=[
            Arg("module", "module"),
            # a name given twice checkpoints that module once
            Arg("enable", "sequence", accept={"longer"}),
        ],
    ),
    # training mode, through torch.utils.checkpoint: the layers' own checks still name x
    Spec(
        LocalAttention2d,
        _layer(lambda: LocalAttention2d(8, 3, 2, grad_checkpointing=True)),
        args=[Arg("x", "tensor")],
        forward=True,
        equivalences=ALL,
        label="checkpointed",
    ),
    Spec(
        Involution2d,  # its BatchNorm in training mode
        _layer(lambda: Involution2d(8, 3, stride=2, groups=2, grad_checkpointing=True)),
        args=[Arg("x", "tensor")],
        forward=True,
        equivalences=ALL,
        label="checkpointed",
    ),
]
