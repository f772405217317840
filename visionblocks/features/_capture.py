"""Private machinery of `visionblocks.features`: hooks that capture module outputs and stop
the forward early, the construction dry run, and the partial module tree of a getter."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__: list[str] = []


_ACTIVE = threading.local()
"""``_ACTIVE.captures``: the captures running in this thread (innermost last)."""


def _active_captures() -> list[object]:
    captures = getattr(_ACTIVE, "captures", None)
    if captures is None:
        captures = _ACTIVE.captures = []
    return captures


class _StopForward(BaseException):
    """Raised from the hook of the last requested module to end the forward early (a
    ``BaseException``, which a model's ``except Exception`` does not swallow)."""


def resolve_modules(model: nn.Module, names: Iterable[str], arg: str) -> dict[str, nn.Module]:
    """Map dotted module names to the submodules of ``model``; unknown names raise."""
    modules = dict(model.named_modules(remove_duplicate=False))
    found: dict[str, nn.Module] = {}
    problems = []
    for name in names:
        if name and name in modules:
            found[name] = modules[name]
            continue
        if not name:
            problems.append("'' (the model itself; name a submodule)")
            continue
        close = difflib.get_close_matches(name, [n for n in modules if n], n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        problems.append(f"{name!r}{hint}")
    if problems:
        children = [repr(n) for n, _ in model.named_children()]
        top = ", ".join(children[:20]) + (
            f", ... ({len(children)} in all)" if children[20:] else ""
        )
        raise ValueError(
            f"{arg} names no submodule of {type(model).__name__}: {'; '.join(problems)}. "
            f"Top-level children: {top or 'none'}"
        )
    return found


def capture(
    model: nn.Module,
    targets: Mapping[str, nn.Module],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    stop: bool = True,
) -> tuple[dict[str, Any], Any]:
    """Run ``model(*args, **kwargs)`` and keep the first output of every target module.

    With ``stop=True`` the forward ends as soon as every target has produced an output (the
    return value is then ``None``). The hooks act only in the calling thread.
    """
    by_module: dict[int, tuple[nn.Module, list[str]]] = {}
    for name, module in targets.items():
        by_module.setdefault(id(module), (module, []))[1].append(name)
    captured: dict[str, Any] = {}
    total = len(targets)
    token = _StopForward()
    active = _active_captures()

    def make_hook(names: list[str]):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if token not in _active_captures():  # another thread's call of the module
                return
            for name in names:
                captured.setdefault(name, output)
            if stop and len(captured) == total:
                raise token

        return hook

    handles = [m.register_forward_hook(make_hook(n)) for m, n in by_module.values()]
    active.append(token)
    result = None
    try:
        result = model(*args, **kwargs)
    except _StopForward as stopped:
        if stopped is not token:  # an enclosing getter's stop: let it through
            raise
    finally:
        active.remove(token)
        for handle in handles:
            handle.remove()
    return captured, result


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every module in eval mode; restore each module's own flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield
    finally:
        for module, flag in flags:
            module.training = flag


def example_args(
    model: nn.Module, example_input: Any, input_size: Sequence[int]
) -> tuple[Any, ...]:
    """Positional arguments for a dry run: ``example_input`` or zeros of ``(1, *input_size)``."""
    if example_input is not None:
        return example_input if isinstance(example_input, tuple) else (example_input,)
    device, dtype = torch.device("cpu"), torch.get_default_dtype()
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            device, dtype = tensor.device, tensor.dtype
            break
    return (torch.zeros(1, *input_size, device=device, dtype=dtype),)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in a (nested) tensor / tuple / list / dict output."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def graph_leaves(outputs: Iterable[Any]) -> set[int] | None:
    """ids of the leaf tensors the outputs' autograd graph reaches (None: no graph)."""
    tensors = [t for out in outputs for t in tensors_in(out)]
    if not any(t.requires_grad for t in tensors):
        return None
    leaves = {id(t) for t in tensors if t.requires_grad and t.grad_fn is None}
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold the leaf
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


@dataclass
class DryRun:
    """What one construction dry run saw."""

    executed: set[int]  # ids of modules whose forward started before the stop
    kept: set[int]  # ids of parameters the getter registers
    hidden: set[int]  # ids of trainable parameters of executed modules that reach no output


def dry_run(model: nn.Module, targets: Mapping[str, nn.Module], args: Sequence[Any]) -> DryRun:
    """Run the model (eval mode, autograd on for every parameter, restored afterwards) until
    every target ran: the modules that started and the parameters the outputs depend on."""
    executed: set[int] = set()
    without_grad: set[int] = set()  # modules that ran under torch.no_grad() in the forward

    def pre_hook(module: nn.Module, inputs: Any) -> None:
        executed.add(id(module))
        if not torch.is_grad_enabled():
            without_grad.add(id(module))

    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules()]
    try:
        for p in params:
            if p.is_floating_point() or p.is_complex():
                p.requires_grad_(True)
        with eval_mode(model), torch.inference_mode(False), torch.enable_grad():
            # Inference tensors (made under torch.inference_mode) cannot enter a graph.
            args = [
                a.clone() if isinstance(a, torch.Tensor) and a.is_inference() else a for a in args
            ]
            captured, _ = capture(model, targets, args, {})
        reachable = graph_leaves(captured.values())
    except Exception as err:
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args]
        raise ValueError(
            f"the dry run of {type(model).__name__} on inputs {shapes} failed ({err}); pass "
            "example_input= (or input_size=) with an input the model accepts"
        ) from err
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
    missing = [name for name in targets if name not in captured]
    if missing:
        raise ValueError(
            f"return_layers {missing} did not run in {type(model).__name__}.forward on the "
            "example input, so they cannot be returned"
        )
    # Kept: the parameters the outputs depend on (also one read directly from another
    # module's forward), frozen parameters of modules that ran, parameters of modules that
    # ran under torch.no_grad() (autograd cannot tell whether they feed the outputs; they
    # get no gradient in the model either) and - when the whole forward ran without
    # autograd - every parameter of a module that ran.
    kept = {id(p) for p in params} & (reachable or set())
    ran = [m for m in model.modules() if id(m) in executed]
    for module in ran:
        untracked = reachable is None or id(module) in without_grad
        for p in module._parameters.values():
            if p is not None and (untracked or not p.requires_grad):
                kept.add(id(p))
    hidden = {
        id(p) for m in ran for p in m._parameters.values() if p is not None and id(p) not in kept
    }
    return DryRun(executed, kept, hidden)


class MirrorChildren:
    """Mixin for modules that hold children of other modules (``self._originals``): a child
    replaced here (``convert_sync_batchnorm``) is replaced in the originals too."""

    _originals: tuple[nn.Module, ...] = ()

    def add_module(self, name: str, module: nn.Module | None) -> None:
        old = self._modules.get(name)
        super().add_module(name, module)  # type: ignore[misc]
        self._mirror(name, old, module)

    def register_module(self, name: str, module: nn.Module | None) -> None:
        self.add_module(name, module)

    def __setattr__(self, name: str, value: Any) -> None:
        modules = self.__dict__.get("_modules")
        old = modules.get(name) if modules is not None else None
        super().__setattr__(name, value)
        if old is not None and isinstance(value, nn.Module):
            self._mirror(name, old, value)

    def _mirror(self, name: str, old: Any, new: Any) -> None:
        if old is None or new is old:
            return
        for original in self.__dict__.get("_originals", ()):
            if original._modules.get(name) is old:
                original._modules[name] = new


class _Partial(MirrorChildren, nn.Module):
    """Stands in (never called) for a module of which only a part runs before the getter
    stops, holding the kept parts under the original names."""

    def __init__(self, like: nn.Module, original: nn.Module | None = None) -> None:
        super().__init__()
        self.like = type(like).__name__
        self.training = like.training
        object.__setattr__(self, "_originals", () if original is None else (original,))

    def _get_name(self) -> str:
        return f"{self.like}[partial]"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._get_name()} is a partial view held by an IntermediateLayerGetter; "
            "call the getter instead"
        )


@dataclass
class Selection:
    """The partial tree: ``links`` pairs each holder with the original module it stands for."""

    links: list[tuple[nn.Module, nn.Module]] = field(default_factory=list)
    hidden: nn.Module = field(default_factory=nn.Module)


def select_into(target: nn.Module, model: nn.Module, run: DryRun) -> Selection:
    """Register into ``target`` what the getter keeps of ``model`` (names unchanged)."""
    selection = Selection()

    def fill(holder: nn.Module, orig: nn.Module) -> bool:
        """Register what ``orig`` keeps into ``holder``; True if ``orig`` is kept whole."""
        executed = id(orig) in run.executed
        whole = True
        anything = executed
        hidden = _Partial(orig)
        for name, p in orig._parameters.items():
            if p is None:
                continue
            if id(p) in run.kept:
                holder._parameters[name] = p
                anything = True
            else:
                whole = False
                if id(p) in run.hidden:
                    hidden._parameters[name] = p
        if hidden._parameters:
            selection.hidden._modules[str(len(selection.hidden._modules))] = hidden
            selection.links.append((hidden, orig))
        for name, b in orig._buffers.items():
            if b is None:
                continue
            if anything:
                holder._buffers[name] = b
                if name in orig._non_persistent_buffers_set:
                    holder._non_persistent_buffers_set.add(name)
            else:
                whole = False
        for name, child in orig._modules.items():
            if child is None:
                continue
            stub = _Partial(child, child)
            child_whole = fill(stub, child)
            if child_whole:
                holder._modules[name] = child
                anything = True
            elif stub._parameters or stub._buffers or stub._modules or id(child) in run.executed:
                holder._modules[name] = stub
                selection.links.append((stub, child))
                anything = True
                whole = False
            else:
                whole = False
        return whole and anything

    fill(target, model)
    selection.links.append((target, model))
    return selection


def sync(links: Iterable[tuple[nn.Module, nn.Module]]) -> None:
    """Write the holders' tensors back into the original modules (after ``_apply``)."""
    for holder, orig in links:
        for name, p in holder._parameters.items():
            orig._parameters[name] = p
        for name, b in holder._buffers.items():
            orig._buffers[name] = b
