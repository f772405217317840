"""``visionblocks bench`` finds the suite in a clone, in ./benchmarks or in $VISIONBLOCKS_BENCHMARKS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from visionblocks.cli import _bench, main

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks"


@pytest.fixture
def no_suite(monkeypatch, tmp_path):
    """As installed from a wheel: no checkout beside the package, none in the cwd, no env."""
    monkeypatch.setattr(_bench, "CLONE_SUITE", tmp_path / "site-packages" / "benchmarks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(_bench.ENV_VAR, raising=False)
    return tmp_path


def test_suite_is_found_from_the_clone(monkeypatch):
    monkeypatch.delenv(_bench.ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert _bench.CLONE_SUITE == SUITE
    assert _bench.find_suite() == SUITE
    harness = _bench.load_harness(SUITE)
    assert Path(harness.__file__) == SUITE / "harness" / "__init__.py"
    assert sys.path[0] == str(REPO)


@pytest.mark.parametrize(
    "argv",
    [["bench"], ["bench", "--list"], ["bench", "giou*", "--repeats", "3", "--no-memory"]],
)
def test_without_a_suite_bench_says_how_to_get_it(no_suite, argv, capsys):
    assert _bench.find_suite() is None
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("visionblocks bench: the benchmark suite is not part of the")
    for hint in ("clone the repository", "make bench", "python benchmarks/run.py", _bench.ENV_VAR):
        assert hint in err


def test_without_a_suite_bench_help_says_how_to_get_it(no_suite, capsys):
    assert main(["bench", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: visionblocks bench")
    assert "not part of the visionblocks wheel" in out and "make bench" in out
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "not in the wheel" in " ".join(capsys.readouterr().out.split())


def test_the_environment_variable_names_a_checkout(no_suite, monkeypatch, capsys):
    monkeypatch.setenv(_bench.ENV_VAR, str(SUITE))
    assert _bench.find_suite() == SUITE
    assert main(["bench", "--list", "giou*"]) == 0
    assert capsys.readouterr().out.startswith("giou_loss_1m  (vs torchvision)")


def test_the_environment_variable_must_name_a_benchmarks_folder(no_suite, monkeypatch, capsys):
    monkeypatch.setenv(_bench.ENV_VAR, str(REPO))  # the checkout, not its benchmarks folder
    assert _bench.find_suite() is None
    assert main(["bench", "--list"]) == 2
    assert _bench.ENV_VAR in capsys.readouterr().err


def test_benchmarks_in_the_current_directory(no_suite, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert _bench.find_suite() == SUITE
    assert main(["bench", "--list", "giou*"]) == 0
    assert "giou_loss_1m" in capsys.readouterr().out


def test_a_suite_that_cannot_be_imported_is_reported(no_suite, monkeypatch, capsys):
    other = no_suite / "other" / "benchmarks"
    (other / "harness").mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "harness" / "__init__.py").write_text("")
    monkeypatch.setenv(_bench.ENV_VAR, str(other))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert _bench.find_suite() == other
    assert main(["bench", "--list"]) == 2
    assert f"cannot import the benchmark suite at {other}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cmd",
    [
        [sys.executable, str(SUITE / "run.py"), "--list", "giou*"],
        [sys.executable, "-m", "visionblocks", "bench", "--list", "giou*"],
    ],
    ids=["run.py", "visionblocks-bench"],
)
def test_the_suite_runs_from_another_directory(cmd, tmp_path):
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("giou_loss_1m  (vs torchvision)")
