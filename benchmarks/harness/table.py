"""The results as Markdown: workloads first, then the microbenchmarks, then the size sweep.

Each group of cases (`benchmarks.harness.case.GROUPS`) gets its own speed table, workloads
first (what users run), then the microbenchmarks (one op at one size). One wide table did not
fit the docs page, so memory and bandwidth are a second table sharing the case column: peak
extra memory of each side, their ratio, and the achieved GB/s of cases that state the bytes
they move. The size sweep is one row per point (op, threads, size) with the ours/peer speed
ratio and the Python-level calls of each side.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.harness.memory import MemoryResult
from benchmarks.harness.report import MIB, BenchResult
from benchmarks.harness.timing import TimingResult

__all__ = [
    "BANDWIDTH_COLUMNS",
    "MEMORY_COLUMNS",
    "SPEED_COLUMNS",
    "SWEEP_COLUMNS",
    "WORKLOAD_COLUMNS",
    "format_table",
]

SPEED_COLUMNS = (
    "case",
    "peer",
    "quiet ours ms",
    "quiet peer ms",
    "quiet speedup",
    "busy speedup",
    "target",
    "verdict",
)
"""Columns of the speed table (``busy ours ms``/``busy peer ms`` in a busy-only run)."""
MEMORY_COLUMNS = ("case", "ours MiB", "peer MiB", "mem ratio")
"""Columns of the memory-and-bandwidth table ..."""
BANDWIDTH_COLUMNS = ("GB/s", "% of copy")
"""... followed by these when a case states its ``bytes_moved``."""
WORKLOAD_COLUMNS = (*SPEED_COLUMNS[:-1], "same result", "verdict")
"""Columns of the workload table: the speed columns and whether both sides' outputs were
checked equal in this run (``yes``; ``-`` when not checked; a mismatch is an ``error``)."""
SWEEP_COLUMNS = (
    "op",
    "threads",
    "size",
    "ours ms",
    "peer ms",
    "ours/peer speed",
    "Python calls ours / peer",
    "target",
    "verdict",
)
"""Columns of the size-sweep table (quiet timings; busy ones where only they ran)."""
WORKLOAD_CAPTION = "**Workloads: speed**"
SPEED_CAPTION = "**Microbenchmarks: speed**"
MEMORY_CAPTION = "**Memory and bandwidth**"
SWEEP_CAPTION = "**Size sweep: ours/peer speed per size**"
QUICK_NOTE = (
    "*Quick run (`--quick`): reduced inputs and repeats, for a smoke test; not for quoting.*"
)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _mib(memory: MemoryResult | None) -> str:
    if memory is None:
        return "-"
    if memory.error is not None or memory.extra_bytes is None:
        return "error"
    return f"{memory.extra_bytes / MIB:.1f}"


def _gbps(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _num(value: float) -> str:
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"  # no "0.00" for tiny ratios


def _speedup(timing: TimingResult | None) -> str:
    if timing is None or timing.speedup is None:
        return "-"
    q1, q3 = timing.speedup_q1, timing.speedup_q3
    return f"{_num(timing.speedup)}x ({_num(q1)}–{_num(q3)})"


def _target(r: BenchResult) -> str:
    parts = []
    if r.min_speedup is not None:
        parts.append(f"≥{r.min_speedup:g}x")
    if r.min_busy_speedup is not None:
        parts.append(f"busy ≥{r.min_busy_speedup:g}x")
    if r.max_memory_ratio is not None:
        parts.append(f"mem ≤{r.max_memory_ratio:g}")
    if r.max_memory_mib is not None:
        parts.append(f"≤{r.max_memory_mib:.0f} MiB")
    return ", ".join(parts) or "-"


def _ratio(r: BenchResult) -> str:
    pair = r._memory_pair()
    if pair is None:
        return "-"
    ratio = r.memory_ratio
    return _num(ratio) if ratio is not None else ("0/0" if pair[0] == 0 else "inf")


def _notes(results: Sequence[BenchResult]) -> list[str]:
    notes = []
    for r in results:
        problems = [("case", r.error)]
        problems += [(f"{m.side} memory", m.error) for m in (r.ours_memory, r.peer_memory) if m]
        for what, message in problems:
            if message:
                indented = message.strip().replace("\n", "\n    ")
                notes.append(f"- `{r.case}` {what} failed:\n\n    {indented}\n")
    return notes


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _speed_rows(
    results: Sequence[BenchResult], label: str, verified: bool = False
) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        ms = r.timing if label == "quiet" else r.busy_timing
        row: tuple[str, ...] = (
            r.case,
            r.peer_name or "-",
            _ms(ms.ours_ms if ms else None),
            _ms(ms.peer_ms if ms else None),
            _speedup(r.timing),
            _speedup(r.busy_timing),
            _target(r),
        )
        if verified:
            row += ("yes" if r.verified else "-",)
        rows.append((*row, r.verdict))
    return rows


def _calls(r: BenchResult) -> str:
    if r.ours_calls is None:
        return "-"
    return f"{r.ours_calls} / {'-' if r.peer_calls is None else r.peer_calls}"


def _sweep_rows(results: Sequence[BenchResult], label: str) -> list[tuple[str, ...]]:
    ops: dict[str, int] = {}
    for r in results:
        ops.setdefault(str((r.params or {}).get("op", r.case)), len(ops))

    def order(r: BenchResult) -> tuple[int, int, float]:
        params = r.params or {}
        op = str(params.get("op", r.case))
        return ops[op], r.threads, float(params.get("elements", 0))

    rows = []
    for r in sorted(results, key=order):
        params = r.params or {}
        ms = r.timing if label == "quiet" else r.busy_timing
        rows.append(
            (
                str(params.get("op", r.case)),
                str(r.threads),
                str(params.get("size", "-")),
                _ms(ms.ours_ms if ms else None),
                _ms(ms.peer_ms if ms else None),
                _speedup(ms),
                _calls(r),
                f"≥{r.min_speedup:g}x" if r.min_speedup is not None else "-",
                r.verdict,
            )
        )
    return rows


def _memory_rows(results: Sequence[BenchResult], bandwidth: bool) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        gbps = r.gbps
        if r.ours_memory is None and r.peer_memory is None and gbps is None:
            continue  # nothing measured: no row
        row: tuple[str, ...] = (r.case, _mib(r.ours_memory), _mib(r.peer_memory), _ratio(r))
        if bandwidth:
            share = gbps / r.copy_gbps if gbps is not None and r.copy_gbps else None
            row += (_gbps(gbps), "-" if share is None else f"{share:.0%}")
        rows.append(row)
    return rows


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as Markdown tables, one per group, followed by error details.

    A table is left out when its group has no result; a quick run (``--quick``) starts with
    a line saying it is not for quoting.
    **Workloads: speed** (`WORKLOAD_COLUMNS`) and **Microbenchmarks: speed**
    (`SPEED_COLUMNS`): median times in ms of the quiet run (of the busy run when only that
    ran: the columns then say ``busy``), and the quiet and busy speed-ups, each the median
    paired ratio with its interquartile range; the target column lists every target (quiet
    speed-up, busy speed-up, memory), and the verdict checks them all. The workload table
    also says whether the two sides' outputs were checked equal in the run.
    **Size sweep** (`SWEEP_COLUMNS`): one row per point, by op, thread count and size: the
    median times, the ours/peer speed ratio (median paired ratio, interquartile range) and
    the Python-level calls of one call of each side.
    **Memory and bandwidth** (`MEMORY_COLUMNS`): the peak extra memory of one call of each
    side in MiB and their ratio; when a case states the bytes it moves, two more columns
    (`BANDWIDTH_COLUMNS`) give the achieved GB/s of the quiet run and its share of the
    device's measured copy bandwidth. This table lists the cases with something to show and
    is left out when none has.

    Examples:
        >>> from benchmarks.harness.timing import TimingResult
        >>> result = BenchResult("add", peer_name="loop", min_speedup=2.0,
        ...                      min_busy_speedup=1.0,
        ...                      timing=TimingResult(0.5, 1.5, 3.0, 2.9, 3.1),
        ...                      busy_timing=TimingResult(2.0, 1.6, 0.8, 0.7, 0.9))
        >>> print(format_table([result]))
        **Microbenchmarks: speed**
        <BLANKLINE>
        | case | peer | quiet ours ms | quiet peer ms | quiet speedup | busy speedup | target | verdict |
        |---|---|---|---|---|---|---|---|
        | add | loop | 0.5 | 1.5 | 3.00x (2.90–3.10) | 0.80x (0.70–0.90) | ≥2x, busy ≥1x | MISSED |
    """
    quiet = any(r.timing is not None for r in results)
    label = "busy" if not quiet and any(r.busy_timing is not None for r in results) else "quiet"
    workloads = [r for r in results if r.group == "workload"]
    micro = [r for r in results if r.group not in ("workload", "sweep")]
    sweep = [r for r in results if r.group == "sweep"]
    lines = [QUICK_NOTE, ""] if any(r.quick for r in results) else []
    for caption, group, names in (
        (WORKLOAD_CAPTION, workloads, WORKLOAD_COLUMNS),
        (SPEED_CAPTION, micro, SPEED_COLUMNS),
    ):
        if not group:
            continue
        columns = list(names)
        columns[2:4] = [f"{label} ours ms", f"{label} peer ms"]
        rows = _speed_rows(group, label, verified=names is WORKLOAD_COLUMNS)
        lines += [caption, "", *_markdown(columns, rows), ""]
    bandwidth = any(r.bytes_moved is not None for r in workloads + micro)
    memory_rows = _memory_rows(workloads + micro, bandwidth)
    if memory_rows:
        columns = list(MEMORY_COLUMNS) + (list(BANDWIDTH_COLUMNS) if bandwidth else [])
        lines += [MEMORY_CAPTION, "", *_markdown(columns, memory_rows), ""]
    if sweep:
        columns = list(SWEEP_COLUMNS)
        if label == "busy":
            columns[3:6] = ["busy ours ms", "busy peer ms", "busy ours/peer speed"]
        lines += [SWEEP_CAPTION, "", *_markdown(columns, _sweep_rows(sweep, label)), ""]
    notes = _notes(results)
    if notes:
        lines += ["Errors:", "", *notes]
    return "\n".join(lines).rstrip("\n")
