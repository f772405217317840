"""Nothing in ``visionblocks/`` imports the benchmark suite or a peer library, but where it
calls that library on purpose.

The benchmarks (``benchmarks/``, not in the wheel) compare visionblocks with kornia, OpenCV
and others; the library itself must never import them, not even inside a function. The
exceptions are listed in `ALLOWED`, each in one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import visionblocks

PACKAGE = Path(visionblocks.__file__).resolve().parent
FORBIDDEN = ("benchmarks", "kornia", "cv2", "mmcv", "mmdet", "mmengine", "detectron2")
"""Top-level names that must not be imported (timm is a dependency and allowed)."""
ALLOWED = {("cli/_bench.py", "benchmarks"), ("ops/_warp_opencv.py", "cv2")}
"""The exceptions: ``visionblocks bench`` imports the suite it found in a checkout; CPU warps
call OpenCV where it is installed (the ``opencv`` extra), in one module."""


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every import statement in ``tree``, nested ones included.

    Examples:
        >>> imported_modules(ast.parse("import a.b, c\\ndef f():\\n    from d.e import f"))
        [(1, 'a.b'), (1, 'c'), (3, 'd.e')]
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def test_the_walk_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    import kornia\n    return importlib.import_module('cv2')\n")
    assert imported_modules(tree) == [(2, "kornia"), (3, "cv2")]


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_peer_or_benchmark_imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
        for line, module in imported_modules(tree)
        if module.split(".")[0] in FORBIDDEN
        and (path.relative_to(PACKAGE).as_posix(), module.split(".")[0]) not in ALLOWED
    ]
    assert not bad, f"visionblocks imports a peer library or the benchmarks: {bad}"
