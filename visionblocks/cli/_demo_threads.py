"""Choosing the demo's CPU thread count while it trains (private; see `visionblocks.cli.demo`)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["OthersMeter", "ThreadTuner"]


class ThreadTuner:
    """Picks, while training runs, the intra-op thread count that makes steps fastest.

    On a quiet machine all the cores are fastest; when other processes keep the cores busy,
    one thread can be several times faster than two. The tuner times a few steps with each
    candidate (one thread, then ``threads``), keeps the faster, and tries the other again
    after ``period`` steps (doubling, up to ``max_period``, each time it loses again) or at
    once when the current choice becomes 1.5 times as slow. A candidate twice as slow as
    the best is dropped at once, and a try of more than one thread is skipped while other
    processes keep ``busy_cores`` cores busy (``others()``, by default `OthersMeter`;
    ``None``: unknown, try).

    Use: ``tuner.start_step()`` before each step and ``tuner.end_step(seconds)`` after it.
    With ``tune=False`` (or one thread) it leaves the thread count alone.
    """

    def __init__(
        self,
        threads: int,
        *,
        tune: bool = True,
        probe: int = 3,
        period: int = 40,
        max_period: int = 320,
        busy_cores: float = 0.5,
        others: Callable[[], float | None] | None = None,
    ) -> None:
        self.options = [1, threads] if tune and threads > 1 else [threads]
        self.probe, self.base_period, self.max_period = probe, period, max_period
        self.period = period
        self.threads = self.options[-1]
        self._chosen: int | None = None
        self.estimate: dict[int, float] = {}
        self._plan: list[tuple[int, int]] = [(n, probe) for n in self.options]
        self._times: list[float] = []
        self._warm = 1  # the first step builds kernels and caches: not timed
        self._exploiting = False
        self.busy_cores = busy_cores
        self.others = others if others is not None else OthersMeter()

    def start_step(self) -> None:
        """Set the thread count for the coming step."""
        if len(self.options) == 1:
            return
        trying_more = self._plan and not self._exploiting and not self._times
        if trying_more and self._plan[0][0] > 1 and self._others_busy():
            self._plan.pop(0)  # a try now would cost a very slow step: not now
            if not self._plan:
                self._choose()
        if self._plan:
            self.threads = self._plan[0][0]
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def end_step(self, seconds: float) -> None:
        """Record the step that ran with `threads` and took ``seconds``."""
        if self._warm:
            self._warm -= 1
            return
        if len(self.options) == 1 or not self._plan:
            return
        self._times.append(seconds)
        option, steps = self._plan[0]
        best = min((t for n, t in self.estimate.items() if n != option), default=None)
        if self._exploiting:
            recent = self._times[-3:]
            slowed = len(recent) == 3 and statistics.median(recent) > 1.5 * self.estimate[option]
            if len(self._times) >= steps or slowed:
                self.estimate[option] = statistics.median(recent)
                self._reprobe()
            return
        if best is not None and seconds > 2 * best:
            self._times = [seconds] * steps  # far slower than another: stop trying it
        if len(self._times) >= steps:
            self.estimate[option] = statistics.median(self._times)
            self._plan.pop(0)
            self._times = []
            if not self._plan:
                self._choose()

    def _others_busy(self) -> bool:
        cores = self.others()
        return cores is not None and cores >= self.busy_cores

    def _reprobe(self) -> None:
        self._plan = [(n, self.probe) for n in self.options if n != self._chosen]
        self._times, self._exploiting = [], False

    def _choose(self) -> None:
        chosen = min(self.estimate, key=self.estimate.__getitem__)
        others = [t for n, t in self.estimate.items() if n != chosen]
        if chosen != self._chosen:
            self.period = self.base_period
        elif (
            others and min(others) > 1.25 * self.estimate[chosen]
        ):  # the other keeps losing clearly
            self.period = min(2 * self.period, self.max_period)
        self._chosen = self.threads = chosen
        self._plan = [(chosen, self.period)]
        self._times, self._exploiting = [], True


class OthersMeter:
    """How many of this process's cores other processes kept busy since the previous
    reading: ``/proc/stat``'s busy time on those cores minus this process's own, over the
    wall time. ``None`` until ``4 * cores`` clock ticks have passed (keeps counting), or
    without a readable ``/proc/stat`` listing the cores.
    """

    def __init__(self) -> None:
        self._cores = _allowed_cores()
        self._last = _cpu_snapshot(self._cores)

    def __call__(self) -> float | None:
        now = _cpu_snapshot(self._cores)
        last = self._last
        if now is None or last is None:
            self._last = now
            return None
        wall = now[0] - last[0]
        if wall < 4 * len(self._cores) / os.sysconf("SC_CLK_TCK"):
            return None  # too short to resolve: keep counting from the previous reading
        self._last = now
        return ((now[1] - last[1]) - (now[2] - last[2])) / wall


def _allowed_cores() -> frozenset[int]:
    """The cores this process may run on (all of them where the OS cannot say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def _cpu_snapshot(cores: frozenset[int]) -> tuple[float, float, float] | None:
    """``(wall seconds, CPU seconds the given cores spent busy, this process's CPU
    seconds)``, or ``None`` without a readable ``/proc/stat`` listing those cores."""
    busy_ticks = {}
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *fields = line.split() or [""]
                if not (name.startswith("cpu") and name[3:].isdigit()):
                    continue
                # user nice system idle iowait irq softirq: busy = all but idle and iowait
                user, nice, system, _, _, irq, softirq = (int(v) for v in fields[:7])
                busy_ticks[int(name[3:])] = user + nice + system + irq + softirq
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not cores <= busy_ticks.keys():
        return None
    busy = sum(busy_ticks[c] for c in cores) / ticks
    return time.perf_counter(), busy, time.process_time()
