"""Interleaved timing of our implementation against a peer's.

Method: ``setup`` runs once; both sides are warmed up; then each repeat times ``ours`` and
``peer`` back to back with `time.perf_counter`, alternating which goes first (even
repeats ours first, odd repeats peer first) so neither side always inherits a warm or cold
cache. Each repeat gives a paired ratio ``t_peer / t_ours``; the reported speedup is the median
of those ratios, with its interquartile range, which is robust to a noisy neighbour slowing a
few repeats. Every timed call starts after ``SETTLE_S`` seconds of busy-waiting in the calling
thread: after a parallel region, torch's OpenMP threads keep spinning for a few milliseconds
(measured: up to 6 ms here) and would take a core from whichever side runs next, so without
the pause each side would pay for the other's threads. The pause spins rather than sleeps:
after an idle period the first memory accesses of a virtual machine are much slower (here a
16 MB copy took 7.9 ms after a 100 ms sleep, 1.4 ms after a 100 ms spin), which would tax the
shorter call most. When the state holds CUDA tensors, every timed call is bracketed by
``torch.cuda.synchronize()``.

Calls of microseconds (a 10×10 IoU) are below what one `time.perf_counter` pair resolves
against the noise of a shared machine, so a case with ``min_sample_ms`` times each sample as
a loop of ``k`` calls, ``k`` calibrated per side after the warm-up (as `timeit.Timer.autorange`
does) so that one sample takes at least ``min_sample_ms``; the time per call is the sample's
time divided by ``k``. The settling pause then precedes each loop, not each call.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from benchmarks.harness.case import BenchCase

__all__ = ["TimingResult", "num_threads", "time_pair"]


@dataclass
class TimingResult:
    """Timings of one case.

    Attributes:
        ours_ms: Median time of one ``ours`` call, in milliseconds.
        peer_ms: Median time of one ``peer`` call, or ``None`` without a peer.
        speedup: Median of the paired ratios ``t_peer / t_ours`` (> 1: ours is faster).
        speedup_q1: First quartile of the paired ratios.
        speedup_q3: Third quartile of the paired ratios.
        ours_times_ms: Every timed ``ours`` call, in order.
        peer_times_ms: Every timed ``peer`` call, in order (empty without a peer).
        ours_loops: Calls of ``ours`` per timed sample (1 unless the case sets
            ``min_sample_ms``); the times above are per call.
        peer_loops: Calls of ``peer`` per timed sample.
    """

    ours_ms: float
    peer_ms: float | None = None
    speedup: float | None = None
    speedup_q1: float | None = None
    speedup_q3: float | None = None
    ours_times_ms: list[float] = field(default_factory=list)
    peer_times_ms: list[float] = field(default_factory=list)
    ours_loops: int = 1
    peer_loops: int = 1


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the old value after.

    Examples:
        >>> import torch
        >>> before = torch.get_num_threads()
        >>> with num_threads(1):
        ...     torch.get_num_threads()
        1
        >>> torch.get_num_threads() == before
        True
    """
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def iter_tensors(obj: Any, depth: int = 3) -> Iterator[torch.Tensor]:
    """Tensors found in a state object: itself, sequences, dict values, object attributes."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth <= 0 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value, depth - 1)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            yield from iter_tensors(value, depth - 1)
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
    elif hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            yield from iter_tensors(value, depth - 1)


def uses_cuda(state: Any) -> bool:
    """Whether any tensor in ``state`` lives on a CUDA device."""
    return any(t.is_cuda for t in iter_tensors(state))


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


SETTLE_S = 0.02
"""Seconds of busy-waiting before each timed call (see the module docstring)."""


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _timed(fn: Callable[[Any], Any], state: Any, sync: Callable[[], None], loops: int = 1) -> float:
    """Milliseconds per call of ``fn(state)``, over ``loops`` calls after the settling pause."""
    sync()
    _spin(SETTLE_S)
    start = time.perf_counter()
    for _ in range(loops):
        fn(state)
    sync()
    return (time.perf_counter() - start) * 1e3 / loops


MAX_LOOPS = 1_000_000
"""Most calls per timed sample that calibration picks."""
QUICK_SAMPLE_MS = 1.0
"""The longest timed sample of a quick run (``small=True``): loops are calibrated to this."""
CALIBRATION_TRIALS = 3
"""Independent calibrations per side; the largest loop count wins."""


def calibrate_loops(
    fn: Callable[[Any], Any], state: Any, sync: Callable[[], None], min_sample_ms: float
) -> int:
    """Calls per sample so that a sample takes at least ``min_sample_ms`` (1 for slow calls).

    Doubles a trial loop (1, 2, 4, ... calls) until it takes a tenth of the target, then
    scales the count to the target with a 20 % margin; does so `CALIBRATION_TRIALS` times
    and keeps the largest count (a trial slowed by a neighbour gives too small a count).

    Examples:
        >>> calibrate_loops(lambda s: None, None, lambda: None, 0.5) > 10
        True
    """
    best = 1
    for _ in range(CALIBRATION_TRIALS):  # a pre-empted trial only lowers its count: take the max
        loops = 1
        while True:
            elapsed = _timed(fn, state, sync, loops) * loops
            if elapsed >= min_sample_ms / 10 or loops >= MAX_LOOPS:
                break
            loops *= 2
        if elapsed < min_sample_ms:
            loops = math.ceil(1.2 * loops * min_sample_ms / max(elapsed, 1e-6))
        best = max(best, min(MAX_LOOPS, loops))
    return best


def time_pair(
    case: BenchCase, repeats: int = 20, warmup: int = 3, *, small: bool = False
) -> TimingResult:
    """Time ``case.ours`` against ``case.peer``, interleaved (see the module docstring).

    Args:
        case: The case; ``setup`` runs once, under ``torch.set_num_threads(case.threads)``.
        repeats: Timed pairs (>= 1).
        warmup: Untimed calls of each side before timing (>= 0).
        small: A quick run: time on ``case.small_setup``'s inputs where the case has one, and
            calibrate loops to at most `QUICK_SAMPLE_MS` per sample.

    Returns:
        TimingResult: Medians, the median paired speedup and its interquartile range; the peer
        fields are ``None`` when ``case.peer`` is ``None``.

    Raises:
        ValueError: If ``repeats < 1`` or ``warmup < 0``.

    Examples:
        >>> import torch
        >>> from benchmarks.harness import BenchCase
        >>> case = BenchCase("doc_sum", setup=lambda: torch.ones(16), ours=torch.sum)
        >>> result = time_pair(case, repeats=3, warmup=1)
        >>> len(result.ours_times_ms), result.speedup is None
        (3, True)
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    setup = case.small_setup if small and case.small_setup is not None else case.setup
    with num_threads(case.threads):
        state = setup()
        sync = torch.cuda.synchronize if uses_cuda(state) else (lambda: None)
        for _ in range(warmup):
            case.ours(state)
            if case.peer is not None:
                case.peer(state)
        n_ours = n_peer = 1
        if case.min_sample_ms is not None:
            sample_ms = min(case.min_sample_ms, QUICK_SAMPLE_MS) if small else case.min_sample_ms
            n_ours = calibrate_loops(case.ours, state, sync, sample_ms)
            if case.peer is not None:
                n_peer = calibrate_loops(case.peer, state, sync, sample_ms)
        ours: list[float] = []
        peer: list[float] = []
        for i in range(repeats):
            if case.peer is None:
                ours.append(_timed(case.ours, state, sync, n_ours))
            elif i % 2 == 0:
                ours.append(_timed(case.ours, state, sync, n_ours))
                peer.append(_timed(case.peer, state, sync, n_peer))
            else:
                peer.append(_timed(case.peer, state, sync, n_peer))
                ours.append(_timed(case.ours, state, sync, n_ours))
        del state
    result = TimingResult(ours_ms=statistics.median(ours), ours_times_ms=ours, ours_loops=n_ours)
    if peer:
        # A timer tick can read 0.0 for very fast calls; clamp so the ratio stays finite.
        ratios = [p / max(o, 1e-9) for o, p in zip(ours, peer)]
        result.peer_ms = statistics.median(peer)
        result.peer_times_ms = peer
        result.peer_loops = n_peer
        result.speedup = statistics.median(ratios)
        result.speedup_q1, result.speedup_q3 = _quartiles(ratios)
    return result
