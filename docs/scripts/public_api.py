"""The public API as the docs see it: every name in the ``__all__`` of every public module.

Read statically with griffe (the library mkdocstrings renders with), so nothing is imported.
A public module is one whose dotted path has no part starting with ``_``; the deprecated
``visionblocks.demo`` shim is left out. The API index page and the cross-links of the docs
build (``mkdocs_hooks.py``) and the reference-coverage test all start from here::

    python docs/scripts/public_api.py          # print the API index page's Markdown
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "visionblocks"
SKIPPED_MODULES = frozenset({"visionblocks.demo", "visionblocks.__main__"})
# Short names too generic to link from prose on their own (their dotted forms still link).
GENERIC_NAMES = frozenset({"main", "available", "build_parser", "NOTES", "FORMATS"})


@dataclass(frozen=True)
class Symbol:
    """One public name: where users import it from and where it is defined (and rendered)."""

    name: str
    module: str
    target: str
    kind: str
    summary: str
    filepath: str
    lineno: int | None
    endlineno: int | None

    @property
    def public_path(self) -> str:
        return f"{self.module}.{self.name}"


def load(root: Path = ROOT) -> griffe.Module:
    """The package, loaded statically from ``root``, aliases resolved inside the package."""
    return griffe.load(PACKAGE, search_paths=[str(root)], resolve_aliases=True,
                       resolve_external=False)  # fmt: skip


def public_modules(package: griffe.Module) -> list[griffe.Module]:
    """Every public module of ``package``, the package first, then in dotted-path order."""
    found, todo = [], [package]
    while todo:
        module = todo.pop()
        if module.path in SKIPPED_MODULES:
            continue
        found.append(module)
        todo.extend(
            child
            for name, child in module.modules.items()
            if not name.startswith("_") and not child.is_alias
        )
    return sorted(found, key=lambda module: (module.path != package.path, module.path))


def _summary(obj: griffe.Object) -> str:
    if not obj.docstring:
        return ""
    first = obj.docstring.value.strip().split("\n\n")[0]
    return " ".join(first.split())


def _served(module: griffe.Module) -> dict[str, str]:
    """A module's ``_SERVED`` (name → the module defining it), read statically."""
    member = module.members.get("_SERVED")
    return ast.literal_eval(str(member.value)) if member is not None else {}


def public_symbols(package: griffe.Module | None = None) -> list[Symbol]:
    """One entry per name in each public module's ``__all__``, in module then name order."""
    package = package or load()
    symbols = []
    for module in public_modules(package):
        served = _served(module)
        for name in sorted(module.exports or ()):
            if name in served:  # defined a layer above, served by the module's __getattr__
                member = package.get_member(f"{served[name]}.{name}".partition(".")[2])
            else:
                member = module.get_member(name)
            target = member.final_target if member.is_alias else member
            filepath = target.relative_filepath if not target.is_module else None
            symbols.append(
                Symbol(
                    name=name,
                    module=module.path,
                    target=target.path,
                    kind=target.kind.value,
                    summary=_summary(target),
                    filepath=str(filepath or target.relative_filepath),
                    lineno=target.lineno,
                    endlineno=target.endlineno,
                )
            )
    return symbols


def link_targets(symbols: list[Symbol]) -> dict[str, str]:
    """Code-span text to the identifier it links to: full public paths and unique short names.

    A short name exported by several modules for different objects is left out (ambiguous);
    the same object re-exported (``visionblocks.losses.sigmoid_focal_loss`` and
    ``visionblocks.losses.focal.sigmoid_focal_loss``) counts once.
    """
    by_name: dict[str, set[str]] = defaultdict(set)
    targets = {}
    for symbol in symbols:
        targets[symbol.public_path] = symbol.target
        targets[symbol.target] = symbol.target
        if symbol.kind != "module":
            by_name[symbol.name].add(symbol.target)
    for name, found in by_name.items():
        if len(found) == 1 and name not in GENERIC_NAMES:
            targets[name] = next(iter(found))
    return targets


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def api_index_markdown(symbols: list[Symbol]) -> str:
    """The API index page: one line per public name, grouped by module, linked to its entry."""
    by_module: dict[str, list[Symbol]] = defaultdict(list)
    for symbol in symbols:
        by_module[symbol.module].append(symbol)
    lines = [
        "# API index",
        "",
        "Every public name, one line each: the names in the `__all__` of every public module,",
        "linked to their reference entry. The page is generated when the docs are built",
        "(`docs/scripts/public_api.py`), so it lists exactly what the package exports.",
        f"{len(symbols)} names in {len(by_module)} modules.",
        "",
    ]
    for module, members in by_module.items():
        lines += [f"## `{module}`", "", "| Name | Kind | Summary |", "|---|---|---|"]
        for symbol in members:
            lines.append(
                f"| [`{symbol.name}`][{symbol.target}] | {symbol.kind} | {_cell(symbol.summary)} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(api_index_markdown(public_symbols()))
