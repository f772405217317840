"""Every Python block and every console command in ``docs/`` and ``README.md`` runs, and
prints what the page shows (the conventions are in ``tests/docs/pages.py``)."""

from __future__ import annotations

import doctest
import json
import os
import select
import signal
import subprocess
import sys
import time
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


def page_env(cwd: Path | None = None) -> dict[str, str]:
    """The environment a page runs in (``TMPDIR``: its working directory, when given)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "MPLBACKEND": "Agg", "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    if cwd is not None:
        env["TMPDIR"] = str(cwd)  # a page's tempfile.mkdtemp() folders end with the test's tmp_path
    env.pop("TRITON_INTERPRET", None)  # the test suite's, not a reader's
    # VISIONBLOCKS_QUICK=1 (make test) stays: the page runs its quick settings, as do the
    # examples it starts; make test-all runs it in full.
    return env


class PageServer:
    """``_driver.py --serve``, started once per test process: it imports torch, torchvision
    and visionblocks once and forks a fresh process per page (`run`), which then runs as
    ``python _driver.py PAGE RESULTS`` would, without paying those imports again."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.count, self.proc = folder, 0, None

    def _start(self) -> None:
        requests, self.requests = os.pipe()
        self.replies, replies = os.pipe()
        self.buffer = b""
        with open(self.folder / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), "--serve", str(requests), str(replies)],
                pass_fds=(requests, replies), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                cwd=self.folder, env=page_env(),
            )  # fmt: skip
        os.close(requests)
        os.close(replies)

    def _reply(self, deadline: float) -> dict | None:
        """The server's next JSON line, or None at ``deadline``."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                return None
            chunk = os.read(self.replies, 4096)
            if not chunk:
                log = (self.folder / "server.log").read_text()[-3000:]
                raise RuntimeError(f"the docs page server stopped:\n{log}")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def run(self, page: Path, cwd: Path, results: Path, timeout: float) -> tuple[int, str]:
        """Run ``page`` in ``cwd``: the exit code of its process and what it wrote."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.count += 1
        log = self.folder / f"page-{self.count}.log"
        request = {"page": str(page), "results": str(results), "cwd": str(cwd),
                   "env": page_env(cwd), "log": str(log)}  # fmt: skip
        os.write(self.requests, json.dumps(request).encode() + b"\n")
        deadline = time.monotonic() + timeout
        started = self._reply(deadline)
        reply = started and self._reply(deadline)
        if reply is None:
            if started:
                os.kill(started["pid"], signal.SIGKILL)
                self._reply(time.monotonic() + 60)
            output = log.read_text()[-3000:] if log.exists() else ""
            raise subprocess.TimeoutExpired(str(page), timeout, output)
        return reply["status"], log.read_text()

    def close(self) -> None:
        if self.proc is not None:
            os.close(self.requests)
            os.close(self.replies)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def page_server(tmp_path_factory) -> PageServer:
    server = PageServer(tmp_path_factory.mktemp("docs-page-server"))
    yield server
    server.close()


def run_page(page: Path, cwd: Path, server: PageServer, timeout: float = 900) -> list[dict]:
    """Run the page's steps in a fresh process in ``cwd``; one result per step."""
    results = cwd / ".docs-test-results.json"
    status, output = server.run(page, cwd, results, timeout)
    assert status == 0, output[-3000:]
    return json.loads(results.read_text())


SLOW_PAGES = {"docs/learn/deploy.md": "exports to ONNX and runs the file"}
"""Pages that ``make test`` leaves to ``make test-all``, and why (the others run in both; those
that train run on their quick settings in ``make test``)."""


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if _page_id(p) in SLOW_PAGES else p for p in RUNNABLE],
    ids=_page_id,
)
def test_page_runs_and_prints_what_it_shows(page, tmp_path, page_server):
    expected = {step.line: step for step in steps(page)}
    for result in run_page(page, tmp_path, page_server):
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
