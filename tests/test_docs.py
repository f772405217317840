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


def _report_block(page: Path) -> str:
    """The ``text`` block that follows the page's ``visionblocks check-coco`` command."""
    text = page.read_text()
    found = re.search(
        r"```bash\nvisionblocks check-coco [^\n]*\n```\n\n```text\n(.*?)```", text, re.S
    )
    assert found, "the page shows no check-coco report"
    return found.group(1)


def test_your_data_tutorial_runs_and_shows_the_real_report(tmp_path):
    page = ROOT / "docs" / "learn" / "your-data.md"
    script = "\n".join(python_blocks(page))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'AP50'" in done.stdout and "'unknown_category': [3]" in done.stdout
    report = subprocess.run(
        [sys.executable, "-m", "visionblocks", "check-coco", "export/annotations.json",
         "--images", "export/images"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert report.returncode == 1
    assert report.stdout == _report_block(page)  # the page shows what the command prints


def test_your_data_tutorial_lists_every_invalid_reason():
    from visionblocks.data import INVALID_REASONS

    text = (ROOT / "docs" / "learn" / "your-data.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert listed == list(INVALID_REASONS)
