"""The demo's training loop (private; see `visionblocks.cli.demo`).

The loop reads no tensor value on the host between log steps: every `LOG_EVERY` steps the
losses since the last log are averaged over the ranks in one all-reduce and read at once.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import nullcontext
from typing import Any

import torch

from visionblocks import distributed as dist_utils

LEARNING_RATE = 1.2e-2
"""The detection demo's peak learning rate."""
WARMUP_STEPS = 50
EMA_DECAY = 0.99
"""Decay of the weights' moving average that the demo evaluates, draws and saves."""
EMA_TAU = 50.0
"""Steps over which the average's decay ramps up (ultralytics' ``tau``)."""
LOG_EVERY = 10
"""Steps between two host reads of the losses (the progress bar's loss is refreshed then)."""


def schedule(step: int, steps: int) -> float:
    """Learning-rate factor: linear warm-up, then cosine decay to zero."""
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    return warm * 0.5 * (1.0 + math.cos(math.pi * min(step, steps) / steps))


def make_ema(model: Any) -> Any:
    """The moving average of ``model``'s weights the demo keeps (`EMA_DECAY`, `EMA_TAU`)."""
    from visionblocks.training import ModelEMA

    return ModelEMA(model, EMA_DECAY, tau=EMA_TAU)


def make_optimizer(model: Any) -> torch.optim.Optimizer:
    """AdamW at `LEARNING_RATE`, with its fused kernel (one pass per tensor instead of a dozen
    small operations) where this torch has one for the parameters' device."""
    options = {"lr": LEARNING_RATE, "weight_decay": 1e-4}
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **options)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), **options)


def memory_format(device: torch.device) -> torch.memory_format:
    """The layout of the demo's weights and images: channels-last (NHWC) on the CPU, whose
    oneDNN convolutions run the demo's steps faster in it; torch's default elsewhere."""
    return torch.channels_last if device.type == "cpu" else torch.contiguous_format


def amp_dtype(device: torch.device, amp: bool) -> torch.dtype | None:
    """The autocast dtype: bf16 on the CPU and on CUDA GPUs that have it, else fp16;
    ``None`` without AMP."""
    if not amp:
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def train(
    model: Any,
    loader: Any,
    steps: int,
    device: torch.device,
    *,
    amp: bool,
    tune_threads: bool,
    detect_nonfinite: bool,
    ema: Any = None,
) -> tuple[dict[str, list[float]], float]:
    """Train for ``steps`` steps; the loss history (one value per step and loss, the mean
    over the ranks) and the training time in seconds. ``ema``: a
    `visionblocks.training.ModelEMA` of ``model``, updated after every step."""
    from tqdm.auto import tqdm

    from visionblocks.cli._demo_threads import ThreadTuner
    from visionblocks.training import find_nonfinite

    optimizer = make_optimizer(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, steps))
    dtype = amp_dtype(device, amp)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    history: dict[str, list[float]] = defaultdict(list)
    pending: list[torch.Tensor] = []  # each unread step's losses, on the device
    bar = tqdm(total=steps, desc="training", unit="step", disable=not dist_utils.is_main_process())
    # On the CPU, the thread count that makes steps fastest: all cores on a quiet machine,
    # one when other processes keep them busy (see ThreadTuner). Not in a seeded run (the
    # thread count changes the order of floating-point sums), nor under DDP, where a step's
    # time is also the other ranks'.
    tuner = ThreadTuner(torch.get_num_threads(), tune=tune_threads)
    finder = find_nonfinite(
        model, optimizer=optimizer, scaler=scaler if scaler.is_enabled() else None,
        enabled=detect_nonfinite,
    )  # fmt: skip
    model.train()
    step, epoch, start = 0, 0, time.perf_counter()
    try:
        with finder:
            while step < steps:
                if hasattr(loader.sampler, "set_epoch"):
                    loader.sampler.set_epoch(epoch)
                batches = iter(loader)
                while step < steps:
                    tuner.start_step()
                    began = time.perf_counter()
                    batch = next(batches, None)
                    if batch is None:
                        break
                    losses = _step(model, batch, device, optimizer, scaler, dtype, finder)
                    scheduler.step()
                    if ema is not None:
                        ema.update(model)
                    pending.append(torch.stack([v.detach().float() for v in losses.values()]))
                    tuner.end_step(time.perf_counter() - began)
                    step += 1
                    bar.update(1)
                    if step % LOG_EVERY == 0 or step == steps:
                        _read(pending, list(losses), history)
                        bar.set_postfix(
                            loss=f"{history['loss'][-1]:.3f}",
                            lr=f"{scheduler.get_last_lr()[0]:.1e}",
                            steps_s=f"{step / (time.perf_counter() - start):.2f}",
                            threads=torch.get_num_threads(),
                        )  # fmt: skip
                epoch += 1
    finally:
        bar.close()
    return dict(history), time.perf_counter() - start


def _read(pending: list[torch.Tensor], names: list[str], history: dict[str, list[float]]) -> None:
    """Move the pending steps' losses into ``history``: one all-reduce (the mean over the
    ranks) and one host read for all of them; ``pending`` is emptied."""
    logged = dist_utils.reduce_mean(torch.stack(pending)).tolist()  # (steps, losses)
    pending.clear()
    for values in logged:
        for name, value in zip(names, values):
            history[name].append(value)


def _step(
    model: Any,
    batch: Any,
    device: torch.device,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    dtype: torch.dtype | None,
    finder: Any,
) -> dict[str, torch.Tensor]:
    images, targets, sizes = batch
    images = images.to(device, non_blocking=True, memory_format=memory_format(device))
    targets = [{k: t[k].to(device) for k in ("boxes", "labels")} for t in targets]
    autocast = nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
    with autocast:
        losses = model(images, targets, sizes)
    finder.check(losses, "losses")
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(losses["loss"]).backward()
    scaler.step(optimizer)
    scaler.update()
    return losses
