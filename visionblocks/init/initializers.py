"""The per-module initializers, registered in `INITIALIZERS` (see `visionblocks.init`)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import INITIALIZERS
from visionblocks.init._fans import (
    check_number,
    check_truncation,
    draw_zero_mean,
    fill_bias,
    module_fans,
    weight_of,
)

__all__ = [
    "bias_init_with_prob",
    "c2_msra_fill",
    "c2_xavier_fill",
    "compute_fans",
    "constant_init",
    "kaiming_init",
    "normal_init",
    "trunc_normal_init",
    "xavier_init",
]
__dir__ = public_dir(__name__, __all__)

_NONLINEARITIES = (
    *("linear", "sigmoid", "tanh", "relu", "leaky_relu", "selu"),
    *(f"conv{d}d" for d in (1, 2, 3)),
    *(f"conv_transpose{d}d" for d in (1, 2, 3)),
)


def _check_bias(bias: float | None) -> float | None:
    return None if bias is None else check_number("bias", bias)


def compute_fans(module: nn.Module) -> tuple[int, int]:
    """Group-aware ``(fan_in, fan_out)`` of a module's weight (see `visionblocks.init`).

    Any module with an integer ``groups`` attribute (torch convolutions, torchvision's
    ``DeformConv2d``) is read as a convolution, one with ``transposed=True`` as a transposed
    convolution; other weights use PyTorch's ``(out, in, *receptive_field)`` reading.

    Args:
        module: A layer with a ``weight`` tensor of at least 2 dimensions.

    Returns:
        tuple[int, int]: ``(fan_in, fan_out)``.

    Raises:
        TypeError: If ``module`` is not an ``nn.Module`` or has no weight tensor.
        ValueError: If the weight has fewer than 2 dimensions, is a lazy or parametrized
            weight, or ``groups`` does not divide it.

    Examples:
        >>> from torch import nn
        >>> compute_fans(nn.Conv2d(64, 64, 3, groups=64))  # depthwise
        (9, 9)
        >>> compute_fans(nn.ConvTranspose2d(8, 4, 2))
        (32, 16)
    """
    return module_fans(module, "compute_fans")


@INITIALIZERS.register(name="kaiming")
def kaiming_init(
    module: nn.Module,
    a: float = 0,
    mode: Literal["fan_in", "fan_out"] = "fan_out",
    nonlinearity: str = "relu",
    distribution: Literal["normal", "uniform"] = "normal",
    bias: float | None = 0.0,
) -> None:
    """He (Kaiming) initialisation with group-aware fans, in place.

    Standard deviation ``gain / sqrt(fan)`` (``torch.nn.init.calculate_gain(nonlinearity,
    a)``, `compute_fans`), drawn from a normal or ``U(-sqrt(3) * std, sqrt(3) * std)``: for
    ungrouped, non-transposed layers, exactly ``torch.nn.init.kaiming_normal_``'s draw.

    Args:
        module: A layer with a weight of at least 2 dimensions (Linear, Conv, ConvTranspose).
        a: Negative slope of the rectifier (``nonlinearity="leaky_relu"``).
        mode: ``"fan_in"`` (forward variance) or ``"fan_out"`` (backward variance).
        nonlinearity: A name ``torch.nn.init.calculate_gain`` accepts.
        distribution: ``"normal"`` or ``"uniform"``.
        bias: Value for the bias; ``None`` leaves it untouched.

    Raises:
        TypeError: If ``module`` has no weight tensor, or an argument has the wrong type.
        ValueError: If an option is unknown or the weight has fewer than 2 dimensions.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> conv = nn.Conv2d(256, 256, 3, groups=256)  # depthwise: fan_out = 9
        >>> kaiming_init(conv, mode="fan_out")
        >>> round(conv.weight.std().item() / (2 / 9) ** 0.5, 1)
        1.0
    """
    _kaiming(module, a, mode, nonlinearity, distribution, bias, "kaiming_init")


def _kaiming(
    module: nn.Module,
    a: float,
    mode: str,
    nonlinearity: str,
    distribution: str,
    bias: float | None,
    caller: str,
) -> None:
    """`kaiming_init`, with errors naming ``caller`` (``c2_msra_fill``...)."""
    weight = weight_of(module, caller)
    a = check_number("a", a)
    for name, value, choices in (
        ("mode", mode, ("fan_in", "fan_out")),
        ("nonlinearity", nonlinearity, _NONLINEARITIES),
        ("distribution", distribution, ("normal", "uniform")),
    ):
        check_type(name, value, str)
        check_choice(name, value, choices)
    bias = _check_bias(bias)
    fan_in, fan_out = module_fans(module, caller)
    fan = max(fan_in if mode == "fan_in" else fan_out, 1)  # 0 only for an empty weight
    draw_zero_mean(weight, nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan), distribution)
    fill_bias(module, bias)


@INITIALIZERS.register(name="xavier")
def xavier_init(
    module: nn.Module,
    gain: float = 1.0,
    distribution: Literal["uniform", "normal"] = "uniform",
    bias: float | None = 0.0,
) -> None:
    """Glorot (Xavier) initialisation with group-aware fans, in place.

    Standard deviation ``gain * sqrt(2 / (fan_in + fan_out))`` (fans from `compute_fans`),
    drawn from ``U(-sqrt(3) * std, sqrt(3) * std)`` or a normal.

    Args:
        module: A layer with a weight of at least 2 dimensions.
        gain: Scale factor ``>= 0`` (e.g. ``torch.nn.init.calculate_gain("relu")``).
        distribution: ``"uniform"`` or ``"normal"``.
        bias: Value for the bias; ``None`` leaves it untouched.

    Raises:
        TypeError: If ``module`` has no weight tensor, or an argument has the wrong type.
        ValueError: If ``distribution`` is unknown, ``gain`` negative or not finite, or the
            weight has fewer than 2 dimensions.

    Examples:
        >>> from torch import nn
        >>> fc = nn.Linear(300, 100)
        >>> xavier_init(fc, distribution="uniform")
        >>> bool(fc.weight.abs().max() <= (6 / 400) ** 0.5), fc.bias.abs().sum().item()
        (True, 0.0)
    """
    weight = weight_of(module, "xavier_init")
    gain = check_number("gain", gain)
    check_range("gain", gain, 0.0)
    check_type("distribution", distribution, str)
    check_choice("distribution", distribution, ("uniform", "normal"))
    bias = _check_bias(bias)
    fan_in, fan_out = module_fans(module, "xavier_init")
    draw_zero_mean(weight, gain * math.sqrt(2.0 / max(fan_in + fan_out, 1)), distribution)
    fill_bias(module, bias)


@INITIALIZERS.register(name="normal")
def normal_init(
    module: nn.Module, mean: float = 0.0, std: float = 1.0, bias: float | None = 0.0
) -> None:
    """Fill the weight from ``N(mean, std**2)`` in place; weights of any shape.

    Args:
        module: A layer with a ``weight`` tensor.
        mean: Mean of the normal.
        std: Standard deviation, ``>= 0``.
        bias: Value for the bias; ``None`` leaves it untouched.

    Raises:
        TypeError: If ``module`` has no weight tensor, or an argument is not a number.
        ValueError: If ``std`` is negative.

    Examples:
        >>> from torch import nn
        >>> import math
        >>> head = nn.Conv2d(256, 80, 3)
        >>> normal_init(head, std=0.01, bias=-math.log(99))  # RetinaNet classifier
        >>> round(head.bias[0].item(), 4)
        -4.5951
    """
    weight = weight_of(module, "normal_init")
    mean = check_number("mean", mean)
    std = check_number("std", std)
    check_range("std", std, 0.0)
    bias = _check_bias(bias)
    with torch.no_grad():
        weight.normal_(mean, std)
    fill_bias(module, bias)


@INITIALIZERS.register(name="trunc_normal")
def trunc_normal_init(
    module: nn.Module,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    bias: float | None = 0.0,
) -> None:
    """Fill the weight from ``N(mean, std**2)`` truncated to ``[a, b]``, in place.

    ``a`` and ``b`` are absolute bounds (as in ``torch.nn.init.trunc_normal_``), not
    multiples of ``std``; an interval (almost) entirely outside the distribution is refused.

    Args:
        module: A layer with a ``weight`` tensor.
        mean: Mean of the normal before truncation.
        std: Standard deviation before truncation, ``> 0``.
        a: Lower bound.
        b: Upper bound, ``> a``.
        bias: Value for the bias; ``None`` leaves it untouched.

    Raises:
        TypeError: If ``module`` has no weight tensor, or an argument is not a number.
        ValueError: If an argument is not finite, ``std <= 0``, ``a >= b``, or ``[a, b]`` lies
            (almost) entirely outside ``N(mean, std**2)``.

    Examples:
        >>> from torch import nn
        >>> fc = nn.Linear(768, 768)
        >>> trunc_normal_init(fc, std=0.02, a=-0.04, b=0.04)
        >>> bool(fc.weight.abs().max() <= 0.04)
        True
    """
    weight = weight_of(module, "trunc_normal_init")
    mean = check_number("mean", mean)
    std = check_number("std", std)
    a = check_number("a", a)
    b = check_number("b", b)
    check_range("std", std, 0.0, low_inclusive=False)
    if not a < b:
        raise ValueError(f"trunc_normal_init needs a < b, got a={a}, b={b}")
    check_truncation(mean, std, a, b)
    bias = _check_bias(bias)
    nn.init.trunc_normal_(weight, mean, std, a, b)
    fill_bias(module, bias)


@INITIALIZERS.register(name="constant")
def constant_init(module: nn.Module, val: float, bias: float | None = 0.0) -> None:
    """Fill the weight with ``val`` in place; weights of any shape (norm layers included).

    Args:
        module: A layer with a ``weight`` tensor.
        val: The value.
        bias: Value for the bias; ``None`` leaves it untouched.

    Raises:
        TypeError: If ``module`` has no weight tensor, or ``val``/``bias`` is not a number.

    Examples:
        >>> from torch import nn
        >>> bn = nn.BatchNorm2d(4)
        >>> constant_init(bn, 0.5, bias=0.1)
        >>> bn.weight.tolist(), [round(x, 3) for x in bn.bias.tolist()]
        ([0.5, 0.5, 0.5, 0.5], [0.1, 0.1, 0.1, 0.1])
    """
    weight = weight_of(module, "constant_init")
    val = check_number("val", val)
    bias = _check_bias(bias)
    with torch.no_grad():
        weight.fill_(val)
    fill_bias(module, bias)


@INITIALIZERS.register(name="c2_msra")
def c2_msra_fill(module: nn.Module) -> None:
    """Caffe2's "MSRAFill": Kaiming normal, ``mode="fan_out"``, ReLU gain; bias 0.

    Same draw as fvcore's ``c2_msra_fill`` for ungrouped layers; group-aware fans.

    Args:
        module: A layer with a weight of at least 2 dimensions.

    Raises:
        TypeError: If ``module`` has no weight tensor.
        ValueError: If the weight has fewer than 2 dimensions.

    Examples:
        >>> from torch import nn
        >>> conv = nn.Conv2d(16, 32, 3)
        >>> c2_msra_fill(conv)
        >>> conv.bias.abs().sum().item()
        0.0
    """
    _kaiming(module, 0.0, "fan_out", "relu", "normal", 0.0, "c2_msra_fill")


@INITIALIZERS.register(name="c2_xavier")
def c2_xavier_fill(module: nn.Module) -> None:
    """Caffe2's "XavierFill": ``U(-sqrt(3 / fan_in), sqrt(3 / fan_in))``; bias 0.

    Same draw as fvcore's ``c2_xavier_fill`` for ungrouped layers; group-aware fans.

    Args:
        module: A layer with a weight of at least 2 dimensions.

    Raises:
        TypeError: If ``module`` has no weight tensor.
        ValueError: If the weight has fewer than 2 dimensions.

    Examples:
        >>> from torch import nn
        >>> conv = nn.Conv2d(3, 8, 1)  # fan_in = 3
        >>> c2_xavier_fill(conv)
        >>> bool(conv.weight.abs().max() <= 1.0)
        True
    """
    _kaiming(module, 1.0, "fan_in", "leaky_relu", "uniform", 0.0, "c2_xavier_fill")


def bias_init_with_prob(prior_prob: float) -> float:
    """Bias that makes ``sigmoid(bias) == prior_prob``: ``-log((1 - p) / p)`` (RetinaNet, FCOS).

    Args:
        prior_prob: Prior foreground probability, in ``(0, 1)``.

    Returns:
        float: The bias value.

    Raises:
        TypeError: If ``prior_prob`` is not a number.
        ValueError: If ``prior_prob`` is not strictly between 0 and 1.

    Examples:
        >>> round(bias_init_with_prob(0.01), 4)
        -4.5951
    """
    p = check_number("prior_prob", prior_prob)
    check_range("prior_prob", p, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    return math.log(p) - math.log1p(-p)  # = -log((1 - p) / p), accurate near 0 and 1
