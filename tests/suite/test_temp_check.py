"""The suite fails a run that leaves new entries in the temp folder (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_probe(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run one probe test with the suite's conftest as a plugin; its temp folder is inside
    ``tmp_path``, so whatever the probe leaves stays there."""
    temp = tmp_path / "temp"
    temp.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    probe = tmp_path / "test_probe.py"
    probe.write_text(body)
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), str(probe)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("leaks", [True, False])
def test_a_run_that_leaves_temp_entries_fails(tmp_path, leaks):
    body = "import tempfile\n\ndef test_probe(tmp_path):\n"
    body += '    tempfile.mkdtemp(prefix="leak-")\n' if leaks else '    (tmp_path / "f").touch()\n'
    done = _run_probe(tmp_path, body)
    output = done.stdout + done.stderr
    assert "1 passed" in output, output
    if leaks:
        assert done.returncode == 1, output
        assert "left 1 new entries" in output and "leak-" in output
    else:
        assert done.returncode == 0, output
