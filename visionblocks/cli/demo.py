"""``visionblocks demo``: train the reference detector on synthetic COCO and evaluate it.

Offline, end to end: `make_synthetic_coco` writes train and val splits (once),
`CocoInstances` and `collate_detection` feed a `Detector` built from the registries
(``vb_tiny``, `FPN`, `YOLOv8Head`), AdamW trains it (linear warm-up, cosine decay, AMP on
CUDA; each batch mirrored, scaled and shifted by one `visionblocks.transforms.RandomAffine`
draw), and `coco_evaluate` scores the moving average of its weights
(`visionblocks.training.ModelEMA`) on the val split, overall and per class; the average is
also what the picture draws and ``model.pt`` holds. The deployed score threshold is the
one of highest F1 at IoU 0.5 (class-aware, after the head's class-aware NMS) on the val
split; the picture draws the val predictions above it. Under ``torchrun`` with
``--distributed`` it trains with ``DistributedDataParallel``. On the CPU without ``--seed`` the thread count
follows what the machine offers (`visionblocks.cli._demo_threads`); with ``--seed`` the run
is repeatable.

Outputs in ``out``: ``metrics.json`` (the COCO numbers, ``per_class`` AP and AP50,
``score_thresh``, ``drawn``: the drawn images' ``objects``, ``boxes`` and objects ``found``
with a box of their class, then ``steps``, ``seconds``, ``steps_per_second``,
``world_size``, ``seed``, ``amp``), ``losses.json`` (one value per step and loss),
``model.pt`` (``{"config": DEMO_MODEL with the score threshold, "model": state dict}``),
``predictions.png`` and ``loss.png``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from visionblocks import distributed as dist_utils
from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.cli._demo_data import NUM_CLASSES, demo_data, demo_loaders
from visionblocks.cli._demo_eval import above, found_once, hits, per_class_ap, score_threshold
from visionblocks.cli._demo_train import make_ema, memory_format, train
from visionblocks.metrics import format_metrics
from visionblocks.training import seed_everything

__all__ = ["DEFAULT_STEPS", "DEMO_MODEL", "run_demo"]
__dir__ = public_dir(__name__, __all__)

DEFAULT_STEPS = 850
"""Training steps of the default demo."""

DEMO_MODEL: dict[str, Any] = {
    "type": "detector",
    # Wider than vb_tiny's default (16, 32, 64, 128 channels): the early stages keep the
    # corners and curves that tell small circles, squares and triangles apart.
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [24, 48, 96, 192]},
    "neck": {"type": "fpn", "out_channels": 64},
    "head": {
        # Task-aligned assignment with soft (IoU-aware) class targets, DFL and CIoU.
        "type": "yolov8",
        "num_classes": NUM_CLASSES,
        # YOLO11's depthwise-separable class branch: its steps are cheaper, which pays for
        # 850 steps in less time than YOLOv8's branch took for 800, with about as many
        # validation images exactly right (docs/benchmarks.md#the-demo).
        "depthwise_cls": True,
        # Sides of up to 7 cells: 56 pixels at stride 8 for objects of at most 58.
        "reg_max": 8,
        # Objects never overlap: IoU 0.5 removes second boxes on an object that ultralytics'
        # 0.7 keeps.
        "nms_thresh": 0.5,
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


@torch.no_grad()
def _predict(
    model: Any, loader: Any, device: torch.device
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Predictions and targets of ``loader``'s images (this rank's), by image id."""
    model.eval()
    predictions, targets = {}, {}
    for images, batch, sizes in loader:
        outputs = model(images.to(device), image_sizes=sizes)
        for target, output in zip(batch, outputs):
            predictions[target["image_id"]] = {k: v.cpu() for k, v in output.items()}
            targets[target["image_id"]] = target
    return predictions, targets


def _score_threshold(predictions: dict[int, Any], targets: dict[int, Any]) -> float | None:
    """The score threshold of highest F1 at IoU 0.5 on these images (every rank's)."""
    mine = [(p["scores"], hits(p, targets[i]), len(targets[i]["boxes"]))
            for i, p in predictions.items()]  # fmt: skip
    every = [x for part in dist_utils.all_gather_object(mine) for x in part]
    scores = torch.cat([s for s, _, _ in every])
    return score_threshold(scores, torch.cat([h for _, h, _ in every]), sum(n for *_, n in every))


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


@dataclass(frozen=True)
class _Options:
    steps: int
    out: Path
    device: torch.device
    seed: int
    seeded: bool  # a seed was given: a repeatable run
    amp: bool
    detect_nonfinite: bool
    export: bool
    start: float


def run_demo(
    *,
    steps: int = DEFAULT_STEPS,
    out: str | os.PathLike[str] = "demo-out",
    device: str = "auto",
    distributed: bool = False,
    seed: int | None = None,
    amp: bool | None = None,
    detect_nonfinite: bool = False,
    export: bool = True,
) -> dict[str, Any]:
    """Train and evaluate the reference detector on synthetic COCO; write the outputs.

    Args:
        steps: Training steps (global batch of 16 images, split over the ranks).
        out: Output folder; the synthetic data goes to ``out/data`` (reused when present).
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        distributed: Join the ``torchrun`` process group and train with DDP.
        seed: ``None`` (default): seed 0, and on the CPU a thread count tuned while training
            (not bitwise repeatable). An int: a repeatable run
            (`visionblocks.training.seed_everything` with ``deterministic=True``, settings
            put back at the end; a fixed thread count).
        amp: Mixed precision: ``None`` (default) is on for CUDA (bf16 where the GPU has it,
            else fp16 with a gradient scaler) and off on the CPU; ``True`` also trains in
            bf16 on the CPU.
        detect_nonfinite: Train under `visionblocks.training.find_nonfinite`.
        export: Also write ``model.onnx`` (`visionblocks.deploy.export_model`) and check it
            in onnxruntime; skipped, with a message, without ``onnx``, ``onnxscript`` and
            ``onnxruntime``.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds (the same on every rank).

    Raises:
        RuntimeError: ``distributed`` outside ``torchrun``, or ``cuda`` without CUDA.
        visionblocks.training.NonFiniteError: With ``detect_nonfinite``, at the first NaN
            or inf.
        ValueError, TypeError: Bad arguments.

    Examples:
        >>> import tempfile
        >>> folder = tempfile.TemporaryDirectory()
        >>> metrics = run_demo(steps=2, out=folder.name, device="cpu", seed=0, export=False)  # doctest: +ELLIPSIS
        visionblocks demo: 2 steps on cpu x 1, 330,177 parameters, seed 0 (repeatable: ... threads)
        trained 2 steps in ... s: ... steps/s
        AP ...  AP50 ...  AP75 ...
        class ...
        ---...
        circle ...
        square ...
        triangle ...
        score threshold ... (...); the 8 images drawn: ... objects, ... boxes, ... found ...
        >>> sorted(k for k in metrics if k != "stats")  # doctest: +NORMALIZE_WHITESPACE
        ['AP', 'AP50', 'AP75', 'amp', 'device', 'drawn', 'per_class', 'score_thresh', 'seconds',
         'seed', 'steps', 'steps_per_second', 'world_size']
        >>> folder.cleanup()
    """
    check_type("steps", steps, int)
    check_range("steps", steps, 1)
    if seed is not None:
        check_type("seed", seed, int)
        check_range("seed", seed, 0, 2**32 - 1)
    if amp is not None:
        check_type("amp", amp, bool)
    for name, flag in (("distributed", distributed), ("export", export),
                       ("detect_nonfinite", detect_nonfinite)):  # fmt: skip
        check_type(name, flag, bool)
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
        where = _resolve_device(device)
        options = _Options(
            steps=steps, out=Path(out), device=where, seed=0 if seed is None else seed,
            seeded=seed is not None, amp=where.type == "cuda" if amp is None else amp,
            detect_nonfinite=detect_nonfinite, export=export, start=start,
        )  # fmt: skip
        with _kept_global_state():
            return _run(options)
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


@contextmanager
def _kept_global_state() -> Iterator[None]:
    """Put back the thread count and the determinism settings the run may change."""
    threads = torch.get_num_threads()
    flags = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)  # fmt: skip
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:]


def _run(o: _Options) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from visionblocks.cli._demo_plots import plot_losses, plot_predictions
    from visionblocks.data import coco_evaluate
    from visionblocks.registry import MODELS

    world = dist_utils.get_world_size()
    if world > 1 and o.device.type == "cpu":  # share the cores instead of oversubscribing them
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        )
    out, device = o.out, o.device
    out.mkdir(parents=True, exist_ok=True)
    train_ann, val_ann = demo_data(out, o.seed)
    seed_everything(o.seed, deterministic=o.seeded, warn_only=True)
    train_loader, val_loader, val = demo_loaders(train_ann, val_ann, o.seed)
    model = MODELS.build(DEMO_MODEL).to(device, memory_format=memory_format(device))
    if world > 1:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    steps = o.steps
    if o.seeded:
        seeded = f"seed {o.seed} (repeatable: {torch.get_num_threads()} threads)"
    elif device.type == "cpu":
        seeded = "seed 0 (threads tuned: not bitwise repeatable)"
    else:
        seeded = "seed 0"
    _log(f"visionblocks demo: {steps} steps on {device} x {world}, "
         f"{sum(p.numel() for p in model.parameters()):,} parameters, {seeded}"
         f"{', bf16/fp16 autocast' if o.amp else ''}")  # fmt: skip
    ema = make_ema(model)
    history, seconds = train(
        model, train_loader, steps, device, amp=o.amp, detect_nonfinite=o.detect_nonfinite,
        tune_threads=device.type == "cpu" and world == 1 and not o.seeded, ema=ema,
    )  # fmt: skip
    _log(f"trained {steps} steps in {seconds:.1f} s: {steps / seconds:.2f} steps/s")
    detector = ema.module  # the moving average of the weights is evaluated, drawn and saved
    predictions, targets = _predict(detector, val_loader, device)
    stats = coco_evaluate(predictions, val)  # a collective under DDP: rank 0 evaluates all
    per_class = per_class_ap(predictions, val)
    # The deployed postprocessing: the head's class-aware NMS, then the threshold of highest
    # F1 on the val split; saved in model.pt's config (and so in model.onnx).
    found = _score_threshold(predictions, targets)
    threshold = detector.head.inference["score_thresh"] if found is None else found
    head = {**DEMO_MODEL["head"], "score_thresh": threshold}
    detector.head.inference["score_thresh"] = threshold
    # The figure shows the first validation images, whichever rank predicted them.
    shown_ids = val.ids[:8]
    shown: dict[int, Any] = {}
    for part in dist_utils.all_gather_object(
        {i: above(predictions[i], threshold) for i in shown_ids if i in predictions}
    ):
        shown.update(part)
    first = range(len(shown_ids))
    drawn = found_once([shown[i] for i in shown_ids], [val[i][1] for i in first])
    metrics = {
        "AP": stats["AP"], "AP50": stats["AP50"], "AP75": stats["AP75"],
        "per_class": per_class, "score_thresh": threshold, "drawn": drawn, "steps": steps,
        "seconds": round(time.perf_counter() - o.start, 1),
        "steps_per_second": round(steps / seconds, 2), "world_size": world,
        "device": device.type, "seed": o.seed if o.seeded else None, "amp": o.amp,
        "stats": stats,
    }  # fmt: skip
    if dist_utils.is_main_process():
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (out / "losses.json").write_text(json.dumps(history) + "\n")
        # With its config, so that `visionblocks export demo-out/model.pt` rebuilds it.
        config = {**DEMO_MODEL, "head": head}
        torch.save({"config": config, "model": detector.state_dict()}, out / "model.pt")
        plot_predictions(
            [val[i][0] for i in first], [shown[i] for i in shown_ids], [val[i][1] for i in first],
            val.classes, out / "predictions.png", score_thresh=threshold,
            title=f"validation images after {steps} steps: AP {stats['AP']:.2f}, "
            f"AP50 {stats['AP50']:.2f}",
        )  # fmt: skip
        plot_losses({k: v for k, v in history.items() if k != "loss"} | {"loss": history["loss"]},
                    out / "loss.png")  # fmt: skip
        _log(f"AP {stats['AP']:.3f}  AP50 {stats['AP50']:.3f}  AP75 {stats['AP75']:.3f}")
        by_class = {k: [ap[k] for ap in per_class.values()] for k in ("AP", "AP50")}
        _log(format_metrics(by_class, class_names=list(per_class), digits=3))
        source = "the head's default" if found is None else "highest F1 on the val split"
        _log(f"score threshold {threshold:.3f} ({source}); the {drawn['images']} images drawn: "
             f"{drawn['objects']} objects, {drawn['boxes']} boxes, {drawn['found']} objects "
             f"found with their class ({metrics['seconds']} s); wrote {out}/metrics.json, "
             "losses.json, model.pt, predictions.png, loss.png")  # fmt: skip
        if o.export:  # two validation images: the batch, height and width stay dynamic
            images = torch.stack([val[i][0].as_subclass(torch.Tensor) for i in range(2)])
            # Float input, with noise below one grey level: the flat synthetic backgrounds
            # give locations with exactly equal scores, which NMS may order either way.
            noise = torch.rand(images.shape, generator=torch.Generator().manual_seed(0))
            _export_onnx(detector, images.float() + noise, out)
    return metrics
