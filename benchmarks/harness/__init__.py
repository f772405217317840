"""Benchmark harness: our implementations timed and measured against peer libraries.

A `BenchCase` pairs ``ours`` with a ``peer`` on inputs built once by ``setup``, with
optional targets (``min_speedup``, ``min_busy_speedup``, ``max_memory_ratio``) and a
``check`` that both sides compute the same result (`benchmarks.harness.check`). `run_cases`
times each pair interleaved (median of paired ratios, `benchmarks.harness.timing`), on a
quiet machine and/or while busy neighbours compete for the cores
(`benchmarks.harness.busy`), measures each side's peak extra memory in a fresh process
(`benchmarks.harness.memory`) and returns `BenchResult` objects; `format_table` prints
them as Markdown tables (`benchmarks.harness.table`). ``visionblocks bench`` (and
``benchmarks/run.py``) run it from the command line.

Cases belong to a group (`GROUPS`): ``workload`` (what users run: a model's training step,
an augmentation pipeline), ``micro`` (one op at one size) and ``sweep`` (one op at one point
of a size sweep); reports list them in that order. Tiny calls are timed in calibrated loops
(``BenchCase.min_sample_ms``) and their Python-level calls counted with cProfile
(`count_calls`).

Adding a case: put it in a ``benchmarks/cases/*.py`` module listed in
`CASES`' modules, and call `register_case` at import time.

Only the standard library and torch are imported here; cases import their peers themselves.
"""

from __future__ import annotations

from benchmarks.harness.busy import BusyNeighbours
from benchmarks.harness.calls import count_calls
from benchmarks.harness.case import (
    CASES,
    GROUPS,
    BenchCase,
    get_case,
    list_cases,
    register_case,
    resolve_case,
    select_cases,
)
from benchmarks.harness.check import assert_same, same_outputs
from benchmarks.harness.memory import MemoryResult, measure_memory
from benchmarks.harness.report import BenchResult, results_from_json, results_to_json
from benchmarks.harness.runner import LOADS, add_arguments, run_cases, run_from_cli
from benchmarks.harness.table import MEMORY_COLUMNS, SPEED_COLUMNS, format_table
from benchmarks.harness.timing import TimingResult, num_threads, time_pair

__all__ = [
    "CASES",
    "GROUPS",
    "LOADS",
    "MEMORY_COLUMNS",
    "SPEED_COLUMNS",
    "BenchCase",
    "BenchResult",
    "BusyNeighbours",
    "MemoryResult",
    "TimingResult",
    "add_arguments",
    "assert_same",
    "count_calls",
    "format_table",
    "get_case",
    "list_cases",
    "measure_memory",
    "num_threads",
    "register_case",
    "resolve_case",
    "results_from_json",
    "results_to_json",
    "run_cases",
    "run_from_cli",
    "same_outputs",
    "select_cases",
    "time_pair",
]
