"""Conformance specs: `visionblocks.training.ModelEMA` (its constructor, forward and update)."""

from __future__ import annotations

import torch
from torch import nn

from tests.conformance.framework import Arg, Spec
from visionblocks import training


def _update() -> tuple[object, dict[str, object]]:
    model = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))
    return training.ModelEMA(model, 0.9).update, {"model": model, "step": 3}


# fmt: off
SPECS = [
    # inf is a legitimate warm-up power (no warm-up); an infinite tau or warm-up gamma would
    # keep the decay at its floor forever, and is refused
    Spec(training.ModelEMA, lambda: (training.ModelEMA, {
            "model": nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)), "decay": 0.9,
            "min_decay": 0.1, "update_after_step": 0, "use_warmup": False,
            "warmup_gamma": 1.0, "warmup_power": 0.75, "tau": 100.0,
            "exclude_buffers": False, "device": "cpu"}),
         args=[Arg("model", "module"), Arg("decay", "float"), Arg("min_decay", "float"),
               Arg("update_after_step", "int", accept={"zero"}), Arg("use_warmup", "bool"),
               Arg("warmup_gamma", "float"),
               Arg("warmup_power", "float", accept={"inf"}),
               Arg("tau", "float", optional=True),
               Arg("exclude_buffers", "bool"), Arg("device", "choice", optional=True)]),
    Spec(training.ModelEMA, _update, label="update",
         args=[Arg("model", "module"), Arg("step", "int", optional=True, accept={"zero"})]),
    # forward runs the copy: the wrapped layer's checks name its argument
    Spec(training.ModelEMA, lambda: (training.ModelEMA(training.SyncBatchNorm(4)), {
            "input": torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))}),
         args=[Arg("input", "tensor", accept={"rank_up"})], forward=True,
         equivalences=("noncontiguous", "channels_last")),
]
# fmt: on
