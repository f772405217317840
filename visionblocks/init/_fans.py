"""Private helpers of `visionblocks.init`: reaching a module's weight, its group-aware fans,
and the argument checks the initializers share."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

__all__ = [
    "check_number",
    "check_truncation",
    "draw_zero_mean",
    "fill_bias",
    "has_weight",
    "module_fans",
    "weight_of",
    "zero_norm_weight",
]


def has_weight(module: nn.Module) -> bool:
    """True when ``module.weight`` exists and is a tensor (not None)."""
    return isinstance(getattr(module, "weight", None), Tensor)


def weight_of(module: nn.Module, caller: str) -> Tensor:
    """Return ``module.weight``, or raise naming ``caller`` when it cannot be initialised."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"{caller} expects an nn.Module as module, got {type(module).__name__} ({module!r})"
        )
    kind = type(module).__name__
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor):
        what = "weight=None" if hasattr(module, "weight") else "no weight"
        raise TypeError(
            f"{caller} initialises a module's weight tensor, but {kind} has {what}; "
            "apply it to layers with weights (init_weights rules skip such modules)"
        )
    if not (weight.is_floating_point() or weight.is_complex()):
        raise TypeError(
            f"{caller} initialises floating-point weights, but the weight of {kind} has dtype "
            f"{weight.dtype}"
        )
    if isinstance(weight, nn.parameter.UninitializedParameter):
        raise ValueError(
            f"{caller}: the weight of {kind} is an uninitialised lazy parameter; "
            "run one forward pass before initialising it"
        )
    if parametrize.is_parametrized(module, "weight"):
        raise ValueError(
            f"{caller}: the weight of {kind} is computed by a parametrization, so filling it "
            "in place would have no effect; initialise module.parametrizations.weight.original "
            "instead"
        )
    return weight


def check_number(name: str, value: object) -> float:
    """Return ``value`` as a float; raise unless it is a finite real number (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


#: `check_truncation` refuses intervals farther than this many std from the mean...
TRUNCATION_MAX_DISTANCE = 6.0
#: ... or where torch's sampler would accept fewer proposals than this (over 1000 tries/value).
TRUNCATION_MIN_ACCEPTANCE = 1e-3


def check_truncation(mean: float, std: float, a: float, b: float) -> None:
    """Raise ``ValueError`` when ``N(mean, std**2)`` truncated to ``[a, b]`` cannot be sampled
    by ``torch.nn.init.trunc_normal_``'s rejection loop (farther than
    `TRUNCATION_MAX_DISTANCE` std, or accepted less often than `TRUNCATION_MIN_ACCEPTANCE`)."""
    lo, hi = (a - mean) / std, (b - mean) / std  # the interval in std units
    distance = max(lo, -hi, 0.0)
    rate = 1.0
    if distance <= TRUNCATION_MAX_DISTANCE:
        mass = (math.erf(hi / math.sqrt(2.0)) - math.erf(lo / math.sqrt(2.0))) / 2
        if mass <= 0.3:  # torch proposes uniformly in [a, b], accepts by density / peak
            peak = math.exp(-0.5 * distance**2)
            rate = mass * math.sqrt(2 * math.pi) / ((hi - lo) * peak)
    if distance > TRUNCATION_MAX_DISTANCE or rate < TRUNCATION_MIN_ACCEPTANCE:
        raise ValueError(
            f"trunc_normal_init: the interval [a, b] = [{a}, {b}] lies (almost) entirely "
            f"outside N(mean={mean}, std={std}) (it starts {distance:.3g} std from the mean), "
            "so sampling from it would practically never end; move a and b towards mean "
            "(they are absolute values, not multiples of std) or widen std"
        )


def fill_bias(module: nn.Module, bias: float | None) -> None:
    """Fill ``module.bias`` with ``bias`` when both exist; ``bias=None`` leaves it untouched."""
    tensor = getattr(module, "bias", None)
    if bias is not None and isinstance(tensor, Tensor):
        with torch.no_grad():
            tensor.fill_(bias)


def module_fans(module: nn.Module, caller: str) -> tuple[int, int]:
    """`visionblocks.init.compute_fans`, with errors naming ``caller``."""
    weight = weight_of(module, caller)
    kind = type(module).__name__
    if weight.dim() < 2:
        raise ValueError(
            f"{caller} needs a weight with at least 2 dimensions to compute fans, but "
            f"{kind} has weight of shape {tuple(weight.shape)}; use constant_init, normal_init "
            "or trunc_normal_init for it (or restrict the init_weights rule with 'layer')"
        )
    receptive = math.prod(weight.shape[2:])
    groups = getattr(module, "groups", 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or weight.dim() < 3:
        groups = 1
    transposed = weight.dim() >= 3 and bool(getattr(module, "transposed", False))
    # Layout (out, in / groups, *k), or (in, out / groups, *k) when transposed: dim 0 holds
    # all channels of one side, dim 1 the per-group channels of the other.
    if weight.shape[0] % groups:
        raise ValueError(
            f"{caller}: groups={groups} does not divide dim 0 of the weight of {kind} "
            f"(shape {tuple(weight.shape)})"
        )
    full_side = weight.shape[0] // groups * receptive
    group_side = weight.shape[1] * receptive
    if transposed:
        return full_side, group_side
    return group_side, full_side


def draw_zero_mean(weight: Tensor, std: float, distribution: str) -> None:
    """Fill ``weight`` from ``N(0, std**2)`` or ``U(-sqrt(3) * std, sqrt(3) * std)``, as
    ``torch.nn.init.kaiming_normal_``/``kaiming_uniform_`` do."""
    if not weight.numel():  # a zero fan would divide by zero upstream; nothing to fill
        return
    with torch.no_grad():
        if distribution == "normal":
            weight.normal_(0, std)
        else:
            bound = math.sqrt(3.0) * std
            weight.uniform_(-bound, bound)


def zero_norm_weight(block: nn.Module, block_name: str, norm: Any) -> None:
    """Zero the weight of ``norm``: the ``last_norm`` of ``block`` (a module or a submodule name)."""
    if isinstance(norm, str):
        try:
            norm = block.get_submodule(norm)
        except AttributeError:
            raise ValueError(
                f"block {block_name!r} ({type(block).__name__}): last_norm={norm!r} names no "
                "submodule"
            ) from None
    if not isinstance(norm, nn.Module):
        raise TypeError(
            f"block {block_name!r} ({type(block).__name__}): last_norm must be a submodule "
            f"name or the norm module, got {type(norm).__name__}"
        )
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, Tensor):
        raise ValueError(
            f"block {block_name!r} ({type(block).__name__}): its last norm "
            f"{type(norm).__name__} has no affine weight to zero"
        )
    with torch.no_grad():
        weight.zero_()
