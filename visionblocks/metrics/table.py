"""Metric results as one plain-text table: `format_metrics`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir

__all__ = ["format_metrics"]
__dir__ = public_dir(__name__, __all__)


def _numbers(where: str, value: Any) -> list[float | int] | None:
    """The value as a list of numbers (one for a scalar); None for a table of 2+ dims."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 1:
            return None
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{where} must hold real numbers, got dtype {value.dtype}")
        return value.detach().cpu().reshape(-1).tolist()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
        if any(isinstance(v, Sequence | torch.Tensor) and not isinstance(v, str) for v in items):
            return None
        for i, v in enumerate(items):
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise TypeError(f"{where}[{i}] must be a real number, got {type(v).__name__}")
        return items
    raise TypeError(
        f"{where} must be a number, a 0-d or 1-d tensor or a sequence of numbers, got "
        f"{type(value).__name__}"
    )


def _cell(value: float | int, digits: int) -> str:
    if isinstance(value, int):
        return str(value)
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, a rule under the header."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))]).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def format_metrics(
    results: Mapping[str, Any],
    class_names: Sequence[str] | None = None,
    *,
    digits: int = 4,
) -> str:
    """Format metric results as a fixed-width plain-text table.

    ``results`` is one result (a mapping of metric name to value, e.g. `coco_evaluate`'s
    dict, `SegmentationMetrics.compute`'s or `panoptic_quality`'s) or several, as a mapping
    of column title to result (``{"bbox": ..., "segm": ...}``). Per-class values (1-d tensors
    or sequences, all of one length K) become the columns of a first table with a row per
    class; single numbers (floats, ints, 0-d tensors) the rows of a summary table with a
    column per result. Values of two or more dimensions (the confusion matrix) are left out.

    Args:
        results: One result, or a mapping of titles to results.
        class_names: K names for the per-class rows (default: the class indices).
        digits: Digits after the point of floating values (ints print as ints).

    Returns:
        str: The table(s), lines joined by ``"\\n"``, without a trailing newline.

    Raises:
        TypeError: ``results`` is not a mapping (of mappings), a value is not a number, a
            tensor or a sequence of numbers; ``class_names`` is not a sequence of str.
        ValueError: Per-class values of different lengths, ``class_names`` of another
            length, ``digits`` outside [0, 12], no results at all.

    Examples:
        >>> seg = {"iou": torch.tensor([0.5, 0.25]), "miou": torch.tensor(0.375),
        ...        "accuracy": 0.8, "confusion": torch.eye(2)}
        >>> print(format_metrics(seg, class_names=["road", "car"]))
        class     iou
        -----  ------
        road   0.5000
        car    0.2500
        <BLANKLINE>
        metric     value
        --------  ------
        miou      0.3750
        accuracy  0.8000
        >>> print(format_metrics({"bbox": {"AP": 0.5, "AP50": 0.75}, "segm": {"AP": 0.25}}))
        metric    bbox    segm
        ------  ------  ------
        AP      0.5000  0.2500
        AP50    0.7500
    """
    if not isinstance(results, Mapping):
        raise TypeError(f"results must be a mapping, got {type(results).__name__}")
    check_int("digits", digits, 0, 12)
    if results and all(isinstance(v, Mapping) for v in results.values()):
        columns = {str(title): result for title, result in results.items()}
    else:
        columns = {"value": results}
    several = len(columns) > 1
    per_class: dict[str, list[float | int]] = {}
    summary: dict[str, dict[str, float | int]] = {}
    for title, result in columns.items():
        where_title = f"results[{title!r}]" if several else "results"
        if not isinstance(result, Mapping):
            raise TypeError(f"{where_title} must be a mapping, got {type(result).__name__}")
        for name, value in result.items():
            values = _numbers(f"{where_title}[{name!r}]", value)
            if values is None:
                continue
            scalar = (
                value.dim() == 0
                if isinstance(value, torch.Tensor)
                else not isinstance(value, Sequence)
            )
            if scalar:
                summary.setdefault(str(name), {})[title] = values[0]
            else:
                per_class[f"{title} {name}" if several else str(name)] = values
    if not per_class and not summary:
        raise ValueError("results holds no numbers to format")
    lengths = {len(v) for v in per_class.values()}
    if len(lengths) > 1:
        sizes = {name: len(v) for name, v in per_class.items()}
        raise ValueError(f"per-class results must have one length, got {sizes}")
    blocks = []
    if per_class:
        k = lengths.pop()
        if class_names is None:
            labels = [str(i) for i in range(k)]
        else:
            if isinstance(class_names, str) or not isinstance(class_names, Sequence):
                raise TypeError(f"class_names must be a sequence of str, got {class_names!r}")
            for name in class_names:
                check_type("class_names[...]", name, str)
            if len(class_names) != k:
                raise ValueError(f"class_names must hold {k} names, got {len(class_names)}")
            labels = list(class_names)
        rows = [
            [label, *(_cell(v[i], digits) for v in per_class.values())]
            for i, label in enumerate(labels)
        ]
        blocks.append(_grid(["class", *per_class], rows))
    if summary:
        rows = [
            [name, *(_cell(by[t], digits) if t in by else "" for t in columns)]
            for name, by in summary.items()
        ]
        blocks.append(_grid(["metric", *columns], rows))
    return "\n\n".join("\n".join(block) for block in blocks)
