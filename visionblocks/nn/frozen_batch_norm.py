"""BatchNorm with fixed statistics and affine parameters (buffers, never trained).

torchvision's ``FrozenBatchNorm2d``: the same buffers (``weight``, ``bias``, ``running_mean``,
``running_var``), so state dicts load both ways, and the same formula
``x * scale + (bias - running_mean * scale)`` with ``scale = weight * rsqrt(running_var + eps)``;
a ``num_batches_tracked`` entry in a loaded state dict (from a ``nn.BatchNorm2d``) is ignored.
A half-precision input gives its own dtype, as ``nn.BatchNorm2d`` (torchvision's promotes
it to float32). `visionblocks.nn.fuse_modules` folds it into the conv before it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_number
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_device, check_image_batch, is_tracing
from visionblocks.nn._limits import check_channels

__all__ = ["FrozenBatchNorm2d"]
__dir__ = public_dir(__name__, __all__)


@LAYERS.register(name="frozen_bn")
class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d whose statistics and affine parameters are fixed buffers (module notes).

    Args:
        num_features: Channels ``C`` (at most 65,536).
        eps: Added to the variance (positive and finite; torchvision's ``1e-5``).

    Shape:
        - Input and output: ``(B, C, H, W)``, the input's dtype under ``torch.autocast`` too
          (the buffers are cast to it).

    Raises:
        TypeError: Non-int ``num_features``, non-number ``eps``; in ``forward``, a
            non-floating input.
        ValueError: ``num_features`` outside ``[1, 65536]``, ``eps`` not positive and finite;
            in ``forward``, a wrong shape or device (checks skipped while tracing or scripted).

    Examples:
        >>> import torch
        >>> norm = FrozenBatchNorm2d(3)
        >>> _ = norm.running_var.fill_(4.0)
        >>> norm(torch.full((1, 3, 2, 2), 2.0))[0, :, 0, 0]
        tensor([1.0000, 1.0000, 1.0000])
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        check_channels("num_features", num_features)
        check_number("eps", eps, 0.0, math.inf, low_inclusive=False, high_inclusive=False)
        super().__init__()
        self.eps = float(eps)
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            self._check_input(x)
        w = self.weight.reshape(1, -1, 1, 1)
        b = self.bias.reshape(1, -1, 1, 1)
        rv = self.running_var.reshape(1, -1, 1, 1)
        rm = self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + self.eps).rsqrt()
        bias = b - rm * scale
        return x * scale.to(x.dtype) + bias.to(x.dtype)

    def _check_input(self, x: Tensor) -> None:
        if not is_tracing(x):
            check_image_batch("x", x, self.weight.shape[0])
            check_device("x", x, self.weight.device, "the module's buffers")

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
