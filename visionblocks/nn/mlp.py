"""A multi-layer perceptron: ``Linear -> [norm] -> activation -> Dropout`` per hidden layer,
then ``Linear -> Dropout``.

torchvision's ``MLP`` (its arguments, and the same ``nn.Sequential`` indices, so state dicts
load both ways): ``MLP(256, [512, 256])`` is ``Linear(256, 512), ReLU, Dropout, Linear(512,
256), Dropout``. ``norm_layer`` and ``activation_layer`` are factories as in torchvision
(``activation_layer`` may also be a name of `visionblocks.nn.layers.ACTIVATIONS`);
``inplace`` is passed to the activations and dropouts when given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_device, check_floating, is_tracing
from visionblocks.nn._limits import check_channels
from visionblocks.nn.layers import make_activation

__all__ = ["MLP"]
__dir__ = public_dir(__name__, __all__)


@LAYERS.register(name="mlp")
class MLP(nn.Sequential):
    """Multi-layer perceptron over the last dimension (module notes).

    Args:
        in_channels: Size of the input's last dimension.
        hidden_channels: Output sizes of the linear layers (the last one is the output's).
        norm_layer: A factory ``f(size)`` of a norm after each hidden linear layer
            (``nn.LayerNorm``), or ``None``.
        activation_layer: A factory of the activation (torchvision's ``nn.ReLU``), a name in
            `visionblocks.nn.layers.ACTIVATIONS`, or ``None`` (no activation).
        inplace: Passed as ``inplace=`` to the activations and dropouts (``None``: not passed).
        bias: Give the linear layers a bias.
        dropout: Dropout probability after each linear layer, in ``[0, 1]``.

    Shape:
        - Input: ``(*, in_channels)``; output ``(*, hidden_channels[-1])``.

    Raises:
        TypeError: Arguments of the wrong type; in ``forward``, a non-floating input.
        ValueError: Sizes outside ``[1, 65536]``, an empty ``hidden_channels``, ``dropout``
            outside ``[0, 1]``; in ``forward``, a last dimension other than ``in_channels``.

    Examples:
        >>> import torch
        >>> mlp = MLP(16, [32, 8], norm_layer=torch.nn.LayerNorm, dropout=0.1)
        >>> [type(m).__name__ for m in mlp]
        ['Linear', 'LayerNorm', 'ReLU', 'Dropout', 'Linear', 'Dropout']
        >>> mlp(torch.randn(4, 16)).shape
        torch.Size([4, 8])
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: Sequence[int],
        norm_layer: Callable[..., nn.Module] | None = None,
        activation_layer: Callable[..., nn.Module] | str | None = nn.ReLU,
        inplace: bool | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        check_channels("in_channels", in_channels)
        check_type("hidden_channels", hidden_channels, (list, tuple))
        if not hidden_channels:
            raise ValueError("hidden_channels must name at least one layer, got []")
        for size in hidden_channels:
            check_channels("hidden_channels", size)
        if norm_layer is not None and not callable(norm_layer):
            raise TypeError(
                f"norm_layer must be a factory or None, got {type(norm_layer).__name__}"
            )
        if not (activation_layer is None or isinstance(activation_layer, str)) and not callable(
            activation_layer
        ):
            raise TypeError(
                "activation_layer must be a factory, a name or None, got "
                f"{type(activation_layer).__name__}"
            )
        if inplace is not None:
            check_type("inplace", inplace, bool)
        check_type("bias", bias, bool)
        check_number("dropout", dropout, 0.0, 1.0)
        params = {} if inplace is None else {"inplace": inplace}
        layers: list[nn.Module] = []
        in_dim = in_channels
        for hidden_dim in hidden_channels[:-1]:
            layers.append(nn.Linear(in_dim, hidden_dim, bias=bias))
            if norm_layer is not None:
                layers.append(norm_layer(hidden_dim))
            if isinstance(activation_layer, str) or activation_layer is None:
                try:
                    layers.append(make_activation(activation_layer, inplace=bool(inplace)))
                except ValueError as exc:
                    raise ValueError(f"activation_layer: {exc}") from None
            else:
                layers.append(activation_layer(**params))
            layers.append(nn.Dropout(dropout, **params))
            in_dim = hidden_dim
        layers.append(nn.Linear(in_dim, hidden_channels[-1], bias=bias))
        layers.append(nn.Dropout(dropout, **params))
        super().__init__(*layers)
        self.in_channels = in_channels

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            self._check_input(input)
        for module in self:
            input = module(input)
        return input

    def _check_input(self, input: Tensor) -> None:
        if not is_tracing(input):
            check_floating("input", input)
            check_device("input", input, self[0].weight.device, "the module's parameters")
            if input.dim() == 0 or input.shape[-1] != self.in_channels:
                raise ValueError(
                    f"input must have shape (*, {self.in_channels}), got {tuple(input.shape)}"
                )
