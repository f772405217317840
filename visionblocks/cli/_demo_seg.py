"""``visionblocks demo --task segmentation``: train the reference segmenter with CE + Dice on
the demo's synthetic COCO and report its mIoU (private; the command line is in
`visionblocks.cli`).

The detection demo's splits (`visionblocks.cli._demo_data.demo_data`, with `TRAIN_IMAGES`
training images: the first of the detection demo's) are painted into label maps by
`visionblocks.data.CocoSegmentation` and brought to `IMAGE_SIZE` (images with antialiasing,
labels by nearest neighbour); a `Segmenter` (``vb_tiny``, `FPN`, `FPNSegHead`
with ``loss=("ce", "dice")``) trains on random mirrored batches with AdamW (`LEARNING_RATE`,
the detection demo's warm-up and cosine decay), and `visionblocks.metrics.SegmentationMetrics` scores the val
split, printed by `visionblocks.metrics.format_metrics`. Outputs in ``out``: ``metrics.json``
(``miou``, ``accuracy``, ``mean_f1``, ``iou`` and ``f1`` per class, ``loss`` (the last step's
losses), ``steps``, ``seconds``, ``steps_per_second``, ``device``, ``seed``, ``amp``) and
``predictions.png`` (val images, their label maps and the predicted ones).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks.cli._demo_data import NUM_CLASSES

__all__ = ["DEFAULT_STEPS", "SEG_MODEL", "run_segmentation_demo"]

DEFAULT_STEPS = 400
"""Training steps of the default segmentation demo."""
IMAGE_SIZE = (64, 64)
TRAIN_IMAGES = 512
"""Training images of the segmentation demo."""
BATCH_SIZE = 16
LEARNING_RATE = 2.5e-2
SEG_MODEL: dict[str, Any] = {
    "type": "segmenter",
    "backbone": {"type": "vb_tiny"},
    "neck": {"type": "fpn", "out_channels": 32},
    "head": {"type": "fpn_seg", "num_classes": NUM_CLASSES + 1, "channels": 32,
             "loss": ("ce", "dice")},
}  # fmt: skip
"""The segmentation demo's model, built with ``MODELS.build(SEG_MODEL)`` (the classes: the
background and the demo's shapes)."""
_DRAWN = 6  # val images in the picture


def _split(ann: Path) -> tuple[Tensor, Tensor, list[str]]:
    """A split's images ``(N, 3, *IMAGE_SIZE)`` uint8, label maps ``(N, *IMAGE_SIZE)`` int64
    (255 ignored) and class names."""
    from visionblocks.data import CocoSegmentation

    data = CocoSegmentation(ann.parent / "images", ann)
    pairs = [data[i] for i in range(len(data))]
    images = torch.stack([image.as_subclass(Tensor) for image, _ in pairs]).float()
    labels = torch.stack([mask.as_subclass(Tensor) for _, mask in pairs])
    images = F.interpolate(images, size=IMAGE_SIZE, mode="bilinear", antialias=True)
    labels = F.interpolate(labels[:, None].float(), size=IMAGE_SIZE, mode="nearest")[:, 0]
    return images.round().clamp(0, 255).to(torch.uint8), labels.long(), data.classes


def run_segmentation_demo(
    *,
    steps: int = DEFAULT_STEPS,
    out: str | os.PathLike[str] = "demo-seg-out",
    device: str = "auto",
    seed: int | None = None,
    amp: bool | None = None,
) -> dict[str, Any]:
    """Train the reference segmenter on the demo's synthetic COCO, score it, write the outputs.

    Args:
        steps: Training steps (batches of `BATCH_SIZE` images).
        out: Output folder; the synthetic data goes to ``out/data`` (reused when present).
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        seed: ``None``: seed 0, and on the CPU a thread count tuned while training. An int:
            a repeatable run (deterministic algorithms, a fixed thread count).
        amp: Mixed precision: ``None`` is on for CUDA and off on the CPU.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds.

    Raises:
        RuntimeError: ``cuda`` without CUDA.
        ValueError, TypeError: Bad arguments.
    """
    from visionblocks.cli.demo import _kept_global_state, _resolve_device

    check_type("steps", steps, int)
    check_range("steps", steps, 1)
    if seed is not None:
        check_type("seed", seed, int)
        check_range("seed", seed, 0, 2**32 - 1)
    if amp is not None:
        check_type("amp", amp, bool)
    check_type("out", out, (str, os.PathLike))
    check_choice("device", device, ("auto", "cpu", "cuda"))
    start = time.perf_counter()
    where = _resolve_device(device)
    with _kept_global_state():
        return _run(steps, Path(out), where, seed, where.type == "cuda" if amp is None else amp,
                    start)  # fmt: skip


def _run(
    steps: int, out: Path, device: torch.device, seed: int | None, amp: bool, start: float
) -> dict[str, Any]:
    from visionblocks.cli._demo_data import demo_data
    from visionblocks.metrics import SegmentationMetrics, format_metrics
    from visionblocks.registry import MODELS
    from visionblocks.training import seed_everything

    out.mkdir(parents=True, exist_ok=True)
    train_ann, val_ann = demo_data(out, 0 if seed is None else seed, TRAIN_IMAGES)
    seed_everything(0 if seed is None else seed, deterministic=seed is not None, warn_only=True)
    images, labels, _ = _split(train_ann)
    val_images, val_labels, classes = _split(val_ann)
    model = MODELS.build(SEG_MODEL).to(device)
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    print(f"visionblocks demo --task segmentation: {steps} steps on {device}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, seed "
          f"{0 if seed is None else seed}{threads}{', autocast' if amp else ''}", flush=True)  # fmt: skip
    last, seconds = _train(model, images, labels, steps, device, amp, seed)
    print(f"trained {steps} steps in {seconds:.1f} s: {steps / seconds:.2f} steps/s", flush=True)

    model.eval()
    metrics = SegmentationMetrics(len(classes), ignore_index=255)
    predicted = []
    with torch.no_grad():
        for i in range(0, len(val_images), 32):
            pred = model.predict(val_images[i : i + 32].to(device))
            metrics.update(pred, val_labels[i : i + 32].to(device))
            predicted.append(pred.cpu())
    result = metrics.compute()
    print(format_metrics(result, class_names=classes, digits=3), flush=True)
    per_class = {k: dict(zip(classes, result[k].tolist())) for k in ("iou", "f1")}
    summary = {
        "miou": result["miou"].item(), "accuracy": result["accuracy"].item(),
        "mean_f1": result["mean_f1"].item(), **per_class, "loss": last, "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "steps_per_second": round(steps / seconds, 2), "device": device.type, "seed": seed,
        "amp": amp,
    }  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(val_images[:_DRAWN], val_labels[:_DRAWN], torch.cat(predicted)[:_DRAWN], classes,
          out / "predictions.png", f"validation images after {steps} steps: mIoU "
          f"{summary['miou']:.3f}")  # fmt: skip
    print(f"mIoU {summary['miou']:.3f} ({summary['seconds']} s); wrote {out}/metrics.json, "
          "predictions.png", flush=True)  # fmt: skip
    return summary


def _train(
    model: Any,
    images: Tensor,
    labels: Tensor,
    steps: int,
    device: torch.device,
    amp: bool,
    seed: int | None,
) -> tuple[dict[str, float], float]:
    """Train on random mirrored batches; the last step's losses and the training seconds."""
    from tqdm.auto import tqdm

    from visionblocks.cli._demo_threads import ThreadTuner
    from visionblocks.cli._demo_train import LOG_EVERY, amp_dtype, schedule

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s, steps))
    dtype = amp_dtype(device, amp)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    autocast = nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
    # As the detection demo: on the CPU, the thread count that makes steps fastest, unless
    # the run is seeded (the thread count changes the order of floating-point sums).
    tuner = ThreadTuner(torch.get_num_threads(), tune=device.type == "cpu" and seed is None)
    generator = torch.Generator().manual_seed(0 if seed is None else seed)
    model.train()
    losses: dict[str, Tensor] = {}
    begin = time.perf_counter()
    with tqdm(total=steps, desc="training", unit="step") as bar:
        for step in range(steps):
            tuner.start_step()
            began = time.perf_counter()
            pick = torch.randint(len(images), (BATCH_SIZE,), generator=generator)
            mirror = (torch.rand(BATCH_SIZE, generator=generator) < 0.5)[:, None, None]
            x, y = images[pick], labels[pick]
            x = torch.where(mirror[:, None], x.flip(-1), x).to(device, non_blocking=True)
            y = torch.where(mirror, y.flip(-1), y).to(device, non_blocking=True)
            with autocast:
                losses = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(losses["loss"]).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            tuner.end_step(time.perf_counter() - began)
            bar.update(1)
            if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:  # a host read: only then
                bar.set_postfix(loss=f"{losses['loss'].item():.3f}",
                                threads=torch.get_num_threads())  # fmt: skip
    last = {name: round(value.item(), 4) for name, value in losses.items()}
    return last, time.perf_counter() - begin


def _plot(
    images: Tensor, truth: Tensor, predicted: Tensor, classes: list[str], path: Path, title: str
) -> None:
    """Each image above its label map and the predicted one (ignored pixels white)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from visionblocks.cli._demo_plots import _pyplot

    plt = _pyplot()
    palette = ["#202020", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]  # fmt: skip
    colours = [*palette[: len(classes)], "#ffffff"]
    cmap = ListedColormap(colours)
    ignored = len(classes)  # the white colour

    def shown(maps: Tensor) -> Any:
        return maps.masked_fill((maps < 0) | (maps >= len(classes)), ignored).numpy()

    cols = len(images)
    fig, axes = plt.subplots(3, cols, figsize=(1.9 * cols, 6.6), squeeze=False, dpi=90)
    for col in range(cols):
        axes[0, col].imshow(images[col].permute(1, 2, 0).numpy())
        for row, maps in ((1, truth), (2, predicted)):
            axes[row, col].imshow(shown(maps[col]), cmap=cmap, vmin=0, vmax=ignored,
                                  interpolation="nearest")  # fmt: skip
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for row, name in enumerate(("image", "ground truth", "prediction")):
        axes[row, 0].set_ylabel(name)
    handles = [Patch(color=c, label=n) for c, n in zip(colours, [*classes, "ignored"])]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
