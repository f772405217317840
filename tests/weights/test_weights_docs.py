"""docs/learn/checkpoints.md runs as written, and prints what its output blocks show."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "learn" / "checkpoints.md"


def test_the_checkpoints_page_runs_and_shows_its_real_output(tmp_path):
    text = PAGE.read_text()
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for shown in re.findall(r"^```text\n(.*?)^```", text, re.S | re.M):
        assert shown in done.stdout, shown
