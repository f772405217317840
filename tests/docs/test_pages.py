"""Every Python block and every console command in ``docs/`` and ``README.md`` runs, and
prints what the page shows (the conventions are in ``tests/docs/pages.py``)."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .pages import PAGES, ROOT, blocks, steps

DRIVER = Path(__file__).with_name("_driver.py")
RUNNABLE = [page for page in PAGES if any(not step.skip for step in steps(page))]
_CHECKER = doctest.OutputChecker()


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def matches(expected: str, printed: str) -> bool:
    """Whether ``printed`` is what the page shows: doctest's ``...`` wildcard, and any run of
    whitespace equal to any other (so a page may wrap long output lines)."""
    want = "\n".join(line.rstrip() for line in expected.strip("\n").splitlines()) + "\n"
    got = "\n".join(line.rstrip() for line in printed.strip("\n").splitlines()) + "\n"
    return _CHECKER.check_output(want, got, doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)


def run_page(page: Path, cwd: Path, timeout: float = 900) -> list[dict]:
    """Run the page's steps in a fresh process in ``cwd``; one result per step."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "MPLBACKEND": "Agg", "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    env["TMPDIR"] = str(cwd)  # a page's tempfile.mkdtemp() folders end with the test's tmp_path
    env.pop("TRITON_INTERPRET", None)  # the test suite's, not a reader's
    # VISIONBLOCKS_QUICK=1 (make test) stays: the page runs its quick settings, as do the
    # examples it starts; make test-all runs it in full.
    results = cwd / ".docs-test-results.json"
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(page), str(results)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(results.read_text())


SLOW_PAGES = {"docs/learn/deploy.md": "exports to ONNX and runs the file"}
"""Pages that ``make test`` leaves to ``make test-all``, and why (the others run in both; those
that train run on their quick settings in ``make test``)."""


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if _page_id(p) in SLOW_PAGES else p for p in RUNNABLE],
    ids=_page_id,
)
def test_page_runs_and_prints_what_it_shows(page, tmp_path):
    expected = {step.line: step for step in steps(page)}
    for result in run_page(page, tmp_path):
        step = expected[result["line"]]
        where = f"{_page_id(page)}:{step.line}"
        if "skipped" in result:
            continue
        assert result["error"] is None, f"{where} failed:\n{result['error'][-4000:]}"
        if step.expected is not None:
            assert matches(step.expected, result["output"]), (
                f"{where} prints something else than the page shows.\n"
                f"--- page ---\n{step.expected}--- printed ---\n{result['output']}"
            )


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_python_block_compiles(page):
    for block in blocks(page.read_text(), _page_id(page)):
        if block.lang == "python":
            compile(block.code, f"{_page_id(page)}:{block.line}", "exec")


def test_the_matcher_can_fail():
    assert matches("a ... c\n", "a b c")
    assert not matches("a b c\n", "a b d")
    assert not matches("", "something")
    assert matches("{'a': 1,\n 'b': 2}\n", "{'a': 1, 'b': 2}")
    assert not matches("{'a': 1,'b': 2}\n", "{'a': 1, 'b': 2}")
