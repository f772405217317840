"""`feature_info`: channels and stride of a model's features, measured (see `visionblocks.features`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.features._capture import resolve_modules
from visionblocks.features._strides import check_run, measure, stride
from visionblocks.features.getter import _DEFAULT_INPUT_SIZE, check_input_size

__all__ = ["feature_info"]
__dir__ = public_dir(__name__, __all__)


def feature_info(
    model: nn.Module,
    input_size: Sequence[int] = _DEFAULT_INPUT_SIZE,
    layers: Sequence[str | int] | None = None,
) -> list[dict[str, Any]]:
    """Measure the channels and stride of a model's features with one dry run.

    Runs ``model`` on zeros of shape ``(1, *input_size)`` under ``torch.no_grad()`` in eval
    mode (modes restored afterwards). What ``layers`` refers to depends on what ``model``
    returns:

    a dict (an `IntermediateLayerGetter`, a backbone): its keys; a list (timm
    ``features_only`` models): indices; anything else: module names (their first call's
    output). ``layers=None`` takes every 4-D entry of the output, or else every top-level
    child with a 4-D output, in execution order.

    **Stride** is ``input H / output H`` and must equal ``input W / output W`` (exact when
    ``H`` and ``W`` are divisible by the model's total stride). A ratio that is not a power
    of two is settled by a second dry run on sizes rounded up to a multiple of 256 (a
    power-of-two ratio there is the stride, else the first ratio stands; a fixed-size model
    gets the power of two whose rounding gives the output size). An ``int`` when whole, a
    ``float`` otherwise (``0.5`` for an upsampled output).

    Args:
        model: The model.
        input_size: ``(C, H, W)`` of the dry-run input.
        layers: Names, keys or indices of the features; ``None`` for all (see above).

    Returns:
        list[dict]: One ``{"name": name, "channels": int, "stride": int | float}`` per feature,
        in ``layers`` order; ``name`` is the key, the (non-negative) index or the module name.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``input_size`` is not 3 positive ints (or too large), a layer is unknown
            (close names listed) or repeated, a feature is not 4-D, or its H and W strides
            differ.

    Examples:
        >>> import torchvision
        >>> from visionblocks.features import IntermediateLayerGetter
        >>> resnet = torchvision.models.resnet18(weights=None)
        >>> info = feature_info(resnet, (3, 64, 64), ["layer1", "layer2", "layer3", "layer4"])
        >>> [(i["name"], i["channels"], i["stride"]) for i in info]
        [('layer1', 64, 4), ('layer2', 128, 8), ('layer3', 256, 16), ('layer4', 512, 32)]
        >>> getter = IntermediateLayerGetter(resnet, {"layer3": "c4"}, input_size=(3, 64, 64))
        >>> feature_info(getter, (3, 64, 64))
        [{'name': 'c4', 'channels': 256, 'stride': 16}]
    """
    check_type("model", model, nn.Module)
    size = check_input_size(input_size)
    if layers is not None:
        if isinstance(layers, (str, int)) or not isinstance(layers, (list, tuple)):
            raise TypeError(f"layers must be a list of names or indices, got {layers!r}")
        layers = list(layers)
        repeated = sorted({repr(n) for n in layers if layers.count(n) > 1})
        if repeated:
            raise ValueError(f"layers names {', '.join(repeated)} more than once: {layers!r}")
    names = [n for n in layers or () if isinstance(n, str) and n]
    modules = dict(model.named_modules(remove_duplicate=False))
    if layers is None:
        targets = dict(model.named_children())
    else:
        targets = {n: modules[n] for n in names if n in modules}
    try:
        features, out = measure(model, targets, size)
    except Exception as err:
        raise ValueError(
            f"the dry run of {type(model).__name__} on zeros of shape {(1, *size)} failed "
            f"({err}); pass an input_size the model accepts"
        ) from err
    if isinstance(out, Mapping):
        what = "keys of the model's output"
    elif isinstance(out, (list, tuple)):
        what = "indices of the model's output"
        if layers is not None:
            layers = [_index(i, len(out)) for i in layers]
    else:
        what = "submodules"
        if layers is not None:
            if not all(isinstance(n, str) for n in layers):
                raise ValueError(
                    f"layers: {type(model).__name__} returns {type(out).__name__}, not a dict or "
                    f"list, so layers must be module names, got {layers!r}"
                )
            resolve_modules(model, layers, "layers")  # raises for unknown names
    if layers is None:
        layers = [k for k, v in features.items() if isinstance(v, torch.Tensor) and v.dim() == 4]
        if not layers:
            raise ValueError(
                f"{type(model).__name__} has no 4-D (N, C, H, W) feature among its {what} "
                "(feature_info measures submodules, or the entries of a dict or list output)"
            )
    shapes = {}
    for name in layers:
        if name not in features:
            raise ValueError(f"layers: {name!r} is not one of the {what}: {list(features)}")
        value = features[name]
        if not isinstance(value, torch.Tensor) or value.dim() != 4:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"feature {name!r} is not a 4-D (N, C, H, W) tensor: got {got}")
        shapes[name] = tuple(value.shape)
    checks = check_run(model, targets, size, shapes)
    return [
        {
            "name": name,
            "channels": int(shape[1]),
            "stride": stride(name, size[1:], shape[2:], checks.get(name)),
        }
        for name, shape in shapes.items()
    ]


def _index(index: Any, length: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(
            f"layers: the model returns a list of {length} features, so layers must be int "
            f"indices, got {index!r}"
        )
    if not -length <= index < length:
        raise ValueError(f"layers: index {index} is out of range for {length} features")
    return index % length
