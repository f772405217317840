"""Conformance specs: the training kit (`visionblocks.training`)."""

from __future__ import annotations

import torch
from torch import nn

from tests.conformance.framework import Arg, Spec
from visionblocks import training

# fmt: off
SPECS = [
    # seeds the global generators (the suite's calls leave them seeded: harmless); the flags
    # stay False: deterministic=True would switch the whole process to deterministic torch
    Spec(training.seed_everything, lambda: (training.seed_everything, {
            "seed": 0, "deterministic": False, "warn_only": False}),
         args=[Arg("seed", "int", accept={"zero"}), Arg("deterministic", "bool"),
               Arg("warn_only", "bool")]),
    Spec(training.seed_worker, lambda: (training.seed_worker, {"worker_id": 0}),
         args=[Arg("worker_id", "int", accept={"zero"})]),
    Spec(training.loader_generator, lambda: (training.loader_generator, {"seed": 0, "rank": 1}),
         args=[Arg("seed", "int", accept={"zero"}), Arg("rank", "int", optional=True, accept={"zero"})]),
    Spec(training.find_nonfinite, lambda: (training.find_nonfinite, {
            "model": nn.Linear(2, 2), "optimizer": None, "enabled": True, "forward": True,
            "backward": True}),
         args=[Arg("model", "module"), Arg("optimizer", "module", optional=True),
               Arg("enabled", "bool"), Arg("forward", "bool"), Arg("backward", "bool")]),
    Spec(training.NonFiniteFinder, lambda: (training.NonFiniteFinder, {
            "model": nn.Linear(2, 2), "enabled": False}),
         args=[Arg("model", "module"), Arg("enabled", "bool")]),
    # converts in place; process_group is whatever torch.distributed accepts (not checked here)
    Spec(training.convert_sync_batchnorm, lambda: (training.convert_sync_batchnorm, {
            "module": nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))}),
         args=[Arg("module", "module")]),
    Spec(training.SyncBatchNorm, lambda: (training.SyncBatchNorm, {
            "num_features": 4, "eps": 1e-5, "momentum": 0.1, "affine": True,
            "track_running_stats": True}),
         args=[Arg("num_features", "int"), Arg("eps", "float", accept={"inf"}),
               Arg("momentum", "float", optional=True),
               Arg("affine", "bool"), Arg("track_running_stats", "bool")]),
    # any (N, C, *) input: more dimensions are fine, a 3-D (C, H, W) image reads as (N, C, L)
    # only when its dim 1 has C channels, which the mutation's does not
    Spec(training.SyncBatchNorm, lambda: (training.SyncBatchNorm(4).eval(), {
            "input": torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))}),
         args=[Arg("input", "tensor", accept={"rank_up"})], forward=True,
         equivalences=("noncontiguous", "channels_last")),
]
# fmt: on

EXEMPT: dict[object, str] = {
    training.NonFiniteError: "the exception find_nonfinite raises; users catch it, not build it",
}
