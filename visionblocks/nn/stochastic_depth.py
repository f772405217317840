"""Stochastic depth (drop path): zero whole residual branches at random while training.

`drop_path` is torchvision's ``stochastic_depth`` and, in ``"row"`` mode, timm's ``drop_path``
(Huang et al., 2016): the same random draws (one ``bernoulli_`` of the survival rate), so the
same seed gives the same result. The kept rows are scaled by ``1 / (1 - p)`` (timm's default
``scale_by_keep=True``; timm's ``scale_by_keep=False`` has no counterpart). timm's function
defaults to ``training=False``, torchvision's and this one to ``True``; the modules use
``self.training``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_floating

__all__ = ["StochasticDepth", "drop_path"]
__dir__ = public_dir(__name__, __all__)

MODES = ("row", "batch")


def _check_options(p: float, mode: str) -> None:
    check_number("p", p, 0.0, 1.0)
    check_choice("mode", mode, MODES)


def drop_path(input: Tensor, p: float, mode: str = "row", training: bool = True) -> Tensor:
    """Zero each sample (``"row"``) or the whole batch (``"batch"``) with probability ``p``.

    Args:
        input (Tensor[N, *]): The output of a residual branch, floating point.
        p: Probability of dropping, in ``[0, 1]``.
        mode: ``"row"`` (a draw per sample) or ``"batch"`` (one draw for the batch).
        training: Drop only when True (the identity otherwise).

    Returns:
        Tensor[N, *]: ``input`` times a 0/1 mask divided by ``1 - p`` (``input`` itself when
        not training or ``p == 0``); with ``p == 1`` everything is zero.

    Raises:
        TypeError: Non-tensor or non-floating ``input``, non-number ``p``, non-bool ``training``.
        ValueError: ``p`` outside ``[0, 1]``, an unknown ``mode``.

    Examples:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> drop_path(torch.ones(4, 2), 0.5)
        tensor([[0., 0.],
                [0., 0.],
                [2., 2.],
                [0., 0.]])
    """
    if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
        check_floating("input", input)
        _check_options(p, mode)
        check_type("training", training, bool)
    if not training or p == 0.0:
        return input
    survival_rate = 1.0 - p
    if mode == "row":
        size = [input.shape[0]] + [1] * (input.ndim - 1)
    else:
        size = [1] * input.ndim
    noise = torch.empty(size, dtype=input.dtype, device=input.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return input * noise


torch.fx.wrap("drop_path")


@LAYERS.register(name="stochastic_depth")
class StochasticDepth(nn.Module):
    """Module form of `drop_path` (torchvision's ``StochasticDepth``, timm's ``DropPath`` in
    ``"row"`` mode); drops only in training mode.

    Args:
        p: Probability of dropping, in ``[0, 1]``.
        mode: ``"row"`` or ``"batch"``.

    Shape:
        - Input and output: ``(N, *)``, same dtype.

    Raises:
        TypeError: Non-number ``p``.
        ValueError: ``p`` outside ``[0, 1]``, an unknown ``mode``.

    Examples:
        >>> import torch
        >>> StochasticDepth(0.2).eval()(torch.ones(2, 3)).tolist()
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """

    def __init__(self, p: float, mode: str = "row") -> None:
        super().__init__()
        _check_options(p, mode)
        self.p, self.mode = float(p), mode

    def forward(self, input: Tensor) -> Tensor:
        return drop_path(input, self.p, self.mode, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, mode={self.mode!r}"
