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
