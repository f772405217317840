"""Private machinery of `visionblocks.deploy`: comparing a written file's outputs with the
eager model's, finding the module whose export fails, and keeping the exporters quiet."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

__all__ = [
    "DETECTIONS",
    "detections_diff",
    "leaves",
    "locate",
    "max_diff",
    "quiet_exporters",
    "run_onnx",
]


def leaves(value: Any) -> list[Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, Tensor)]


DETECTIONS = ("boxes", "scores", "labels", "num_detections")


def detections_diff(ours: Sequence[Tensor], expected: Sequence[Tensor]) -> float | None:
    """Largest difference between two sets of padded detections, each row compared with its
    closest row of the same label and a score within 1e-4 (NMS may order ties either way);
    ``None`` when they are not padded detections of equal shapes."""
    if len(ours) != 4 or len(expected) != 4:
        return None
    ours = [torch.as_tensor(v) for v in ours]
    if any(a.shape != b.shape for a, b in zip(ours, expected, strict=True)) or ours[0].dim() != 3:
        return None
    boxes, scores, labels, count = (t.detach().cpu().double() for t in ours)
    e_boxes, e_scores, e_labels, e_count = (t.detach().cpu().double() for t in expected)
    worst = (count - e_count).abs().max().item()
    for b in range(boxes.shape[0]):
        score = (scores[b][:, None] - e_scores[b][None, :]).abs()
        box = (boxes[b][:, None, :] - e_boxes[b][None, :, :]).abs().amax(-1)
        cost = torch.maximum(score, box)
        cost[(labels[b][:, None] != e_labels[b][None, :]) | (score > 1e-4)] = float("inf")
        worst = max(worst, cost.min(1).values.max().item(), cost.min(0).values.max().item())
    return worst


def max_diff(ours: Sequence[Any], expected: Sequence[Tensor]) -> float:
    if len(ours) != len(expected):
        raise RuntimeError(
            f"the exported file returns {len(ours)} tensors, the eager model {len(expected)}"
        )
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, expected, strict=True)):
        a = torch.as_tensor(a)
        if tuple(a.shape) != tuple(b.shape):
            raise RuntimeError(
                f"output {i}: the exported file gives shape {tuple(a.shape)}, the eager model "
                f"{tuple(b.shape)}"
            )
        if a.numel():
            diff = (a.double() - b.detach().cpu().double()).abs().max().item()
            worst = max(worst, diff)
    return worst


def _record_inputs(
    model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The first ``(args, kwargs)`` each submodule is called with in ``model(*args)``."""
    seen: dict[str, tuple[Any, Any]] = {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(mod: nn.Module, a: Any, kw: Any, name: str = name) -> None:
            seen.setdefault(name, (a, kw))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _exports(module: nn.Module, args: Any, kwargs: Any) -> BaseException | None:
    try:
        torch.export.export(module, tuple(args), dict(kwargs), strict=False)
    except Exception as err:  # the failure is the answer
        return err
    return None


def locate(
    model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], error: BaseException
) -> tuple[str, str, str]:
    """The innermost submodule whose own export fails: ``(message, its path, its class)``."""
    try:
        inputs = _record_inputs(model, args, kwargs)
    except Exception:  # the eager model fails too: report the export error as it is
        inputs = {}
    path, module, cause = "", model, error
    while True:
        for name, child in module.named_children():
            full = f"{path}.{name}" if path else name
            if full not in inputs:
                continue  # did not run
            failure = _exports(child, *inputs[full])
            if failure is not None:
                path, module, cause = full, child, failure
                break
        else:
            break
    where = (
        f"module '{path}' ({type(module).__name__})"
        if path
        else (f"the forward of {type(module).__name__} itself (no submodule fails on its own)")
    )
    first = (str(cause).strip().splitlines() or [""])[0][:300].rstrip(".")
    return (
        f"export failed in {where}: {type(cause).__name__}: {first}. Replace that module by "
        "an exportable one or keep it out of the exported part (export the submodules before "
        "it); if the failure is about dynamic sizes, export a fixed image size "
        "(dynamic_hw=False, or --static on the command line)",
        path,
        type(module).__name__,
    )


@contextmanager
def quiet_exporters() -> Iterator[None]:
    """Silence the exporters' notes to their own developers; errors and other warnings
    still show."""
    notes = logging.getLogger("onnx_ir")
    level = notes.level
    notes.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*create_unbacked_symint.*")
            warnings.filterwarnings("ignore", message=".*different number of inputs than the")
            yield
    finally:
        notes.setLevel(level)


def run_onnx(path: Path, example: Tensor) -> list[Any]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return session.run(None, {name: example.detach().cpu().numpy()})
