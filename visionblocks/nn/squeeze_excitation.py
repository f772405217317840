"""Squeeze-and-Excitation (Hu et al., 2018): rescale channels by a gate computed from their
global average.

torchvision's ``SqueezeExcitation`` (its arguments, submodule names ``avgpool``, ``fc1``,
``fc2``, ``activation``, ``scale_activation``, so state dicts load both ways, and its
formula): ``x * scale_activation(fc2(activation(fc1(mean(x)))))`` with 1x1 convolutions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_image_batch
from visionblocks.nn._limits import check_channels
from visionblocks.nn.layers import ActSpec, make_activation

__all__ = ["SqueezeExcitation"]
__dir__ = public_dir(__name__, __all__)


def _activation(name: str, spec: ActSpec) -> nn.Module:
    """`make_activation` with errors that name the argument."""
    try:
        return make_activation(spec)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


@LAYERS.register(name="squeeze_excitation")
class SqueezeExcitation(nn.Module):
    """Squeeze-and-Excitation block (module notes).

    Args:
        input_channels: Channels ``C`` of the input.
        squeeze_channels: Channels of the bottleneck.
        activation: Activation after ``fc1``: a factory (torchvision's ``nn.ReLU``), a name in
            `visionblocks.nn.layers.ACTIVATIONS` or ``None``.
        scale_activation: The gate (torchvision's ``nn.Sigmoid``; ``nn.Hardsigmoid`` in
            MobileNetV3), same kinds.

    Shape:
        - Input and output: ``(B, C, H, W)``.

    Raises:
        TypeError: Non-int channels, activations of the wrong kind; in ``forward``, an input
            that is not a floating tensor of the weights' dtype.
        ValueError: Channels outside ``[1, 65536]``; in ``forward``, a wrong shape or device.

    Examples:
        >>> import torch
        >>> se = SqueezeExcitation(8, 2)
        >>> se(torch.randn(2, 8, 5, 5)).shape
        torch.Size([2, 8, 5, 5])
    """

    def __init__(
        self,
        input_channels: int,
        squeeze_channels: int,
        activation: ActSpec = nn.ReLU,
        scale_activation: ActSpec = nn.Sigmoid,
    ) -> None:
        check_channels("input_channels", input_channels)
        check_channels("squeeze_channels", squeeze_channels)
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = _activation("activation", activation)
        self.scale_activation = _activation("scale_activation", scale_activation)

    def _scale(self, input: Tensor) -> Tensor:
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript skips the block
            check_image_batch("input", input, self.fc1.in_channels, weight=self.fc1.weight)
        return self._scale(input) * input
