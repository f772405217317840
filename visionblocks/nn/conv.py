"""Convolution blocks: conv + norm + activation (2-D, and 3-D as torchvision's), depthwise
(separable) convs, channel shuffle and permute.

Every block keeps its convolution and norm as ``conv``/``norm`` attributes (or as plain
``nn.Conv2d`` children), so `visionblocks.nn.fuse.fuse_modules` can fold BatchNorms into the
convolutions; all are registered in `visionblocks.registry.LAYERS`. Under ``torch.autocast``
the convolutions run in the autocast dtype (bfloat16 on CPU), which norm and activation keep,
so a block returns that dtype; parameters, gradients and BatchNorm statistics stay float32.
A ``channels_last`` input or block gives channels_last. Every block and `channel_shuffle`
scripts with ``torch.jit.script`` (alone or in a model) and gives the eager output, except
with a ``torch.nn.SyncBatchNorm`` norm (see `ConvNormAct`).

Checks: sizes are ints ``>= 1`` (padding ``>= 0``), at most 65,536 channels, 1,024 for the other
sizes and 2**31 weights per conv. ``forward`` takes a floating ``(B, C_in, H, W)`` tensor
(`ConvNormAct3d`: ``(B, C_in, D, H, W)``) on the weights' device (and dtype, outside
``torch.autocast``); scripted or traced blocks skip that check.

Convention (``padding=None``): each side gets ``dilation * (k - 1) // 2``, which keeps the
spatial size at stride 1 for odd kernels (``ceil(H / stride)`` at any stride). When
``dilation * (k - 1)`` is odd (even kernel, odd dilation), stride 1 uses ``padding="same"``
(the extra row/column at the bottom/right, like TensorFlow's ``SAME``) and stride > 1 the
symmetric ``dilation * (k - 1) // 2`` (a 2x2 or 4x4 kernel at stride 2 halves an even size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx
from torch import Tensor, nn

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import (
    check_device,
    check_floating,
    check_image_batch,
    check_tensor,
    is_tracing,
)
from visionblocks.nn._limits import MAX_CHANNELS, MAX_KERNEL_SIZE, check_conv_weights
from visionblocks.nn.layers import ActSpec, NormSpec, make_activation, make_norm

__all__ = [
    "ChannelShuffle",
    "ConvNormAct",
    "ConvNormAct3d",
    "DepthwiseConv2d",
    "DepthwiseSeparableConv2d",
    "Permute",
    "channel_shuffle",
]
__dir__ = public_dir(__name__, __all__)

_Size2 = int | tuple[int, int]


def _check_int(name: str, value: object, minimum: int, maximum: int = MAX_CHANNELS) -> int:
    return check_int(name, value, minimum, maximum)


def _pair(name: str, value: object, minimum: int = 1) -> tuple[int, int]:
    """``int`` or a pair of ints in ``[minimum, MAX_KERNEL_SIZE]`` as a tuple of two ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
        first, second = (_check_int(name, v, minimum, MAX_KERNEL_SIZE) for v in value)
        return (first, second)
    _check_int(name, value, minimum, MAX_KERNEL_SIZE)
    return (value, value)


def _resolve_padding(
    padding: object, kernel_size: tuple[int, int], stride: tuple[int, int], dilation: tuple
) -> tuple[int, int] | str:
    """The padding passed to ``nn.Conv2d`` (``None``: the module's Convention)."""
    if padding is None:
        totals = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
        if stride == (1, 1) and any(t % 2 for t in totals):
            return "same"
        return (totals[0] // 2, totals[1] // 2)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(
                f"padding must be None, an int, a pair, 'same' or 'valid'; got {padding!r}"
            )
        if padding == "same" and stride != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
        return padding
    return _pair("padding", padding, minimum=0)


def _check_groups(groups: int, in_channels: int, out_channels: int) -> None:
    for name, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
        if channels % groups:
            raise ValueError(f"groups={groups} must divide {name}={channels}")


def _check_input(x: Tensor, conv: nn.Conv2d) -> None:
    """``x`` fit for ``conv`` (skipped while tracing: see `is_tracing`)."""
    if not is_tracing(x):  # reading conv.weight would show in a torch.fx graph
        check_image_batch("x", x, conv.in_channels, weight=conv.weight)


@LAYERS.register(name="conv_norm_act")
class ConvNormAct(nn.Module):
    """``Conv2d -> norm -> activation``, the basic block of most CNNs.

    Args:
        in_channels: Input channels ``C_in``.
        out_channels: Output channels ``C_out``.
        kernel_size: Kernel size, an int or ``(kh, kw)``.
        stride: Stride, an int or a pair.
        padding: ``None`` (default) keeps the size at stride 1 (the module's Convention);
            otherwise an int, a pair, ``"same"`` or ``"valid"`` as ``nn.Conv2d``.
        dilation: Dilation, an int or a pair.
        groups: Convolution groups; must divide ``in_channels`` and ``out_channels``.
        norm: A name (``"bn"``, ``"gn"``, ...), a factory ``f(C_out)`` or ``None``
            (`visionblocks.nn.layers.make_norm`).
        act: A name (``"relu"``, ``"silu"``, ...), a zero-argument factory or ``None``
            (`visionblocks.nn.layers.make_activation`).
        bias: Give the convolution a bias. ``None`` (default): only when ``norm`` is
            ``None`` (a norm's shift makes the bias redundant).
        inplace: Use the in-place variant of a named activation (as torchvision's
            ``Conv2dNormActivation``).

    Attributes:
        conv (nn.Conv2d): The convolution.
        norm (nn.Module): The norm, ``nn.Identity`` when ``norm=None``.
        act (nn.Module): The activation, ``nn.Identity`` when ``act=None``.

    Shape:
        - Input: ``(B, C_in, H, W)``.
        - Output: ``(B, C_out, H_out, W_out)`` with
          ``H_out = floor((H + 2 * pad - dilation * (k - 1) - 1) / stride) + 1``
          (``H_out = H`` at stride 1 with ``padding=None``); dtype: the module notes.

    TorchScript: scripting a block with a ``torch.nn.SyncBatchNorm`` norm raises a
    ``RuntimeError`` (torch's does not compile): script inference models with plain BatchNorms.

    Raises:
        TypeError: Non-int sizes, an ``act``/``norm`` of the wrong type; in ``forward``, an
            input that fails the module's checks by type or dtype.
        ValueError: Sizes out of the module's bounds, ``groups`` not dividing the channels,
            an unknown ``norm``/``act`` name; in ``forward``, a wrong shape or device.

    Examples:
        >>> import torch
        >>> block = ConvNormAct(16, 32, kernel_size=3, stride=2, act="silu")
        >>> block(torch.randn(2, 16, 15, 15)).shape
        torch.Size([2, 32, 8, 8])
        >>> block.conv.bias is None, type(block.norm).__name__, type(block.act).__name__
        (True, 'BatchNorm2d', 'SiLU')
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _Size2 = 3,
        stride: _Size2 = 1,
        padding: _Size2 | str | None = None,
        dilation: _Size2 = 1,
        groups: int = 1,
        norm: NormSpec = "bn",
        act: ActSpec = "relu",
        bias: bool | None = None,
        *,
        inplace: bool = True,
    ) -> None:
        super().__init__()
        _check_int("in_channels", in_channels, 1)
        _check_int("out_channels", out_channels, 1)
        _check_int("groups", groups, 1)
        _check_groups(groups, in_channels, out_channels)
        ks = _pair("kernel_size", kernel_size)
        st = _pair("stride", stride)
        dil = _pair("dilation", dilation)
        pad = _resolve_padding(padding, ks, st, dil)
        if bias is not None:
            check_type("bias", bias, bool)
        check_type("inplace", inplace, bool)
        check_conv_weights(in_channels, out_channels, ks, groups)
        use_bias = norm is None if bias is None else bias
        self.conv = nn.Conv2d(
            in_channels, out_channels, ks, st, pad, dil, groups=groups, bias=use_bias
        )
        self.norm = make_norm(norm, out_channels)
        self.act = make_activation(act, inplace=inplace)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            _check_input(x, self.conv)
        return self.act(self.norm(self.conv(x)))

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles: the block; a clear error for a SyncBatchNorm."""
        if isinstance(self.norm, nn.SyncBatchNorm):
            raise RuntimeError(
                f"ConvNormAct with a {type(self.norm).__name__} norm does not compile with "
                "torch.jit.script: torch.nn.SyncBatchNorm does not (its forward calls "
                "torch.distributed); script a model with plain BatchNorms for inference"
            )
        return self


@LAYERS.register(name="depthwise_conv")
class DepthwiseConv2d(nn.Conv2d):
    """Depthwise convolution: every input channel convolved with its own ``multiplier`` filters.

    An ``nn.Conv2d`` with ``groups=channels`` and ``out_channels=channels * multiplier``
    (output channel ``c * multiplier + m`` from input channel ``c``), behaving exactly like it.

    Args:
        channels: Input channels ``C``.
        kernel_size: Kernel size, an int or a pair.
        stride: Stride, an int or a pair.
        padding: As `ConvNormAct`.
        dilation: Dilation, an int or a pair.
        multiplier: Filters per input channel.
        bias: Add a learnable bias.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, C * multiplier, H_out, W_out)``, ``H_out`` as `ConvNormAct`.

    Raises:
        TypeError: Non-int sizes; in ``forward``, a wrong input type or dtype.
        ValueError: Sizes out of the module's bounds, an invalid ``padding``; in
            ``forward``, a wrong input shape or device.

    Examples:
        >>> import torch
        >>> dw = DepthwiseConv2d(8, kernel_size=5, stride=2, multiplier=2)
        >>> dw(torch.randn(1, 8, 16, 16)).shape
        torch.Size([1, 16, 8, 8])
        >>> dw.groups, tuple(dw.weight.shape)
        (8, (16, 1, 5, 5))
    """

    def __init__(
        self,
        channels: int,
        kernel_size: _Size2 = 3,
        stride: _Size2 = 1,
        padding: _Size2 | str | None = None,
        dilation: _Size2 = 1,
        multiplier: int = 1,
        bias: bool = False,
    ) -> None:
        _check_int("channels", channels, 1)
        _check_int("multiplier", multiplier, 1)
        _check_int("channels * multiplier", channels * multiplier, 1)
        check_type("bias", bias, bool)
        ks = _pair("kernel_size", kernel_size)
        st = _pair("stride", stride)
        dil = _pair("dilation", dilation)
        pad = _resolve_padding(padding, ks, st, dil)
        check_conv_weights(channels, channels * multiplier, ks, channels)
        super().__init__(
            channels, channels * multiplier, ks, st, pad, dil, groups=channels, bias=bias
        )

    def forward(self, x: Tensor) -> Tensor:
        """``nn.Conv2d.forward`` after checking ``x`` (so `fuse_modules` still folds it)."""
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            _check_input(x, self)
        return self._conv_forward(x, self.weight, self.bias)  # TorchScript has no super()


@LAYERS.register(name="depthwise_separable_conv")
class DepthwiseSeparableConv2d(nn.Module):
    """Depthwise ``k x k`` `ConvNormAct` followed by a pointwise ``1 x 1`` `ConvNormAct`.

    The MobileNet (v1) block: ``dw conv -> norm -> act -> 1x1 conv -> norm -> act``.

    Args:
        in_channels: Input channels ``C_in``.
        out_channels: Output channels ``C_out``.
        kernel_size: Depthwise kernel size.
        stride: Depthwise stride.
        dilation: Depthwise dilation (padding keeps the size at stride 1).
        norm: Norm of both convolutions (see `ConvNormAct`).
        act: Activation of both convolutions (see `ConvNormAct`).

    Attributes:
        depthwise (ConvNormAct): ``groups=C_in`` ``k x k`` convolution block.
        pointwise (ConvNormAct): ``1 x 1`` convolution block.

    Shape:
        - Input: ``(B, C_in, H, W)``.
        - Output: ``(B, C_out, H_out, W_out)``, ``H_out = ceil(H / stride)`` for odd ``k``.

    Raises:
        TypeError: Non-int sizes; in ``forward``, a wrong input type.
        ValueError: Sizes out of the module's bounds, unknown ``norm``/``act``; in
            ``forward``, a wrong input shape.

    Examples:
        >>> import torch
        >>> block = DepthwiseSeparableConv2d(32, 64, stride=2, act="relu6")
        >>> block(torch.randn(2, 32, 16, 16)).shape
        torch.Size([2, 64, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _Size2 = 3,
        stride: _Size2 = 1,
        dilation: _Size2 = 1,
        norm: NormSpec = "bn",
        act: ActSpec = "relu",
    ) -> None:
        super().__init__()
        _check_int("in_channels", in_channels, 1)
        self.depthwise = ConvNormAct(in_channels, in_channels, kernel_size, stride,
                                     dilation=dilation, groups=in_channels, norm=norm, act=act)  # fmt: skip
        self.pointwise = ConvNormAct(in_channels, out_channels, 1, norm=norm, act=act)

    def forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x))


def _triple(name: str, value: object, minimum: int = 1) -> tuple[int, int, int]:
    """``int`` or a triple of ints in ``[minimum, MAX_KERNEL_SIZE]`` as a tuple of three ints."""
    values = value if isinstance(value, (tuple, list)) else (value,) * 3
    if len(values) != 3:
        raise ValueError(f"{name} must be an int or a triple of ints, got {value!r}")
    first, second, third = (_check_int(name, v, minimum, MAX_KERNEL_SIZE) for v in values)
    return (first, second, third)


def _check_volume(x: Tensor, conv: nn.Conv3d) -> None:
    """``x`` a ``(B, C_in, D, H, W)`` input fit for ``conv`` (`check_image_batch`'s rules)."""
    if is_tracing(x):
        return
    check_floating("input", x)
    if x.dim() != 5 or x.shape[1] != conv.in_channels:
        raise ValueError(
            f"input must have shape (B, {conv.in_channels}, D, H, W), got {tuple(x.shape)}"
        )
    check_device("input", x, conv.weight.device, "the module's parameters")
    if x.dtype != conv.weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"input has dtype {x.dtype} but the module's parameters have {conv.weight.dtype}; "
            "cast one to the other (or run under torch.autocast)"
        )


@LAYERS.register(name="conv_norm_act3d")
class ConvNormAct3d(nn.Sequential):
    """``Conv3d -> norm -> activation`` on volumes: torchvision's ``Conv3dNormActivation``.

    Its arguments, its ``nn.Sequential`` indices (``0`` the convolution, then the norm and the
    activation when not ``None``: state dicts load both ways) and its outputs. Unlike
    `ConvNormAct`, ``norm_layer`` is a factory ``f(C_out)`` (torchvision's, not a name) and
    ``padding=None`` is torchvision's ``dilation * ((k - 1) // 2)`` per side (odd kernels keep
    the size at stride 1).

    Args:
        in_channels: Input channels ``C_in``.
        out_channels: Output channels ``C_out``.
        kernel_size: Kernel size, an int or ``(kd, kh, kw)``.
        stride: Stride, an int or a triple.
        padding: ``None`` (above), an int, a triple, ``"same"`` or ``"valid"``.
        groups: Convolution groups; must divide ``in_channels`` and ``out_channels``.
        norm_layer: A factory ``f(C_out)`` of the norm (``nn.BatchNorm3d``) or ``None``.
        activation_layer: A factory of the activation (``nn.ReLU``), a name in
            `visionblocks.nn.layers.ACTIVATIONS` or ``None``.
        dilation: Dilation, an int or a triple.
        inplace: Passed as ``inplace=`` to a factory activation (``None``: not passed).
        bias: Give the convolution a bias; ``None``: only when ``norm_layer`` is ``None``.

    Shape:
        - Input: ``(B, C_in, D, H, W)``; output ``(B, C_out, D_out, H_out, W_out)``, each side
          as ``nn.Conv3d``.

    Raises:
        TypeError: Non-int sizes, factories of the wrong type; in ``forward``, an input that
            is not a floating tensor of the weights' dtype.
        ValueError: Sizes out of the module's bounds, ``groups`` not dividing the channels; in
            ``forward``, a wrong shape or device.

    Examples:
        >>> import torch
        >>> block = ConvNormAct3d(4, 8, kernel_size=3, stride=2)
        >>> block(torch.randn(1, 4, 5, 9, 9)).shape
        torch.Size([1, 8, 3, 5, 5])
        >>> [type(m).__name__ for m in block]
        ['Conv3d', 'BatchNorm3d', 'ReLU']
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int] = 3,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] | str | None = None,
        groups: int = 1,
        norm_layer: Callable[[int], nn.Module] | None = nn.BatchNorm3d,
        activation_layer: ActSpec = nn.ReLU,
        dilation: int | tuple[int, int, int] = 1,
        inplace: bool | None = True,
        bias: bool | None = None,
    ) -> None:
        _check_int("in_channels", in_channels, 1)
        _check_int("out_channels", out_channels, 1)
        _check_int("groups", groups, 1)
        _check_groups(groups, in_channels, out_channels)
        ks, st, dil = (_triple(n, v) for n, v in (("kernel_size", kernel_size),
                                                   ("stride", stride), ("dilation", dilation)))  # fmt: skip
        if padding is None:
            padding = tuple(d * ((k - 1) // 2) for k, d in zip(ks, dil))
        elif not isinstance(padding, str):
            padding = _triple("padding", padding, minimum=0)
        for name, value in (("inplace", inplace), ("bias", bias)):
            if value is not None:
                check_type(name, value, bool)
        if norm_layer is not None and not callable(norm_layer):
            raise TypeError(f"norm_layer must be a factory or None, got {norm_layer!r}")
        check_conv_weights(in_channels, out_channels, (ks[0] * ks[1], ks[2]), groups)
        use_bias = norm_layer is None if bias is None else bias
        layers = [nn.Conv3d(in_channels, out_channels, ks, st, padding, dil, groups, use_bias)]
        if norm_layer is not None:
            layers.append(norm_layer(out_channels))
        if isinstance(activation_layer, str):
            try:
                layers.append(make_activation(activation_layer, inplace=bool(inplace)))
            except ValueError as exc:
                raise ValueError(f"activation_layer: {exc}") from None
        elif activation_layer is not None:
            if not callable(activation_layer):
                raise TypeError(f"activation_layer must be a factory, a name or None, got "
                                f"{activation_layer!r}")  # fmt: skip
            layers.append(activation_layer(**({} if inplace is None else {"inplace": inplace})))
        super().__init__(*layers)
        self.out_channels = out_channels

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            _check_volume(input, self[0])
        for module in self:
            input = module(input)
        return input


def _check_shuffle(x: Tensor, groups: int) -> None:
    if torch.jit.is_tracing():  # sizes are traced tensors there; checks would warn
        return
    check_tensor("x", x)
    _check_int("groups", groups, 1)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (B, C, ...), got {tuple(x.shape)}")
    if x.shape[1] % groups:
        raise ValueError(
            f"groups={groups} must divide the channels of x, got x of shape {tuple(x.shape)}"
        )


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """ShuffleNet's channel shuffle: interleave the channels of ``groups`` equal groups.

    Output channel ``j * groups + g`` is input channel ``g * (C // groups) + j``, as
    torchvision's ``shufflenetv2.channel_shuffle`` (any trailing dimensions allowed).

    Args:
        x (Tensor[B, C, *]): Input with channels in dim 1, any dtype.
        groups: Number of groups; must divide ``C``.

    Returns:
        Tensor[B, C, *]: The shuffled tensor in ``x``'s dtype and memory format (a view of
        ``x`` when ``groups`` is 1 or ``C``).

    Raises:
        TypeError: ``x`` not a tensor, ``groups`` not an int.
        ValueError: ``x`` with fewer than 2 dims, ``groups < 1`` or not dividing ``C``.

    Examples:
        >>> import torch
        >>> x = torch.arange(6).view(1, 6, 1, 1)
        >>> channel_shuffle(x, 2).flatten().tolist()
        [0, 3, 1, 4, 2, 5]
    """
    if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
        _check_shuffle(x, groups)
    if x.dim() == 4 and x.stride(1) == 1 and not x.is_contiguous():  # channels last: stay so
        nhwc = x.permute(0, 2, 3, 1)
        return nhwc.unflatten(3, (groups, -1)).transpose(3, 4).flatten(3, 4).permute(0, 3, 1, 2)
    return x.unflatten(1, (groups, -1)).transpose(1, 2).flatten(1, 2)


# A torch.fx leaf (its checks cannot run on proxies): models using it stay traceable.
torch.fx.wrap("channel_shuffle")


@LAYERS.register(name="channel_shuffle")
class ChannelShuffle(nn.Module):
    """Module form of `channel_shuffle` (no parameters; dtype and memory format as there).

    Args:
        groups: Number of groups; must divide the input's channels.

    Shape:
        - Input and output: ``(B, C, *)``.

    Raises:
        TypeError: ``groups`` not an int.
        ValueError: ``groups < 1``; in ``forward``, ``groups`` not dividing ``C``.

    Examples:
        >>> import torch
        >>> shuffle = ChannelShuffle(3)
        >>> shuffle(torch.arange(6.0).view(1, 6, 1, 1)).flatten().tolist()
        [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = _check_int("groups", groups, 1)

    def forward(self, x: Tensor) -> Tensor:
        return channel_shuffle(x, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


def _check_permuted(x: Tensor, dims: list[int]) -> None:
    if not is_tracing(x):  # proxies have no dims
        check_tensor("x", x)
        if x.dim() != len(dims):
            raise ValueError(f"x must have {len(dims)} dims for dims={dims}, got {tuple(x.shape)}")


@LAYERS.register(name="permute")
class Permute(nn.Module):
    """``torch.permute(x, dims)`` as a layer: torchvision's ``Permute`` (a view of ``x``).

    Args:
        dims: The new order of the input's dimensions, a permutation of ``0 .. n - 1``
            (negative indices count from the end).

    Shape:
        - Input: ``n`` dims; output: the same sizes in the order ``dims``.

    Raises:
        TypeError: ``dims`` not a sequence of ints; in ``forward``, a non-tensor input.
        ValueError: ``dims`` not a permutation; in ``forward``, an input without ``n`` dims.

    Examples:
        >>> import torch
        >>> Permute([0, 2, 3, 1])(torch.zeros(2, 3, 4, 5)).shape
        torch.Size([2, 4, 5, 3])
    """

    def __init__(self, dims: Sequence[int]) -> None:
        super().__init__()
        check_type("dims", dims, (list, tuple))
        for d in dims:
            check_int("dims", d)
        if sorted(d % len(dims) for d in dims) != list(range(len(dims))) or any(
            not -len(dims) <= d < len(dims) for d in dims
        ):
            raise ValueError(f"dims must be a permutation of 0 .. {len(dims) - 1}, got {dims!r}")
        self.dims = list(dims)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            _check_permuted(x, self.dims)
        return torch.permute(x, self.dims)

    def extra_repr(self) -> str:
        return f"dims={self.dims}"
