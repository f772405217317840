"""Key renaming and first-conv channel adaptation (private; see `visionblocks.weights`)."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Sequence

import torch

__all__ = [
    "adapt_input_conv_weight",
    "compile_rename",
    "differs_in_input_channels",
    "input_conv_key",
    "map_keys",
]


def compile_rename(
    rename: Sequence[tuple[str, str]] | None,
) -> list[tuple[re.Pattern[str], str]]:
    """Validate ``rename`` and compile its patterns (a bad one raises naming it)."""
    if rename is None:
        return []
    if isinstance(rename, (str, bytes)) or not isinstance(rename, Iterable):
        raise TypeError(
            f"rename must be a list of (regex, replacement) pairs, got {type(rename).__name__}"
        )
    compiled = []
    for i, rule in enumerate(rename):
        if not (
            isinstance(rule, (tuple, list))
            and len(rule) == 2
            and all(isinstance(part, str) for part in rule)
        ):
            raise TypeError(f"rename[{i}] must be a (regex, replacement) pair of str, got {rule!r}")
        try:
            compiled.append((re.compile(rule[0]), rule[1]))
        except re.error as exc:
            raise ValueError(f"rename[{i}] has an invalid regex {rule[0]!r}: {exc}") from None
    return compiled


def map_keys(
    keys: Iterable[str],
    strip_prefixes: Sequence[str],
    rules: Sequence[tuple[re.Pattern[str], str]],
    model_keys: Container[str] = (),
) -> dict[str, str]:
    """``{checkpoint key: model key}``: strip prefixes (in order), then apply the rules.

    A prefix is not stripped from a key that already is a model key, so a model wrapped in
    ``DistributedDataParallel`` (keys ``module.*``) loads its own checkpoint.

    Raises:
        ValueError: If two checkpoint keys end up with the same name.
    """
    mapping: dict[str, str] = {}
    owner: dict[str, str] = {}
    for key in keys:
        new = key
        for prefix in strip_prefixes:
            if prefix and new.startswith(prefix) and new not in model_keys:
                new = new[len(prefix) :]
        for pattern, replacement in rules:
            new = pattern.sub(replacement, new)
        if new in owner:
            raise ValueError(
                f"checkpoint keys {owner[new]!r} and {key!r} both become {new!r} after "
                "prefix stripping and renaming; make the rename rules tell them apart"
            )
        owner[new] = key
        mapping[key] = new
    return mapping


def differs_in_input_channels(value: torch.Tensor, target: torch.Tensor) -> bool:
    """Two conv weights ``(O, I, kh, kw)`` that differ in ``I`` only."""
    return (
        value.dim() == 4
        and target.dim() == 4
        and target.is_floating_point()
        and value.shape[1] != target.shape[1]
        and value.shape[0] == target.shape[0]
        and value.shape[2:] == target.shape[2:]
    )


def input_conv_key(
    pairs: Iterable[tuple[str, torch.Tensor, torch.Tensor]],
) -> str | None:
    """The stem convolution to adapt: the first ``*weight`` of the ``(model key, checkpoint
    tensor, model tensor)`` pairs that differ in input channels only."""
    for name, value, target in pairs:
        if name.endswith("weight") and differs_in_input_channels(value, target):
            return name
    return None


def adapt_input_conv_weight(weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """A ``(O, I, kh, kw)`` conv weight for ``in_channels`` inputs (`load_partial`'s rule): the
    sum over channels for one, else channels repeated cyclically times ``I / in_channels``;
    in float32 at least (the caller casts)."""
    source = weight.to(torch.promote_types(weight.dtype, torch.float32))
    channels = source.shape[1]
    if in_channels == 1:
        return source.sum(dim=1, keepdim=True)
    index = torch.arange(in_channels, device=source.device) % channels
    return source.index_select(1, index) * (channels / in_channels)
