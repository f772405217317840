"""Every public name has a rendered entry in the API reference.

The site is built once per session (``mkdocs build --strict``) and its ``objects.inv`` read:
the inventory lists every rendered object under its identifier, and under its aliases (the
paths it is imported under, and its canonical path). A public module is one under
``visionblocks`` whose dotted path has no component starting with ``_`` (the deprecated shim
``visionblocks.demo`` excepted). For every name in its ``__all__``, the inventory must hold
``module.name`` or the path where the object is defined: ``obj.__module__ + "." +
obj.__qualname__`` for classes and functions, griffe's ``final_target.path`` for constants
(they carry no ``__module__``). The benchmark harness, ``benchmarks.harness``, lives in the
repository rather than the wheel but has reference pages too, and is held to the same rule.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_MODULES = frozenset({"visionblocks.demo"})  # deprecated shim, removed in 0.3

# One inventory line: "name domain:role priority uri dispname" (Sphinx inventory version 2).
_INVENTORY_LINE = re.compile(
    r"(?P<name>.+?)\s+(?P<type>\S+)\s+(?P<priority>-?\d+)\s+(?P<uri>\S*)\s+(?P<dispname>.*)"
)


def public_modules(package: str = "visionblocks") -> list[str]:
    """``package`` and every public module under it, in dotted-path order."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        if info.name not in SKIPPED_MODULES:
            names.append(info.name)
    return sorted(names)


def read_inventory(path: Path) -> dict[str, str]:
    """The Python objects of an ``objects.inv``: identifier -> role (``function``, ``class``...).

    Format: four header lines, then zlib-compressed lines ``name domain:role priority uri
    dispname``.
    """
    lines = path.read_bytes().split(b"\n", 4)
    assert len(lines) == 5, f"{path}: shorter than the four header lines"
    header = [line.decode() for line in lines[:4]]
    assert header[0] == "# Sphinx inventory version 2", f"{path}: not a version 2 inventory"
    assert "zlib" in header[3], f"{path}: body not compressed with zlib: {header[3]!r}"
    objects = {}
    for line in zlib.decompress(lines[4]).decode().splitlines():
        match = _INVENTORY_LINE.fullmatch(line.strip())
        if match is None:
            continue
        domain, _, role = match["type"].partition(":")
        if domain == "py":
            objects[match["name"]] = role
    return objects


def _griffe_member(module_path: str, name: str, packages: dict):
    """The griffe object (or alias) ``name`` of the module ``module_path``."""
    top, *parts = module_path.split(".")
    if top not in packages:
        griffe = pytest.importorskip("griffe", reason="griffe comes with mkdocstrings[python]")
        packages[top] = griffe.load(
            top, search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False
        )
    obj = packages[top]
    for part in parts:
        obj = obj.members[part]
    return obj.members[name]


def defined_at(module_path: str, name: str, packages: dict) -> str:
    """The path where ``module_path.name`` is defined (its canonical path)."""
    obj = getattr(importlib.import_module(module_path), name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    member = _griffe_member(module_path, name, packages)
    return member.final_target.path if member.is_alias else member.path


def missing_names(module_paths: list[str], rendered: dict[str, str]) -> list[str]:
    """``module.name`` for every name in the modules' ``__all__`` that has no rendered entry."""
    packages: dict = {}
    missing = []
    for module_path in module_paths:
        for name in getattr(importlib.import_module(module_path), "__all__", ()):
            public = f"{module_path}.{name}"
            if public in rendered:
                continue
            canonical = defined_at(module_path, name, packages)
            if canonical not in rendered:
                missing.append(f"{public} (defined at {canonical})")
    return missing


def uncovered_modules(module_paths: list[str], rendered: dict[str, str]) -> list[str]:
    """The modules with no entry of their own whose parent module has none either."""
    return [
        path
        for path in module_paths
        if rendered.get(path) != "module" and rendered.get(path.rpartition(".")[0]) != "module"
    ]


@pytest.fixture(scope="session")
def rendered(built_site) -> dict[str, str]:
    """The Python objects of the built site's inventory (the site is built once, conftest)."""
    return read_inventory(built_site / "objects.inv")


def test_the_walk_finds_the_public_modules():
    modules = public_modules()
    assert {"visionblocks", "visionblocks.data.coco", "visionblocks.kernels.iou"} <= set(modules)
    assert not any("._" in name for name in modules)
    assert "visionblocks.demo" not in modules


def test_the_inventory_reader(tmp_path):
    body = "\n".join(
        [
            "visionblocks.ops.box_iou py:function 1 reference/ops-boxes/#$ -",
            "visionblocks.ops._private.box_iou py:function 2 reference/ops-boxes/#x -",
            "Box ops std:doc -1 reference/ops-boxes/ Box ops",
        ]
    )
    header = (
        "# Sphinx inventory version 2\n# Project: p\n# Version: 0\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    path = tmp_path / "objects.inv"
    path.write_bytes(header.encode() + zlib.compress(body.encode()))
    assert read_inventory(path) == {
        "visionblocks.ops.box_iou": "function",
        "visionblocks.ops._private.box_iou": "function",
    }


def test_every_public_name_has_a_rendered_entry(rendered):
    missing = missing_names(public_modules(), rendered)
    assert not missing, (
        f"{len(missing)} public names have no entry in the API reference: render them in a "
        "docs/reference/*.md page with `::: module` (a constant is only shown with a "
        "docstring):\n  " + "\n  ".join(missing)
    )


def test_every_public_module_has_an_entry_or_its_parent_has(rendered):
    uncovered = uncovered_modules(public_modules(), rendered)
    assert not uncovered, (
        "public modules without a reference entry, neither their own nor their parent's:\n  "
        + "\n  ".join(uncovered)
    )


def test_the_benchmark_harness_is_rendered(rendered):
    pytest.importorskip("benchmarks.harness", reason="the benchmark suite is not importable here")
    modules = public_modules("benchmarks.harness")
    problems = missing_names(modules, rendered) + [
        f"module {path}" for path in uncovered_modules(modules, rendered)
    ]
    assert not problems, (
        "parts of the benchmark harness without an entry on its reference pages "
        "(docs/reference/benchmark-harness*.md):\n  " + "\n  ".join(problems)
    )
