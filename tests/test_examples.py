"""The examples run end to end (``VISIONBLOCKS_QUICK=1``: a few steps on a few images)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CASES = {
    "train_detector.py": (True, ["val: AP", "saved"], ["detector.pth"]),
    "train_segmenter.py": (True, ["val mIoU"], []),
    "partial_loading.py": (
        True,
        ["1. a new head", "== 4. the wrong checkpoint fails loudly", "LoadError: only"],
        ["resnet18.pth"],
    ),
    "warp_augment.py": (True, ["wrote"], ["warp_augment.png"]),
    "local_ops.py": (False, ["max |difference|", "every parameter got a gradient: True"], []),
}


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path):
    takes_out, expected, files = CASES[name]
    command = [sys.executable, str(EXAMPLES / name)] + (
        ["--out", str(tmp_path)] if takes_out else []
    )
    env = {**os.environ, "VISIONBLOCKS_QUICK": "1"}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for text in expected:
        assert text in done.stdout, done.stdout[-2000:]
    for file in files:
        assert (tmp_path / file).is_file()
