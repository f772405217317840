"""Training kit: seeding and determinism, a non-finite finder, activation checkpointing,
SyncBatchNorm conversion, a model EMA; each works on any ``nn.Module`` (the "Training
recipes" page shows them together)."""

from __future__ import annotations

from visionblocks._core.checkpointing import set_grad_checkpointing
from visionblocks._core.namespace import public_dir
from visionblocks.training.ema import ModelEMA
from visionblocks.training.nonfinite import NonFiniteError, NonFiniteFinder, find_nonfinite
from visionblocks.training.seed import loader_generator, seed_everything, seed_worker
from visionblocks.training.sync_bn import SyncBatchNorm, convert_sync_batchnorm

__all__ = [
    "ModelEMA",
    "NonFiniteError",
    "NonFiniteFinder",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "find_nonfinite",
    "loader_generator",
    "seed_everything",
    "seed_worker",
    "set_grad_checkpointing",
]
__dir__ = public_dir(__name__, __all__)
