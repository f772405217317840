"""Private machinery of `visionblocks.features`: the traced capture path of a getter (the
model's ``forward`` traced by ``torch.fx`` with the requested modules as leaves, its output
replaced by theirs; the function takes the live model as its first argument)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn

from visionblocks._core.dispatch import recording

__all__: list[str] = []

TracedForward = Callable[..., tuple[Any, ...]]
"""``forward(model, *args, **kwargs)``: the requested outputs, in ``return_layers`` order."""


tracing = recording
"""True under ``torch.export``, ``torch.compile``, ``torch.jit.trace`` or ``torch.fx``."""


def non_strict_export() -> bool:
    """True under ``torch.export(..., strict=False)`` (Python runs; dynamo does not trace)."""
    return torch.compiler.is_exporting() and not torch.compiler.is_dynamo_compiling()


def dynamo_export() -> bool:
    """True under ``torch.export(..., strict=True)``."""
    return torch.compiler.is_exporting() and torch.compiler.is_dynamo_compiling()


class _OutputTracer(fx.Tracer):
    """Keeps the requested modules (and the standard ``torch.nn`` ones) as leaves, traces into
    every module that holds a requested one, and records each requested module's first call."""

    def __init__(self, targets: set[int], holders: set[int]) -> None:
        super().__init__()
        self.targets = targets
        self.holders = holders
        self.found: dict[int, Any] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if id(m) in self.holders:
            return False
        return id(m) in self.targets or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        out = super().call_module(m, forward, args, kwargs)
        if id(m) in self.targets:
            self.found.setdefault(id(m), out)
        return out


@contextmanager
def _all_in_mode(model: nn.Module, mode: bool) -> Iterator[None]:
    """Put every module in ``mode``; restore each module's own flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.train(mode)
        yield
    finally:
        for module, flag in flags:
            module.training = flag


def trace_outputs(
    model: nn.Module, targets: Mapping[str, nn.Module], names: Sequence[str]
) -> TracedForward | None:
    """``forward(model, *args)`` returning the outputs of ``targets[name]`` for each name;
    ``None`` when ``torch.fx`` cannot trace the model so."""
    modules = dict(model.named_modules(remove_duplicate=False))
    holders = set()
    for name in names:
        parts = name.split(".")
        holders.update(id(modules[".".join(parts[:i])]) for i in range(len(parts)))
    tracer = _OutputTracer({id(m) for m in targets.values()}, holders)
    attrs = set(vars(model))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = tracer.trace(model)
    except Exception:
        return None
    finally:
        added = set(vars(model)) - attrs  # tensor constants the tracer stored on the root
        for attr in added:
            delattr(model, attr)
    if added or any(id(targets[n]) not in tracer.found for n in names):
        return None
    (old,) = [node for node in graph.nodes if node.op == "output"]
    with graph.inserting_before(old):
        graph.output(tracer.create_arg(tuple(tracer.found[id(targets[n])] for n in names)))
    graph.erase_node(old)

    def impure(node: fx.Node) -> bool:
        if node.op == "call_module":
            return bool(getattr(model.get_submodule(node.target), "_is_impure", False))
        return node.is_impure()

    try:
        graph.eliminate_dead_code(impure)
        graph.lint()
        code = graph.python_code(root_module="self")
        scope = dict(code.globals)
        exec(compile(code.src, "<visionblocks traced capture>", "exec"), scope)
    except Exception:
        return None
    return scope["forward"]


def trace_modes(
    model: nn.Module, targets: Mapping[str, nn.Module], names: Sequence[str]
) -> dict[bool, TracedForward | None]:
    """The traced forward for eval mode (``False``) and training mode (``True``)."""
    traced = {}
    for mode in (False, True):
        with _all_in_mode(model, mode):
            traced[mode] = trace_outputs(model, targets, names)
    return traced


class TracedPaths:
    """The traced forwards of a getter, by mode. Deep copies share them (they take the model as
    an argument); pickling drops them (generated functions do not pickle): the getter traces
    them again when unpickled (or, failing that, on first use outside dynamo)."""

    def __init__(self, fns: dict[bool, TracedForward | None] | None = None) -> None:
        self.fns = fns

    def __deepcopy__(self, memo: dict[int, Any]) -> TracedPaths:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (TracedPaths, ())

    def get(
        self, model: nn.Module, targets: Mapping[str, nn.Module], names: Sequence[str]
    ) -> TracedForward | None:
        """The traced forward for ``model``'s current mode, or ``None`` if there is none."""
        if self.fns is None:
            if torch.compiler.is_dynamo_compiling():
                return None
            self.fns = trace_modes(model, targets, names)
        return self.fns[model.training]
