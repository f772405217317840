"""Backbones by name: torchvision classifiers, any timm model, and a tiny test network.

Every backbone is a `Backbone`: its forward returns ``OrderedDict[str, Tensor]`` (``stage0``,
``stage1``, ...) and ``feature_info`` lists each output's name, channels and stride, measured
by a dry run when it is built. Nothing is ever downloaded: ``pretrained`` is a local file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import BACKBONES
from visionblocks.backbones._timm import timm_backbone
from visionblocks.backbones._tv import TORCHVISION_STAGES, torchvision_backbone
from visionblocks.backbones.base import Backbone, backbone_from_model
from visionblocks.backbones.tiny import TinyNet, vb_tiny

__all__ = [
    "TORCHVISION_STAGES",
    "Backbone",
    "TinyNet",
    "backbone_from_model",
    "build_backbone",
    "timm_backbone",
    "torchvision_backbone",
    "vb_tiny",
]
__dir__ = public_dir(__name__, __all__)


def build_backbone(
    name: str,
    *,
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    out_indices: Sequence[int] | None = None,
    in_channels: int = 3,
    frozen_stages: int = 0,
    norm_eval: bool = False,
    grad_checkpointing: bool | Sequence[int] = False,
    **kwargs: Any,
) -> Backbone:
    """Build a backbone by name; its forward returns ``OrderedDict[str, Tensor]``.

    Names: the entries of `visionblocks.registry.BACKBONES` (torchvision families and
    ``vb_tiny``) and ``"timm/<model>"`` for any timm model; ``build_backbone(name, **kw)`` is
    ``BACKBONES.build(name, **kw)``. Every family has four stages at strides 4, 8, 16 and 32
    (timm models: their levels of stride 4 or more); output ``stage{i}`` is stage ``i``.

    Args:
        name: A registered name or ``"timm/<model>"``.
        pretrained: ``None``, or a local checkpoint file (``.pt``, ``.pth``, ``.bin``,
            ``.safetensors``) or state dict of the original model (as published), loaded
            with `visionblocks.weights.load_partial` (report in ``backbone.load_report``).
            Every backbone tensor must load (only ``num_batches_tracked`` may be missing),
            else `visionblocks.weights.LoadError` is raised and nothing is copied; for
            partial loading, call ``load_partial`` yourself. URLs, hub names and ``True``
            raise.
        out_indices: Stages to return, Python-style indices into the stages (``-1`` is the
            last); returned in stage order. Default: the last four stages.
        in_channels: Input channels; pretrained RGB weights of the first convolution are
            adapted (summed for 1 channel, else repeated and scaled by 3 / channels).
        frozen_stages: ``n`` freezes the stem and the first ``n`` stages (their BatchNorms
            kept in eval mode, through ``.train()``); ``0`` (default) nothing.
        norm_eval: Keep every BatchNorm in eval mode during training.
        grad_checkpointing: Activation checkpointing: ``True`` for every stage, or a list of
            stage indices (see `Backbone.set_grad_checkpointing`).
        **kwargs: Passed to the model's builder (torchvision builder, ``timm.create_model``
            or `TinyNet`).

    Returns:
        Backbone: The backbone, with ``feature_info`` (``[{"name", "channels", "stride"}]``)
        and ``load_report`` (`visionblocks.weights.LoadReport` or ``None``).

    Raises:
        KeyError: Unknown name; the message suggests close matches.
        LoadError: ``pretrained`` lacks a backbone tensor or has one of another shape (the
            exception's ``report`` says which).
        ValueError: ``out_indices``, ``frozen_stages`` or ``in_channels`` out of range,
            ``pretrained`` a URL, hub name or ``True``.
        FileNotFoundError: ``pretrained`` is not an existing file.
        TypeError: An option of the wrong type.

    Examples:
        >>> import torch
        >>> backbone = build_backbone("vb_tiny")
        >>> [(f["name"], f["channels"], f["stride"]) for f in backbone.feature_info]
        [('stage0', 16, 4), ('stage1', 32, 8), ('stage2', 64, 16), ('stage3', 128, 32)]
        >>> features = backbone(torch.randn(2, 3, 128, 128))
        >>> {name: tuple(t.shape) for name, t in features.items()}
        {'stage0': (2, 16, 32, 32), 'stage1': (2, 32, 16, 16), 'stage2': (2, 64, 8, 8), 'stage3': (2, 128, 4, 4)}
        >>> build_backbone("vb_tiny", in_channels=1, out_indices=(-1,)).feature_info
        [{'name': 'stage3', 'channels': 128, 'stride': 32}]
        >>> build_backbone("resnet_50")
        Traceback (most recent call last):
        ...
        KeyError: "'resnet_50' is not in the backbones registry. Did you mean: 'resnet50'..."
    """
    check_type("name", name, str)
    options = dict(
        pretrained=pretrained,
        out_indices=out_indices,
        in_channels=in_channels,
        frozen_stages=frozen_stages,
        norm_eval=norm_eval,
    )
    if grad_checkpointing is not False:  # builders registered elsewhere may lack the option
        options["grad_checkpointing"] = grad_checkpointing
    if name == "timm" and "model_name" not in kwargs:  # say how timm models are named
        return timm_backbone("", **options, **kwargs)
    return BACKBONES.get(name)(**options, **kwargs)
