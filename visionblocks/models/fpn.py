"""Feature pyramid network neck: `FPN`, registered in ``NECKS`` as ``"fpn"``."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_int, check_positive_ints
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import NECKS
from visionblocks.init import c2_xavier_fill
from visionblocks.models._levels import check_levels, check_measured_strides
from visionblocks.nn._limits import MAX_CHANNELS, MAX_EXTRA_LEVELS, MAX_STRIDE, check_channels
from visionblocks.nn.conv import ConvNormAct
from visionblocks.nn.layers import NormSpec

__all__ = ["FPN"]
__dir__ = public_dir(__name__, __all__)


def level_name(stride: int) -> str:
    """``"p3"`` for stride 8: the level's name is ``p`` and ``log2(stride)``."""
    return f"p{round(math.log2(stride))}"


@NECKS.register(name="fpn")
class FPN(nn.Module):
    """Feature pyramid network (Lin et al., 2017): one ``out_channels`` map per level.

    Each input level gets a 1x1 lateral convolution; from the coarsest level down, each
    output is the lateral plus the nearest-upsampled coarser output, then a 3x3
    convolution. ``extra_levels`` adds stride-2 3x3 convolutions on top (P6, P7), with a ReLU
    between them. Convolutions are initialised as in Detectron2 (`visionblocks.init.
    c2_xavier_fill`). Outputs are named after their stride (``p3`` for 8); ``feature_info``
    is like a backbone's.

    Args:
        in_channels: Channels of the input levels, finest first (``backbone.channels``).
        strides: Strides of the input levels (``backbone.strides``); powers of two,
            increasing by 2x from level to level.
        out_channels: Channels of every output level (at most 65,536).
        extra_levels: Stride-2 levels added on top (at most 8).
        extra_from: ``"output"`` (P6 from P5's output, FCOS) or ``"input"`` (from the last
            input, RetinaNet).
        norm: Norm after each convolution (``None``, ``"gn"``, ``"bn"``, ...).

    Shape:
        - Input: a dict (or list) of ``Tensor[B, in_channels[i], H / strides[i], W /
          strides[i]]``, finest first; dict keys are ignored, their order counts.
        - Output: ``OrderedDict`` ``{"p3": Tensor[B, out_channels, H / 8, W / 8], ...}``.

    Raises:
        TypeError: Options of the wrong type; at call time, ``features`` that is not a dict
            or list of floating-point tensors.
        ValueError: Bad channel or stride lists or lengths, strides that do not double, an
            unknown ``extra_from``; at call time, levels that do not match ``strides`` and
            ``in_channels`` (number, channels, sizes), not 4-D, or not on the FPN's device.

    Examples:
        >>> import torch
        >>> fpn = FPN([64, 128, 256], [8, 16, 32], out_channels=32, extra_levels=2)
        >>> feats = [torch.randn(2, c, 64 // s, 64 // s) for c, s in zip([64, 128, 256], [8, 16, 32])]
        >>> {k: tuple(v.shape) for k, v in fpn(feats).items()}
        {'p3': (2, 32, 8, 8), 'p4': (2, 32, 4, 4), 'p5': (2, 32, 2, 2), 'p6': (2, 32, 1, 1), 'p7': (2, 32, 1, 1)}
        >>> [f["stride"] for f in fpn.feature_info]
        [8, 16, 32, 64, 128]

    References:
        Lin et al., "Feature Pyramid Networks for Object Detection", CVPR 2017.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        strides: Sequence[int],
        out_channels: int = 256,
        *,
        extra_levels: int = 0,
        extra_from: str = "output",
        norm: NormSpec = None,
    ) -> None:
        super().__init__()
        in_channels = list(check_positive_ints("in_channels", in_channels, high=MAX_CHANNELS))
        strides = list(check_positive_ints("strides", strides, high=MAX_STRIDE))
        if len(in_channels) != len(strides):
            raise ValueError(
                f"in_channels and strides must have the same length, got {len(in_channels)} "
                f"and {len(strides)}"
            )
        if any(b != 2 * a for a, b in itertools.pairwise(strides)) or not all(
            math.log2(s).is_integer() for s in strides
        ):
            raise ValueError(f"strides must be powers of two doubling per level, got {strides}")
        check_channels("out_channels", out_channels)
        check_int("extra_levels", extra_levels, 0, MAX_EXTRA_LEVELS)
        check_choice("extra_from", extra_from, ("output", "input"))
        self.extra_from = extra_from
        bias = norm is None
        self.lateral = nn.ModuleList(
            ConvNormAct(c, out_channels, 1, norm=norm, act=None, bias=bias) for c in in_channels
        )
        self.output = nn.ModuleList(
            ConvNormAct(out_channels, out_channels, 3, norm=norm, act=None, bias=bias)
            for _ in in_channels
        )
        extra_in = out_channels if extra_from == "output" else in_channels[-1]
        self.extra = nn.ModuleList(
            ConvNormAct(
                extra_in if i == 0 else out_channels, out_channels, 3, stride=2, norm=norm,
                act=None, bias=bias,
            )
            for i in range(extra_levels)
        )  # fmt: skip
        all_strides = [*strides, *(strides[-1] * 2 ** (i + 1) for i in range(extra_levels))]
        self._info = [
            {"name": level_name(s), "channels": out_channels, "stride": s} for s in all_strides
        ]
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                c2_xavier_fill(module)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """``[{"name", "channels", "stride"}, ...]`` of the outputs, finest first."""
        return [dict(f) for f in self._info]

    def forward(
        self, features: Mapping[str, Tensor] | Sequence[Tensor]
    ) -> OrderedDict[str, Tensor]:
        channels = [conv.conv.in_channels for conv in self.lateral]
        strides = [info["stride"] for info in self._info[: len(channels)]]
        if isinstance(features, (Mapping, list, tuple)) and len(features) != len(channels):
            raise ValueError(
                f"features must hold {len(channels)} levels (finest first), one per stride of "
                f"strides={strides}, got {len(features)}"
            )
        inputs = check_levels("features", features, channels, self.lateral[0].conv)
        check_measured_strides(features, inputs, strides)
        laterals = [conv(x) for conv, x in zip(self.lateral, inputs)]
        outs = [self.output[-1](laterals[-1])]
        top = laterals[-1]
        for i in range(len(laterals) - 2, -1, -1):
            top = laterals[i] + F.interpolate(top, size=laterals[i].shape[-2:], mode="nearest")
            outs.insert(0, self.output[i](top))
        last = outs[-1] if self.extra_from == "output" else inputs[-1]
        for i, conv in enumerate(self.extra):
            last = conv(F.relu(last) if i > 0 else last)
            outs.append(last)
        return OrderedDict((info["name"], out) for info, out in zip(self._info, outs))

    def extra_repr(self) -> str:
        strides = [f["stride"] for f in self._info]
        return f"strides={strides}, extra_from={self.extra_from!r}"
