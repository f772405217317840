"""``vb_tiny``: a small, fast CNN built only from visionblocks blocks, for tests and demos."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from visionblocks._core.checks import check_positive_ints
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import BACKBONES
from visionblocks.backbones.base import Backbone, backbone_from_model
from visionblocks.nn._limits import MAX_CHANNELS, MAX_REPEATS
from visionblocks.nn.conv import ConvNormAct, DepthwiseSeparableConv2d
from visionblocks.nn.layers import ActSpec, NormSpec

__all__ = ["TinyNet", "vb_tiny"]
__dir__ = public_dir(__name__, __all__)

TINY_STAGES = ("stage1", "stage2", "stage3", "stage4")
"""Module names of `TinyNet` whose outputs are the backbone's stages (strides 4 to 32)."""


class TinyNet(nn.Module):
    """A four-stage depthwise-separable CNN: ``stem`` (stride 2), ``stage1`` ... ``stage4``.

    Each stage is a stride-2 `DepthwiseSeparableConv2d` and ``depths[i] - 1`` stride-1 ones,
    so the stages end at strides 4, 8, 16 and 32. ``forward`` returns the last stage's
    output; ``build_backbone("vb_tiny")`` returns all four.

    Args:
        in_channels: Input channels.
        widths: Output channels of the four stages; the stem has ``widths[0]``.
        depths: Blocks per stage (each at least 1).
        norm: Norm of every block (see `visionblocks.nn.ConvNormAct`).
        act: Activation of every block.

    Shape:
        - Input: ``(B, in_channels, H, W)``.
        - Output: ``(B, widths[3], ceil(H / 32), ceil(W / 32))``.

    Raises:
        TypeError: ``widths`` or ``depths`` not a tuple or list.
        ValueError: They are not four positive ints (widths at most 65,536, depths at most
            64).

    Examples:
        >>> import torch
        >>> net = TinyNet(widths=(8, 16, 32, 64))
        >>> net(torch.randn(1, 3, 64, 64)).shape
        torch.Size([1, 64, 2, 2])
        >>> [name for name, _ in net.named_children()]
        ['stem', 'stage1', 'stage2', 'stage3', 'stage4']
    """

    def __init__(
        self,
        in_channels: int = 3,
        widths: Sequence[int] = (16, 32, 64, 128),
        depths: Sequence[int] = (1, 2, 2, 2),
        norm: NormSpec = "bn",
        act: ActSpec = "relu",
    ) -> None:
        super().__init__()
        widths = check_positive_ints("widths", widths, 4, MAX_CHANNELS)
        depths = check_positive_ints("depths", depths, 4, MAX_REPEATS)
        self.stem = ConvNormAct(in_channels, widths[0], 3, stride=2, norm=norm, act=act)
        previous = widths[0]
        for index, (width, depth) in enumerate(zip(widths, depths), start=1):
            blocks = [DepthwiseSeparableConv2d(previous, width, stride=2, norm=norm, act=act)]
            blocks += [
                DepthwiseSeparableConv2d(width, width, norm=norm, act=act) for _ in range(depth - 1)
            ]
            self.add_module(f"stage{index}", nn.Sequential(*blocks))
            previous = width

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for name in TINY_STAGES:
            x = getattr(self, name)(x)
        return x


@BACKBONES.register(name="vb_tiny", aliases=("tiny",))
def vb_tiny(
    *,
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    out_indices: Sequence[int] | None = None,
    in_channels: int = 3,
    frozen_stages: int = 0,
    norm_eval: bool = False,
    grad_checkpointing: bool | Sequence[int] = False,
    **kwargs: Any,
) -> Backbone:
    """`TinyNet` as a backbone: stages ``stage1`` ... ``stage4`` at strides 4, 8, 16, 32.

    Registered as ``"vb_tiny"`` (alias ``"tiny"``). The options are those of
    `visionblocks.backbones.build_backbone`; ``kwargs`` go to `TinyNet`.

    Returns:
        Backbone: Its forward returns ``OrderedDict[str, Tensor]`` (``stage0`` ... ``stage3``).

    Examples:
        >>> import torch
        >>> backbone = vb_tiny(widths=(8, 16, 32, 64))
        >>> [(f["name"], f["channels"], f["stride"]) for f in backbone.feature_info]
        [('stage0', 8, 4), ('stage1', 16, 8), ('stage2', 32, 16), ('stage3', 64, 32)]
    """
    model = TinyNet(in_channels, **kwargs)
    return backbone_from_model(
        model,
        TINY_STAGES,
        name="vb_tiny",
        pretrained=pretrained,
        out_indices=out_indices,
        in_channels=in_channels,
        frozen_stages=frozen_stages,
        norm_eval=norm_eval,
        grad_checkpointing=grad_checkpointing,
    )
