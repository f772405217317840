"""torchvision classifiers as backbones (built with ``weights=None``; nothing is downloaded).

Each family names the last module of the model at strides 4, 8, 16 and 32 (so the
MobileNets' and EfficientNet's last stage includes their final 1x1 convolution, as
torchvision's detection models use them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.registries import BACKBONES
from visionblocks.backbones._checkpointing import check_option
from visionblocks.backbones._options import normalize_frozen_stages, normalize_out_indices
from visionblocks.backbones.base import Backbone, backbone_from_model, check_common

__all__ = ["TORCHVISION_STAGES", "torchvision_backbone"]

_RESNET = ("layer1", "layer2", "layer3", "layer4")

TORCHVISION_STAGES: dict[str, tuple[str, ...]] = {
    "resnet18": _RESNET,
    "resnet34": _RESNET,
    "resnet50": _RESNET,
    "resnet101": _RESNET,
    "resnet152": _RESNET,
    "resnext50_32x4d": _RESNET,
    "wide_resnet50_2": _RESNET,
    "mobilenet_v2": ("features.3", "features.6", "features.13", "features.18"),
    "mobilenet_v3_small": ("features.1", "features.3", "features.8", "features.12"),
    "mobilenet_v3_large": ("features.3", "features.6", "features.12", "features.16"),
    "efficientnet_b0": ("features.2", "features.3", "features.5", "features.8"),
    "convnext_tiny": ("features.1", "features.3", "features.5", "features.7"),
}
"""torchvision builder name -> module names ending its four stages (strides 4 to 32)."""

_HEADS = ("fc", "classifier")  # classifier heads, dropped before wrapping (never run)


def torchvision_backbone(
    arch: str,
    *,
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    out_indices: Sequence[int] | None = None,
    in_channels: int = 3,
    frozen_stages: int = 0,
    norm_eval: bool = False,
    grad_checkpointing: bool | Sequence[int] = False,
    **kwargs: Any,
) -> Backbone:
    """Build the torchvision model ``arch`` with ``weights=None`` and make it a backbone.

    The options are those of `visionblocks.backbones.build_backbone`; the measured
    ``feature_info`` follows whatever ``kwargs`` change.

    Args:
        arch: A key of `TORCHVISION_STAGES` (``"resnet50"``, ``"mobilenet_v3_large"``, ...).
        pretrained: As `visionblocks.backbones.build_backbone`.
        out_indices: As `visionblocks.backbones.build_backbone`.
        in_channels: As `visionblocks.backbones.build_backbone`.
        frozen_stages: As `visionblocks.backbones.build_backbone`.
        norm_eval: As `visionblocks.backbones.build_backbone`.
        grad_checkpointing: As `visionblocks.backbones.build_backbone`.
        **kwargs: Passed to the torchvision builder (not ``weights``).

    Returns:
        Backbone: Outputs ``stage{i}`` for ``i`` in ``out_indices``.

    Raises:
        TypeError: ``arch`` is not a string, or an option of the wrong type.
        KeyError: ``arch`` is not in `TORCHVISION_STAGES`.
        ValueError: ``weights`` given (torchvision would download), or an invalid option.

    Examples:
        >>> backbone = torchvision_backbone("mobilenet_v3_small", out_indices=(-1,))
        >>> backbone.feature_info
        [{'name': 'stage3', 'channels': 576, 'stride': 32}]
    """
    check_type("arch", arch, str)
    if arch not in TORCHVISION_STAGES:
        raise KeyError(
            f"arch={arch!r} is not a supported torchvision backbone; choose one of "
            f"{', '.join(TORCHVISION_STAGES)}"
        )
    stages = TORCHVISION_STAGES[arch]
    check_common(pretrained, in_channels, norm_eval)
    check_option(grad_checkpointing)
    normalize_out_indices(out_indices, len(stages), arch)
    normalize_frozen_stages(frozen_stages, len(stages), arch)
    for key in ("weights", "weights_backbone"):
        if kwargs.get(key) is not None:
            raise ValueError(
                f"{key}={kwargs[key]!r} would download weights; visionblocks builds torchvision "
                "models with weights=None. Download the file yourself and pass "
                "pretrained='path/to/file.pth'"
            )
        kwargs.pop(key, None)
    from torchvision import models

    model = getattr(models, arch)(weights=None, **kwargs)
    for head in _HEADS:
        if isinstance(getattr(model, head, None), nn.Module):
            setattr(model, head, nn.Identity())
    return backbone_from_model(
        model,
        stages,
        name=arch,
        pretrained=pretrained,
        out_indices=out_indices,
        in_channels=in_channels,
        frozen_stages=frozen_stages,
        norm_eval=norm_eval,
        grad_checkpointing=grad_checkpointing,
    )


def _factory(arch: str) -> Callable[..., Backbone]:
    """``torchvision_backbone`` with ``arch`` filled in: the builder registered as ``arch``."""
    build = functools.partial(torchvision_backbone, arch)
    build.__name__ = arch  # type: ignore[attr-defined]
    build.__doc__ = (
        f"torchvision ``{arch}`` (``weights=None``) as a backbone, stages ending at "
        f"{', '.join(TORCHVISION_STAGES[arch])}. See `torchvision_backbone`."
    )
    return build


for _arch in TORCHVISION_STAGES:
    BACKBONES.register(_factory(_arch), name=_arch)
