"""`benchmarks/plot.py`: the Benchmarks page's chart, drawn from a results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import results_to_json
from tests.bench.test_report import _sample_results

PLOT = Path(__file__).resolve().parents[2] / "benchmarks" / "plot.py"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PLOT), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_draws_a_png_from_a_results_file(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(results_to_json(_sample_results())))
    out = tmp_path / "chart.png"
    done = _run(str(results), str(out), cwd=tmp_path)  # from another folder than the repo
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_names_the_arguments_and_writes_nothing(tmp_path):
    done = _run("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "results_json" in done.stdout and "docs/assets/benchmarks.png" in done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", ["[]", None])
def test_empty_or_missing_results_fail_with_a_message(tmp_path, content):
    results = tmp_path / "results.json"
    if content is not None:
        results.write_text(content)
    done = _run(str(results), str(tmp_path / "chart.png"), cwd=tmp_path)
    assert done.returncode != 0
    assert str(results) in done.stderr
    assert not (tmp_path / "chart.png").exists()


def test_sweep_results_draw_the_sweep_chart_only(tmp_path):
    from benchmarks.harness import BenchResult, TimingResult

    results = [
        BenchResult(
            f"sweep_focal_1e{k}_t{t}",
            peer_name="torchvision",
            min_speedup=0.9,
            threads=t,
            timing=TimingResult(1.0, 1.0 + k / 10, 1.0 + k / 10, 1.0, 1.2),
            group="sweep",
            params={"op": "sigmoid_focal_loss", "size": f"1e{k}", "elements": 10**k},
        )
        for k in (1, 2, 3)
        for t in (1, 2)
    ]
    data = tmp_path / "sweep.json"
    data.write_text(json.dumps(results_to_json(results)))
    main, sweep = tmp_path / "chart.png", tmp_path / "sweep.png"
    done = _run(str(data), str(main), "--sweep-output", str(sweep), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(sweep)]
    assert sweep.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not main.exists()
