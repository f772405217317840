"""Deformable convolution as a layer: the weight and bias of `visionblocks.ops.deform_conv2d`.

torchvision's ``DeformConv2d``: its constructor, attributes (``weight``, ``bias``,
``kernel_size``, ``stride``, ``padding``, ``dilation``, ``groups``), initialisation and
``forward(input, offset, mask=None)``; the offsets (and the v2 mask) come from a layer the
model defines, in the layout of `visionblocks.ops.deform_conv2d`'s Convention.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks.nn._limits import check_channels, check_conv_weights
from visionblocks.ops.deform_conv import _pair, deform_conv2d

__all__ = ["DeformConv2d"]
__dir__ = public_dir(__name__, __all__)


@LAYERS.register(name="deform_conv2d")
class DeformConv2d(nn.Module):
    """Deformable 2-D convolution layer (v1; v2 with a ``mask``), torchvision's module.

    Args:
        in_channels: Input channels ``C_in``.
        out_channels: Output channels ``C_out``.
        kernel_size: Kernel size, an int or ``(kh, kw)``.
        stride: Stride, an int or a pair.
        padding: Zero padding, an int or a pair.
        dilation: Dilation, an int or a pair.
        groups: Convolution groups; must divide ``in_channels`` and ``out_channels``.
        bias: Give the layer a bias.

    Shape:
        - input: ``(B, C_in, H, W)``; offset: ``(B, 2 * G * kh * kw, H_out, W_out)``; mask:
          ``(B, G * kh * kw, H_out, W_out)`` (``G`` offset groups dividing ``C_in``).
        - Output: ``(B, C_out, H_out, W_out)``, as `visionblocks.ops.deform_conv2d`.

    Raises:
        TypeError: Non-int sizes, a non-bool ``bias``; in ``forward``, non-floating tensors.
        ValueError: Sizes out of range, ``groups`` not dividing the channels; in ``forward``,
            shapes that do not fit (`visionblocks.ops.deform_conv2d`).

    Examples:
        >>> import torch
        >>> layer = DeformConv2d(4, 6, kernel_size=3, padding=1)
        >>> x, offset = torch.randn(1, 4, 8, 8), torch.zeros(1, 18, 8, 8)
        >>> layer(x, offset).shape
        torch.Size([1, 6, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_channels("in_channels", in_channels)
        check_channels("out_channels", out_channels)
        check_channels("groups", groups)
        for name, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
            if channels % groups:
                raise ValueError(f"groups={groups} must divide {name}={channels}")
        check_type("bias", bias, bool)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair("kernel_size", kernel_size, 1)
        self.stride = _pair("stride", stride, 1)
        self.padding = _pair("padding", padding, 0)
        self.dilation = _pair("dilation", dilation, 1)
        self.groups = groups
        check_conv_weights(in_channels, out_channels, self.kernel_size, groups)
        self.weight = nn.Parameter(
            torch.empty(out_channels, in_channels // groups, *self.kernel_size)
        )
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's initialisation (that of ``nn.Conv2d``)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight[0].numel())  # 1 / sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Tensor | None = None) -> Tensor:
        if torch.jit.is_scripting():  # torchvision's call, without the checks
            return self._scripted(input, offset, mask)
        return deform_conv2d(
            input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask
        )

    def _scripted(self, input: Tensor, offset: Tensor, mask: Tensor | None) -> Tensor:
        kh, kw = self.kernel_size
        use_mask = mask is not None
        if mask is None:
            mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
        bias = self.bias
        if bias is None:
            bias = torch.zeros(self.out_channels, device=input.device, dtype=input.dtype)
        return torch.ops.torchvision.deform_conv2d(
            input, self.weight, offset, mask, bias, self.stride[0], self.stride[1],
            self.padding[0], self.padding[1], self.dilation[0], self.dilation[1], self.groups,
            offset.shape[1] // (2 * kh * kw), use_mask,
        )  # fmt: skip

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles: the layer, once torchvision's ops are loaded."""
        import torchvision.ops  # noqa: F401  (registers torch.ops.torchvision.deform_conv2d)

        return self

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}"
        )
