"""Benchmark results: what was measured for each case, its verdict, and the JSON form.

`format_table` (in `benchmarks.harness.table`) prints them as Markdown.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.memory import MemoryResult
from benchmarks.harness.timing import TimingResult

__all__ = ["JSON_SCHEMA", "BenchResult", "results_from_json", "results_to_json"]

JSON_SCHEMA = 3
"""Version of the JSON form; 2 added the busy-neighbour fields, 3 the case group, point
parameters, call counts, output verification and quick runs (schemas 1 and 2 still read)."""
_READABLE_SCHEMAS = (1, 2, 3)
MIB = 1024 * 1024


@dataclass
class BenchResult:
    """Everything measured for one case.

    Attributes:
        case: Case name.
        peer_name: Who the peer is.
        description: What the case measures.
        min_speedup: Quiet speed target (ours at least this many times faster), or ``None``.
        max_memory_ratio: Memory target (ours' peak / peer's peak at most this), or ``None``.
        max_memory_mib: Memory target (ours' peak extra memory at most this many MiB), or
            ``None``.
        threads: Threads the case ran with.
        timing: Timings on a quiet machine, or ``None`` when not run (``--load busy``) or
            the case failed.
        ours_memory: Our peak memory, or ``None`` when not measured.
        peer_memory: The peer's peak memory, or ``None`` when not measured.
        error: Why the case failed (setup or a timed call raised), or ``None``.
        device: Where the case ran (``"cpu"`` or ``"cuda"``).
        bytes_moved: Bytes one ``ours`` call must read and write at least (the case's
            performance model), or ``None``; gives the achieved GB/s.
        copy_gbps: The device's measured copy bandwidth in GB/s (the practical ceiling),
            or ``None``.
        busy_timing: Timings while busy neighbours ran (`benchmarks.harness.busy`), or
            ``None`` when not run (``--load quiet``) or the case failed.
        min_busy_speedup: Speed target under load, or ``None`` (no target, or no peer).
        busy_load: What ran beside the case during ``busy_timing``, or ``None``.
        group: The case's group (``"workload"``, ``"micro"``, ``"sweep"``).
        params: The case's point parameters (`BenchCase.params`), or ``None``.
        ours_calls: Python-level calls of one ``ours`` call (cProfile), or ``None`` when not
            counted.
        peer_calls: The same for ``peer``.
        verified: ``True`` when the case's ``check`` ran in this run and both sides agreed
            (a mismatch is an ``error``), ``None`` when it did not run.
        quick: Timed by a quick run (``--quick``: reduced inputs and repeats): not for quoting.

    A target is *checked* when what it needs was measured without error: the quiet speed
    target needs ``timing``, the busy one ``busy_timing``. The verdict is ``"error"`` if the
    case failed, ``"MISSED"`` if a checked target was missed, ``"ok"`` if every checked target
    was met, and ``"-"`` when no target was checked.
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
    busy_timing: TimingResult | None = None
    min_busy_speedup: float | None = None
    busy_load: str | None = None
    group: str = "micro"
    params: dict[str, Any] | None = None
    ours_calls: int | None = None
    peer_calls: int | None = None
    verified: bool | None = None
    quick: bool = False

    @property
    def gbps(self) -> float | None:
        """Achieved quiet bandwidth of ``ours`` (``bytes_moved`` per median call) in GB/s."""
        if self.bytes_moved is None or self.timing is None or not self.timing.ours_ms:
            return None
        return self.bytes_moved / (self.timing.ours_ms * 1e-3) / 1e9

    @property
    def speedup(self) -> float | None:
        """Median paired speedup on a quiet machine (``t_peer / t_ours``), or ``None``."""
        return self.timing.speedup if self.timing is not None else None

    @property
    def busy_speedup(self) -> float | None:
        """Median paired speedup while busy neighbours ran, or ``None``."""
        return self.busy_timing.speedup if self.busy_timing is not None else None

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
        """Whether the quiet speed target was met; ``None`` when none or unchecked."""
        if self.min_speedup is None or self.speedup is None:
            return None
        return self.speedup >= self.min_speedup

    @property
    def busy_speed_met(self) -> bool | None:
        """Whether the busy speed target was met; ``None`` when none or unchecked."""
        if self.min_busy_speedup is None or self.busy_speedup is None:
            return None
        return self.busy_speedup >= self.min_busy_speedup

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
        return ours.extra_bytes <= self.max_memory_mib * MIB

    @property
    def verdict(self) -> str:
        """``"ok"``, ``"MISSED"``, ``"error"`` or ``"-"`` (see the class docstring).

        Examples:
            >>> from benchmarks.harness.timing import TimingResult
            >>> quiet, busy = TimingResult(1.0, 6.0, 6.0), TimingResult(4.0, 2.0, 0.5)
            >>> r = BenchResult("x", min_speedup=5.0, min_busy_speedup=1.0, timing=quiet)
            >>> r.verdict
            'ok'
            >>> r.busy_timing = busy  # 5x quiet, but 0.5x under load
            >>> r.speed_met, r.busy_speed_met, r.verdict
            (True, False, 'MISSED')
        """
        if self.error is not None:
            return "error"
        targets = (self.speed_met, self.busy_speed_met, self.memory_met, self.memory_mib_met)
        checked = [met for met in targets if met is not None]
        if not checked:
            return "-"
        return "ok" if all(checked) else "MISSED"


def _environment() -> dict[str, Any]:
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def results_to_json(results: Sequence[BenchResult]) -> dict[str, Any]:
    """A JSON-ready dict: ``{"schema", "environment", "results": [...]}``.

    Each result carries its raw fields plus the derived ``speedup``, ``busy_speedup``,
    ``memory_ratio`` and ``verdict``; `results_from_json` reads it back.

    Examples:
        >>> data = results_to_json([BenchResult("noop")])
        >>> data["results"][0]["verdict"], results_from_json(data) == [BenchResult("noop")]
        ('-', True)
    """
    out = []
    for r in results:
        item = dataclasses.asdict(r)
        item.update(
            speedup=r.speedup,
            busy_speedup=r.busy_speedup,
            memory_ratio=r.memory_ratio,
            verdict=r.verdict,
        )
        out.append(item)
    return {"schema": JSON_SCHEMA, "environment": _environment(), "results": out}


def results_from_json(data: dict[str, Any]) -> list[BenchResult]:
    """Read results written by `results_to_json` (this schema or an older one).

    Raises:
        ValueError: If ``data`` is not a results dict of a known schema.
    """
    schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
    if schema not in _READABLE_SCHEMAS or "results" not in data:
        *first, last = map(str, _READABLE_SCHEMAS)
        known = f"{', '.join(first)} or {last}" if first else last
        raise ValueError(f"expected benchmark results of schema {known}, got {schema!r}")
    names = {f.name for f in dataclasses.fields(BenchResult)}
    results = []
    for item in data["results"]:
        kwargs = {k: v for k, v in item.items() if k in names}
        for timing in ("timing", "busy_timing"):
            if kwargs.get(timing) is not None:
                kwargs[timing] = TimingResult(**kwargs[timing])
        for side in ("ours_memory", "peer_memory"):
            if kwargs.get(side) is not None:
                kwargs[side] = MemoryResult(**kwargs[side])
        results.append(BenchResult(**kwargs))
    return results
