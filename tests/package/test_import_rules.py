"""The package's import rules: layers point down, no cycles, triton only in ``kernels``.

Every ``import`` statement of every module under ``visionblocks/`` counts: at module level,
inside functions (lazy imports) and under ``TYPE_CHECKING``. A lazy import is still a
dependency; it only changes when the cost is paid. (The registries' lazy filling, which
imports modules by *name* through ``importlib``, is the one deliberate upward reach: a
registry lists the modules that register into it. It is not an import statement.)

The layers, lowest first (docs/architecture.md explains them):

0. ``_core``: checks, reduction and dtype policy, implementation choice, thread parts,
   native kernels, the registry core.
1. ``kernels``: Triton kernels and the routing of an op to its kernel.
2. ``ops``: functional tensor ops.
3. ``losses``, ``nn``, ``init``, ``weights``, ``distributed``, ``transforms``, ``training``.
4. ``features``, ``metrics``.
5. ``backbones``, ``data``.
6. ``models``.
7. ``registry`` (the public facade), ``deploy``.
8. ``cli``.
9. the package root (``visionblocks/__init__.py``, ``__main__``) and deprecated shims.

A module may import its own package and any lower layer; packages of the same layer do not
import each other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import visionblocks

ROOT = Path(visionblocks.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "_core": 0,
    "kernels": 1,
    "ops": 2,
    "losses": 3,
    "nn": 3,
    "init": 3,
    "weights": 3,
    "distributed": 3,
    "transforms": 3,
    "training": 4,
    "features": 4,
    "metrics": 4,
    "backbones": 5,
    "data": 5,
    "models": 6,
    "registry": 7,
    "deploy": 7,
    "cli": 8,
    "demo": 9,  # deprecated shim of visionblocks.cli.demo
    "__main__": 9,
    "": 9,  # visionblocks/__init__.py
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _group(module: str) -> str:
    """The top-level unit under ``visionblocks`` (``"ops"``, ``"_core"``; ``""`` the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _target(name: str) -> str | None:
    """The visionblocks module an imported dotted name refers to (longest known prefix)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """``id``s of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def _imports(module: str, *, type_only: bool = True) -> list[tuple[str, int]]:
    """``(imported name, line)`` for every import statement of ``module``, lazy ones too.

    ``type_only=False`` leaves out the imports under ``if TYPE_CHECKING:``.
    """
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if type_only else _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            # `from visionblocks.ops import boxes` imports the submodule; the package itself
            # counts only when a name is taken from it.
            subs = [f"{base_name}.{alias.name}" for alias in node.names]
            found += [(name, node.lineno) for name in subs if name in MODULES]
            if any(name not in MODULES for name in subs):
                found.append((base_name, node.lineno))
    return found


def _edges(*, type_only: bool = True) -> dict[str, dict[str, int]]:
    """``{module: {imported visionblocks module: line}}``."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for module in MODULES:
        for name, line in _imports(module, type_only=type_only):
            if name == "visionblocks" or name.startswith("visionblocks."):
                target = _target(name)
                if target is not None and target != module:
                    edges[module].setdefault(target, line)
    return edges


EDGES = _edges()
RUNTIME_EDGES = _edges(type_only=False)  # what runs: imports for type hints only left out


def test_every_unit_has_a_layer():
    unknown = sorted({_group(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"add these to LAYERS (and to docs/architecture.md): {unknown}"


def test_imports_point_down_the_layers():
    upward = []
    for module, targets in sorted(EDGES.items()):
        for target, line in sorted(targets.items()):
            a, b = _group(module), _group(target)
            if a != b and LAYERS[b] >= LAYERS[a]:
                upward.append(
                    f"{MODULES[module].relative_to(ROOT.parent)}:{line}: {module} -> {target}"
                )
    assert not upward, "imports that do not point down the layers:\n" + "\n".join(upward)


def _cycle(edges: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle of ``edges`` (as a closed path), or ``None``."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_modules():
    # Type-hint-only imports (`if TYPE_CHECKING:`) may point back: they never run.
    cycle = _cycle(RUNTIME_EDGES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycles_between_units():
    units: dict[str, dict[str, int]] = defaultdict(dict)
    for module, targets in EDGES.items():
        for target in targets:
            if _group(module) != _group(target):
                units[_group(module) or "visionblocks"][_group(target) or "visionblocks"] = 0
    cycle = _cycle(units)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_only_kernels_import_triton():
    offenders = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{line}"
        for m in MODULES
        if _group(m) != "kernels"
        for name, line in _imports(m)
        if name == "triton" or name.startswith("triton.")
    ]
    assert not offenders, f"triton imported outside visionblocks/kernels: {offenders}"


def test_nothing_below_the_command_line_imports_it():
    offenders = [
        f"{m} -> {t}"
        for m, targets in EDGES.items()
        for t in targets
        if _group(t) == "cli" and LAYERS[_group(m)] < LAYERS["cli"]
    ]
    assert not offenders, offenders


# The checker itself, on small graphs: a test that cannot fail is a defect.
@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b": 1}, "b": {"c": 1}}, None),
        ({"a": {"b": 1}, "b": {"a": 1}}, ["a", "b", "a"]),
        ({"a": {"b": 1}, "b": {"c": 1}, "c": {"b": 1}}, ["b", "c", "b"]),
        ({"a": {"a": 1}}, ["a", "a"]),
    ],
)
def test_cycle_finder(edges, expected):
    assert _cycle(edges) == expected


def test_relative_and_from_imports_are_resolved(tmp_path, monkeypatch):
    pkg = tmp_path / "visionblocks" / "ops"
    pkg.mkdir(parents=True)
    (tmp_path / "visionblocks" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from . import b\nfrom ..nn import conv\n\ndef f():\n    from visionblocks.ops.b import x\n"
        "\nif TYPE_CHECKING:\n    from visionblocks.nn import Thing\n"
    )
    monkeypatch.setitem(MODULES, "visionblocks.ops.a", pkg / "a.py")
    for name in ("visionblocks.ops.b", "visionblocks.nn.conv", "visionblocks.nn"):
        monkeypatch.setitem(MODULES, name, pkg / "a.py")
    names = {name for name, _ in _imports("visionblocks.ops.a")}
    # Submodules by name; a package only when a name is taken from it (`x` from ops.b).
    assert names == {"visionblocks.ops.b", "visionblocks.nn.conv", "visionblocks.nn"}
    runtime = {name for name, _ in _imports("visionblocks.ops.a", type_only=False)}
    assert runtime == {"visionblocks.ops.b", "visionblocks.nn.conv"}
