"""The Architecture page: its recipe runs, and its layer table is the one the import test checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.docs.pages import blocks
from tests.package.test_import_rules import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"

RUNNER = """
import doctest, sys, types
module = types.ModuleType("balanced_l1_example")
exec(compile(SOURCE, "architecture.md", "exec"), module.__dict__)
tests = [name for name in vars(module) if name.startswith("test_")]
assert len(tests) >= 4, tests
for name in tests:
    getattr(module, name)()
finder = doctest.DocTestFinder()
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
for obj in (module.balanced_l1_loss, module.BalancedL1Loss):
    for test in finder.find(obj, globs=vars(module)):
        runner.run(test)
assert runner.failures == 0 and runner.tries >= 2, runner.summarize()
print("ran", len(tests), "tests and", runner.tries, "doctest examples")
"""


def test_the_add_a_block_recipe_runs():
    source = "\n".join(b.code for b in blocks(PAGE.read_text()) if b.lang == "python")
    script = f"SOURCE = {source!r}\n{RUNNER}"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran 4 tests" in done.stdout


def test_the_layer_table_matches_the_import_rules():
    table = PAGE.read_text().split("## Layers", 1)[1].split("## Where things go", 1)[0]
    rows = re.findall(r"^\| (\d) \| (.*?) \|", table, re.M)
    documented = {}
    for layer, cell in rows:
        for name in re.findall(r"`([\w_]+)(?:/|\.py)`", cell):
            documented[name] = int(layer)
    expected = {name: layer for name, layer in LAYERS.items() if name not in ("", "demo")}
    expected["__init__"] = LAYERS[""]
    assert documented == expected


def test_the_paths_the_page_names_exist():
    text = PAGE.read_text()
    paths = set(re.findall(r"`((?:tests|benchmarks|docs)/[\w/.]+\.(?:py|md))`", text))
    paths |= {
        f"visionblocks/{p}"
        for p in re.findall(r"`((?:kernels|cli|_core|ops|losses)/_?[a-z_]+\.py)`", text)
    }
    paths.discard("visionblocks/kernels/<name>.py")
    assert len(paths) >= 8
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
