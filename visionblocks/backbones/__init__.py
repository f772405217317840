"""Backbones by name: torchvision classifiers, any timm model, and a tiny test network.

`build_backbone` builds a registered backbone (`visionblocks.registry.BACKBONES`) or, for
names starting with ``timm/``, any timm model (a namespace of ``BACKBONES``, so
``BACKBONES.build`` and model configs take ``"timm/<model>"`` too). Every backbone is a `Backbone`: its forward
returns ``OrderedDict[str, Tensor]`` (``stage0``, ``stage1``, ...) and ``feature_info`` lists
each output's name, channels and stride, measured by a dry run when it is built. Nothing is
ever downloaded: ``pretrained`` is a local file.
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

    Names: the entries of `visionblocks.registry.BACKBONES` (``BACKBONES.list()``: the
    torchvision ResNets, ResNeXt-50 32x4d, Wide ResNet-50-2, MobileNetV2/V3, EfficientNet-B0,
    ConvNeXt-Tiny, and ``vb_tiny``), plus ``"timm/<model>"`` for any timm model
    (``"timm/resnet50"``, ``"timm/convnext_nano"``). Every family has four stages at strides
    4, 8, 16 and 32 (timm models: their levels of stride 4 or more); output ``stage{i}`` is
    stage ``i``.

    ``build_backbone(name, **kw)`` is ``BACKBONES.build(name, **kw)``: a config's
    ``{"type": "timm/resnet18"}`` builds the same backbone.

    Args:
        name: A registered name or ``"timm/<model>"``.
        pretrained: ``None``, or a local checkpoint file (``.pt``, ``.pth``, ``.bin``,
            ``.safetensors``) or state dict of the original model (a torchvision or timm
            checkpoint as published), loaded with `visionblocks.weights.load_partial`; the
            report is kept as ``backbone.load_report`` (the classifier head shows as
            unexpected). Every backbone tensor must load (only ``num_batches_tracked`` may
            be missing), else `visionblocks.weights.LoadError` is raised and nothing is
            copied: a checkpoint of another architecture never "loads" silently. For partial
            loading, build without ``pretrained`` and call ``load_partial`` yourself. URLs,
            hub names and ``True`` raise: nothing is ever downloaded.
        out_indices: Stages to return, Python-style indices into the stages (``-1`` is the
            last); returned in stage order. Default: the last four stages.
        in_channels: Input channels. Other than 3, the first convolution gets that many
            inputs, and pretrained RGB weights are adapted (summed for 1 channel, so a grey
            image gives what its RGB copy gives; else repeated and scaled by 3 / channels).
        frozen_stages: ``0`` (default) freezes nothing; ``n`` freezes the stem and the first
            ``n`` stages (``requires_grad=False``, their BatchNorms kept in eval mode).
        norm_eval: Keep every BatchNorm in eval mode during training (running statistics
            frozen). Both options survive ``.train()``.
        grad_checkpointing: Activation checkpointing: ``True`` for every stage, or a list of
            stage indices. Each block of those stages keeps only its input in the forward
            and recomputes its activations in the backward: less memory, about one more
            forward of time (see `Backbone.set_grad_checkpointing`; frozen stages are
            skipped).
        **kwargs: Passed to the model's builder (torchvision builder, ``timm.create_model``
            or `TinyNet`).

    Returns:
        Backbone: The backbone, with ``feature_info`` (``[{"name", "channels", "stride"}]``)
        and ``load_report`` (`visionblocks.weights.LoadReport` or ``None``).

    Raises:
        KeyError: Unknown name; the message suggests close matches (``'timm/<model>'`` for
            a timm model name given without ``timm/``).
        LoadError: ``pretrained`` lacks a backbone tensor or has one of another shape (the
            exception's ``report`` says which).
        ValueError: ``out_indices`` out of range or repeated, ``frozen_stages`` out of range,
            ``in_channels`` outside ``[1, 65536]``, ``pretrained`` a URL, hub name or
            ``True``. The backbone's ``forward`` raises ``ValueError``/``TypeError`` for an
            input that is not a floating-point ``(B, in_channels, H, W)`` tensor on its device.
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
        >>> build_backbone("vb_tiny", pretrained="https://example.com/tiny.pth")
        Traceback (most recent call last):
        ...
        ValueError: pretrained='https://example.com/tiny.pth' is a URL or hub name. ...
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
