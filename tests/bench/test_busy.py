"""Busy-neighbour mode: the neighbours compute while busy timings run and never outlive them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from benchmarks.harness import CASES, BenchCase, BusyNeighbours, register_case, run_cases
from benchmarks.harness import runner as runner_module
from visionblocks.cli import main

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")


def _small_pair() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(64.0), torch.arange(64.0)


def _fast_add(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.add(*state)


def _slow_add(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = state
    return torch.stack([a[i] + b[i] for i in range(len(a))])


def _interrupt(state: object) -> None:
    raise KeyboardInterrupt


ADD_CASE = BenchCase(
    "_vbtest_busy_add",
    setup=_small_pair,
    ours=_fast_add,
    peer=_slow_add,
    peer_name="python loop",
    min_speedup=1.0,
    memory=False,
    threads=1,
)


@pytest.fixture
def registered() -> Iterator[Callable[[BenchCase], BenchCase]]:
    names: list[str] = []

    def add(case: BenchCase) -> BenchCase:
        register_case(case)
        names.append(case.name)
        return case

    yield add
    for name in names:
        CASES._remove(name)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_ticks(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[11]) + int(fields[12])  # utime + stime


def _neighbour_children() -> list[int]:
    """Our child processes running the neighbour module (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat(int(entry))[1])
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"benchmarks.harness._neighbour" in cmdline:
            found.append(int(entry))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------ the neighbours
def test_neighbours_compute_and_are_killed():
    with BusyNeighbours(count=2, size=128) as load:
        pids = load.pids
        assert len(pids) == 2 and sorted(_neighbour_children()) == sorted(pids)
        before = [_cpu_ticks(pid) for pid in pids]
        time.sleep(1.0)
        assert all(_cpu_ticks(pid) > ticks for pid, ticks in zip(pids, before))
        assert "2 torch processes" in load.description
    assert load.pids == [] and _neighbour_children() == []
    assert all(_gone(pid) for pid in pids)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_neighbours_are_killed_on_error_and_interrupt(error):
    with pytest.raises(error), BusyNeighbours(count=2, size=64) as load:
        pids = load.pids
        raise error
    assert _neighbour_children() == [] and all(_gone(pid) for pid in pids)


@pytest.mark.slow
def test_ensure_running_restarts_a_dead_neighbour():
    with BusyNeighbours(count=2, size=64) as load:
        first, second = load.pids
        os.kill(first, 9)
        load._procs[0].wait(timeout=30)  # a busy machine can take over 0.2 s to reap it
        load.ensure_running()
        assert load.pids[1] == second and load.pids[0] != first
        assert not _gone(load.pids[0])
    assert _neighbour_children() == []


class _Broken(BusyNeighbours):
    def __init__(self, code: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.code = code

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", self.code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("import sys; sys.exit('neighbour broke')", r"exit status 1\): neighbour broke"),
        ("import time; time.sleep(60)", r"no first product within 0.5 s"),
    ],
)
def test_a_neighbour_that_cannot_start_is_reported(code, message):
    load = _Broken(code, count=2, ready_timeout=0.5)
    with pytest.raises(RuntimeError, match=message):
        load.start()
    assert load.pids == []


def test_neighbour_arguments_are_checked():
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        BusyNeighbours(count=0)


# ------------------------------------------------------------------ busy runs
def test_run_both_times_each_case_quiet_and_busy(registered):
    registered(ADD_CASE)
    lines: list[str] = []
    (result,) = run_cases(
        ["_vbtest_busy_add"], repeats=3, warmup=0, memory=False, load="both", progress=lines.append
    )
    assert result.timing is not None and result.busy_timing is not None
    assert len(result.busy_timing.ours_times_ms) == 3 and result.busy_speedup > 0
    assert result.min_busy_speedup == 1.0 and "torch processes" in result.busy_load
    assert [line.split(":")[0] for line in lines] == [
        "[1/1] _vbtest_busy_add quiet",
        "[1/1] _vbtest_busy_add busy",
    ]
    assert _neighbour_children() == []


def test_busy_run_measures_memory_quiet_and_kills_neighbours(registered, monkeypatch):
    registered(BenchCase("_vbtest_busy_mem", setup=_small_pair, ours=_fast_add, peer=_fast_add))
    seen: list[int] = []

    def fake_memory(case, side):
        seen.append(len(_neighbour_children()))
        return None

    monkeypatch.setattr(runner_module, "measure_memory", fake_memory)
    (result,) = run_cases(["_vbtest_busy_mem"], repeats=2, warmup=0, memory=True, load="busy")
    assert seen == [0, 0]  # both sides measured, no neighbour running
    assert result.timing is None and result.busy_timing is not None
    assert _neighbour_children() == []


def test_interrupted_busy_run_leaves_no_neighbour(registered):
    registered(BenchCase("_vbtest_busy_int", setup=_small_pair, ours=_interrupt, memory=False))
    with pytest.raises(KeyboardInterrupt):
        run_cases(["_vbtest_busy_int"], repeats=1, warmup=0, load="busy")
    assert _neighbour_children() == []


def test_no_busy_target_without_a_peer_and_bad_load(registered):
    registered(BenchCase("_vbtest_busy_solo", setup=_small_pair, ours=_fast_add, memory=False))
    (result,) = run_cases(["_vbtest_busy_solo"], repeats=1, warmup=0, memory=False)
    assert result.min_busy_speedup is None and result.busy_timing is None
    with pytest.raises(ValueError, match="load must be one of 'quiet', 'busy', 'both', got 'x'"):
        run_cases(["_vbtest_busy_solo"], load="x")  # type: ignore[arg-type]


def test_cli_load_both_prints_quiet_and_busy(registered, capsys):
    registered(ADD_CASE)
    argv = ["bench", "_vbtest_busy_add", "--load", "both", "--repeats", "2", "--warmup", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| quiet speedup | busy speedup |" in out
    row = next(line for line in out.splitlines() if line.startswith("| _vbtest_busy_add"))
    quiet, busy = (cell.strip() for cell in row.strip("|").split("|")[4:6])
    assert quiet.endswith(")") and busy.endswith(")")  # both measured: "1.23x (1.1–1.3)"
    with pytest.raises(SystemExit):
        main(["bench", "--load", "heavy"])
