"""Benchmark results: verdicts (quiet, busy, memory), the two Markdown tables and the JSON form."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.harness import (
    MEMORY_COLUMNS,
    SPEED_COLUMNS,
    BenchResult,
    MemoryResult,
    TimingResult,
    format_table,
    results_from_json,
    results_to_json,
)

MIB = 1024 * 1024
QUIET = TimingResult(0.25, 1.0, 4.0, 3.5, 4.5, [0.25, 0.25], [1.0, 1.0])
BUSY = TimingResult(2.0, 1.0, 0.5, 0.4, 0.6, [2.0, 2.0], [1.0, 1.0])
BUSY_OK = TimingResult(0.5, 1.0, 2.0, 1.8, 2.2, [0.5, 0.5], [1.0, 1.0])


def _sample_results() -> list[BenchResult]:
    return [
        BenchResult(
            "fast_small",
            peer_name="torchvision",
            min_speedup=2.0,
            min_busy_speedup=1.0,
            max_memory_ratio=0.25,
            timing=QUIET,
            busy_timing=BUSY_OK,
            busy_load="2 torch processes",
            ours_memory=MemoryResult("ours", 10 * MIB, 500 * MIB, "vmhwm"),
            peer_memory=MemoryResult("peer", 80 * MIB, 500 * MIB, "vmhwm"),
        ),
        BenchResult("too_slow", peer_name="kornia", min_speedup=8.0, timing=QUIET),
        BenchResult(
            "no_target",
            timing=TimingResult(2.0, ours_times_ms=[2.0]),
            ours_memory=MemoryResult("ours", error="exit status 1\nMemoryError: tail"),
        ),
    ]


def _rows(lines: list[str], start: int, count: int) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in lines[start : start + count]
    ]


# ------------------------------------------------------------------ verdicts
def test_quiet_met_but_busy_missed_is_a_miss():
    result = BenchResult("x", min_speedup=2.0, min_busy_speedup=1.0, timing=QUIET)
    assert result.verdict == "ok" and result.busy_speed_met is None  # busy not run: unchecked
    result.busy_timing = BUSY  # 4x quiet, 0.5x busy
    assert result.speed_met is True and result.busy_speed_met is False
    assert result.verdict == "MISSED"
    result.busy_timing = BUSY_OK
    assert result.verdict == "ok"


def test_busy_target_alone_and_its_override():
    only_busy = BenchResult("x", min_speedup=5.0, min_busy_speedup=1.0, busy_timing=BUSY_OK)
    assert only_busy.speed_met is None and only_busy.verdict == "ok"
    assert BenchResult("x", min_busy_speedup=0.4, busy_timing=BUSY).verdict == "ok"
    assert BenchResult("x", min_busy_speedup=None, busy_timing=BUSY).verdict == "-"


def test_absolute_memory_target():
    def result(mib: float) -> BenchResult:
        return BenchResult(
            "load",
            peer_name="torch",
            min_speedup=1.0,
            max_memory_mib=117.0,
            timing=TimingResult(1.0, 2.0, 2.0, 2.0, 2.0, [1.0], [2.0]),
            ours_memory=MemoryResult("ours", int(mib * MIB), 500 * MIB, "vmhwm"),
        )

    assert result(13.0).verdict == "ok" and result(13.0).memory_mib_met is True
    assert result(130.0).verdict == "MISSED" and result(130.0).memory_mib_met is False
    assert "≥1x, ≤117 MiB" in format_table([result(13.0)])
    assert BenchResult("x", max_memory_mib=1.0).memory_mib_met is None  # not measured


# ------------------------------------------------------------------ tables
def test_speed_table_has_quiet_and_busy_columns_side_by_side():
    lines = format_table(_sample_results()).splitlines()
    assert lines[:2] == ["**Microbenchmarks: speed**", ""]
    assert lines[2] == "| " + " | ".join(SPEED_COLUMNS) + " |"
    assert "| quiet speedup | busy speedup |" in lines[2]
    assert lines[3] == "|" + "---|" * len(SPEED_COLUMNS)
    rows = _rows(lines, 4, 3)
    assert rows[0] == [
        "fast_small",
        "torchvision",
        "0.25",
        "1",
        "4.00x (3.50–4.50)",
        "2.00x (1.80–2.20)",
        "≥2x, busy ≥1x, mem ≤0.25",
        "ok",
    ]
    assert rows[1] == ["too_slow", "kornia", "0.25", "1", "4.00x (3.50–4.50)", "-", "≥8x", "MISSED"]
    assert rows[2] == ["no_target", "-", "2", "-", "-", "-", "-", "-"]


def test_memory_table_lists_what_was_measured():
    lines = format_table(_sample_results()).splitlines()
    at = lines.index("**Memory and bandwidth**")
    assert lines[at + 2] == "| " + " | ".join(MEMORY_COLUMNS) + " |"
    # too_slow measured no memory: no row; a failed measurement shows "error".
    assert _rows(lines, at + 4, 2) == [
        ["fast_small", "10.0", "80.0", "0.12"],
        ["no_target", "error", "-", "-"],
    ]
    assert lines[at + 6] == ""
    assert "Errors:" in lines and "MemoryError: tail" in "\n".join(lines)


def test_busy_only_run_labels_its_times_busy():
    result = BenchResult("x", peer_name="p", min_busy_speedup=1.0, busy_timing=BUSY_OK)
    lines = format_table([result]).splitlines()
    assert "| busy ours ms | busy peer ms | quiet speedup | busy speedup |" in lines[2]
    assert _rows(lines, 4, 1)[0][2:6] == ["0.5", "1", "-", "2.00x (1.80–2.20)"]
    assert "Memory and bandwidth" not in "\n".join(lines)  # nothing measured


def test_tables_fit_the_page():
    """Each table fits the docs content column once its cells wrap at spaces.

    A browser can narrow a column down to its longest unbreakable word: the sum of those
    (plus padding) is the narrowest each table can be laid out. mkdocs-material sets table
    text at 0.64rem in a content column of about 45rem: some 120 characters.
    """
    result = _sample_results()[0]
    result.case = "warp_affine_8x3x512_per_sample"
    result.peer_name = "torchvision CocoDetection + v2 wrapper"
    result.max_memory_mib = 117.0
    result.bytes_moved, result.copy_gbps = 48_000_000, 20.0
    tables = [t for t in format_table([result]).split("**") if t.strip().startswith("|")]
    assert len(tables) == 2
    for table in tables:
        rows = [line.strip("|").split("|") for line in table.strip().splitlines()]
        rows = [row for row in rows if not set("".join(row)) <= {"-"}]  # the --- rule
        assert len(rows[0]) <= 8
        widths = [max(max(map(len, cell.split())) for cell in column) for column in zip(*rows)]
        assert sum(width + 3 for width in widths) <= 120, widths


# ------------------------------------------------------------------ JSON
def test_json_round_trip_with_busy_fields():
    results = _sample_results()
    data = json.loads(json.dumps(results_to_json(results)))
    assert data["schema"] == 3 and data["environment"]["torch"] == torch.__version__
    assert data["environment"]["cpu_count"] >= 1
    first = data["results"][0]
    assert [r["verdict"] for r in data["results"]] == ["ok", "MISSED", "-"]
    assert first["memory_ratio"] == pytest.approx(0.125)
    assert first["busy_speedup"] == 2.0 and first["min_busy_speedup"] == 1.0
    assert first["busy_timing"]["ours_times_ms"] == [0.5, 0.5]
    assert first["busy_load"] == "2 torch processes"
    back = results_from_json(data)
    assert back == results
    assert isinstance(back[0].busy_timing, TimingResult) and back[0].busy_speedup == 2.0


def test_json_reads_schema_1_and_rejects_unknown():
    old = {"schema": 1, "results": [{"case": "a", "timing": None, "speedup": None}]}
    assert results_from_json(old) == [BenchResult("a")]
    with pytest.raises(ValueError, match="expected benchmark results of schema 1, 2 or 3, got 99"):
        results_from_json({"schema": 99})
    with pytest.raises(ValueError, match="got 'list'"):
        results_from_json([])  # type: ignore[arg-type]
