"""Any timm model as a backbone: ``build_backbone("timm/<name>")`` (nothing is downloaded;
``"timm/<name>"`` is a namespace of `visionblocks.registry.BACKBONES`)."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.registries import BACKBONES
from visionblocks.backbones import _checkpointing as ckpt
from visionblocks.backbones._options import (
    normalize_frozen_stages,
    normalize_out_indices,
)
from visionblocks.backbones._pretrained import load_pretrained
from visionblocks.backbones.base import (
    DRY_RUN_SIZE,
    Backbone,
    check_common,
    stage_name,
)
from visionblocks.features import feature_info
from visionblocks.weights import read_state_dict
from visionblocks.weights._io import unwrap_state_dict

__all__ = ["TIMM_PREFIX", "check_model_name", "timm_backbone"]

TIMM_PREFIX = "timm/"
"""``build_backbone`` names starting with this are timm model names."""

_RESERVED = ("features_only", "pretrained", "out_indices", "in_chans")


def check_model_name(model_name: Any, *, prefix: str = "") -> str:
    """Return ``model_name`` if it is a timm model, else raise (close matches suggested,
    with the caller's ``prefix``)."""
    check_type("model_name", model_name, str)
    if not model_name:
        raise ValueError(
            "timm backbones are named 'timm/<model>' (build_backbone('timm/resnet50')) or "
            "built as BACKBONES.build({'type': 'timm', 'model_name': 'resnet50'})"
        )
    if ":" in model_name or "/" in model_name:
        raise ValueError(
            f"timm model name {model_name!r} looks like a hub name; visionblocks never "
            "downloads. Use a plain timm architecture name (timm/resnet50) and pass weights "
            "as a local file: pretrained='path/to/model.safetensors'"
        )
    import timm

    if not timm.is_model(model_name):
        close = [prefix + c for c in _close_timm_names(model_name)]
        hint = f" Did you mean: {', '.join(repr(c) for c in close)}?" if close else ""
        if not prefix:
            raise KeyError(
                f"model_name={model_name!r} is not a timm model.{hint} (see timm.list_models())"
            )
        raise KeyError(
            f"{prefix + model_name!r} is not a backbone: {model_name!r} is not a timm model."
            f"{hint} ('{prefix}<name>' takes any name in timm.list_models())"
        )
    return model_name


def _close_timm_names(name: str) -> list[str]:
    import timm

    return difflib.get_close_matches(name.lower(), timm.list_models(), n=3, cutoff=0.6)


def _resolve_timm_name(model_name: str) -> Callable[..., Backbone]:
    """The ``BACKBONES`` builder of ``"timm/<model_name>"`` (the ``timm/`` namespace)."""
    check_model_name(model_name, prefix=TIMM_PREFIX)
    return functools.partial(timm_backbone, model_name)


def _suggest_timm_names(name: str) -> list[str]:
    """``'timm/<name>'`` forms of the timm models close to ``name`` (exactly it when one is)."""
    if not name or ":" in name or "/" in name:
        return []
    import timm

    if timm.is_model(name):
        return [TIMM_PREFIX + name]
    return [TIMM_PREFIX + c for c in _close_timm_names(name)]


def _dry_run_size(
    model: nn.Module, in_channels: int, kwargs: dict[str, Any]
) -> tuple[int, int, int]:
    """Input size of the dry runs: the model's own size for fixed-size models (``img_size=``
    when given, else the pretrained config's), else a small one."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if not cfg.get("fixed_input_size"):
        return (in_channels, DRY_RUN_SIZE, DRY_RUN_SIZE)
    size = kwargs.get("img_size", cfg.get("input_size"))
    if isinstance(size, int):
        size = (size, size)
    return (in_channels, int(size[-2]), int(size[-1]))


def _is_nhwc(model: nn.Module) -> bool:
    """timm feature models of channels-last families (Swin) return ``(B, H, W, C)``."""
    return str(getattr(model, "output_fmt", "NCHW")).endswith("NHWC")


def _upstream_names(model: nn.Module, size: Sequence[int], positions: Sequence[int]) -> set[str]:
    """Names of the trainable parameters that the outputs at ``positions`` depend on."""
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.enable_grad():
            out = model(torch.zeros(1, *size))
            total = sum(out[p].float().sum() for p in positions)
            grads = torch.autograd.grad(total, list(trainable.values()), allow_unused=True)
    finally:
        for module, mode in modes:
            module.training = mode
    return {name for name, grad in zip(trainable, grads) if grad is not None}


def _rename_rules(model_keys: Iterable[str], ckpt_keys: Iterable[str]) -> list[tuple[str, str]]:
    """Rules mapping a timm checkpoint's keys to its ``features_only`` model's (``model.``
    prefixes, ``stages.0.`` flattened to ``stages_0.``)."""
    model_keys = set(model_keys)
    ckpt_keys = [k[len("module.") :] if k.startswith("module.") else k for k in ckpt_keys]
    rules: dict[str, str] = {}
    if all(k.startswith("model.") for k in model_keys) and not any(
        k.startswith("model.") for k in ckpt_keys
    ):
        rules["^"] = "model."
    for key in ckpt_keys:
        head, _, rest = key.partition(".")
        sub, dot, tail = rest.partition(".")
        if key not in model_keys and dot and f"{head}_{sub}.{tail}" in model_keys:
            rules[rf"^{re.escape(head)}\.{re.escape(sub)}\."] = f"{head}_{sub}."
    return list(rules.items())


def _state_dict(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, torch.Tensor]:
    if isinstance(source, Mapping):
        return unwrap_state_dict(source)[0]
    return read_state_dict(source)


def _levels(model: nn.Module, size: Sequence[int], nhwc: bool) -> list[dict[str, Any]]:
    """Channels and strides of every level of a timm feature model (a dry run)."""
    if not nhwc:
        return feature_info(model, size)
    probe = Backbone(model, [str(i) for i in range(len(model.feature_info.out_indices))],
                     input_size=size, channels_last_outputs=True)  # fmt: skip
    return probe.feature_info


@BACKBONES.register(name="timm")
def timm_backbone(
    model_name: str,
    *,
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    out_indices: Sequence[int] | None = None,
    in_channels: int = 3,
    frozen_stages: int = 0,
    norm_eval: bool = False,
    grad_checkpointing: bool | Sequence[int] = False,
    **kwargs: Any,
) -> Backbone:
    """The timm model ``model_name`` (``features_only=True``, no download) as a backbone.

    Registered as ``"timm"``; ``"timm/<model_name>"`` calls it too. Stages are the model's
    feature levels with a measured stride of at least 4 (all levels if none has);
    channels-last models (Swin) return ``(B, C, H, W)`` too. Parameters the selected stages
    do not depend on are frozen (no unused parameters for DDP). ``pretrained`` may be a
    checkpoint of the full timm model: its keys are mapped to the ``features_only`` model's.

    Args:
        model_name: A timm architecture (``timm.list_models()``), optionally with a
            pretrained tag (``"resnet50.a1_in1k"``, only the config is used).
        pretrained: As `visionblocks.backbones.build_backbone`.
        out_indices: As `visionblocks.backbones.build_backbone`.
        in_channels: Input channels (timm's ``in_chans``).
        frozen_stages: As `visionblocks.backbones.build_backbone`.
        norm_eval: As `visionblocks.backbones.build_backbone`.
        grad_checkpointing: As `visionblocks.backbones.build_backbone`.
        **kwargs: Passed to ``timm.create_model``, except ``features_only``,
            ``pretrained``, ``out_indices``, ``in_chans``.

    Returns:
        Backbone: Outputs ``stage{i}`` for ``i`` in ``out_indices``.

    Raises:
        KeyError: Unknown timm model (with close matches).
        TypeError: A reserved timm argument in ``kwargs``.
        ValueError: A hub name (``hf-hub:...``) or an invalid option.

    Examples:
        >>> backbone = timm_backbone("resnet18", out_indices=(-2, -1))
        >>> [(f["name"], f["channels"], f["stride"]) for f in backbone.feature_info]
        [('stage2', 256, 16), ('stage3', 512, 32)]
    """
    check_model_name(model_name)
    check_common(pretrained, in_channels, norm_eval)
    ckpt.check_option(grad_checkpointing)
    reserved = sorted(set(kwargs) & set(_RESERVED))
    if reserved:
        raise TypeError(
            f"timm_backbone sets {', '.join(reserved)} itself; use pretrained=, "
            "out_indices= and in_channels= instead"
        )
    check_type("frozen_stages", frozen_stages, int)
    import timm

    what = f"{TIMM_PREFIX}{model_name}"
    options = dict(features_only=True, pretrained=False, in_chans=in_channels, **kwargs)
    probe = timm.create_model(model_name, **options)
    size = _dry_run_size(probe, in_channels, kwargs)
    nhwc = _is_nhwc(probe)
    levels = _levels(probe, size, nhwc)
    kept = [i for i, level in enumerate(levels) if level["stride"] >= 4]
    kept = kept or list(range(len(levels)))
    indices = normalize_out_indices(out_indices, len(kept), what)
    frozen_stages = normalize_frozen_stages(frozen_stages, len(kept), what)
    frozen = _upstream_names(probe, size, [kept[frozen_stages - 1]]) if frozen_stages else set()
    selected = [kept[i] for i in indices]
    if selected[-1] == len(levels) - 1:
        model, positions = probe, selected
    else:  # drop the unused tail
        timm_indices = tuple(probe.feature_info.out_indices[p] for p in selected)
        model = timm.create_model(model_name, out_indices=timm_indices, **options)
        positions = list(range(len(selected)))
    # Some feature models (timm's EfficientNet family) still run blocks after the last
    # selected level: their parameters get no gradient, so they are frozen.
    used = _upstream_names(model, size, positions)
    unused = [p for n, p in model.named_parameters() if p.requires_grad and n not in used]
    backbone = Backbone(
        model,
        [stage_name(i) for i in indices],
        input_size=size,
        positions=positions,
        frozen_parameters=[p for n, p in model.named_parameters() if n in frozen],
        norm_eval=norm_eval,
        out_indices=indices,
        num_stages=len(kept),
        channels_last_outputs=nhwc,
    )
    for p in unused:
        p.requires_grad_(False)
    backbone.frozen_stages = frozen_stages
    info = probe.feature_info
    names = ckpt.timm_level_names(model, [info.info[i]["module"] for i in info.out_indices])
    ordered = (nn.Sequential, nn.ModuleDict)  # timm's feature wrappers run their items in order
    backbone._stage_blocks = ckpt.stage_blocks(model, names, kept[: indices[-1] + 1], ordered)
    ckpt.configure(backbone, grad_checkpointing)
    if pretrained is not None and pretrained is not False:
        state = _state_dict(pretrained)
        rules = _rename_rules(backbone.state_dict().keys(), state.keys())
        backbone.load_report = load_pretrained(backbone, state, what, rename=rules)
    return backbone


BACKBONES.add_namespace(TIMM_PREFIX, _resolve_timm_name, suggest=_suggest_timm_names)
