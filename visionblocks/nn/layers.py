"""Activation and normalisation factories: names (``"relu"``, ``"bn"``, ...) to fresh modules.

Blocks such as `ConvNormAct` take ``act=`` and ``norm=`` as a name, ``None`` (an
``nn.Identity``) or a factory, built by `make_activation` and `make_norm`. An entry added to
the plain dicts `ACTIVATIONS` and `NORMS` is usable everywhere:

    ACTIVATIONS["mish"] = lambda inplace=False: nn.Mish(inplace=inplace)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_number, check_positive_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_device, check_image_batch, is_tracing
from visionblocks.nn._limits import MAX_CHANNELS, check_channels

__all__ = [
    "ACTIVATIONS",
    "NORMS",
    "ActSpec",
    "LayerNorm2d",
    "NormSpec",
    "group_norm_groups",
    "make_activation",
    "make_norm",
]
__dir__ = public_dir(__name__, __all__)

ActSpec: TypeAlias = str | Callable[[], nn.Module] | None
"""What ``act=`` accepts: a name in `ACTIVATIONS`, a zero-argument factory or ``None``."""
NormSpec: TypeAlias = str | Callable[[int], nn.Module] | None
"""What ``norm=`` accepts: a name in `NORMS`, a factory ``f(num_channels)`` or ``None``."""


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channel dimension of a ``(B, C, H, W)`` tensor (the ``"ln2d"`` norm).

    Every pixel is normalised over its ``C`` channels, with a per-channel affine, as the
    LayerNorm of ConvNeXt; the state dict is that of ``nn.LayerNorm(C)``.

    Args:
        num_channels: Number of channels ``C`` (at most 65,536).
        eps: Added to the variance (default ``1e-6``, as ConvNeXt); positive and finite.
        elementwise_affine: Learn a per-channel scale and shift.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, C, H, W)``, same dtype (also under ``torch.autocast``), always
          ``channels_last`` in memory (the norm runs on a channels-last view).

    Raises:
        TypeError: Non-int ``num_channels``, non-number ``eps``, non-bool
            ``elementwise_affine``; in ``forward``, a non-floating-point input.
        ValueError: ``num_channels`` outside ``[1, 65536]``, ``eps`` not positive and finite;
            in ``forward``, an input not ``(B, C, H, W)`` or not on the parameters' device
            (checks skipped while tracing or scripted).

    Examples:
        >>> import torch
        >>> norm = LayerNorm2d(8)
        >>> x = torch.randn(2, 8, 4, 4)
        >>> y = norm(x)
        >>> torch.allclose(y.mean(dim=1), torch.zeros(2, 4, 4), atol=1e-5)
        True
    """

    def __init__(
        self, num_channels: int, eps: float = 1e-6, elementwise_affine: bool = True
    ) -> None:
        check_channels("num_channels", num_channels)
        check_number("eps", eps, 0.0, math.inf, low_inclusive=False, high_inclusive=False)
        check_type("elementwise_affine", elementwise_affine, bool)
        super().__init__(num_channels, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # Python-only checks: TorchScript skips the block
            self._check_input(x)
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        if torch.jit.is_scripting() and x.requires_grad:
            # TorchScript's autodiff hands this view out as a view of a leaf, which an
            # in-place activation after the norm may not modify: a copy, same layout.
            x = x.clone(memory_format=torch.channels_last)
        return x

    def _check_input(self, x: Tensor) -> None:
        if not is_tracing(x):
            check_image_batch("x", x, self.normalized_shape[0])
            if self.weight is not None:
                check_device("x", x, self.weight.device, "the module's parameters")


def group_norm_groups(num_channels: int, max_groups: int = 32) -> int:
    """GroupNorm groups of the ``"gn"`` norm: the largest divisor of ``num_channels`` that is
    at most ``max_groups`` (32 as in Wu & He, 2018, when it divides; never failing).

    Args:
        num_channels: Channels to normalise (in ``[1, 65536]``).
        max_groups: Upper bound on the number of groups (in ``[1, 65536]``).

    Returns:
        int: The group count.

    Raises:
        TypeError: Non-int arguments.
        ValueError: Arguments below 1 or above 65,536.

    Examples:
        >>> group_norm_groups(256), group_norm_groups(48), group_norm_groups(37)
        (32, 24, 1)
    """
    for name, value in (("num_channels", num_channels), ("max_groups", max_groups)):
        check_positive_int(name, value, MAX_CHANNELS)
    for groups in range(min(num_channels, max_groups), 0, -1):
        if num_channels % groups == 0:
            return groups
    return 1  # unreachable: 1 divides everything


ACTIVATIONS: dict[str, Callable[..., nn.Module]] = {
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "silu": nn.SiLU,
    "gelu": lambda inplace=False: nn.GELU(),  # no in-place variant
    "hardswish": nn.Hardswish,
    "leaky_relu": lambda inplace=False: nn.LeakyReLU(negative_slope=0.01, inplace=inplace),
}
"""Activation names to factories ``f(inplace=False) -> nn.Module``; ``gelu`` is the exact (erf)
GELU, without ``inplace``; ``leaky_relu`` has slope 0.01 (``functools.partial`` for another)."""

NORMS: dict[str, Callable[[int], nn.Module]] = {
    "bn": nn.BatchNorm2d,
    "syncbn": nn.SyncBatchNorm,
    "gn": lambda num_channels: nn.GroupNorm(group_norm_groups(num_channels), num_channels),
    "ln2d": LayerNorm2d,
}
"""Norm names to factories ``f(num_channels) -> nn.Module``, with torch's defaults; ``syncbn``
is plain BatchNorm when no process group is initialised, ``gn`` uses `group_norm_groups`."""


def _lookup(arg: str, kind: str, table: dict[str, Callable[..., nn.Module]], name: str) -> Callable:
    key = name.lower()
    if key not in table:
        allowed = ", ".join(repr(n) for n in (*table, None))
        raise ValueError(
            f"{arg}: unknown {kind} {name!r}; choose one of {allowed} or pass a factory"
        )
    return table[key]


def _check_spec(kind: str, spec: object) -> None:
    if isinstance(spec, nn.Module):
        raise TypeError(
            f"{kind} must be a name, a factory or None, got a module instance "
            f"({type(spec).__name__}); pass the class (e.g. {type(spec).__name__}) so that "
            "every block gets its own layer"
        )
    if spec is not None and not isinstance(spec, str) and not callable(spec):
        raise TypeError(f"{kind} must be a name, a factory or None, got {type(spec).__name__}")


def _check_built(kind: str, spec: object, module: object) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"the {kind} factory {spec!r} must return an nn.Module, got {type(module).__name__}"
        )
    return module


def make_activation(act: ActSpec, *, inplace: bool = False) -> nn.Module:
    """Build a fresh activation module from a name, a factory or ``None``.

    Args:
        act: A name in `ACTIVATIONS` (case-insensitive), a zero-argument callable returning
            a module (a class such as ``nn.Tanh``, or a ``functools.partial``), or ``None``
            for ``nn.Identity``.
        inplace: Ask for the in-place variant. Only used for names (and ignored by
            ``"gelu"``); factories are called without arguments.

    Returns:
        nn.Module: A new module. Named activations keep the input's dtype (also under
        ``torch.autocast``).

    Raises:
        ValueError: An unknown name (the message lists the choices).
        TypeError: A module instance instead of a class or factory, another type, or a
            factory that does not return an ``nn.Module``.

    Examples:
        >>> from torch import nn
        >>> make_activation("relu6")
        ReLU6()
        >>> make_activation("silu", inplace=True)
        SiLU(inplace=True)
        >>> make_activation(nn.Tanh)
        Tanh()
    """
    _check_spec("act", act)
    check_type("inplace", inplace, bool)
    if act is None:
        return nn.Identity()
    if isinstance(act, str):
        factory = _lookup("act", "activation", ACTIVATIONS, act)
        return _check_built("activation", act, factory(inplace=inplace))
    return _check_built("activation", act, act())


def make_norm(norm: NormSpec, num_channels: int) -> nn.Module:
    """Build a fresh normalisation module for ``num_channels`` channels.

    Args:
        norm: A name in `NORMS` (case-insensitive: ``"bn"``, ``"syncbn"``, ``"gn"``, ``"ln2d"``); a
            callable ``f(num_channels)`` returning a module (``nn.InstanceNorm2d``,
            ``functools.partial(nn.GroupNorm, 8)``); or ``None`` for ``nn.Identity``.
        num_channels: Channels of the normalised tensor (in ``[1, 65536]``).

    Returns:
        nn.Module: A new module. Named norms return the input's dtype (also under
        ``torch.autocast``) and keep float32 parameters and statistics.

    Raises:
        ValueError: An unknown name (the message lists the choices), ``num_channels``
            outside ``[1, 65536]``.
        TypeError: A module instance instead of a class or factory, another type, or a
            factory that does not return an ``nn.Module``.

    Examples:
        >>> bn = make_norm("bn", 64)
        >>> type(bn).__name__, bn.num_features
        ('BatchNorm2d', 64)
        >>> gn = make_norm("gn", 48)
        >>> type(gn).__name__, gn.num_groups, gn.num_channels
        ('GroupNorm', 24, 48)
    """
    _check_spec("norm", norm)
    check_positive_int("num_channels", num_channels, MAX_CHANNELS)
    if norm is None:
        return nn.Identity()
    if isinstance(norm, str):
        return _check_built("norm", norm, _lookup("norm", "norm", NORMS, norm)(num_channels))
    return _check_built("norm", norm, norm(num_channels))
