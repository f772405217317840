"""Validation of the options every backbone builder takes (private), so every family reports
the same errors."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_int, check_type
from visionblocks.nn._limits import MAX_CHANNELS
from visionblocks.weights._adapt import adapt_input_conv_weight

__all__ = [
    "check_in_channels",
    "check_names",
    "check_parameters",
    "check_pretrained",
    "check_stage_names",
    "first_conv",
    "normalize_frozen_stages",
    "normalize_out_indices",
    "replace_first_conv",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_HUB_PREFIXES = ("hf-hub:", "hf_hub:", "timm:", "torchvision:", "open-mmlab:")
_HOW = (
    "visionblocks never downloads weights: download the checkpoint yourself (for example "
    "torch.hub.download_url_to_file(url, 'resnet50.pth'), or huggingface_hub.hf_hub_download) "
    "and pass the local file: build_backbone(name, pretrained='resnet50.pth')"
)


def check_pretrained(pretrained: Any) -> str | Mapping[str, Any] | None:
    """``None`` (no weights), a path of an existing file, or a state dict; ``True``, URLs and
    hub names raise ``ValueError``."""
    if pretrained is None or pretrained is False:
        return None
    if pretrained is True:
        raise ValueError(f"pretrained=True asks for a download. {_HOW}")
    if isinstance(pretrained, Mapping):
        return pretrained
    if isinstance(pretrained, (str, os.PathLike)):
        path = os.fspath(pretrained)
        if _SCHEME.match(path) or path.startswith(_HUB_PREFIXES):
            raise ValueError(f"pretrained={path!r} is a URL or hub name. {_HOW}")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"pretrained={path!r} is not an existing file; pretrained must be the path of "
                f"a local checkpoint (.pt, .pth, .bin, .safetensors) or a state dict. {_HOW}"
            )
        return path
    url = getattr(pretrained, "url", None)
    hint = f" (its weights are at {url})" if isinstance(url, str) else ""
    raise TypeError(
        f"pretrained must be None, a local file path or a state dict, got "
        f"{type(pretrained).__name__}{hint}. {_HOW}"
    )


def check_in_channels(in_channels: Any) -> int:
    """``in_channels`` as an int in ``[1, 65536]``."""
    return check_int("in_channels", in_channels, 1, MAX_CHANNELS)


def check_names(name: str, values: object, kind: type) -> tuple:
    """A list or tuple of ``kind`` (``names``: strings, ``positions``: ints)."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of {kind.__name__}, got {type(values).__name__} ({values!r})"
        )
    for i, value in enumerate(values):
        check_type(f"{name}[{i}]", value, kind)
    return tuple(values)


def check_parameters(name: str, values: object) -> list[torch.Tensor]:
    """An iterable of tensors (parameters), as a list."""
    if isinstance(values, (str, bytes, torch.Tensor)) or not isinstance(values, Iterable):
        raise TypeError(
            f"{name} must be an iterable of parameters, got {type(values).__name__} ({values!r})"
        )
    out = list(values)
    for i, value in enumerate(out):
        check_type(f"{name}[{i}]", value, torch.Tensor)
    return out


def normalize_out_indices(out_indices: Any, num_stages: int, what: str) -> tuple[int, ...]:
    """Sorted non-negative stage indices; ``None`` means the last four (or all) stages."""
    if out_indices is None:
        return tuple(range(max(0, num_stages - 4), num_stages))
    if not isinstance(out_indices, (tuple, list)):
        raise TypeError(
            f"out_indices must be a tuple or list of ints, got {type(out_indices).__name__} "
            f"({out_indices!r})"
        )
    if not out_indices:
        raise ValueError("out_indices is empty; name at least one stage")
    for index in out_indices:
        check_type("out_indices entries", index, int)
    return normalize_stage_indices("out_indices", out_indices, num_stages, what)


def normalize_stage_indices(
    arg: str, indices: Sequence[int], num_stages: int, what: str
) -> tuple[int, ...]:
    """Stage indices (negative ones count from the end) as sorted non-negative ones."""
    normalized = []
    for index in indices:
        if not -num_stages <= index < num_stages:
            raise ValueError(
                f"{arg}={tuple(indices)!r}: index {index} is out of range for {what}, which "
                f"has {num_stages} stages (valid indices: {-num_stages} to {num_stages - 1}; "
                "negative ones count from the end)"
            )
        normalized.append(index % num_stages)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{arg}={tuple(indices)!r} names a stage twice (normalized: {normalized})")
    return tuple(sorted(normalized))


def normalize_frozen_stages(frozen_stages: Any, num_stages: int, what: str) -> int:
    """``frozen_stages`` checked against the number of stages."""
    check_type("frozen_stages", frozen_stages, int)
    if not 0 <= frozen_stages <= num_stages:
        raise ValueError(
            f"frozen_stages must be in [0, {num_stages}] for {what} (0 freezes nothing, n "
            f"freezes the stem and the first n stages), got {frozen_stages}"
        )
    return frozen_stages


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The module holding the model's first 4-D weight in state-dict order, if a Conv2d."""
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name.endswith("weight") and tensor.dim() == 4 and tensor.is_floating_point():
            module = model.get_submodule(name.rpartition(".")[0])
            return (name.rpartition(".")[0], module) if isinstance(module, nn.Conv2d) else None
    return None


def replace_first_conv(model: nn.Module, in_channels: int) -> None:
    """Give ``model``'s first convolution (`first_conv`) ``in_channels`` inputs, in place,
    its weight adapted as pretrained weights are."""
    found = first_conv(model)
    if found is None:
        raise ValueError(
            f"in_channels={in_channels}: cannot find the first nn.Conv2d of "
            f"{type(model).__name__} to replace"
        )
    name, conv = found
    if conv.in_channels == in_channels:
        return
    if conv.groups != 1:
        raise ValueError(f"in_channels: the first convolution {name!r} is grouped ({conv})")
    new = nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        new.weight.copy_(adapt_input_conv_weight(conv.weight, in_channels))
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    model.set_submodule(name, new)


def check_stage_names(stages: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple of distinct module names."""
    if isinstance(stages, str) or not isinstance(stages, (tuple, list)) or not stages:
        raise TypeError(f"stages must be a non-empty list of module names, got {stages!r}")
    for i, stage in enumerate(stages):
        check_type(f"stages[{i}]", stage, str)
    if len(set(stages)) != len(stages):
        raise ValueError(f"stages name a module twice: {list(stages)}")
    return tuple(stages)
