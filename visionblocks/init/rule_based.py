"""`init_weights`: initialise a model from a list of rules (see `visionblocks.init`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import INITIALIZERS
from visionblocks.init._rules import apply_rules

__all__ = ["init_weights"]
__dir__ = public_dir(__name__, __all__)


def init_weights(
    model: nn.Module, rules: Sequence[Mapping[str, Any]] | Mapping[str, Any]
) -> dict[str, str]:
    """Initialise the layers of ``model`` by rules matched on layer type and module name.

    A rule is a dict ``{"type": <INITIALIZERS name or callable>, "layer": ..., "name": ...,
    **params}``; ``params`` go to the initializer as keywords
    (``{"type": "constant", "val": 0.5}``).

    - ``layer``: a class, a class name (its own or a base class's: ``"Conv2d"`` also matches
      timm's ``Conv2dSame``, ``"_ConvNd"`` every convolution), or a list of them.
    - ``name``: a regular expression matching the whole qualified module name
      (``r"head\\..*"``: everything under ``head``).
    - Neither: the rule matches every module with a weight.

    Only modules with a ``weight`` tensor are initialised, each by the last rule that
    matches it, in ``named_modules()`` order (a fixed seed gives a fixed result). Block
    initializers (``zero_init_last_norm``) run after all weight rules, on every module their
    ``layer``/``name`` select, or on the whole model. Rules are checked before any weight is
    touched; parameter values are checked by the initializer (its error names the rule and
    the module).

    Args:
        model: The model to initialise in place.
        rules: A list of rule dicts (a single dict is accepted too).

    Returns:
        dict[str, str]: ``{module name: "rules[i] type(params)"}`` for every module
        initialised, in module order, then the blocks changed by block initializers.

    Raises:
        TypeError: If ``model`` is not a module, or a rule or its fields have the wrong type.
        ValueError: For an unknown initializer, parameter key or layer name, an invalid
            pattern or one that selects nothing, or an initializer rejecting its parameters.

    Examples:
        >>> from torch import nn
        >>> from visionblocks.init import bias_init_with_prob
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
    """
    check_type("model", model, nn.Module)
    return apply_rules(model, rules, INITIALIZERS)
