"""The benchmark harness: timing, fresh-process memory, table, JSON and the command line.

No assertion here is about the speed of visionblocks code: the speed test pits ``torch.add``
against a deliberately slow Python loop, so its outcome does not depend on the machine.
The cases are module-level so the fresh memory-measuring process can find them by importing
this module (``tests.bench.test_harness``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from benchmarks.harness import (
    CASES,
    BenchCase,
    format_table,
    get_case,
    list_cases,
    register_case,
    resolve_case,
    run_cases,
    select_cases,
    time_pair,
)
from benchmarks.harness.case import case_origins
from visionblocks.cli import main

MIB = 1024 * 1024
ALLOC_MIB = 200
REPO = Path(__file__).resolve().parents[2]


def _small_pair() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(64.0), torch.arange(64.0)


def _fast_add(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.add(*state)


def _slow_add(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = state
    return torch.stack([a[i] + b[i] for i in range(len(a))])


def _tiny() -> torch.Tensor:
    return torch.zeros(1)


def _allocate(state: torch.Tensor) -> torch.Tensor:
    return torch.ones(ALLOC_MIB * MIB // 4)  # written, so resident: 200 MiB


def _lazy_heavy_peer(state: torch.Tensor) -> torch.Tensor:
    from tests.bench import _heavy_import  # 150 MiB at import, like a big peer library

    return state + _heavy_import.BALLAST[:1]


def _boom(state: object) -> None:
    raise RuntimeError("boom from the test case")


ADD_CASE = BenchCase(
    "_vbtest_add",
    setup=_small_pair,
    ours=_fast_add,
    peer=_slow_add,
    peer_name="python loop",
    description="torch.add vs a loop over 64 elements",
    min_speedup=1.0,
    memory=False,
    threads=1,
)
ALLOC_CASE = BenchCase(
    "_vbtest_alloc",
    setup=_tiny,
    ours=_allocate,
    peer=torch.neg,
    peer_name="torch.neg",
    max_memory_ratio=0.5,
)


HEAVY_IMPORT_CASE = BenchCase(
    "_vbtest_heavy_import",
    setup=_tiny,
    ours=torch.neg,
    peer=_lazy_heavy_peer,
    peer_name="a library costly to import",
)


def alloc_case_factory() -> BenchCase:
    return ALLOC_CASE


@pytest.fixture
def registered() -> Iterator[Callable[[BenchCase], BenchCase]]:
    """Register cases for one test and remove them afterwards."""
    names: list[str] = []

    def add(case: BenchCase) -> BenchCase:
        register_case(case)
        names.append(case.name)
        return case

    yield add
    for name in names:
        CASES._remove(name)


# ------------------------------------------------------------------ cases and registry
def test_register_get_list_select(registered):
    registered(ADD_CASE)
    registered(ALLOC_CASE)
    assert get_case("_vbtest_add") is ADD_CASE
    assert list_cases("_vbtest_*") == ["_vbtest_add", "_vbtest_alloc"]
    assert select_cases(["_vbtest_al*"]) == [ALLOC_CASE]
    with pytest.raises(KeyError, match="already registered"):
        register_case(ADD_CASE)
    with pytest.raises(ValueError, match=r"no benchmark case matches 'nope\*'.*_vbtest_add"):
        select_cases(["_vbtest_add", "nope*"])


def test_register_rejects_non_case():
    with pytest.raises(TypeError, match="takes a BenchCase, got function"):
        register_case(_fast_add)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ours": 3}, TypeError, "ours must be callable"),
        ({"peer": "x"}, TypeError, "peer must be callable or None"),
        ({"min_speedup": 0}, ValueError, "min_speedup must be a positive number"),
        ({"threads": 0}, ValueError, "threads must be an int >= 1, got 0"),
    ],
)
def test_case_validation(kwargs, error, message):
    base = {"name": "x", "setup": _tiny, "ours": _fast_add}
    with pytest.raises(error, match=message):
        BenchCase(**{**base, **kwargs})


def test_resolve_case_from_spec_and_origins():
    assert resolve_case("tests.bench.test_harness:ALLOC_CASE") is ALLOC_CASE
    assert resolve_case("tests.bench.test_harness:alloc_case_factory") is ALLOC_CASE
    assert resolve_case("_vbtest_add", ["tests.bench.test_harness"]) is ADD_CASE
    assert case_origins(ALLOC_CASE) == [__name__, "torch"]
    with pytest.raises(KeyError, match="neither registered nor a module-level BenchCase"):
        resolve_case("_vbtest_missing", [__name__])


# ------------------------------------------------------------------ timing
def test_time_pair_deliberately_slow_peer_gives_speedup():
    result = time_pair(ADD_CASE, repeats=5, warmup=1)
    assert len(result.ours_times_ms) == len(result.peer_times_ms) == 5
    assert result.speedup > 1
    assert result.speedup_q1 <= result.speedup <= result.speedup_q3
    assert 0 < result.ours_ms < result.peer_ms


def test_time_pair_alternates_order_and_sets_threads():
    log: list[tuple[str, int]] = []
    case = BenchCase(
        "order",
        setup=lambda: log,
        ours=lambda s: s.append(("o", torch.get_num_threads())),
        peer=lambda s: s.append(("p", torch.get_num_threads())),
        threads=1,
    )
    before = torch.get_num_threads()
    time_pair(case, repeats=4, warmup=1)
    assert "".join(side for side, _ in log) == "op" + "op" + "po" + "op" + "po"
    assert {threads for _, threads in log} == {1}
    assert torch.get_num_threads() == before


def test_time_pair_without_peer_and_validation():
    case = BenchCase("solo", setup=_small_pair, ours=_fast_add)
    result = time_pair(case, repeats=2, warmup=0)
    assert len(result.ours_times_ms) == 2
    assert result.peer_ms is None and result.speedup is None and result.peer_times_ms == []
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        time_pair(case, repeats=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        time_pair(case, warmup=-1)


@pytest.mark.slow  # fresh processes
# ------------------------------------------------------------------ memory (fresh processes)
def test_memory_measured_in_fresh_process(registered):
    registered(ALLOC_CASE)
    # Hold a big tensor here: a child inherits its parent's resident size into ru_maxrss,
    # which must not leak into the measurement.
    ballast = torch.ones(300 * MIB // 4)
    (result,) = run_cases(["_vbtest_alloc"], repeats=1, warmup=0, memory=True)
    del ballast
    ours, peer = result.ours_memory, result.peer_memory
    assert ours.error is None and peer.error is None, (ours.error, peer.error)
    assert ours.extra_bytes >= 0.75 * ALLOC_MIB * MIB
    assert ours.extra_bytes <= 1.5 * ALLOC_MIB * MIB
    assert peer.extra_bytes < 0.25 * ALLOC_MIB * MIB
    assert result.memory_met is False and result.verdict == "MISSED"


@pytest.mark.slow  # fresh processes
def test_memory_baseline_excludes_imports(registered):
    """Both sides are imported and called once before the baseline: an import costs nothing."""
    registered(HEAVY_IMPORT_CASE)
    (result,) = run_cases(["_vbtest_heavy_import"], repeats=1, warmup=0, memory=True)
    for side in (result.ours_memory, result.peer_memory):
        assert side.error is None, side.error
        assert side.method == "vmhwm"
        assert side.extra_bytes < 20 * MIB, side  # not the 150 MiB of the import
        assert side.baseline_bytes > 150 * MIB  # the import happened before the baseline


def test_memory_error_is_reported_not_raised(registered):
    # Defined inside the test: a fresh process cannot find it, so measuring fails cleanly.
    registered(BenchCase("_vbtest_hidden", setup=_small_pair, ours=_fast_add))
    (result,) = run_cases(["_vbtest_hidden"], repeats=1, warmup=0, memory=True)
    assert result.error is None and result.timing is not None
    assert result.ours_memory.extra_bytes is None
    assert "_vbtest_hidden" in result.ours_memory.error
    assert "exit status 1" in result.ours_memory.error
    table = format_table([result])
    assert "| _vbtest_hidden | error | - | - |" in table
    assert "`_vbtest_hidden` ours memory failed" in table


def test_failing_case_does_not_stop_the_run(registered):
    registered(BenchCase("_vbtest_a_boom", setup=_tiny, ours=_boom, min_speedup=1.0))
    registered(ADD_CASE)
    results = run_cases(["_vbtest_*"], repeats=2, warmup=0, memory=False)
    assert [r.case for r in results] == ["_vbtest_a_boom", "_vbtest_add"]
    assert results[0].verdict == "error" and "boom from the test case" in results[0].error
    assert results[1].verdict == "ok"
    assert "`_vbtest_a_boom` case failed" in format_table(results)


# ------------------------------------------------------------------ cases
def test_weights_case_file_size_constant():
    """FILE_MIB, the basis of the load cases' memory target, is the real file's size."""
    from benchmarks.cases import weights

    path = weights._checkpoint_path()
    assert os.path.getsize(path) / MIB == pytest.approx(weights.FILE_MIB, abs=0.05)


def test_the_cases_write_their_inputs_in_the_cache(bench_cache, monkeypatch, tmp_path):
    """Under ``$VISIONBLOCKS_BENCH_CACHE`` (this run's temp folder), else the user cache
    folder: never the system temp folder."""
    from benchmarks.cases import _cache, coco, weights

    assert Path(weights._checkpoint_path()).parent == bench_cache
    assert Path(coco._data()[1]).parent == bench_cache / "coco-320x416"
    monkeypatch.delenv(_cache.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_cache.sys, "platform", "linux")
    assert _cache.cache_dir("a") == str(tmp_path / "visionblocks" / "bench" / "a")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _cache.cache_dir() == str(tmp_path / ".cache" / "visionblocks" / "bench")


# ------------------------------------------------------------------ command line
def test_cli_list(registered, capsys):
    registered(ADD_CASE)
    assert main(["bench", "--list"]) == 0
    assert "_vbtest_add  (vs python loop): torch.add vs a loop" in capsys.readouterr().out


def test_cli_unknown_pattern_exits_1_listing_cases(registered, capsys):
    registered(ADD_CASE)
    assert main(["bench", "_vbtest_nope*"]) == 1
    err = capsys.readouterr().err
    assert "no benchmark case matches '_vbtest_nope*'" in err and "_vbtest_add" in err


def test_cli_run_writes_json_and_markdown(registered, capsys, tmp_path):
    registered(ADD_CASE)
    # The loop as "ours" against torch.add: a missed target, reported but not an exit code.
    registered(
        BenchCase(
            "_vbtest_missed",
            setup=_small_pair,
            ours=_slow_add,
            peer=_fast_add,
            min_speedup=1.0,
            memory=False,
        )
    )
    argv = ["bench", "_vbtest_*", "--repeats", "3", "--warmup", "1", "--no-memory"]
    argv += ["--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Microbenchmarks: speed**\n\n| case | peer | quiet ours ms |")
    data = json.loads((tmp_path / "r.json").read_text())
    verdicts = {r["case"]: r["verdict"] for r in data["results"]}
    assert verdicts == {"_vbtest_add": "ok", "_vbtest_missed": "MISSED"}
    assert (tmp_path / "r.md").read_text() == out


def test_cli_with_no_cases_registered(monkeypatch, capsys):
    monkeypatch.setattr(CASES, "_entries", {})
    monkeypatch.setattr(CASES, "_modules_loaded", True)
    assert main(["bench"]) == 0
    assert "no benchmark cases are registered yet" in capsys.readouterr().err
    assert main(["bench", "--list"]) == 0
    assert "no benchmark cases are registered yet" in capsys.readouterr().out


def test_cli_rejects_bad_repeats(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--repeats", "0"])
    assert info.value.code == 2
    assert "expected an integer >= 1, got 0" in capsys.readouterr().err


def test_benchmarks_run_script(registered, capsys, tmp_path):
    registered(ADD_CASE)
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = ["--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md")]
    assert module.main(["_vbtest_add", "--repeats", "2", "--warmup", "0", *paths]) == 0
    assert "| case | peer |" in (tmp_path / "r.md").read_text()
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result["timing"] and result["busy_timing"]  # run.py defaults to --load both
    assert module.DEFAULT_JSON == REPO / "benchmarks" / "results.json"
