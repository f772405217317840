"""What ``visionblocks inspect CHECKPOINT [--model NAME]`` prints (private; cli stays thin)."""

from __future__ import annotations

import difflib
import os
import sys
from collections import Counter
from collections.abc import Mapping
from typing import TextIO

import torch
from torch import nn

from visionblocks.weights import LoadReport
from visionblocks.weights._io import ReadInfo, read_checkpoint

__all__ = [
    "backbone_hint",
    "check_model_name",
    "describe_state_dict",
    "load_into_backbone",
    "run_inspect",
    "structure_mapping",
]

_MIB = 1024 * 1024
_MAX_ROWS = 24


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _common_prefix(keys: list[str]) -> str:
    """Longest dotted prefix (ending in ".") shared by every key and shorter than each."""
    parts = [k.split(".")[:-1] for k in keys]  # never the whole key
    common: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return "".join(p + "." for p in common)


def _group(
    state: Mapping[str, torch.Tensor], common: str
) -> dict[str, tuple[int, int, dict[str, tuple[int, int]]]]:
    """``{first part: (count, bytes, {second part: (count, bytes)})}`` of keys after ``common``."""
    counts: dict[str, list[int]] = {}
    subcounts: dict[str, dict[str, list[int]]] = {}
    for key, tensor in state.items():
        head, dot, rest = key[len(common) :].partition(".")
        entry = counts.setdefault(head + dot, [0, 0])
        entry[0] += 1
        entry[1] += _nbytes(tensor)
        sub, sub_dot, leaf = rest.partition(".")
        if leaf:  # only parts that hold further names, not the tensor's own name
            sub_entry = subcounts.setdefault(head + dot, {}).setdefault(sub + sub_dot, [0, 0])
            sub_entry[0] += 1
            sub_entry[1] += _nbytes(tensor)
    return {
        group: (count, size, {k: (c, b) for k, (c, b) in subcounts.get(group, {}).items()})
        for group, (count, size) in counts.items()
    }


def _field(label: str, value: str) -> str:
    return f"{label + ':':<11}{value}"


def describe_state_dict(
    state: Mapping[str, torch.Tensor], info: ReadInfo | None = None, *, path: str | None = None
) -> str:
    """A readable summary: tensor count, total size, dtypes and top-level key groups.

    Examples:
        >>> import torch
        >>> state = {"body.conv.weight": torch.zeros(8, 3, 3, 3), "body.conv.bias": torch.zeros(8),
        ...          "head.weight": torch.zeros(2, 8, dtype=torch.float16)}
        >>> print(describe_state_dict(state))
        tensors:   3 (240 elements, 0.00 MiB)
        dtypes:    float32 2, float16 1
        prefixes:  2
          body.  2 tensors  0.00 MiB
          head.  1 tensor   0.00 MiB
    """
    lines = []
    if path is not None:
        lines.append(_field("file", f"{path} ({os.path.getsize(path) / _MIB:.2f} MiB on disk)"))
    if info is not None:
        lines.append(_field("format", info.format))
        if info.layout:
            lines.append(_field("layout", info.layout))
        if info.containers:
            lines.append(_field("unwrapped", " -> ".join(repr(c) for c in info.containers)))
        if info.modules:  # module placeholders rebuilt as state dicts
            classes = ", ".join(f"{name} {count}" for name, count in info.modules.items())
            lines.append(_field("modules", f"{classes} (state dicts rebuilt, never imported)"))
        others = {k: n for k, n in info.placeholders.items() if k not in info.modules}
        if others:
            replaced = ", ".join(f"{name} {count}" for name, count in others.items())
            lines.append(_field("replaced", f"{replaced} (placeholders: never imported or run)"))
        others = [*info.other_keys, *info.dropped]
        if others:
            lines.append(_field("dropped", f"{', '.join(others)} (not tensors)"))
    total = sum(_nbytes(t) for t in state.values())
    elements = sum(t.numel() for t in state.values())
    lines.append(_field("tensors", f"{len(state)} ({elements:,} elements, {total / _MIB:.2f} MiB)"))
    dtypes = Counter(str(t.dtype).removeprefix("torch.") for t in state.values())
    lines.append(_field("dtypes", ", ".join(f"{d} {n}" for d, n in dtypes.most_common())))
    keys = list(state)
    if not keys:
        return "\n".join(lines)
    common = _common_prefix(keys)
    if common:
        lines.append(_field("common", f"every key starts with {common!r}"))
    groups = _group(state, common)
    lines.append(_field("prefixes", str(len(groups))))
    rows: list[tuple[str, int, int]] = []
    for group, (count, size, subgroups) in groups.items():
        rows.append(("  " + common + group, count, size))
        # Named parts (backbone.body / backbone.fpn) are worth a line; numbered blocks are not.
        if len(subgroups) >= 2 and not all(name[:-1].isdigit() for name in subgroups):
            for sub, (sub_count, sub_size) in subgroups.items():
                rows.append(("    " + common + group + sub, sub_count, sub_size))
    shown = rows[:_MAX_ROWS]
    width = max(len(name) for name, _, _ in shown)
    count_width = max(len(str(count)) for _, count, _ in shown)
    size_width = max(len(f"{size / _MIB:.2f}") for _, _, size in shown)
    for name, count, size in shown:
        noun = "tensor " if count == 1 else "tensors"
        lines.append(
            f"{name:<{width}}  {count:>{count_width}} {noun}  {size / _MIB:>{size_width}.2f} MiB"
        )
    if len(rows) > _MAX_ROWS:
        lines.append(f"  ... and {len(rows) - _MAX_ROWS} more")
    return "\n".join(lines)


def check_model_name(name: str) -> None:
    """Raise ``KeyError`` (with close matches) unless `build_backbone` knows ``name`` (a
    malformed timm name, or ``"timm"`` alone, too)."""
    from visionblocks.backbones._timm import check_model_name as check_timm_name
    from visionblocks.registry import BACKBONES

    try:
        if name == "timm":
            check_timm_name("")  # raises: says how timm models are named
        BACKBONES.get(name)
    except ValueError as exc:
        raise KeyError(str(exc)) from None


def backbone_hint(argument: str) -> str | None:
    """What to say when the checkpoint ``argument`` is no file but names a backbone, or a
    name close to one; None when it looks like a file name or is nowhere near a backbone.

    Examples:
        >>> print(backbone_hint("resnet18"))
        'resnet18' is not a file; to inspect how a checkpoint loads into the backbone named 'resnet18', use `visionblocks inspect CHECKPOINT --model resnet18`
        >>> print(backbone_hint("resnet-18"))
        checkpoint file not found: 'resnet-18'; for a backbone (did you mean 'resnet18'?), use `visionblocks inspect CHECKPOINT --model resnet18`
        >>> backbone_hint("resnet18.pth") is None
        True
    """
    from visionblocks.backbones._timm import TIMM_PREFIX, _suggest_timm_names
    from visionblocks.registry import BACKBONES

    if argument in BACKBONES:
        return (
            f"{argument!r} is not a file; to inspect how a checkpoint loads into the backbone "
            f"named {argument!r}, use `visionblocks inspect CHECKPOINT --model {argument}`"
        )
    name = argument.removeprefix(TIMM_PREFIX)
    base, suffix = os.path.splitext(name)
    if suffix or os.sep in base or "/" in base or not base:  # a path, not a name
        return None
    if name != argument:  # timm/<not a timm model>: the timm models close to it
        close = _suggest_timm_names(name)
    else:  # close registered names, after the timm form of a timm model named without timm/
        names = [*BACKBONES.list(), *(a for n in BACKBONES.list() for a in BACKBONES.aliases(n))]
        lowered = {n.lower(): n for n in names}
        matches = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.8)
        matches = [name.lower()] if name.lower() in lowered else matches  # only case differs
        close = [*_suggest_timm_names(name)[:1], *(lowered[m] for m in matches)]
        close = [c for c in close if c == TIMM_PREFIX + name or not c.startswith(TIMM_PREFIX)]
    if not close:
        return None
    options = ", ".join(repr(c) for c in dict.fromkeys(close))
    return (
        f"checkpoint file not found: {argument!r}; for a backbone (did you mean {options}?), "
        f"use `visionblocks inspect CHECKPOINT --model {close[0]}`"
    )


def load_into_backbone(name: str, state: Mapping[str, torch.Tensor]) -> tuple[LoadReport, bool]:
    """The report of ``build_backbone(name, pretrained=state)`` (a throw-away backbone), and
    whether that load passes build_backbone's guard (every backbone tensor loads)."""
    from visionblocks.backbones import build_backbone
    from visionblocks.weights import LoadError, load_partial

    try:
        backbone: nn.Module = build_backbone(name, pretrained=state)
    except LoadError as exc:  # the guard failed: the report says why
        return exc.report, False
    report = getattr(backbone, "load_report", None)
    if not isinstance(report, LoadReport):  # min_loaded=0: report an empty load, not raise
        report = load_partial(backbone, state, dry_run=True, min_loaded=0)
    return report, True


def structure_mapping(
    name: str, state: Mapping[str, torch.Tensor], info: ReadInfo, loaded_by_names: int = 0
) -> str:
    """What ``load_partial(backbone, state, match="structure", dry_run=True, min_loaded=0)``
    proposes for a fresh backbone ``name``: its report, or why it refused, or one line when
    it loads no more than the ``loaded_by_names`` keys that names load.

    Examples:
        >>> import torchvision
        >>> from visionblocks.weights._io import ReadInfo
        >>> state = torchvision.models.resnet18().state_dict()
        >>> state = {f"p{i}": v for i, v in enumerate(state.values())}  # names that say nothing
        >>> print(structure_mapping("resnet18", state, ReadInfo()).splitlines()[1])
        loaded 120/120 model keys (100.0%): 0 missing, 0 mismatched, 2 unexpected, 0 adapted, 120 renamed (dry run: nothing copied)
    """
    from visionblocks.backbones import build_backbone
    from visionblocks.weights import load_partial

    title = "load_partial(backbone, FILE, match='structure')"
    if info.format == "safetensors":
        return (
            f"{title} not tried: a .safetensors file stores its keys sorted by name, "
            "so their order says nothing about the module tree"
        )
    try:
        backbone: nn.Module = build_backbone(name)
        report = load_partial(backbone, state, match="structure", dry_run=True, min_loaded=0)
    except (RuntimeError, ValueError, TypeError) as exc:
        return f"{title} refuses:\n{exc}"
    if report.num_loaded <= loaded_by_names:
        return (
            f"{title} loads no more: {report.num_loaded}/{report.num_model_keys} model keys "
            "(the order and shapes pair nothing that the names leave)"
        )
    return f"{title} would load (every pairing, checkpoint -> backbone):\n" + report.describe(
        all_pairs=True
    )


def run_inspect(
    checkpoint: str,
    model_name: str | None = None,
    *,
    key: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the summary of ``checkpoint`` (and how it loads into a backbone); return the exit code.

    When the names do not load the backbone, `structure_mapping` is printed too. ``key`` is
    ``read_state_dict``'s. Exit codes: 0 printed; 1 the file is missing, unsafe or
    unreadable, or building the backbone failed; 2 unknown backbone name.
    """
    out = sys.stdout if out is None else out
    prog = "visionblocks inspect"
    if model_name is not None:
        try:
            check_model_name(model_name)
        except KeyError as exc:
            print(f"{prog}: {exc.args[0]}", file=sys.stderr)
            return 2
    try:
        state, info = read_checkpoint(checkpoint, key=key)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        if isinstance(exc, FileNotFoundError):  # `inspect resnet18` meant `--model resnet18`?
            message = backbone_hint(checkpoint) or message
        print(f"{prog}: {message}", file=sys.stderr)
        return 1
    print(describe_state_dict(state, info, path=checkpoint), file=out)
    if model_name is None:
        return 0
    try:
        report, passes = load_into_backbone(model_name, state)
    except KeyError as exc:  # e.g. an unknown timm model
        print(f"{prog}: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError, TypeError) as exc:
        print(f"{prog}: cannot build backbone {model_name!r}: {exc}", file=sys.stderr)
        return 1
    verdict = (
        "loads"
        if passes
        else "does NOT load (a backbone tensor is missing or mismatched; it raises LoadError)"
    )
    print(
        f"\nbuild_backbone({model_name!r}, pretrained=FILE) {verdict}:\n{report}",
        file=out,
    )
    left = [k for k in report.missing if not k.endswith("num_batches_tracked")]
    if not passes or left or report.mismatched:  # the names do not fit: try the structure
        print(f"\n{structure_mapping(model_name, state, info, report.num_loaded)}", file=out)
    return 0
