"""Weight initializers with group-aware fans, and rule-based `init_weights`.

Every initializer fills one module's ``weight`` and, when the module has one, its ``bias``
(``bias=None`` leaves the bias untouched). Called directly on a module without a weight
tensor (``nn.ReLU()``, or a norm layer with ``affine=False``) an initializer raises
``TypeError``; `init_weights` rules simply skip such modules.

Fans are group-aware: for grouped, depthwise and transposed convolutions,
``fan_in = in_channels / groups * prod(kernel_size)`` and
``fan_out = out_channels / groups * prod(kernel_size)`` (see `compute_fans`). PyTorch's own
initializers ignore ``groups`` (pytorch #23854) and read a transposed weight's dimensions
the wrong way round.

The initializers are registered in `visionblocks.registry.INITIALIZERS` as ``kaiming``,
``xavier``, ``normal``, ``trunc_normal``, ``constant``, ``c2_msra`` and ``c2_xavier``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.registry import INITIALIZERS
from visionblocks.init._fans import (
    check_number,
    check_truncation,
    draw_zero_mean,
    fill_bias,
    module_fans,
    weight_of,
)
from visionblocks.init._residual import zero_init_last_norm
from visionblocks.init._rules import apply_rules

__all__ = [
    "bias_init_with_prob",
    "c2_msra_fill",
    "c2_xavier_fill",
    "compute_fans",
    "constant_init",
    "init_weights",
    "kaiming_init",
    "normal_init",
    "trunc_normal_init",
    "xavier_init",
    "zero_init_last_norm",
]

_NONLINEARITIES = (
    *("linear", "sigmoid", "tanh", "relu", "leaky_relu", "selu"),
    *(f"conv{d}d" for d in (1, 2, 3)),
    *(f"conv_transpose{d}d" for d in (1, 2, 3)),
)


def _check_bias(bias: float | None) -> float | None:
    return None if bias is None else check_number("bias", bias)


def compute_fans(module: nn.Module) -> tuple[int, int]:
    """Group-aware ``(fan_in, fan_out)`` of a module's weight.

    Each fan counts the connections one weight really has:
    ``fan_in = in_channels / groups * prod(kernel_size)`` and
    ``fan_out = out_channels / groups * prod(kernel_size)``. Weight layouts:
    ``(out, in)`` for Linear, ``(out, in / groups, *k)`` for convolutions and
    ``(in, out / groups, *k)`` for transposed convolutions. Any module with an integer
    ``groups`` attribute (torch convolutions, torchvision's ``DeformConv2d``) is read as a
    convolution, and one with ``transposed=True`` as a transposed convolution. Other weights
    of 2 or more dimensions use PyTorch's ``(out, in, *receptive_field)`` reading.

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
        >>> nn.init._calculate_fan_in_and_fan_out(nn.Conv2d(64, 64, 3, groups=64).weight)
        (9, 576)
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

    The weight gets standard deviation ``gain / sqrt(fan)`` (``gain`` from
    ``torch.nn.init.calculate_gain(nonlinearity, a)``, ``fan`` from `compute_fans`), drawn
    from a normal or from ``U(-sqrt(3) * std, sqrt(3) * std)``. For ungrouped, non-transposed
    layers this draws exactly what ``torch.nn.init.kaiming_normal_``/``kaiming_uniform_``
    draw.

    Args:
        module: A layer with a weight of at least 2 dimensions (Linear, Conv, ConvTranspose).
        a: Negative slope of the rectifier (used when ``nonlinearity="leaky_relu"``).
        mode: ``"fan_in"`` preserves the variance of the forward pass, ``"fan_out"`` that of
            the backward pass.
        nonlinearity: A name accepted by ``torch.nn.init.calculate_gain`` (``"relu"``,
            ``"leaky_relu"``, ``"linear"``, ``"tanh"``, ...).
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
        >>> kaiming_init(nn.ReLU())
        Traceback (most recent call last):
        ...
        TypeError: kaiming_init initialises a module's weight tensor, but ReLU has no weight; ...
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

    ``a`` and ``b`` are absolute bounds (as in ``torch.nn.init.trunc_normal_`` and timm), not
    multiples of ``std``. An interval that lies (almost) entirely outside the distribution
    (``[a, b]`` more than 6 ``std`` from ``mean``) or holds so little of it that torch's
    sampler would need over a thousand tries per value is refused: sampling it would not end
    (or would return the bound itself).

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

    Same draw as fvcore's ``c2_msra_fill`` (``kaiming_normal_(mode="fan_out",
    nonlinearity="relu")``) for ungrouped layers; with groups the fan is group-aware.

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

    Same draw as fvcore's ``c2_xavier_fill`` (``kaiming_uniform_(a=1)``, i.e. fan_in and
    gain 1) for ungrouped, non-transposed layers; otherwise the fan is group-aware.

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
    """Bias that makes ``sigmoid(bias) == prior_prob``: ``-log((1 - p) / p)``.

    Used for the classifier of dense detectors (RetinaNet, FCOS) so that training starts
    with every anchor predicting foreground with probability ``prior_prob``.

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
        >>> bias_init_with_prob(0.5)
        0.0
        >>> bias_init_with_prob(1.0)
        Traceback (most recent call last):
        ...
        ValueError: prior_prob must be in (0.0, 1.0), got 1.0
    """
    p = check_number("prior_prob", prior_prob)
    check_range("prior_prob", p, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    return math.log(p) - math.log1p(-p)  # = -log((1 - p) / p), accurate near 0 and 1


def init_weights(
    model: nn.Module, rules: Sequence[Mapping[str, Any]] | Mapping[str, Any]
) -> dict[str, str]:
    """Initialise the layers of ``model`` by rules matched on layer type and module name.

    A rule is a dict ``{"type": <INITIALIZERS name or callable>, "layer": ..., "name": ...,
    **params}``; ``params`` go to the initializer as keywords
    (``{"type": "constant", "val": 0.5}``).

    - ``layer``: a class name, a class, or a list of them. A module matches when it is an
      instance of a given class, or when a given name is the name of its class or of one of
      its base classes (``"Conv2d"`` also matches timm's ``Conv2dSame``; ``"_ConvNd"``
      matches every convolution). A name that is neither a class of ``model`` nor of
      ``torch.nn`` is a typo and raises.
    - ``name``: a regular expression that must match the whole qualified module name
      (``re.fullmatch``): ``"head"`` selects the module ``head`` only, ``r"head\\..*"``
      everything under it. A name pattern that selects no module with a weight raises.
    - Neither: the rule matches every module with a weight.

    Only modules with a ``weight`` tensor are initialised (others, and norm layers with
    ``affine=False``, are skipped). Each module gets exactly one rule: the last one that
    matches it (later rules win). Modules are initialised in ``named_modules()`` order, so a
    fixed seed gives a fixed result; shared modules are initialised once.

    Block initializers (``zero_init_last_norm``) act on whole residual blocks: their rules
    run after all weight rules, on every module their ``layer``/``name`` select (a
    ``name`` pattern may then select modules without a weight), or on the whole model when
    the rule has neither; the report lists the blocks they changed.

    Rules are checked before any weight is touched (types, keys, layer names, patterns,
    parameter names). Parameter values are checked by the initializer itself, so an error in
    one can stop the walk part-way; its message names the rule and the module.

    Args:
        model: The model to initialise in place.
        rules: A list of rule dicts (a single dict is accepted too).

    Returns:
        dict[str, str]: ``{module name: "rules[i] type(params)"}`` for every module
        initialised, in module order, then the blocks changed by block initializers.

    Raises:
        TypeError: If ``model`` is not a module, a rule is not a dict, or ``type``, ``layer``
            or ``name`` has the wrong type.
        ValueError: For an unknown initializer, unknown parameter keys, an unknown layer name,
            an invalid pattern or one that selects nothing, or when an initializer rejects its
            parameters or a matched module.

    Examples:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 2, 1))
        >>> report = init_weights(model, [
        ...     {"type": "kaiming", "layer": "Conv2d", "mode": "fan_out"},
        ...     {"type": "constant", "layer": nn.BatchNorm2d, "val": 1.0},
        ...     {"type": "normal", "name": "3", "std": 0.01, "bias": bias_init_with_prob(0.01)},
        ... ])
        >>> for name, rule in report.items():
        ...     print(name, "<-", rule)
        0 <- rules[0] kaiming(mode='fan_out')
        1 <- rules[1] constant(val=1.0)
        3 <- rules[2] normal(std=0.01, bias=-4.59511985013459)
        >>> import torchvision
        >>> resnet = torchvision.models.resnet18()
        >>> report = init_weights(resnet, [
        ...     {"type": "kaiming", "layer": "Conv2d"},
        ...     {"type": "zero_init_last_norm"},  # the whole model: every residual block
        ... ])
        >>> report["layer1.0"], float(resnet.layer1[0].bn2.weight.detach().abs().sum())
        ('rules[1] zero_init_last_norm()', 0.0)
    """
    check_type("model", model, nn.Module)
    return apply_rules(model, rules, INITIALIZERS)
