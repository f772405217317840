"""The shared part of `Detector` and `Segmenter` (private): backbone, neck and head from
config entries, and the pixel statistics a model normalises its images with."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.config_keys import config_key
from visionblocks._core.registries import BACKBONES, HEADS, NECKS

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ComposedModel", "build_parts", "input_channels"]

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def input_channels(backbone: nn.Module) -> int | None:
    """The channels a backbone takes: its ``in_channels``, else its first ``nn.Conv2d``'s."""
    channels = getattr(backbone, "in_channels", None)
    if isinstance(channels, int):
        return channels
    conv = next((m for m in backbone.modules() if isinstance(m, nn.Conv2d)), None)
    return None if conv is None else conv.in_channels


def _pixel_stats(name: str, values: Any, positive: bool) -> list[float]:
    """A non-empty list of finite numbers (positive ones for a standard deviation)."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(
                f"{name} must be 1-D (one value per channel), got {tuple(values.shape)}"
            )
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(
            f"{name} must be a list of numbers (one per image channel, 0-255 units), got "
            f"{type(values).__name__}"
        )
    if not values:
        raise ValueError(f"{name} is empty; give one value per image channel")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}[{i}] must be a number, got {type(v).__name__} ({v!r})")
        if not math.isfinite(v) or (positive and v <= 0):
            what = "positive and finite (images are divided by it)" if positive else "finite"
            raise ValueError(f"{name}[{i}] must be {what}, got {v!r} in {name}={list(values)}")
    return [float(v) for v in values]


class ComposedModel(nn.Module):
    """Backbone, neck and head, with the pixel statistics the model normalises with (the
    shared part of `visionblocks.models.Detector` and `visionblocks.models.Segmenter`;
    ``head_methods`` names what the head must provide besides ``forward``)."""

    head_methods: tuple[str, ...] = ()

    def __init__(
        self,
        backbone: nn.Module,
        neck: nn.Module,
        head: nn.Module,
        *,
        pixel_mean: Sequence[float] = IMAGENET_MEAN,
        pixel_std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        for name, part in (("backbone", backbone), ("neck", neck), ("head", head)):
            check_type(name, part, nn.Module)
        for method in self.head_methods:
            if not callable(getattr(head, method, None)):
                raise TypeError(f"head must have a {method}() method, got {type(head).__name__}")
        mean = _pixel_stats("pixel_mean", pixel_mean, positive=False)
        std = _pixel_stats("pixel_std", pixel_std, positive=True)
        channels = input_channels(backbone)
        expected = len(mean) if channels is None else channels
        if len(mean) != expected or len(std) != expected:
            raise ValueError(
                f"pixel_mean and pixel_std must have one value per image channel "
                f"({expected}, the backbone's input channels), got {len(mean)} and {len(std)}"
            )
        self.backbone, self.neck, self.head = backbone, neck, head
        self.register_buffer("pixel_mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("pixel_std", torch.tensor(std, dtype=torch.float32))


def _part(registry: Any, cfg: Any, what: str, **defaults: Any) -> nn.Module:
    if isinstance(cfg, nn.Module):
        return cfg
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(
            f"{what} must be a module, a registered name or a dict with 'type', got {cfg!r}"
        )
    options = {**defaults, **{k: v for k, v in cfg.items() if k != "type"}}
    with config_key(what):  # errors name the keys by their path: head.num_classes
        return registry.build(cfg["type"], **options)


def build_parts(
    cfg: Mapping[str, Any] | None, entries: Mapping[str, Any]
) -> tuple[nn.Module, nn.Module, nn.Module, dict[str, Any]]:
    """Backbone, neck and head from config entries (see `visionblocks.models.build_detector`),
    and the other model options."""
    if cfg is not None:
        check_type("cfg", cfg, Mapping)
    cfg = {**(cfg or {}), **entries}
    unknown = set(cfg) - {"backbone", "neck", "head", "pixel_mean", "pixel_std"}
    if unknown or not {"backbone", "neck", "head"} <= set(cfg):
        raise ValueError(
            "cfg needs 'backbone', 'neck' and 'head' (optional: 'pixel_mean', 'pixel_std'); "
            f"got keys {sorted(cfg)}"
        )
    cfg = {k: v if isinstance(v, nn.Module) else copy.deepcopy(v) for k, v in cfg.items()}
    backbone = _part(BACKBONES, cfg["backbone"], "backbone")
    info = _feature_info(backbone, "backbone")
    _check_levels_agree(cfg, backbone, [f["stride"] for f in info])
    neck = _part(
        NECKS, cfg["neck"], "neck",
        in_channels=[f["channels"] for f in info], strides=[f["stride"] for f in info],
    )  # fmt: skip
    levels = getattr(neck, "feature_info", info)
    head = _part(
        HEADS, cfg["head"], "head",
        in_channels=levels[0]["channels"], strides=[f["stride"] for f in levels],
    )  # fmt: skip
    extras = {k: cfg[k] for k in ("pixel_mean", "pixel_std") if k in cfg}
    return backbone, neck, head, extras


def _check_levels_agree(cfg: Mapping[str, Any], backbone: nn.Module, strides: list[int]) -> None:
    """The config's ``backbone.out_indices`` finest first, its ``neck.strides`` the backbone's:
    a backbone returns its levels sorted and a neck cannot see absolute strides, so either
    disagreement would place every box at the wrong scale without an error."""
    indices = cfg["backbone"].get("out_indices") if isinstance(cfg["backbone"], Mapping) else None
    stages = getattr(backbone, "num_stages", None)
    if isinstance(indices, (list, tuple)) and isinstance(stages, int):
        order = [i % stages for i in indices if isinstance(i, int)]
        if order != sorted(order):
            raise ValueError(
                f"backbone.out_indices must list the stages finest first (increasing), got "
                f"{list(indices)}: the backbone returns them as {sorted(order)}"
            )
    given = cfg["neck"].get("strides") if isinstance(cfg["neck"], Mapping) else None
    if given is not None and list(given) != strides:
        raise ValueError(
            f"neck.strides must be the backbone's strides {strides} (its feature_info), got "
            f"{given!r}; leave them out to take the backbone's"
        )


def _feature_info(backbone: nn.Module, what: str) -> list[dict[str, Any]]:
    info = getattr(backbone, "feature_info", None)
    if not isinstance(info, list) or not info:
        raise TypeError(
            f"{what} must have a feature_info list ([{{'channels', 'stride'}}, ...]) to size the "
            f"neck, as visionblocks backbones do; got {type(backbone).__name__}"
        )
    return info
