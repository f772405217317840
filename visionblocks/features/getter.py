"""`IntermediateLayerGetter`: the outputs of named submodules (see `visionblocks.features`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any

import torch
from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.features._capture import (
    MirrorChildren,
    capture,
    dry_run,
    example_args,
    resolve_modules,
    select_into,
    sync,
)
from visionblocks.features._export import (
    TracedPaths,
    dynamo_export,
    non_strict_export,
    trace_modes,
    tracing,
)
from visionblocks.nn._limits import MAX_CHANNELS, MAX_SIDE

__all__ = ["IntermediateLayerGetter"]
__dir__ = public_dir(__name__, __all__)

_DEFAULT_INPUT_SIZE = (3, 224, 224)


def _return_layers(return_layers: Any) -> dict[str, str]:
    """Normalise ``return_layers`` to an ordered ``{module name: output name}`` dict."""
    if isinstance(return_layers, Mapping):
        pairs = list(return_layers.items())
    elif isinstance(return_layers, (list, tuple)):
        pairs = [(name, name) for name in return_layers]
    else:
        raise TypeError(
            "return_layers must be a {name: out_name} dict or a list of names, got "
            f"{type(return_layers).__name__}"
        )
    if not pairs:
        raise ValueError("return_layers is empty; name at least one submodule")
    for name, out in pairs:
        for what, value in (("module name", name), ("output name", out)):
            if not isinstance(value, str):
                hint = f"; write {str(value)!r}" if isinstance(value, int) else ""
                raise TypeError(
                    f"return_layers {what}s must be str, as in model.named_modules(), got "
                    f"{type(value).__name__} ({value!r}){hint}"
                )
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError(f"return_layers names a module twice: {[n for n, _ in pairs]}")
    outs = list(result.values())
    if len(set(outs)) != len(outs):
        raise ValueError(f"return_layers output names are not unique: {outs}")
    return result


def check_input_size(input_size: Any) -> tuple[int, int, int]:
    """``(C, H, W)`` of a dry run: channels up to 65,536, sides up to 16,384."""
    check_type("input_size", input_size, (tuple, list, torch.Size))
    if len(input_size) != 3 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in input_size
    ):
        raise ValueError(f"input_size must be 3 positive ints (C, H, W), got {input_size!r}")
    if input_size[0] > MAX_CHANNELS or max(input_size[1:]) > MAX_SIDE:
        raise ValueError(
            f"input_size={tuple(input_size)!r} is too large for a dry run (at most "
            f"{MAX_CHANNELS} channels and {MAX_SIDE} pixels a side)"
        )
    return (input_size[0], input_size[1], input_size[2])


class IntermediateLayerGetter(MirrorChildren, nn.Module):
    """Return the outputs of named submodules of a model, as its ``forward`` computes them.

    Calling the getter runs ``model(*args, **kwargs)`` with forward hooks on the requested
    modules (for the calling thread only) and stops the forward once every requested output
    is captured; ``model`` itself is never modified. Under ``torch.export.export`` (strict
    and non-strict, and so ``torch.onnx.export(..., dynamo=True)``), ``torch.compile``,
    ``torch.jit.trace`` and ``torch.fx`` it instead runs ``model.forward`` traced by
    ``torch.fx`` at construction (per mode) with the requested modules as leaves, truncated
    at their outputs: the eager outputs, with dynamic batch and image size where the model
    allows it (Python control flow is fixed at construction). For a model ``torch.fx``
    cannot trace, non-strict export runs the hooks without the early stop, strict export
    raises, and the other tracers use the eager path.

    A dry run at construction finds the modules that run before the stop and the parameters
    the outputs depend on; the getter registers exactly those (shared with ``model``), under
    their original names, so no parameter goes without a gradient and ``state_dict()`` keys
    are a subset of the model's. A module that runs several times gives the output of its
    *first* call. ``nn.DataParallel`` raises.

    **Differences from torchvision's** ``torchvision.models._utils.IntermediateLayerGetter``.
    On chain-like models and top-level names, outputs, children, parameters, ``state_dict()``
    keys, the constructor and the ``ValueError`` for a missing name are torchvision's. The
    differences:

    - It is not an ``nn.ModuleDict``: read access is the same (``getter["layer1"]``,
      ``len``, iteration, ``in``, ``keys()``, ``items()``, ``values()``), mutation is not.
    - Outputs come in ``return_layers`` order; torchvision's come in the model's child order.
    - It runs ``model.forward``, so functional code between children (a ``torch.flatten``,
      a skip connection) takes part; torchvision chains the children and skips it. Children
      that do not run before the last requested output are not held.
    - A list of names, nested names (``"layer4.1.conv2"``) and any forward arguments are
      accepted; an empty ``return_layers`` raises ``ValueError`` (torchvision returns ``{}``).
    - The getter's own ``training`` flag starts as the model's (torchvision's starts True).

    Args:
        model: Any ``nn.Module``; it is called with the getter's arguments.
        return_layers: ``{module name: output name}`` or a list of module names, as in
            ``model.named_modules()`` (``"layer1"``, ``"layer4.1.conv2"``).
        example_input: Input for the construction dry run: one argument or a tuple of
            positional arguments. Default: zeros of shape ``(1, *input_size)``.
        input_size: ``(C, H, W)`` of the default dry-run input, ``(3, 224, 224)`` if not given
            (a smaller one makes construction cheaper).

    Shape:
        - Input: whatever ``model`` takes, e.g. ``(B, C, H, W)``.
        - Output: ``OrderedDict[str, Any]`` in ``return_layers`` order, mapping each output
          name to that module's output (typically ``Tensor[B, C_i, H_i, W_i]``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``return_layers`` is neither a dict nor
            a list of names.
        ValueError: A name is not a submodule (close names listed), names repeat, both
            ``example_input`` and ``input_size`` are given, a requested module does not run
            in the dry run, the dry run fails, or ``input_size`` is too large.
        RuntimeError: At call time, a requested module did not run.

    Examples:
        >>> import torch, torchvision
        >>> model = torchvision.models.resnet18(weights=None)
        >>> getter = IntermediateLayerGetter(
        ...     model, {"layer2": "p3", "layer4.1.conv2": "c5"}, input_size=(3, 64, 64)
        ... )
        >>> out = getter(torch.rand(2, 3, 128, 128))
        >>> {name: tuple(t.shape) for name, t in out.items()}
        {'p3': (2, 128, 16, 16), 'c5': (2, 512, 4, 4)}
        >>> "fc.weight" in getter.state_dict(), "layer4.0.conv1.weight" in getter.state_dict()
        (False, True)
        >>> list(IntermediateLayerGetter(model, ["layer1"], input_size=(3, 64, 64)).state_dict())[:2]
        ['conv1.weight', 'bn1.weight']
    """

    def __init__(
        self,
        model: nn.Module,
        return_layers: Mapping[str, str] | Sequence[str],
        *,
        example_input: torch.Tensor | tuple[Any, ...] | None = None,
        input_size: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        check_type("model", model, nn.Module)
        if isinstance(model, torch.jit.ScriptModule):
            raise TypeError("IntermediateLayerGetter needs an eager module, not a ScriptModule")
        layers = _return_layers(return_layers)
        if example_input is not None and input_size is not None:
            raise ValueError("give example_input or input_size, not both")
        size = check_input_size(_DEFAULT_INPUT_SIZE if input_size is None else input_size)
        try:
            targets = resolve_modules(model, layers, "return_layers")
        except ValueError as exc:  # torchvision's message first, for code that matches it
            raise ValueError(f"return_layers are not present in model: {exc}") from None
        run = dry_run(model, targets, example_args(model, example_input, size))
        self.return_layers = layers
        self.training = model.training
        selection = select_into(self, model, run)  # children under the model's own names
        # Not registered: the model (whose unused tail must stay out of parameters()), the
        # requested modules, and the holder of parameters that run but reach no output.
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_originals", (model,))  # replaced children mirror into it
        object.__setattr__(self, "_targets", targets)
        object.__setattr__(self, "_links", selection.links)
        object.__setattr__(self, "_hidden", selection.hidden)
        object.__setattr__(self, "_traced", TracedPaths(trace_modes(model, targets, list(layers))))

    def forward(self, *args: Any, **kwargs: Any) -> OrderedDict[str, Any]:
        if tracing():  # torch.export / compile / jit.trace / fx: no hooks, no early stop
            names = list(self.return_layers)
            traced = self._traced.get(self._model, self._targets, names)
            if traced is not None:
                values = traced(self._model, *args, **kwargs)
                return OrderedDict(zip(self.return_layers.values(), values, strict=True))
            if dynamo_export():
                raise RuntimeError(
                    f"torch.fx cannot trace {type(self._model).__name__}, so "
                    "IntermediateLayerGetter cannot be exported with strict=True; use "
                    "torch.export.export(..., strict=False)"
                )
        stop = not non_strict_export()  # the tail is dead code in a non-strict export
        captured, _ = capture(self._model, self._targets, args, kwargs, stop=stop)
        missing = [name for name in self.return_layers if name not in captured]
        if missing:
            raise RuntimeError(
                f"return_layers {missing} did not run in {type(self._model).__name__}.forward"
            )
        return OrderedDict((out, captured[name]) for name, out in self.return_layers.items())

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._traced.fns is None:  # unpickled: trace again, so strict export works at once
            self._traced.get(self._model, self._targets, list(self.return_layers))

    def train(self, mode: bool = True) -> IntermediateLayerGetter:
        super().train(mode)
        for holder, orig in self._links:  # the partly-run originals behind the stand-ins
            holder.training = mode
            orig.training = mode
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> IntermediateLayerGetter:
        super()._apply(fn, recurse)
        self._hidden._apply(fn, recurse)
        sync(self._links)  # buffers (and overwritten parameters) back into the model
        return self

    def _replicate_for_data_parallel(self) -> IntermediateLayerGetter:
        raise RuntimeError(
            "IntermediateLayerGetter does not support nn.DataParallel: its forward runs the "
            "original model, which DataParallel does not replicate. Use "
            "torch.nn.parallel.DistributedDataParallel (one process per GPU) instead"
        )

    def extra_repr(self) -> str:
        return f"return_layers={self.return_layers}"

    # Read access as torchvision's getter (an nn.ModuleDict of the kept children).
    def __getitem__(self, name: str) -> nn.Module:
        return self._modules[name]  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def keys(self) -> KeysView[str]:
        """Names of the children, as ``nn.ModuleDict.keys``."""
        return self._modules.keys()

    def items(self) -> ItemsView[str, nn.Module]:
        """``(name, child)`` pairs, as ``nn.ModuleDict.items``."""
        return self._modules.items()  # type: ignore[return-value]

    def values(self) -> ValuesView[nn.Module]:
        """The children, as ``nn.ModuleDict.values``."""
        return self._modules.values()  # type: ignore[return-value]
