"""`load_partial`: copy the tensors of a checkpoint that fit a model (see `visionblocks.weights`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.weights._adapt import (
    adapt_input_conv_weight,
    compile_rename,
    input_conv_key,
    map_keys,
)
from visionblocks.weights._guards import (
    check_flags,
    check_min_loaded,
    failed_guard,
    require_patterns,
)
from visionblocks.weights._io import source_state
from visionblocks.weights._prefix import find_prefix_change
from visionblocks.weights._structure import match_structure
from visionblocks.weights.report import LoadError, LoadReport

__all__ = ["load_partial"]
__dir__ = public_dir(__name__, __all__)


def load_partial(
    model: nn.Module,
    source: str | os.PathLike[str] | Mapping[str, Any] | nn.Module,
    *,
    key: str | None = None,
    rename: Sequence[tuple[str, str]] | None = None,
    strip_prefixes: str | Sequence[str] = ("module.",),
    skip_mismatched: bool = True,
    adapt_input_channels: bool = True,
    strict: bool = False,
    dry_run: bool = False,
    require: str | Sequence[str] | None = None,
    min_loaded: float | None = None,
    auto_prefix: bool = True,
    match: str = "names",
) -> LoadReport:
    """Copy the tensors of a checkpoint that fit ``model`` into it, and report the rest.

    Keys: each prefix of ``strip_prefixes`` is removed, in order, from the keys that start
    with it (unless the key already is a model key: a ``DistributedDataParallel`` model loads
    its own ``module.*`` checkpoint), then each ``rename`` rule is applied with ``re.sub``.
    With ``auto_prefix``, when keys still do not fit, the dotted prefix of the unfitting keys
    whose removal (Lightning's ``model.``) or addition (a bare backbone into ``backbone.*``)
    loads the most keys, if any, is applied (ties: removing, then the shorter) and reported
    in ``prefix_change`` and ``renamed``.

    Tensors: one whose shape equals the model's is copied into the existing parameter or
    buffer (never replaced) under ``torch.no_grad()``, cast to its dtype and device; tied
    parameters load through any of their names. With ``adapt_input_channels``, the first conv
    weight ``(O, I, kh, kw)`` that differs from the checkpoint's in ``I`` only is adapted:
    summed over the checkpoint's channels for ``I == 1`` (a grey image gives its RGB copy's
    output), else channels repeated cyclically and scaled by checkpoint channels / ``I``.

    By structure (``match="structure"``), for the same network under other names (timm, detectron2,
    torchvision), tensors are paired by the order of the module tree and by shape: keys that
    ``strip_prefixes``/``rename`` turn into a fitting model key first, then an alignment that pairs
    as many modules as possible, preferring agreeing module names (``conv3``) and blocks kept whole,
    then siblings registered in another order. Shapes equal once size-1 dims are dropped load with
    ``reshape`` (``reshaped``); separate ``q``/``k``/``v`` and a fused ``qkv`` are concatenated or
    chunked along dim 0 (``fused``, ``split``). An ambiguous pairing raises ``ValueError`` listing
    the candidates. ``mismatched`` stays empty, ``auto_prefix`` and ``adapt_input_channels`` do not
    apply, and a ``.safetensors`` path is refused (its keys are sorted by name).

    The guards (``skip_mismatched``, ``strict``, ``require``, ``min_loaded``) run before
    anything is copied: a failure raises `LoadError` and leaves the model unchanged.

    Memory: a zip-format torch file is memory-mapped (``torch.load(weights_only=True,
    mmap=True)``) and each tensor copied from the mapping; tensors not loaded are never read.

    Args:
        model: The module to load into.
        source: A checkpoint path (read with `read_state_dict`'s rules), a state dict
            (training-checkpoint containers are unwrapped, modules in them taken as their
            state dicts, as in a file, and non-tensors dropped) or a module (its state dict).
        key: Take the state dict from this top-level entry of the checkpoint instead of
            guessing, as `read_state_dict` (``key="ema"``, ``key="state_dict_ema"``).
        rename: ``(regex, replacement)`` pairs applied in order with ``re.sub``.
        strip_prefixes: Prefixes removed, in order, from the keys that start with them;
            a str is one prefix.
        skip_mismatched: Skip (and report) tensors whose shape differs; False raises instead.
        adapt_input_channels: Adapt the first convolution to the model's input channels.
        strict: Fail unless every model key loads and no checkpoint key is left over.
        dry_run: Compute the report (and run the guards) without copying anything.
        require: fnmatch pattern(s) (``*`` also matches dots) of model keys that must all
            load; a pattern matching no model key is a ``ValueError``.
        min_loaded: Smallest acceptable fraction of loaded model keys, in ``[0, 1]``;
            None (default) requires at least one loaded key, 0 accepts loading nothing.
        auto_prefix: Find a key prefix to remove or add when that makes more keys load (names only).
        match: ``"names"`` (default): pair tensors by name, after prefix stripping and
            renaming; ``"structure"``: by the module tree's order and shape (see above).

    Returns:
        LoadReport: Loaded, missing, unexpected, mismatched, adapted and renamed keys
        (and, matched by structure, reshaped, fused and split ones).

    Raises:
        LoadError: A guard failed, including loading nothing with the default
            ``min_loaded`` (a `RuntimeError`; ``.report`` has the report).
        ValueError: Two checkpoint keys map to one name, an invalid ``rename`` regex, a
            ``require`` pattern matching no model key, ``min_loaded`` outside ``[0, 1]``, an
            unknown ``match``, a file that cannot be read safely, model tensors on the meta
            device, or (by structure) an ambiguous pairing or a ``.safetensors`` path.
        FileNotFoundError: ``source`` is a path that does not exist.
        KeyError: ``key`` is given and the checkpoint has no mapping (or module) under it.
        TypeError: An argument has the wrong type.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> pretrained = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4, 1000))
        >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, 10))
        >>> report = load_partial(model, pretrained.state_dict())
        >>> print(report)
        loaded 2/4 model keys (50.0%): 0 missing, 2 mismatched, 0 unexpected, 1 adapted, 0 renamed
        mismatched (2, checkpoint vs model shape):
          2.weight: (1000, 4) vs (10, 4)
          2.bias: (1000,) vs (10,)
        adapted (1):
          0.weight

        A checkpoint held in memory, with whole models in it (ultralytics' layout):

        >>> checkpoint = {"model": None, "ema": pretrained, "epoch": 3}
        >>> load_partial(model, checkpoint, key="ema").loaded
        ['0.weight', '0.bias']

        The same network under other names, with its layer scale stored as ``(C,)``, loads
        by structure:

        >>> class Block(nn.Module):
        ...     def __init__(self, scale_shape):
        ...         super().__init__()
        ...         self.conv = nn.Conv2d(3, 8, 3)
        ...         self.scale = nn.Parameter(torch.ones(scale_shape))
        >>> names = {"0": "stem", "1": "head"}
        >>> theirs = nn.Sequential(Block((8,)), nn.Linear(8, 2)).state_dict()
        >>> theirs = {names[k[0]] + k[1:]: v for k, v in theirs.items()}
        >>> ours = nn.Sequential(Block((8, 1, 1)), nn.Linear(8, 2))
        >>> report = load_partial(ours, theirs, match="structure", strict=True)
        >>> print(report.describe(all_pairs=True))
        loaded 5/5 model keys (100.0%): 0 missing, 0 mismatched, 0 unexpected, 0 adapted, 5 renamed
        matched by structure: module-tree order and shapes (describe(all_pairs=True) lists every pairing)
        reshaped (1, checkpoint vs model shape):
          0.scale: (8,) vs (8, 1, 1)
        renamed (5):
          stem.scale -> 0.scale
          stem.conv.weight -> 0.conv.weight
          stem.conv.bias -> 0.conv.bias
          head.weight -> 1.weight
          head.bias -> 1.bias
    """
    check_type("model", model, nn.Module)
    check_type("match", match, str)
    check_choice("match", match, ("names", "structure"))
    rules = compile_rename(rename)
    prefixes = _prefixes(strip_prefixes)
    patterns = require_patterns(require)
    check_min_loaded(min_loaded)
    check_flags(
        skip_mismatched=skip_mismatched, adapt_input_channels=adapt_input_channels,
        strict=strict, dry_run=dry_run, auto_prefix=auto_prefix,
    )  # fmt: skip
    is_path = isinstance(source, (str, os.PathLike))
    if match == "structure" and is_path and os.fspath(source).lower().endswith(".safetensors"):
        raise ValueError(
            "match='structure' pairs tensors by the order of the module tree, and a "
            ".safetensors file stores its keys sorted by name, so its order says nothing "
            f"about the tree: {os.fspath(source)!r}. Use match='names' (with rename rules), "
            "or pass dict(read_state_dict(path)) as source only if you know that its keys "
            "are in the order of the module tree"
        )

    state = source_state(source, key)
    model_state = model.state_dict(keep_vars=True)
    key_map = map_keys(state, prefixes, rules, model_state)
    stacked: dict[str, list[tuple[str, int, int]]] = {}
    if match == "structure":
        report, updates, stacked = _plan_by_structure(state, model_state, key_map)
    else:
        report, updates = _plan_by_names(
            state, model_state, key_map, auto_prefix, adapt_input_channels
        )
    report.dry_run = dry_run
    # Tied tensors (one Parameter under several names) load through any of their names.
    written = {id(model_state[name]) for name in [*updates, *stacked]}
    for name in model_state:
        if (
            name in updates
            or name in stacked
            or (name not in report.mismatched and id(model_state[name]) in written)
        ):
            report.loaded.append(name)
        elif name not in report.mismatched:
            report.missing.append(name)

    failure = failed_guard(report, model_state, skip_mismatched, strict, patterns, min_loaded)
    if failure is not None:
        raise LoadError(failure, report)
    on_meta = [name for name in [*updates, *stacked] if model_state[name].is_meta]
    if on_meta and not dry_run:
        raise ValueError(
            f"{len(on_meta)} model tensor(s) are on the meta device (first: {on_meta[0]!r}), "
            "which holds no data to copy into; materialise the model first, e.g. "
            "model.to_empty(device='cpu'), then load"
        )
    if not dry_run:
        _copy(updates, model_state, state, set(report.adapted), set(report.reshaped), stacked)
    return report


def _prefixes(strip_prefixes: str | Sequence[str]) -> list[str]:
    """``strip_prefixes`` as a list (a str is one prefix); a TypeError names a bad entry."""
    check_type("strip_prefixes", strip_prefixes, (str, list, tuple))
    prefixes = [strip_prefixes] if isinstance(strip_prefixes, str) else list(strip_prefixes)
    for i, prefix in enumerate(prefixes):
        check_type(f"strip_prefixes[{i}]", prefix, str)
    return prefixes


def _plan_by_names(
    state: dict[str, torch.Tensor],
    model_state: dict[str, torch.Tensor],
    key_map: dict[str, str],
    auto_prefix: bool,
    adapt_input_channels: bool,
) -> tuple[LoadReport, dict[str, str]]:
    """The report (but loaded and missing keys) and ``{model key: checkpoint key}``, by name."""
    found = find_prefix_change(key_map, state, model_state) if auto_prefix else None
    prefix_change = None
    if found is not None:
        prefix_change, key_map = found
    pairs = [
        (new, state[old], model_state[new]) for old, new in key_map.items() if new in model_state
    ]
    stem = input_conv_key(pairs) if adapt_input_channels else None

    report = LoadReport(prefix_change=prefix_change)
    report.renamed = {old: new for old, new in key_map.items() if old != new}
    updates: dict[str, str] = {}  # model key -> checkpoint key
    for old, new in key_map.items():
        if new not in model_state:
            report.unexpected.append(new)
            continue
        value, target = state[old], model_state[new]
        if value.shape == target.shape:
            updates[new] = old
        elif new == stem:
            updates[new] = old
            report.adapted.append(new)
        else:
            report.mismatched[new] = (tuple(value.shape), tuple(target.shape))
    return report, updates


def _plan_by_structure(
    state: dict[str, torch.Tensor],
    model_state: dict[str, torch.Tensor],
    key_map: dict[str, str],
) -> tuple[LoadReport, dict[str, str], dict[str, list[tuple[str, int, int]]]]:
    """`_plan_by_names` by structure, with the stacked pieces of `_copy`."""
    found = match_structure(state, model_state, key_map)
    report = LoadReport(match="structure", reshaped=found.reshaped)
    updates = {new: old for old, new in found.pairs.items()}
    report.renamed = {old: new for old, new in found.pairs.items() if old != new}
    stacked: dict[str, list[tuple[str, int, int]]] = {}
    for new, parts in found.fused.items():
        stacked[new] = [(old, 0, state[old].shape[0]) for old in parts]
        report.fused[new] = list(parts)
    for new, (old, chunk, chunks) in found.split.items():
        rows = model_state[new].shape[0]
        stacked[new] = [(old, chunk * rows, rows)]
        report.split[new] = (old, chunk, chunks)
    used = {*found.pairs, *(old for parts in found.fused.values() for old in parts)}
    used.update(old for old, _, _ in found.split.values())
    used_groups = {found.tied[old] for old in used if old in found.tied}
    for old in state:  # a tied tensor loads through any of its names
        if old not in used and found.tied.get(old) not in used_groups:
            report.unexpected.append(key_map[old])
    return report, updates, stacked


def _copy(
    updates: dict[str, str],
    model_state: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    adapted: set[str],
    reshaped: set[str],
    stacked: dict[str, list[tuple[str, int, int]]],
) -> None:
    """Copy ``state[updates[name]]`` into each ``model_state[name]`` (adapted or reshaped as
    listed), and the rows of ``stacked``: ``{name: [(checkpoint key, first row, rows)]}``
    one after the other along dim 0."""
    with torch.no_grad():
        for name, old in updates.items():
            target, value = model_state[name], state[old]
            if name in adapted:
                value = adapt_input_conv_weight(value, target.shape[1])
            elif name in reshaped:
                value = value.reshape(target.shape)
            target.copy_(value)
        for name, pieces in stacked.items():
            target, row = model_state[name], 0
            for old, start, rows in pieces:
                target.narrow(0, row, rows).copy_(state[old].narrow(0, start, rows))
                row += rows
