"""Benchmark results: verdicts, the Markdown table and the JSON form."""

from __future__ import annotations

import dataclasses
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from visionblocks.bench.memory import MemoryResult
from visionblocks.bench.timing import TimingResult

__all__ = ["TABLE_COLUMNS", "BenchResult", "format_table", "results_from_json", "results_to_json"]

TABLE_COLUMNS = (
    "case",
    "peer",
    "ours ms",
    "peer ms",
    "speedup",
    "target",
    "ours MiB",
    "peer MiB",
    "mem ratio",
    "verdict",
)
JSON_SCHEMA = 1
_MIB = 1024 * 1024


@dataclass
class BenchResult:
    """Everything measured for one case.

    Attributes:
        case: Case name.
        peer_name: Who the peer is.
        description: What the case measures.
        min_speedup: Speed target (ours at least this many times faster), or ``None``.
        max_memory_ratio: Memory target (ours' peak / peer's peak at most this), or ``None``.
        max_memory_mib: Memory target (ours' peak extra memory at most this many MiB), or
            ``None``.
        threads: Threads the case ran with.
        timing: Timings, or ``None`` when the case failed.
        ours_memory: Our peak memory, or ``None`` when not measured.
        peer_memory: The peer's peak memory, or ``None`` when not measured.
        error: Why the case failed (setup or a timed call raised), or ``None``.
        device: Where the case ran (``"cpu"`` or ``"cuda"``).
        bytes_moved: Bytes one ``ours`` call must read and write at least (the case's
            performance model), or ``None``; gives the achieved GB/s.
        copy_gbps: The device's measured copy bandwidth in GB/s (the practical ceiling),
            or ``None``.

    A target is *checked* when what it needs was measured without error. The verdict is
    ``"error"`` if the case failed, ``"MISSED"`` if a checked target was missed, ``"ok"`` if
    every checked target was met, and ``"-"`` when no target was checked.
    """

    case: str
    peer_name: str = ""
    description: str = ""
    min_speedup: float | None = None
    max_memory_ratio: float | None = None
    max_memory_mib: float | None = None
    threads: int = 2
    timing: TimingResult | None = None
    ours_memory: MemoryResult | None = None
    peer_memory: MemoryResult | None = None
    error: str | None = None
    device: str = "cpu"
    bytes_moved: int | None = None
    copy_gbps: float | None = None

    @property
    def gbps(self) -> float | None:
        """Achieved bandwidth of ``ours`` (``bytes_moved`` per median call) in GB/s, or None."""
        if self.bytes_moved is None or self.timing is None or not self.timing.ours_ms:
            return None
        return self.bytes_moved / (self.timing.ours_ms * 1e-3) / 1e9

    @property
    def speedup(self) -> float | None:
        """Median paired speedup (``t_peer / t_ours``), or ``None``."""
        return self.timing.speedup if self.timing is not None else None

    def _memory_pair(self) -> tuple[int, int] | None:
        ours, peer = self.ours_memory, self.peer_memory
        if ours is None or peer is None or ours.extra_bytes is None or peer.extra_bytes is None:
            return None
        return ours.extra_bytes, peer.extra_bytes

    @property
    def memory_ratio(self) -> float | None:
        """Ours' peak extra memory over the peer's; ``None`` if unmeasured or the peer's is 0."""
        pair = self._memory_pair()
        if pair is None or pair[1] == 0:
            return None
        return pair[0] / pair[1]

    @property
    def speed_met(self) -> bool | None:
        """Whether the speed target was met; ``None`` when there is none or it was unchecked."""
        if self.min_speedup is None or self.speedup is None:
            return None
        return self.speedup >= self.min_speedup

    @property
    def memory_met(self) -> bool | None:
        """Whether the memory target was met; ``None`` when there is none or it was unchecked."""
        pair = self._memory_pair()
        if self.max_memory_ratio is None or pair is None:
            return None
        return pair[0] <= self.max_memory_ratio * pair[1]

    @property
    def memory_mib_met(self) -> bool | None:
        """Whether the absolute memory target was met; ``None`` when none or unchecked."""
        ours = self.ours_memory
        if self.max_memory_mib is None or ours is None or ours.extra_bytes is None:
            return None
        return ours.extra_bytes <= self.max_memory_mib * _MIB

    @property
    def verdict(self) -> str:
        """``"ok"``, ``"MISSED"``, ``"error"`` or ``"-"`` (see the class docstring)."""
        if self.error is not None:
            return "error"
        targets = (self.speed_met, self.memory_met, self.memory_mib_met)
        checked = [met for met in targets if met is not None]
        if not checked:
            return "-"
        return "ok" if all(checked) else "MISSED"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _mib(memory: MemoryResult | None) -> str:
    if memory is None:
        return "-"
    if memory.error is not None or memory.extra_bytes is None:
        return "error"
    return f"{memory.extra_bytes / _MIB:.1f}"


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


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as a Markdown table, followed by error details when something failed.

    Columns: see `TABLE_COLUMNS`. Times are medians in ms; speedup is the median paired
    ratio with its interquartile range; memory is the peak extra memory of one call in MiB.
    When a case states the bytes it moves, two more columns give the achieved GB/s and its
    share of the device's measured copy bandwidth.

    Examples:
        >>> from visionblocks.bench.timing import TimingResult
        >>> result = BenchResult("add", peer_name="loop", min_speedup=2.0,
        ...                      timing=TimingResult(0.5, 1.5, 3.0, 2.9, 3.1))
        >>> print(format_table([result]))
        | case | peer | ours ms | peer ms | speedup | target | ours MiB | peer MiB | mem ratio | verdict |
        |---|---|---|---|---|---|---|---|---|---|
        | add | loop | 0.5 | 1.5 | 3.00x (2.90–3.10) | ≥2x | - | - | - | ok |
    """
    bandwidth = any(r.bytes_moved is not None for r in results)
    columns = TABLE_COLUMNS + (("GB/s", "of copy") if bandwidth else ())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        row = (
            r.case,
            r.peer_name or "-",
            _ms(r.timing.ours_ms if r.timing else None),
            _ms(r.timing.peer_ms if r.timing else None),
            _speedup(r.timing),
            _target(r),
            _mib(r.ours_memory),
            _mib(r.peer_memory),
            _ratio(r),
            r.verdict,
        )
        if bandwidth:
            gbps = r.gbps
            share = gbps / r.copy_gbps if gbps is not None and r.copy_gbps else None
            row += (
                "-" if gbps is None else f"{gbps:.0f}",
                "-" if share is None else f"{share:.0%}",
            )
        lines.append("| " + " | ".join(row) + " |")
    notes = _notes(results)
    if notes:
        lines += ["", "Errors:", "", *notes]
    return "\n".join(lines).rstrip("\n")


def _environment() -> dict[str, Any]:
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def results_to_json(results: Sequence[BenchResult]) -> dict[str, Any]:
    """A JSON-ready dict: ``{"schema", "environment", "results": [...]}``.

    Each result carries its raw fields plus the derived ``speedup``, ``memory_ratio`` and
    ``verdict``; `results_from_json` reads it back.

    Examples:
        >>> data = results_to_json([BenchResult("noop")])
        >>> data["results"][0]["verdict"], results_from_json(data) == [BenchResult("noop")]
        ('-', True)
    """
    out = []
    for r in results:
        item = dataclasses.asdict(r)
        item.update(speedup=r.speedup, memory_ratio=r.memory_ratio, verdict=r.verdict)
        out.append(item)
    return {"schema": JSON_SCHEMA, "environment": _environment(), "results": out}


def results_from_json(data: dict[str, Any]) -> list[BenchResult]:
    """Read results written by `results_to_json`.

    Raises:
        ValueError: If ``data`` is not a results dict of a known schema.
    """
    if not isinstance(data, dict) or data.get("schema") != JSON_SCHEMA or "results" not in data:
        schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"expected benchmark results of schema {JSON_SCHEMA}, got {schema!r}")
    names = {f.name for f in dataclasses.fields(BenchResult)}
    results = []
    for item in data["results"]:
        kwargs = {k: v for k, v in item.items() if k in names}
        if kwargs.get("timing") is not None:
            kwargs["timing"] = TimingResult(**kwargs["timing"])
        for side in ("ours_memory", "peer_memory"):
            if kwargs.get(side) is not None:
                kwargs[side] = MemoryResult(**kwargs[side])
        results.append(BenchResult(**kwargs))
    return results
