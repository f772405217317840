"""Code in the README and the docs: the README example runs; every Python block compiles."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_compile(page):
    for i, block in enumerate(python_blocks(page)):
        compile(block, f"{page.name} block {i}", "exec")


def test_readme_example_runs(tmp_path):
    (block,) = python_blocks(ROOT / "README.md")
    done = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'AP50'" in done.stdout
