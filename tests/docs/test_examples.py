"""The examples run end to end (``VISIONBLOCKS_QUICK=1``: a few steps on a few images), and
their ``--help`` answers at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# name: (takes --out, lines in stdout, files written under --out, patterns in stderr).
# The stderr patterns are the training progress bars: the last step of the run and the loss.
CASES = {
    "train_detector.py": (
        True,
        ["writing synthetic COCO data", "step    4  loss_cls", "val: AP", "saved"],
        ["detector.pth"],
        [r"training: 100%\|.*\| 4/4 .*loss=\d+\.\d{3}"],
    ),
    "compare_heads.py": (
        True,
        ["writing synthetic COCO data", "| head | steps | AP | AP50 |", "| fcos | ", "| yolov8 | "],
        [],
        [],
    ),
    "train_segmenter.py": (
        True,
        ["step    3  loss", "val mIoU"],
        [],
        [r"training \(ohem\): 100%\|.*\| 3/3 .*loss=\d+\.\d{3}"],
    ),
    "partial_loading.py": (
        True,
        [
            "resnet18.pth (44.7 MiB)",
            "fasterrcnn_r50.pth (159.8 MiB)",
            "1. a new head",
            "== 4. the wrong checkpoint fails loudly",
            "LoadError: only",
            "kept the checkpoint files",
        ],
        ["resnet18.pth", "fasterrcnn_r50.pth"],
        [],
    ),
    "warp_augment.py": (True, ["wrote"], ["warp_augment.png"], []),
    "local_ops.py": (False, ["max |difference|", "every parameter got a gradient: True"], [], []),
}


def run_example(
    name: str, args: list[str], cwd: Path, *options: str
) -> subprocess.CompletedProcess:
    env = {**os.environ, "VISIONBLOCKS_QUICK": "1"}
    command = [sys.executable, *options, str(EXAMPLES / name), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=180)


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("[!_]*.py")) == sorted(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path):
    """Runs, prints its results, writes its files and (training) shows per-step progress."""
    takes_out, expected, files, progress = CASES[name]
    done = run_example(name, ["--out", str(tmp_path)] if takes_out else [], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for text in expected:
        assert text in done.stdout, done.stdout[-2000:]
    for file in files:
        assert (tmp_path / file).is_file()
    for pattern in progress:
        assert re.search(pattern, done.stderr), done.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(CASES))
def test_help_answers_at_once_and_does_nothing(name, tmp_path):
    """``--help``: usage, every option's default, the quick mode and the outputs; it exits 0
    before importing torch (which takes seconds) and writes nothing."""
    done = run_example(name, ["--help"], tmp_path, "-X", "importtime")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: {name} [-h]")
    assert "VISIONBLOCKS_QUICK=1" in done.stdout
    assert re.search(r"^outputs|^disk use", done.stdout, re.MULTILINE), done.stdout
    options = re.findall(r"^  (--[a-z]+)", done.stdout, re.MULTILINE)
    assert options, done.stdout
    for option in options:  # each option has help text, and a default where it has one
        entry = done.stdout.split(f"  {option}", 1)[1].split("\n  -", 1)[0].split("\n\n")[0]
        entry = " ".join(entry.split())
        assert len(entry) > 30 and "default: " in entry, entry
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "torch" not in imported and "visionblocks" not in imported
    assert "argparse" in imported  # -X importtime did list the imports
    assert list(tmp_path.iterdir()) == []


def test_partial_loading_help_states_its_disk_use(tmp_path):
    done = run_example("partial_loading.py", ["--help"], tmp_path)
    assert "204 MiB" in done.stdout and "temporary folder" in done.stdout
    # The description is the whole docstring, not its first line.
    assert "Every step prints the `LoadReport`." in done.stdout
