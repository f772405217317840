"""DropBlock (Ghiasi et al., 2018): drop contiguous square (cube) regions of feature maps.

torchvision's ``drop_block2d`` / ``drop_block3d`` and their modules, with the same random
draws (one ``bernoulli_`` of ``gamma`` over the valid block centres), so the same seed gives
the same result: each centre starts a dropped block with probability
``gamma = p * H * W / (block_size**2 * (H - block_size + 1) * (W - block_size + 1))``
(``D``, ``**3`` in 3-D), and the kept values are scaled by ``numel / (eps + kept)``.
``block_size`` is cut to the smallest spatial side; it must be odd (after that cut, as
torchvision).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_int, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_floating
from visionblocks.nn._limits import MAX_KERNEL_SIZE

__all__ = ["DropBlock2d", "DropBlock3d", "drop_block2d", "drop_block3d"]
__dir__ = public_dir(__name__, __all__)


def _check_options(p: float, block_size: int, inplace: bool, eps: float) -> None:
    check_number("p", p, 0.0, 1.0)
    check_int("block_size", block_size, 1, MAX_KERNEL_SIZE)
    check_type("inplace", inplace, bool)
    check_number("eps", eps, 0.0, low_inclusive=False)


def _drop_block(
    input: Tensor, p: float, block_size: int, inplace: bool, eps: float, training: bool, dims: int
) -> Tensor:
    if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
        check_floating("input", input)
        _check_options(p, block_size, inplace, eps)
        check_type("training", training, bool)
        if input.dim() != dims + 2:
            names = "(N, C, H, W)" if dims == 2 else "(N, C, D, H, W)"
            raise ValueError(f"input must have shape {names}, got {tuple(input.shape)}")
    if not training or p == 0.0:
        return input
    sides = input.shape[2:]
    block_size = min([block_size] + [int(s) for s in sides])
    if block_size % 2 == 0:
        raise ValueError(
            f"block_size must be odd after its cut to the input's smallest side, got {block_size}"
        )
    area = 1
    valid = 1
    for s in sides:
        area *= s
        valid *= s - block_size + 1
    gamma = (p * area) / ((block_size**dims) * valid)
    shape = [input.shape[0], input.shape[1]] + [s - block_size + 1 for s in sides]
    noise = torch.empty(shape, dtype=input.dtype, device=input.device)
    noise.bernoulli_(gamma)
    noise = F.pad(noise, [block_size // 2] * (2 * dims), value=0.0)
    if dims == 2:
        noise = F.max_pool2d(noise, kernel_size=block_size, stride=1, padding=block_size // 2)
    else:
        noise = F.max_pool3d(noise, kernel_size=block_size, stride=1, padding=block_size // 2)
    noise = 1 - noise
    normalize_scale = noise.numel() / (eps + noise.sum())
    if inplace:
        return input.mul_(noise).mul_(normalize_scale)
    return input * noise * normalize_scale


def drop_block2d(
    input: Tensor,
    p: float,
    block_size: int,
    inplace: bool = False,
    eps: float = 1e-6,
    training: bool = True,
) -> Tensor:
    """DropBlock of a ``(N, C, H, W)`` batch (torchvision's ``drop_block2d``; module notes).

    Args:
        input (Tensor[N, C, H, W]): Feature maps, floating point.
        p: Probability of dropping a value, in ``[0, 1]``.
        block_size: Side of the dropped squares (odd after the cut to ``min(H, W)``).
        inplace: Modify ``input`` in place.
        eps: Added to the count of kept values (``> 0``).
        training: Drop only when True (``input`` itself otherwise).

    Returns:
        Tensor[N, C, H, W]: The input with blocks zeroed and the rest rescaled.

    Raises:
        TypeError: Non-tensor or non-floating ``input``, options of the wrong type.
        ValueError: Not 4-D, ``p`` outside ``[0, 1]``, ``block_size < 1`` or even after the
            cut, ``eps`` not positive.

    Examples:
        >>> import torch
        >>> _ = torch.manual_seed(1)
        >>> out = drop_block2d(torch.ones(1, 1, 6, 6), 0.3, 3)  # one 3x3 block dropped
        >>> int((out == 0).sum()), round(out.max().item(), 4)
        (9, 1.3333)
    """
    return _drop_block(input, p, block_size, inplace, eps, training, 2)


def drop_block3d(
    input: Tensor,
    p: float,
    block_size: int,
    inplace: bool = False,
    eps: float = 1e-6,
    training: bool = True,
) -> Tensor:
    """DropBlock of a ``(N, C, D, H, W)`` batch (torchvision's ``drop_block3d``).

    Args:
        input (Tensor[N, C, D, H, W]): Feature volumes, floating point.
        p: Probability of dropping a value, in ``[0, 1]``.
        block_size: Side of the dropped cubes (odd after the cut to ``min(D, H, W)``).
        inplace: Modify ``input`` in place.
        eps: Added to the count of kept values (``> 0``).
        training: Drop only when True (``input`` itself otherwise).

    Returns:
        Tensor[N, C, D, H, W]: The input with cubes zeroed and the rest rescaled.

    Raises:
        TypeError: Non-tensor or non-floating ``input``, options of the wrong type.
        ValueError: Not 5-D, ``p`` outside ``[0, 1]``, ``block_size < 1`` or even after the
            cut, ``eps`` not positive.

    Examples:
        >>> import torch
        >>> drop_block3d(torch.ones(1, 1, 2, 3, 3), 0.5, 3, training=False).shape
        torch.Size([1, 1, 2, 3, 3])
    """
    return _drop_block(input, p, block_size, inplace, eps, training, 3)


torch.fx.wrap("drop_block2d")
torch.fx.wrap("drop_block3d")


class _DropBlock(nn.Module):
    def __init__(self, p: float, block_size: int, inplace: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        _check_options(p, block_size, inplace, eps)
        self.p, self.block_size, self.inplace, self.eps = float(p), block_size, inplace, float(eps)

    def extra_repr(self) -> str:
        return f"p={self.p}, block_size={self.block_size}, inplace={self.inplace}"


@LAYERS.register(name="drop_block2d")
class DropBlock2d(_DropBlock):
    """Module form of `drop_block2d` (torchvision's ``DropBlock2d``); drops only in training.

    Args:
        p: Probability of dropping a value, in ``[0, 1]``.
        block_size: Side of the dropped squares.
        inplace: Modify the input in place.
        eps: Added to the count of kept values (``> 0``).

    Shape:
        - Input and output: ``(N, C, H, W)``.

    Raises:
        TypeError: Options of the wrong type.
        ValueError: ``p`` outside ``[0, 1]``, ``block_size < 1``, ``eps`` not positive.

    Examples:
        >>> import torch
        >>> DropBlock2d(0.1, 3).eval()(torch.ones(1, 2, 4, 4)).sum().item()
        32.0
    """

    def forward(self, input: Tensor) -> Tensor:
        return drop_block2d(input, self.p, self.block_size, self.inplace, self.eps, self.training)


@LAYERS.register(name="drop_block3d")
class DropBlock3d(_DropBlock):
    """Module form of `drop_block3d` (torchvision's ``DropBlock3d``); drops only in training.

    Args:
        p: Probability of dropping a value, in ``[0, 1]``.
        block_size: Side of the dropped cubes.
        inplace: Modify the input in place.
        eps: Added to the count of kept values (``> 0``).

    Shape:
        - Input and output: ``(N, C, D, H, W)``.

    Raises:
        TypeError: Options of the wrong type.
        ValueError: ``p`` outside ``[0, 1]``, ``block_size < 1``, ``eps`` not positive.

    Examples:
        >>> import torch
        >>> DropBlock3d(0.1, 3).eval()(torch.ones(1, 2, 3, 4, 4)).sum().item()
        96.0
    """

    def forward(self, input: Tensor) -> Tensor:
        return drop_block3d(input, self.p, self.block_size, self.inplace, self.eps, self.training)
