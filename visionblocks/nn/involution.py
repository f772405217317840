"""Layers built on per-pixel dynamic filtering (`visionblocks.ops.local.local_filter2d`).

`Involution2d` generates its kernels from the input itself (Li et al., CVPR 2021); `LocalFilter2d`
predicts them with a convolution or takes them as given. Both run `local_filter2d`, which does not
unfold the input, except under ``torch.export`` and ``torch.jit.script``: there they unfold it
(``k*k`` times the memory); a scripted layer skips the input checks and activation checkpointing.
Under ``torch.autocast`` the convolutions run in the autocast dtype and `local_filter2d` promotes
their kernels with ``x`` (float32 ``x`` gives float32); outputs are contiguous NCHW.

Checks: ints ``>= 1``, ``kernel_size`` odd and at most 63, ``stride`` and ``dilation`` at
most 1,024, ``channels`` at most 65,536 and divisible by ``groups``. In ``forward`` the
input must be a floating-point ``(B, C, H, W)`` tensor of the weights' dtype and device.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from visionblocks._core.checkpointing import set_grad_checkpointing, without_checkpointing
from visionblocks._core.checks import check_choice, check_int, check_positive_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import (
    check_device,
    check_floating,
    check_image_batch,
    is_tracing,
)
from visionblocks.nn._export_paths import local_filter_plain
from visionblocks.nn._limits import MAX_CHANNELS, MAX_KERNEL_SIZE, MAX_WINDOW
from visionblocks.ops.local import check_window, local_filter2d

__all__ = ["Involution2d", "LocalFilter2d"]
__dir__ = public_dir(__name__, __all__)


def _check_sizes(kernel_size: int, dilation: int, stride: int = 1) -> None:
    """Bounded window sizes, then `check_window`'s rules."""
    check_int("kernel_size", kernel_size, 1, MAX_WINDOW)
    check_int("dilation", dilation, 1, MAX_KERNEL_SIZE)
    check_int("stride", stride, 1, MAX_KERNEL_SIZE)
    check_window(kernel_size, dilation, stride)


def _check_groups(channels: int, groups: int) -> None:
    check_positive_int("channels", channels, MAX_CHANNELS)
    check_positive_int("groups", groups, MAX_CHANNELS)
    if channels % groups:
        raise ValueError(f"groups must divide channels, got groups={groups}, channels={channels}")


def _check_kernels(kernels: object, x: torch.Tensor, taps: int) -> None:
    """Given kernels: floating ``(B, G*k*k, H, W)`` like ``x``, on its device."""
    check_floating("kernels", kernels)
    expected = (x.shape[0], taps, *x.shape[2:])
    if tuple(kernels.shape) != expected:
        raise ValueError(
            f"kernels must have shape (B, groups * kernel_size**2, H, W) = {expected} for x of "
            f"shape {tuple(x.shape)}, got {tuple(kernels.shape)}"
        )
    check_device("kernels", kernels, x.device, "x")


@LAYERS.register(name="involution")
class Involution2d(nn.Module):
    """Involution: a ``k x k`` kernel per pixel and channel group, generated from the input.

    Kernel generation as in the paper's reference code: ``AvgPool2d(stride, ceil_mode=True)``
    (when ``stride > 1``) -> 1x1 conv to ``channels // reduction`` -> BatchNorm -> ReLU ->
    1x1 conv (with bias) to ``groups * k * k`` channels, which filter the input with
    `local_filter2d` at that stride (channel ``c`` uses group ``c // (channels // groups)``).

    Args:
        channels: Input and output channels ``C``.
        kernel_size: Window side ``k``, odd.
        stride: Output stride ``s``.
        groups: Kernel groups ``G`` (must divide ``channels``).
        reduction: Channel reduction of the kernel generator (``channels // reduction >= 1``).
        grad_checkpointing: Recompute the generated kernels in the backward instead of
            keeping them (`visionblocks.training.set_grad_checkpointing`); the BatchNorm's
            running statistics are still updated once.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, C, ceil(H / s), ceil(W / s))`` (dtype: the module notes).

    Raises:
        TypeError: Non-int arguments; in ``forward``, a wrong input type or dtype.
        ValueError: Sizes out of the module's bounds, ``reduction`` larger than
            ``channels``; in ``forward``, a wrong input shape or device.

    Examples:
        >>> import torch
        >>> layer = Involution2d(32, kernel_size=7, stride=2, groups=4)
        >>> layer(torch.randn(2, 32, 15, 16)).shape
        torch.Size([2, 32, 8, 8])

    References:
        Li et al., "Involution: Inverting the Inherence of Convolution for Visual
        Recognition", CVPR 2021. https://arxiv.org/abs/2103.06255
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        stride: int = 1,
        groups: int = 16,
        reduction: int = 4,
        *,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        _check_sizes(kernel_size, 1, stride)
        _check_groups(channels, groups)
        check_positive_int("reduction", reduction, MAX_CHANNELS)
        check_type("grad_checkpointing", grad_checkpointing, bool)
        if channels // reduction < 1:
            raise ValueError(
                f"reduction must be <= channels (channels // reduction >= 1), "
                f"got reduction={reduction}, channels={channels}"
            )
        self.channels, self.kernel_size, self.stride = channels, kernel_size, stride
        self.groups, self.reduction = groups, reduction
        hidden = channels // reduction
        self.pool = nn.AvgPool2d(stride, stride, ceil_mode=True) if stride > 1 else nn.Identity()
        self.reduce = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(inplace=True),
        )
        self.span = nn.Conv2d(hidden, groups * kernel_size * kernel_size, 1)
        if grad_checkpointing:
            set_grad_checkpointing(self)

    def kernels(self, x: Tensor) -> Tensor:
        """The generated kernels ``(B, G*k*k, ceil(H / s), ceil(W / s))`` of ``x``."""
        return self.span(self.reduce(self.pool(x)))

    def forward(self, x: Tensor) -> Tensor:
        """Involve ``x (B, C, H, W)`` with its own kernels."""
        if not torch.jit.is_scripting():  # Python only: TorchScript skips the block
            if not is_tracing(x):  # reading self.span.weight would show in a torch.fx graph
                check_image_batch("x", x, self.channels, weight=self.span.weight)
            if not torch.compiler.is_exporting():  # the threaded op does not trace
                return local_filter2d(x, self.kernels(x), self.kernel_size, stride=self.stride)
        # Export and TorchScript: the same maths on the unfolded windows.
        return local_filter_plain(x, self.kernels(x), self.kernel_size, stride=self.stride)

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles: the layer without activation checkpointing."""
        return without_checkpointing(self)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"groups={self.groups}, reduction={self.reduction}"
        )


@LAYERS.register(name="local_filter")
class LocalFilter2d(nn.Module):
    """A dynamic per-pixel ``k x k`` filter (`local_filter2d`), its kernels predicted or given.

    With ``predict=True`` a ``3 x 3`` convolution predicts ``groups * k * k`` kernel values
    per pixel; ``normalize="softmax"`` makes each pixel's taps sum to 1 (as CARAFE's
    reassembly kernels), ``"none"`` keeps them raw. Kernels passed to ``forward`` are used
    as given; ``predict=False`` builds a parameter-free layer that needs them.

    Args:
        channels: Input and output channels ``C``.
        kernel_size: Window side ``k``, odd.
        dilation: Spacing between taps.
        groups: Kernel groups ``G`` (must divide ``channels``; ``G = C``: a depthwise filter).
        normalize: ``"softmax"`` | ``"none"``, applied to predicted kernels.
        predict: Build the kernel predictor.
        grad_checkpointing: Recompute the predicted kernels in the backward instead of
            keeping them (`visionblocks.training.set_grad_checkpointing`).

    Shape:
        - Input: ``x (B, C, H, W)``, optional ``kernels (B, G*k*k, H, W)``.
        - Output: ``(B, C, H, W)`` (dtype: the module notes).

    Raises:
        TypeError: Non-int sizes, a non-bool ``predict``; in ``forward``, a wrong input
            type or dtype.
        ValueError: Sizes out of the module's bounds, an unknown ``normalize``; in
            ``forward``, a wrong input shape or device, or no kernels without a predictor.

    Examples:
        >>> import torch
        >>> layer = LocalFilter2d(16, kernel_size=5, groups=4)
        >>> x = torch.randn(2, 16, 9, 9)
        >>> layer(x).shape
        torch.Size([2, 16, 9, 9])
        >>> box = torch.full((2, 4 * 25, 9, 9), 1 / 25)  # given kernels: a 5x5 mean filter
        >>> torch.allclose(layer(x, box), local_filter2d(x, box, 5))
        True
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        dilation: int = 1,
        groups: int = 1,
        normalize: Literal["softmax", "none"] = "softmax",
        predict: bool = True,
        *,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        _check_sizes(kernel_size, dilation)
        _check_groups(channels, groups)
        check_choice("normalize", normalize, ("softmax", "none"))
        check_type("predict", predict, bool)
        check_type("grad_checkpointing", grad_checkpointing, bool)
        self.channels, self.kernel_size, self.dilation = channels, kernel_size, dilation
        self.groups, self.normalize = groups, normalize
        taps = groups * kernel_size * kernel_size
        self.predictor = nn.Conv2d(channels, taps, 3, padding=1) if predict else None
        if grad_checkpointing:
            set_grad_checkpointing(self)

    def predict_kernels(self, x: Tensor) -> Tensor:
        """Predicted (and normalised) kernels ``(B, G*k*k, H, W)`` of ``x``.

        Raises:
            ValueError: If the layer was built with ``predict=False``.
        """
        predictor = self.predictor
        if predictor is None:
            raise ValueError("LocalFilter2d(predict=False) has no predictor; pass kernels")
        kernels = predictor(x)
        if self.normalize == "softmax":
            taps = self.kernel_size * self.kernel_size
            kernels = torch.softmax(kernels.unflatten(1, (self.groups, taps)), 2).flatten(1, 2)
        return kernels

    def forward(self, x: Tensor, kernels: Tensor | None = None) -> Tensor:
        """Filter ``x (B, C, H, W)`` with ``kernels`` (predicted from ``x`` when None)."""
        if not torch.jit.is_scripting():  # Python only: TorchScript skips the block
            self._check_input(x, kernels)
            if not torch.compiler.is_exporting():  # the threaded op does not trace
                kernels = self.predict_kernels(x) if kernels is None else kernels
                return local_filter2d(x, kernels, self.kernel_size, self.dilation)
        # Export and TorchScript: the same maths on the unfolded windows.
        kernels = self.predict_kernels(x) if kernels is None else kernels
        return local_filter_plain(x, kernels, self.kernel_size, self.dilation)

    def _check_input(self, x: Tensor, kernels: Tensor | None) -> None:
        if is_tracing(x, kernels):  # a weight read would show in a torch.fx graph
            return
        predictor = self.predictor if kernels is None else None
        check_image_batch("x", x, self.channels, weight=getattr(predictor, "weight", None))
        if kernels is not None:
            _check_kernels(kernels, x, self.groups * self.kernel_size**2)

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles: the layer without activation checkpointing."""
        return without_checkpointing(self)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, kernel_size={self.kernel_size}, "
            f"dilation={self.dilation}, groups={self.groups}, normalize={self.normalize!r}, "
            f"predict={self.predictor is not None}"
        )
