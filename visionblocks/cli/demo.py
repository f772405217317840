"""``visionblocks demo``: train the reference detector on synthetic COCO and evaluate it.

The demo shows the library doing its job end to end, offline, in a few minutes on a laptop
CPU: `make_synthetic_coco` writes train and val splits (once), `CocoInstances` and
`collate_detection` feed a `Detector` built from the registries (``vb_tiny`` backbone,
`FPN` neck, `FCOSHead`), AdamW trains it with a linear warm-up and a cosine decay (AMP on
CUDA), and `coco_evaluate` scores the val split. Under ``torchrun`` with ``--distributed``
it trains with ``DistributedDataParallel`` (gloo on CPU, nccl on CUDA) on a
``DistributedSampler`` and evaluates the predictions gathered from every rank. On the CPU
(one process), the number of threads follows what the machine offers: all cores when it is
quiet, one when other processes keep the cores busy (`visionblocks.cli._demo_threads`). The
progress bar and the summary show the training speed in steps/s.

Outputs in ``out``: ``metrics.json`` (``AP``, ``AP50``, ``AP75``, ``steps``, ``seconds``,
``steps_per_second`` (training), ``world_size`` and the rest of the COCO numbers),
``model.pt`` (``{"config": DEMO_MODEL, "model": state dict}``: `visionblocks.deploy`
rebuilds it), ``predictions.png`` and ``loss.png``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from visionblocks import distributed as dist_utils
from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.cli._demo_data import NUM_CLASSES, demo_data, demo_loaders

__all__ = ["DEFAULT_STEPS", "DEMO_MODEL", "run_demo"]
__dir__ = public_dir(__name__, __all__)

DEFAULT_STEPS = 800
"""Training steps of the default demo: AP50 about 0.9 (0.896 and 0.899 with seeds 0 and 1;
600 steps gave 0.77 and 0.80)."""

LEARNING_RATE = 2e-3
WARMUP_STEPS = 50

DEMO_MODEL: dict[str, Any] = {
    "type": "detector",
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
    "neck": {"type": "fpn", "out_channels": 64},
    "head": {
        "type": "fcos",
        "num_classes": NUM_CLASSES,
        "num_convs": 2,
        # Objects are 19 to 58 pixels: one level per octave of their extent.
        "size_ranges": [(0, 32), (32, 64), (64, 1e8)],
    },
}
"""The demo's model, built with ``MODELS.build(DEMO_MODEL)``."""


def _log(message: str) -> None:
    if dist_utils.is_main_process():
        print(message, flush=True)


def _resolve_device(device: str) -> torch.device:
    check_choice("device", device, ("auto", "cpu", "cuda"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but CUDA is not available")
    if device == "cuda" and dist_utils.is_dist_initialized():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device(device)


def _init_distributed(device: str) -> None:
    """Join the process group ``torchrun`` describes (gloo on CPU, nccl on CUDA)."""
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError(
            "--distributed needs the environment torchrun sets (RANK, WORLD_SIZE, ...): run "
            "torchrun --standalone --nproc_per_node 2 -m visionblocks demo --distributed"
        )
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if use_cuda else "gloo")


def _schedule(step: int, steps: int) -> float:
    """Learning-rate factor: linear warm-up, then cosine decay to zero."""
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    return warm * 0.5 * (1.0 + math.cos(math.pi * min(step, steps) / steps))


def _optimizer(model: Any) -> torch.optim.Optimizer:
    """AdamW, with its fused kernel (one pass per tensor instead of a dozen small operations)
    where this torch has one for the parameters' device."""
    options = {"lr": LEARNING_RATE, "weight_decay": 1e-4}
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **options)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), **options)


def _train(
    model: Any, loader: Any, steps: int, device: torch.device
) -> tuple[dict[str, list[float]], float]:
    """Train for ``steps`` steps; the loss history and the training time in seconds."""
    from tqdm.auto import tqdm

    from visionblocks.cli._demo_threads import ThreadTuner

    optimizer = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _schedule(s, steps))
    amp = device.type == "cuda"
    amp_dtype = torch.bfloat16 if amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp and amp_dtype == torch.float16)
    history: dict[str, list[float]] = defaultdict(list)
    bar = tqdm(total=steps, desc="training", unit="step", disable=not dist_utils.is_main_process())
    # On the CPU, the thread count that makes steps fastest: all cores on a quiet machine,
    # one when other processes keep them busy (see ThreadTuner).
    # Not under DDP, where a step's time is also the other ranks'.
    tuner = ThreadTuner(
        torch.get_num_threads(), tune=device.type == "cpu" and dist_utils.get_world_size() == 1
    )
    model.train()
    step, epoch, start = 0, 0, time.perf_counter()
    try:
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
                losses = _step(model, batch, device, optimizer, scaler, amp_dtype)
                scheduler.step()
                # One all-reduce per step for the logged losses, not one per loss.
                logged = dist_utils.reduce_mean(
                    torch.stack([v.detach().float() for v in losses.values()])
                )
                for name, value in zip(losses, logged.tolist()):
                    history[name].append(value)
                tuner.end_step(time.perf_counter() - began)
                step += 1
                bar.update(1)
                bar.set_postfix(
                    loss=f"{history['loss'][-1]:.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}",
                    steps_s=f"{step / (time.perf_counter() - start):.2f}",
                    threads=torch.get_num_threads(),
                )  # fmt: skip
            epoch += 1
    finally:
        bar.close()
    return dict(history), time.perf_counter() - start


def _step(
    model: Any,
    batch: Any,
    device: torch.device,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    amp_dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    images, targets, sizes = batch
    images = images.to(device, non_blocking=True)
    targets = [{k: t[k].to(device) for k in ("boxes", "labels")} for t in targets]
    with torch.autocast(device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
        losses = model(images, targets, sizes)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(losses["loss"]).backward()
    scaler.step(optimizer)
    scaler.update()
    return losses


@torch.no_grad()
def _predict(model: Any, loader: Any, device: torch.device) -> dict[int, dict[str, Any]]:
    model.eval()
    predictions = {}
    for images, targets, sizes in loader:
        outputs = model(images.to(device), image_sizes=sizes)
        for target, output in zip(targets, outputs):
            predictions[target["image_id"]] = {k: v.cpu() for k, v in output.items()}
    return predictions


def _export_onnx(model: Any, images: torch.Tensor, out: Path) -> None:
    """Write ``out/model.onnx`` (the padded detection form, float 0-255 input) and check it
    in onnxruntime on ``images``."""
    from visionblocks.deploy import export_kwargs, export_model, max_stride

    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        _log("model.onnx skipped: pip install onnx onnxscript onnxruntime to export it")
        return
    model = model.to("cpu")
    result = export_model(
        model, images.cpu(), out / "model.onnx", "onnx", stride=max_stride(model),
        kwargs=export_kwargs(model),
    )  # fmt: skip
    _log(f"wrote {result.path} ({result.size_bytes / 2**20:.1f} MiB), checked in onnxruntime: "
         f"max difference from eager {result.max_abs_diff:.2g}")  # fmt: skip


def run_demo(
    *,
    steps: int = DEFAULT_STEPS,
    out: str | os.PathLike[str] = "demo-out",
    device: str = "auto",
    distributed: bool = False,
    seed: int = 0,
    export: bool = True,
) -> dict[str, Any]:
    """Train and evaluate the reference detector on synthetic COCO; write the outputs.

    Args:
        steps: Training steps (global batch of 16 images, split over the ranks).
        out: Output folder; the synthetic data goes to ``out/data`` (reused when present).
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        distributed: Join the ``torchrun`` process group and train with DDP.
        seed: Seed of the data and of the training.
        export: Also write ``model.onnx`` (`visionblocks.deploy.export_model`: the
            detector's padded output form, dynamic batch and image size) and check it
            against the eager model in onnxruntime; skipped, with a message, when ``onnx``,
            ``onnxscript`` or ``onnxruntime`` is not installed.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds (the same on every rank).

    Raises:
        RuntimeError: ``distributed`` outside ``torchrun``, or ``cuda`` without CUDA.
        ValueError, TypeError: Bad arguments.

    Examples:
        >>> import tempfile
        >>> folder = tempfile.TemporaryDirectory()
        >>> metrics = run_demo(steps=2, out=folder.name, device="cpu", export=False)  # doctest: +ELLIPSIS
        visionblocks demo: 2 steps on cpu x 1, 315,675 parameters
        trained 2 steps in ... s: ... steps/s
        AP ...  AP50 ...  AP75 ...; wrote .../metrics.json, model.pt, predictions.png, loss.png
        >>> sorted(k for k in metrics if k != "stats")
        ['AP', 'AP50', 'AP75', 'device', 'seconds', 'steps', 'steps_per_second', 'world_size']
        >>> folder.cleanup()
    """
    check_type("steps", steps, int)
    check_range("steps", steps, 1)
    check_type("seed", seed, int)
    check_range("seed", seed, 0)
    check_type("distributed", distributed, bool)
    check_type("export", export, bool)
    check_type("out", out, (str, os.PathLike))
    check_choice("device", device, ("auto", "cpu", "cuda"))
    start = time.perf_counter()
    if not distributed and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print(
            "visionblocks demo: started by torchrun without --distributed, so every process "
            "runs its own demo; add --distributed to train one model with DDP",
            file=sys.stderr,
        )
    if distributed:
        _init_distributed(device)
    try:
        return _run(steps, Path(out), _resolve_device(device), seed, start, export)
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def _run(
    steps: int, out: Path, device: torch.device, seed: int, start: float, export: bool
) -> dict[str, Any]:
    threads = torch.get_num_threads()  # the training may change it: put back at the end
    try:
        return _run_threads(steps, out, device, seed, start, export)
    finally:
        torch.set_num_threads(threads)


def _run_threads(
    steps: int, out: Path, device: torch.device, seed: int, start: float, export: bool
) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from visionblocks.cli._demo_plots import plot_losses, plot_predictions
    from visionblocks.data import coco_evaluate
    from visionblocks.registry import MODELS

    world = dist_utils.get_world_size()
    if world > 1 and device.type == "cpu":  # share the cores instead of oversubscribing them
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        )
    out.mkdir(parents=True, exist_ok=True)
    train_ann, val_ann = demo_data(out, seed)
    train_loader, val_loader, val = demo_loaders(train_ann, val_ann, seed)
    torch.manual_seed(seed)
    model = MODELS.build(DEMO_MODEL).to(device)
    if world > 1:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    _log(f"visionblocks demo: {steps} steps on {device} x {world}, "
         f"{sum(p.numel() for p in model.parameters()):,} parameters")  # fmt: skip
    history, seconds = _train(model, train_loader, steps, device)
    _log(f"trained {steps} steps in {seconds:.1f} s: {steps / seconds:.2f} steps/s")
    detector = model.module if world > 1 else model
    predictions = _predict(detector, val_loader, device)
    stats = coco_evaluate(predictions, val)  # a collective under DDP: rank 0 evaluates all
    metrics = {
        "AP": stats["AP"], "AP50": stats["AP50"], "AP75": stats["AP75"], "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "steps_per_second": round(steps / seconds, 2), "world_size": world,
        "device": device.type, "stats": stats,
    }  # fmt: skip
    # The figure shows the first validation images, whichever rank predicted them.
    shown_ids = val.ids[:8]
    shown: dict[int, Any] = {}
    for part in dist_utils.all_gather_object(
        {i: predictions[i] for i in shown_ids if i in predictions}
    ):
        shown.update(part)
    if dist_utils.is_main_process():
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        # With its config, so that `visionblocks export demo-out/model.pt` rebuilds it.
        torch.save({"config": DEMO_MODEL, "model": detector.state_dict()}, out / "model.pt")
        first = range(len(shown_ids))
        plot_predictions([val[i][0] for i in first], [shown[i] for i in shown_ids],
                         [val[i][1] for i in first], val.classes, out / "predictions.png")  # fmt: skip
        plot_losses({k: v for k, v in history.items() if k != "loss"} | {"loss": history["loss"]},
                    out / "loss.png")  # fmt: skip
        _log(f"AP {stats['AP']:.3f}  AP50 {stats['AP50']:.3f}  AP75 {stats['AP75']:.3f}  "
             f"({metrics['seconds']} s); wrote {out}/metrics.json, model.pt, predictions.png, "
             "loss.png")  # fmt: skip
        if export:  # two validation images: the batch, height and width stay dynamic
            images = torch.stack([val[i][0].as_subclass(torch.Tensor) for i in range(2)])
            # Float input, with noise below one grey level: the flat synthetic backgrounds
            # give locations with exactly equal scores, which NMS may order either way.
            noise = torch.rand(images.shape, generator=torch.Generator().manual_seed(0))
            _export_onnx(detector, images.float() + noise, out)
    return metrics
