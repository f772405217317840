"""State dicts of whole modules pickled with ``torch.save(model)`` (private; see `read_state_dict`).

A module's `Placeholder` holds in ``state`` the ``__dict__`` that pickle's ``BUILD`` passed
(``_parameters``, ``_buffers``, ``_non_persistent_buffers_set``, ``_modules``, hooks).
`module_state_dict` rebuilds from it what ``model.state_dict()`` gives, names and order
included, tensors as the reader made them; nothing of the class is imported or called.
State-dict hooks (spectral norm's excepted) and non-tensor entries are refused; what a class
adds by overriding ``get_extra_state`` or ``_save_to_state_dict`` is missing. `rebuild_modules`
replaces the modules of a read object (itself or values of nested mappings).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from visionblocks.weights._rebuild import Placeholder

__all__ = ["ModuleStateDict", "Rebuilt", "is_module", "module_state_dict", "rebuild_modules"]

_TABLES = ("_parameters", "_buffers", "_modules")
_HOOK_TABLES = ("_state_dict_pre_hooks", "_state_dict_hooks")
# State-dict hooks that change no name and no tensor (spectral norm records its version).
_HARMLESS_HOOKS = frozenset({"torch.nn.utils.spectral_norm.SpectralNormStateDictHook"})
_MAX_VISITS = 1_000_000  # module visits per model: far above real models, below a pickle bomb
_MAX_NESTING = 2_000  # modules inside modules (real models: tens)
_MAX_DEPTH = 64  # nested mappings searched for modules


class ModuleStateDict(dict):
    """A state dict rebuilt by `module_state_dict` (an empty one is a model without weights,
    not weights hidden in code)."""


def _module_dict(obj: Any) -> Mapping[Any, Any] | None:
    """The pickled ``__dict__`` of a module placeholder, or None if ``obj`` is none."""
    if not isinstance(obj, Placeholder) or obj.kind != "object":
        return None
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slot state)
        state = state[0]
    if not isinstance(state, Mapping):
        return None
    if all(isinstance(state.get(name), Mapping) for name in _TABLES):
        return state
    return None


def is_module(obj: Any) -> bool:
    """Whether ``obj`` is the placeholder of a pickled ``nn.Module`` (an object placeholder
    whose state holds ``_parameters``, ``_buffers`` and ``_modules`` mappings).

    Examples:
        >>> placeholder = Placeholder("torch.nn.modules.linear.Linear", "object")
        >>> is_module(placeholder)
        False
        >>> placeholder.state = {"_parameters": {}, "_buffers": {}, "_modules": {}}
        >>> is_module(placeholder), is_module({"_parameters": {}})
        (True, False)
    """
    return _module_dict(obj) is not None


def _where(path: str, name: Placeholder) -> str:
    return f"module {path!r} ({name.name})" if path else f"the module ({name.name})"


def _tensors(
    state: Mapping[Any, Any], table: str, path: str, module: Placeholder
) -> list[tuple[str, torch.Tensor]]:
    """The non-None tensors of ``state[table]``, checked."""
    found = []
    for name, value in state[table].items():
        if not isinstance(name, str):
            raise ValueError(
                f"{_where(path, module)} has a {type(name).__name__} name {name!r} in "
                f"{table}; names are str"
            )
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            what = repr(value) if isinstance(value, Placeholder) else type(value).__name__
            raise ValueError(
                f"{_where(path, module)}: {table[1:-1]} {name!r} is a {what}, not a tensor"
            )
        found.append((name, value.detach() if isinstance(value, torch.nn.Parameter) else value))
    return found


def _non_persistent(state: Mapping[Any, Any], path: str, module: Placeholder) -> set[str]:
    names = state.get("_non_persistent_buffers_set", set())  # absent before PyTorch 1.6
    if not isinstance(names, (set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{_where(path, module)}: _non_persistent_buffers_set must be a set of names, got "
            f"{type(names).__name__}"
        )
    return set(names)


def _check_hooks(state: Mapping[Any, Any], path: str, module: Placeholder) -> None:
    for table in _HOOK_TABLES:
        hooks = state.get(table)
        if hooks is None:
            continue
        if not isinstance(hooks, Mapping):
            raise ValueError(
                f"{_where(path, module)}: {table} must be a mapping, got {type(hooks).__name__}"
            )
        for hook in hooks.values():
            if not (isinstance(hook, Placeholder) and hook.name in _HARMLESS_HOOKS):
                raise ValueError(
                    f"{_where(path, module)} has a state-dict hook ({hook!r} in {table}) that "
                    "would change its state dict by running code of the file; it is not "
                    "rebuilt without that code"
                )


def module_state_dict(module: Any) -> ModuleStateDict:
    """What ``module.state_dict()`` would give, rebuilt from a module placeholder.

    Args:
        module: A placeholder for which `is_module` is true.

    Returns:
        ModuleStateDict: The tensors by name, as the reader made them.

    Raises:
        ValueError: If ``module`` is not a module placeholder, or its state (or a child's) is
            malformed: a parameter or buffer that is not a tensor, a child that is not a
            module, a module that contains itself, colliding names, a state-dict hook, more
            than 2,000 levels of nesting or 1,000,000 module visits (a pickle bomb).

    Examples:
        >>> import torch
        >>> child = Placeholder("torch.nn.modules.linear.Linear", "object")
        >>> child.state = {"_parameters": {"weight": torch.ones(3, 2), "bias": None},
        ...                "_buffers": {}, "_modules": {}}
        >>> parent = Placeholder("models.Net", "object")
        >>> parent.state = {"_parameters": {}, "_buffers": {"mean": torch.zeros(3),
        ...                 "cache": torch.zeros(1)}, "_non_persistent_buffers_set": {"cache"},
        ...                 "_modules": {"fc": child, "unused": None}}
        >>> list(module_state_dict(parent))
        ['mean', 'fc.weight']
        >>> child.state["_parameters"]["bias"] = "oops"
        >>> module_state_dict(parent)
        Traceback (most recent call last):
        ...
        ValueError: module 'fc' (torch.nn.modules.linear.Linear): parameter 'bias' is a str, not a tensor
    """
    if _module_dict(module) is None:
        what = repr(module) if isinstance(module, Placeholder) else type(module).__name__
        raise ValueError(f"expected a pickled nn.Module, got {what}")
    result = ModuleStateDict()
    on_path: set[int] = set()  # modules between the root and the one visited: a cycle check
    visits = 0
    # Depth-first, children in order; ("leave", id) pops a module off the path.
    todo: list[tuple[str, Any]] = [("visit", ("", module, 0))]
    while todo:
        action, item = todo.pop()
        if action == "leave":
            on_path.discard(item)
            continue
        path, node, depth = item
        state = _module_dict(node)
        if state is None:
            what = repr(node) if isinstance(node, Placeholder) else type(node).__name__
            raise ValueError(f"child {path!r} is a {what}, not a pickled nn.Module")
        if id(node) in on_path:
            raise ValueError(f"{_where(path, node)} contains itself (a cycle in _modules)")
        visits += 1
        if visits > _MAX_VISITS or depth > _MAX_NESTING:
            raise ValueError(
                f"more than {_MAX_VISITS} modules to visit or {_MAX_NESTING} levels of nesting "
                f"(at {path[:80]!r}...): refusing the model"
            )
        _check_hooks(state, path, node)
        skip = _non_persistent(state, path, node)
        prefix = path + "." if path else ""
        entries = _tensors(state, "_parameters", path, node)
        entries += [(n, t) for n, t in _tensors(state, "_buffers", path, node) if n not in skip]
        for name, tensor in entries:
            if prefix + name in result:
                raise ValueError(f"{_where(path, node)}: the name {prefix + name!r} occurs twice")
            result[prefix + name] = tensor
        children = []
        for name, child in state["_modules"].items():
            if not isinstance(name, str):
                raise ValueError(
                    f"{_where(path, node)} has a {type(name).__name__} child name {name!r}"
                )
            if child is not None:
                children.append(("visit", (prefix + name, child, depth + 1)))
        on_path.add(id(node))
        todo.append(("leave", id(node)))
        todo.extend(reversed(children))
    return result


@dataclass
class Rebuilt:
    """What `rebuild_modules` did.

    Attributes:
        obj: The object with every module placeholder replaced by its state dict.
        classes: ``{class name: modules}`` rebuilt (each module counted once, however many
            times it is referenced), in the order first met.
        entries: Where whole models were: ``[]`` for the object itself, else the keys leading
            to each (``[("model",), ("ema",)]``), in order.
    """

    obj: Any
    classes: dict[str, int] = field(default_factory=dict)
    entries: list[tuple[Any, ...]] = field(default_factory=list)


def rebuild_modules(obj: Any) -> Rebuilt:
    """Replace every pickled module in ``obj`` (itself, or values of nested mappings).

    Mappings holding a module are copied with the module's entry replaced by its
    `module_state_dict`; everything else is returned as it is (the same objects).

    Args:
        obj: What the safe unpickler read.

    Returns:
        Rebuilt: The new object, the module classes rebuilt and the entries that held them.

    Raises:
        ValueError: As `module_state_dict`, prefixed by the entry it came from.

    Examples:
        >>> import torch
        >>> net = Placeholder("models.yolo.Model", "object")
        >>> net.state = {"_parameters": {"w": torch.ones(1)}, "_buffers": {}, "_modules": {}}
        >>> rebuilt = rebuild_modules({"model": net, "epoch": 3})
        >>> rebuilt.obj, rebuilt.classes, rebuilt.entries
        ({'model': {'w': tensor([1.])}, 'epoch': 3}, {'models.yolo.Model': 1}, [('model',)])
    """
    found = Rebuilt(obj)
    seen: set[int] = set()

    def count(module: Placeholder) -> None:  # each module object once, children included
        todo = [module]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            found.classes[node.name] = found.classes.get(node.name, 0) + 1
            children = _module_dict(node)["_modules"].values()  # type: ignore[index]
            todo.extend(reversed([c for c in children if c is not None]))

    def rebuild(value: Any, keys: tuple[Any, ...]) -> ModuleStateDict:
        try:
            state = module_state_dict(value)
        except ValueError as exc:
            where = " -> ".join(repr(k) for k in keys)
            raise ValueError(f"whole model under {where}: {exc}" if keys else str(exc)) from None
        count(value)
        found.entries.append(keys)
        return state

    done: dict[int, Any] = {}  # mappings already walked (shared or cyclic ones once)

    def walk(mapping: Mapping[Any, Any], keys: tuple[Any, ...]) -> Any:
        if id(mapping) in done or len(keys) > _MAX_DEPTH:
            return done.get(id(mapping), mapping)
        done[id(mapping)] = mapping  # a cycle back here keeps the original
        changed = {}
        for key, value in mapping.items():
            if is_module(value):
                changed[key] = rebuild(value, (*keys, key))
            elif isinstance(value, Mapping):
                new = walk(value, (*keys, key))
                if new is not value:
                    changed[key] = new
        if not changed:
            return mapping
        kind = OrderedDict if isinstance(mapping, OrderedDict) else dict
        result = kind((key, changed.get(key, value)) for key, value in mapping.items())
        done[id(mapping)] = result
        return result

    if is_module(obj):
        found.obj = rebuild(obj, ())
    elif isinstance(obj, Mapping):
        found.obj = walk(obj, ())
    return found
