"""`load_partial`: copy the tensors of a checkpoint that fit a model (see `visionblocks.weights`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.weights._adapt import compile_rename, input_conv_key, map_keys
from visionblocks.weights._guards import (
    check_flags,
    check_min_loaded,
    failed_guard,
    require_patterns,
)
from visionblocks.weights._io import source_state
from visionblocks.weights._pages import copy_tensors
from visionblocks.weights._prefix import find_prefix_change
from visionblocks.weights.report import LoadError, LoadReport

__all__ = ["load_partial"]
__dir__ = public_dir(__name__, __all__)


def load_partial(
    model: nn.Module,
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    rename: Sequence[tuple[str, str]] | None = None,
    strip_prefixes: Sequence[str] = ("module.",),
    skip_mismatched: bool = True,
    adapt_input_channels: bool = True,
    strict: bool = False,
    dry_run: bool = False,
    require: str | Sequence[str] | None = None,
    min_loaded: float | None = None,
    auto_prefix: bool = True,
) -> LoadReport:
    """Copy the tensors of a checkpoint that fit ``model`` into it, and report the rest.

    Checkpoint keys are mapped to model keys in two steps: each prefix of ``strip_prefixes``
    is removed, in order, from every key that starts with it (unless the key already is a
    model key: a model wrapped in ``DistributedDataParallel`` loads its own ``module.*``
    checkpoint); then each ``(regex, replacement)`` pair of ``rename`` is applied, in order,
    with ``re.sub``. Tied parameters (one tensor under several names) load through any of
    their names. A tensor whose shape matches the model's is copied into the existing
    parameter or buffer (under ``torch.no_grad()``, cast to its dtype and device; parameters
    are never replaced).

    Automatic prefix (``auto_prefix=True``): when keys still do not fit after those steps,
    every dotted prefix of the keys that are not model keys is tried, removed from them
    (Lightning's ``model.``, ``module.``, ``backbone.``, ``encoder.``, ``student.``...) or
    added to them (a bare backbone's checkpoint loaded into a model whose keys are
    ``backbone.*``). The change that makes the most keys load (same name and shape) is
    applied, only if it makes more keys load than none does; ties go to removing, then to
    the shorter prefix. It is reported in ``LoadReport.prefix_change`` and ``renamed``.

    Input-channel adaptation (``adapt_input_channels``): the first convolution weight
    ``(O, I, kh, kw)`` (in state-dict order) whose checkpoint tensor differs from it only in
    ``I`` - the stem, the one convolution that sees the image - is adapted instead of
    skipped. For ``I == 1`` the checkpoint's channels are summed, so a grey image
    gives exactly the output that its RGB copy (the grey channel repeated) gives with the
    original weights. For any other ``I`` the channels are repeated cyclically (R, G, B, R, ...)
    and scaled by ``3 / I`` (in general: checkpoint channels / ``I``).

    Guards, all checked before anything is copied (a failure raises `LoadError` with the
    report, and the model is left unchanged):

    * ``skip_mismatched=False``: any shape mismatch fails.
    * ``strict=True``: any missing, unexpected or mismatched key fails.
    * ``require``: fnmatch patterns (``*`` also matches dots) on *model* keys; every model
      key matched by a pattern must be loaded. A pattern that matches no model key is an
      error too (`ValueError`), so a typo cannot pass silently.
    * ``min_loaded``: at least this fraction (0..1) of the model's keys must be loaded.
      By default (None) at least one key must load when the model has any: a checkpoint
      that fits nothing is an error, not an empty report. ``min_loaded=0`` accepts it.

    Memory and speed: a zip-format torch file given as a path is memory-mapped (a plain
    state dict or training checkpoint is unpickled by pickle's C unpickler restricted to
    three names, `visionblocks.weights._zipmap`; anything else by ``torch.load``); on Linux
    each tensor is read from the file straight into the model's (``os.preadv``, no page
    faults), and one that must be converted is copied from the mapping, whose pages are then
    handed back to the OS (``madvise``), so the peak extra memory is about the largest
    converted tensor rather than the file (tensors that are not loaded are never read). With
    the file in the page cache this is 3 to 9 times faster than
    ``model.load_state_dict(torch.load(path, weights_only=True, mmap=True))`` (ViT-L/16 and
    ResNet-50, ``benchmarks/cases/weights.py``).

    Args:
        model: The module to load into.
        source: A checkpoint path (read with `read_state_dict`'s rules) or a state dict
            (training-checkpoint containers are unwrapped and non-tensors dropped).
        rename: ``(regex, replacement)`` pairs applied in order with ``re.sub``.
        strip_prefixes: Prefixes removed, in order, from the keys that start with them.
        skip_mismatched: Skip (and report) tensors whose shape differs; False raises instead.
        adapt_input_channels: Adapt the first convolution to the model's input channels.
        strict: Fail unless every model key loads and no checkpoint key is left over.
        dry_run: Compute the report (and run the guards) without copying anything.
        require: fnmatch pattern(s) of model keys that must all load.
        min_loaded: Smallest acceptable fraction of loaded model keys, in ``[0, 1]``;
            None (default) requires at least one loaded key, 0 accepts loading nothing.
        auto_prefix: Find a key prefix to remove or add when that makes more keys load.

    Returns:
        LoadReport: Loaded, missing, unexpected, mismatched, adapted and renamed keys.

    Raises:
        LoadError: A guard failed, including loading nothing with the default
            ``min_loaded`` (a `RuntimeError`; ``.report`` has the report).
        ValueError: Two checkpoint keys map to one name, a ``rename`` regex is invalid, a
            ``require`` pattern matches no model key, ``min_loaded`` is outside ``[0, 1]``,
            the file cannot be read safely, or tensors to load into are on the meta device.
        FileNotFoundError: ``source`` is a path that does not exist.
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
        >>> load_partial(model, pretrained.state_dict(), require="2.*")
        Traceback (most recent call last):
        ...
        visionblocks.weights.report.LoadError: 2 required key(s) not loaded: 2.weight (mismatched), ...
    """
    check_type("model", model, nn.Module)
    rules = compile_rename(rename)
    check_type("strip_prefixes", strip_prefixes, (str, list, tuple))
    prefixes = [strip_prefixes] if isinstance(strip_prefixes, str) else list(strip_prefixes)
    for p in prefixes:
        check_type("strip_prefixes entry", p, str)
    patterns = require_patterns(require)
    check_min_loaded(min_loaded)
    check_flags(
        skip_mismatched=skip_mismatched, adapt_input_channels=adapt_input_channels,
        strict=strict, dry_run=dry_run, auto_prefix=auto_prefix,
    )  # fmt: skip

    state, pages = source_state(source)
    try:
        model_state = model.state_dict(keep_vars=True)
        key_map = map_keys(state, prefixes, rules, model_state)
        found = find_prefix_change(key_map, state, model_state) if auto_prefix else None
        if found is not None:
            prefix_change, key_map = found
        else:
            prefix_change = None
        pairs = [
            (new, state[old], model_state[new])
            for old, new in key_map.items()
            if new in model_state
        ]
        stem = input_conv_key(pairs) if adapt_input_channels else None

        report = LoadReport(prefix_change=prefix_change, dry_run=dry_run)
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
        # Tied tensors (one Parameter under several names) load through any of their names.
        written = {id(model_state[name]) for name in updates}
        for name in model_state:
            if name in updates or (
                name not in report.mismatched and id(model_state[name]) in written
            ):
                report.loaded.append(name)
            elif name not in report.mismatched:
                report.missing.append(name)

        failure = failed_guard(report, model_state, skip_mismatched, strict, patterns, min_loaded)
        if failure is not None:
            raise LoadError(failure, report)
        on_meta = [name for name in updates if model_state[name].is_meta]
        if on_meta and not dry_run:
            raise ValueError(
                f"{len(on_meta)} model tensor(s) are on the meta device (first: {on_meta[0]!r}), "
                "which holds no data to copy into; materialise the model first, e.g. "
                "model.to_empty(device='cpu'), then load"
            )
        if not dry_run:
            copy_tensors(updates, model_state, state, set(report.adapted), pages)
    finally:
        if pages is not None:  # its file, open when the fast reader mapped it
            pages.close()
    return report
