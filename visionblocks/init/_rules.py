"""Private machinery of `visionblocks.init.init_weights`: parsing and matching rules."""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from visionblocks._core.registry import Registry
from visionblocks.init._fans import has_weight

__all__ = ["BLOCK_INITIALIZER", "apply_rules"]

BLOCK_INITIALIZER = "_vb_block_initializer"
"""Attribute set (True) on initializers that act on whole blocks, not on one layer's weight
(see `visionblocks.init.init_weights`); they return the names of the blocks they changed."""

_RESERVED = ("type", "layer", "name")


@dataclass(frozen=True)
class _Rule:
    index: int
    fn: Callable[..., Any]
    classes: tuple[type, ...]
    class_names: frozenset[str]
    pattern: re.Pattern[str] | None
    params: dict[str, Any]
    description: str

    def matches(self, name: str, module: nn.Module) -> bool:
        if self.classes or self.class_names:
            by_class = isinstance(module, self.classes) if self.classes else False
            if not by_class and not any(
                c.__name__ in self.class_names for c in type(module).__mro__
            ):
                return False
        return self.pattern is None or self.pattern.fullmatch(name) is not None


def _resolve_type(where: str, kind: Any, registry: Registry) -> tuple[Callable[..., Any], str]:
    if isinstance(kind, str):
        try:
            return registry.get(kind), kind
        except KeyError as exc:
            raise ValueError(f"{where}: {exc.args[0]}") from None
    if callable(kind):
        return kind, getattr(kind, "__name__", type(kind).__name__)
    raise TypeError(
        f"{where}: 'type' must be an initializer name or a callable, got "
        f"{type(kind).__name__} ({kind!r})"
    )


def _check_params(where: str, label: str, fn: Callable[..., Any], params: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        signature.bind(None, **params)
    except TypeError as exc:
        accepted = [p for p in list(signature.parameters)[1:]]
        unknown = sorted(set(params) - set(accepted))
        problem = f"unknown keys {unknown}" if unknown else str(exc)
        raise ValueError(
            f"{where}: {problem} for initializer {label!r}; it accepts "
            f"{accepted} (plus the rule keys 'type', 'layer', 'name')"
        ) from None


def _parse_layer(
    where: str, layer: Any, known: set[str]
) -> tuple[tuple[type, ...], frozenset[str]]:
    if layer is None:
        return (), frozenset()
    items = list(layer) if isinstance(layer, list | tuple | set | frozenset) else [layer]
    if not items:
        raise ValueError(f"{where}: 'layer' is an empty list; omit it to match every layer")
    classes, names = [], []
    for item in items:
        if isinstance(item, type):
            classes.append(item)
        elif isinstance(item, str):
            if item not in known:
                close = difflib.get_close_matches(item, sorted(known), n=3)
                hint = f" Did you mean: {', '.join(repr(c) for c in close)}?" if close else ""
                raise ValueError(
                    f"{where}: layer {item!r} is neither a class in the model nor in "
                    f"torch.nn.{hint}"
                )
            names.append(item)
        else:
            raise TypeError(
                f"{where}: 'layer' entries must be class names or classes, got "
                f"{type(item).__name__} ({item!r})"
            )
    return tuple(classes), frozenset(names)


def _parse_rule(index: int, rule: Any, registry: Registry, known: set[str]) -> _Rule:
    where = f"rules[{index}]"
    if not isinstance(rule, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(rule).__name__} ({rule!r})")
    if "type" not in rule:
        raise ValueError(
            f"{where} has no 'type' key naming the initializer; got keys {sorted(rule)}"
        )
    for key in rule:
        if not isinstance(key, str):
            raise TypeError(f"{where}: keys must be strings, got {key!r}")
    fn, label = _resolve_type(where, rule["type"], registry)
    classes, class_names = _parse_layer(where, rule.get("layer"), known)
    pattern = rule.get("name")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise TypeError(f"{where}: 'name' must be a regex string, got {type(pattern).__name__}")
        try:
            pattern = re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"{where}: 'name' is not a valid regex ({exc}): {rule['name']!r}"
            ) from None
    params = {k: v for k, v in rule.items() if k not in _RESERVED}
    _check_params(where, label, fn, params)
    args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return _Rule(index, fn, classes, class_names, pattern, params, f"{where} {label}({args})")


def _known_class_names(modules: list[nn.Module]) -> set[str]:
    known = {c.__name__ for m in modules for c in type(m).__mro__}
    known.update(n for n, obj in vars(nn).items() if isinstance(obj, type))
    known.update(n for n, obj in vars(nn.modules.conv).items() if isinstance(obj, type))
    return known


def apply_rules(model: nn.Module, rules: Any, registry: Registry) -> dict[str, str]:
    """Match ``rules`` against ``model`` (later rules win) and run them; return the report."""
    if isinstance(rules, Mapping):
        rules = [rules]
    if isinstance(rules, str) or not isinstance(rules, list | tuple):
        raise TypeError(f"rules must be a list of dicts, got {type(rules).__name__}")
    named = list(model.named_modules())
    known = _known_class_names([m for _, m in named])
    parsed = [_parse_rule(i, r, registry, known) for i, r in enumerate(rules)]

    block_rules = [r for r in parsed if getattr(r.fn, BLOCK_INITIALIZER, False)]
    weighted = [(n, m) for n, m in named if has_weight(m)]
    chosen: dict[str, _Rule] = {}
    for rule in parsed:
        if rule in block_rules:
            continue
        hits = [n for n, m in weighted if rule.matches(n, m)]
        if rule.pattern is not None and not hits:
            examples = ", ".join(repr(n) for n, _ in weighted[:4]) or "none"
            raise ValueError(
                f"rules[{rule.index}]: name pattern {rule.pattern.pattern!r} selects no module "
                f"with a weight (it must match the whole qualified name, e.g. r'head\\..*' for "
                f"everything under 'head'; names with weights: {examples}, ...)"
            )
        chosen.update(dict.fromkeys(hits, rule))

    report = {}
    for name, module in weighted:
        rule = chosen.get(name)
        if rule is None:
            continue
        try:
            rule.fn(module, **rule.params)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{rule.description} failed on module {name!r} ({type(module).__name__}): {exc}"
            ) from exc
        report[name] = rule.description
    for rule in block_rules:
        _apply_block_rule(rule, named, report)
    return report


def _apply_block_rule(
    rule: _Rule, named: list[tuple[str, nn.Module]], report: dict[str, str]
) -> None:
    """Run a block initializer on the modules its rule selects (the model when unscoped)."""
    if rule.classes or rule.class_names or rule.pattern is not None:
        hits = [(n, m) for n, m in named if rule.matches(n, m)]
        if not hits:
            raise ValueError(f"rules[{rule.index}] ({rule.description}) selects no module")
    else:
        hits = named[:1]  # the model itself
    for prefix, module in hits:
        try:
            changed = rule.fn(module, **rule.params)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{rule.description} failed on module {prefix!r} ({type(module).__name__}): {exc}"
            ) from exc
        for name in changed or ():
            full = ".".join(p for p in (prefix, name) if p)
            report[full] = rule.description
