"""The results as Markdown: a speed table and a memory-and-bandwidth table.

One wide table did not fit the docs page, so `format_table` prints two that share the case
column: speed (quiet and busy speed-ups side by side, the targets and the verdict) and
memory and bandwidth (peak extra memory of each side, their ratio, and the achieved GB/s of
cases that state the bytes they move).
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.harness.memory import MemoryResult
from benchmarks.harness.report import MIB, BenchResult
from benchmarks.harness.timing import TimingResult

__all__ = ["BANDWIDTH_COLUMNS", "MEMORY_COLUMNS", "SPEED_COLUMNS", "format_table"]

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
SPEED_CAPTION = "**Speed**"
MEMORY_CAPTION = "**Memory and bandwidth**"


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


def _speed_rows(results: Sequence[BenchResult], label: str) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        ms = r.timing if label == "quiet" else r.busy_timing
        rows.append(
            (
                r.case,
                r.peer_name or "-",
                _ms(ms.ours_ms if ms else None),
                _ms(ms.peer_ms if ms else None),
                _speedup(r.timing),
                _speedup(r.busy_timing),
                _target(r),
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
    """The results as two Markdown tables, followed by error details when something failed.

    **Speed** (`SPEED_COLUMNS`): median times in ms of the quiet run (of the busy run when
    only that ran: the columns then say ``busy``), and the quiet and busy speed-ups, each the
    median paired ratio with its interquartile range; the target column lists every target
    (quiet speed-up, busy speed-up, memory), and the verdict checks them all.
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
        **Speed**
        <BLANKLINE>
        | case | peer | quiet ours ms | quiet peer ms | quiet speedup | busy speedup | target | verdict |
        |---|---|---|---|---|---|---|---|
        | add | loop | 0.5 | 1.5 | 3.00x (2.90–3.10) | 0.80x (0.70–0.90) | ≥2x, busy ≥1x | MISSED |
    """
    quiet = any(r.timing is not None for r in results)
    label = "busy" if not quiet and any(r.busy_timing is not None for r in results) else "quiet"
    columns = list(SPEED_COLUMNS)
    columns[2:4] = [f"{label} ours ms", f"{label} peer ms"]
    lines = [SPEED_CAPTION, "", *_markdown(columns, _speed_rows(results, label))]
    bandwidth = any(r.bytes_moved is not None for r in results)
    memory_rows = _memory_rows(results, bandwidth)
    if memory_rows:
        columns = list(MEMORY_COLUMNS) + (list(BANDWIDTH_COLUMNS) if bandwidth else [])
        lines += ["", MEMORY_CAPTION, "", *_markdown(columns, memory_rows)]
    notes = _notes(results)
    if notes:
        lines += ["", "Errors:", "", *notes]
    return "\n".join(lines).rstrip("\n")
