"""CPU work spread over threads with one fork and one join per call.

Why: a chunked CPU path that calls torch ops on cache-sized pieces runs every op as its own
OpenMP parallel region. On a quiet machine that is cheap; when other processes share the
cores, each region waits for its slowest (descheduled) thread, and a call with hundreds of
regions collapses (the busy rows of the benchmarks show it).

How: `parallel_for` cuts ``range(n)`` into contiguous *parts* whose boundaries depend only on
``n`` and ``grain`` (never on the thread count, so results are bitwise reproducible on any
machine), and hands the parts to a pool of Python threads, each of which runs torch with
**one** intra-op thread. Torch ops release the GIL, so the threads compute in parallel; parts
are taken from a shared queue, so a descheduled thread delays only the part it holds. The
calling thread works too. With ``torch.get_num_threads() == 1``, inside one of the pool's
own threads, or when there is a single part, the parts run inline in the calling thread.

Each thread also owns a `workspace`: scratch buffers reused across parts and calls, so a
worker's temporaries stay cache-resident and are allocated once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from visionblocks._core.dispatch import recording

__all__ = ["parallel_for", "parts", "workspace"]

T = TypeVar("T")

_state = threading.local()
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _worker_init() -> None:
    # torch initialises each thread's OpenMP count lazily, on its first parallel op, from the
    # process-wide setting; run that first, or a later op would undo the `set_num_threads(1)`
    # whenever the caller has restored a larger process-wide count in between.
    torch.get_num_threads()
    torch.set_num_threads(1)
    _state.in_pool = True


def _reset_after_fork() -> None:  # a forked child (e.g. a DataLoader worker) has no threads
    global _pool, _pool_size, _lock
    _pool, _pool_size, _lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _get_pool(size: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < size:
            old = _pool
            _pool = ThreadPoolExecutor(size, "visionblocks-cpu", initializer=_worker_init)
            _pool_size = size
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def parts(n: int, grain: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` ranges covering ``range(n)``, each about ``grain`` long.

    The ranges depend only on ``n`` and ``grain``: ``ceil(n / grain)`` parts of equal size
    (the last ones one shorter).

    Examples:
        >>> parts(10, 4)
        [(0, 4), (4, 7), (7, 10)]
        >>> parts(0, 4)
        []
    """
    if n <= 0:
        return []
    count = -(-n // max(1, grain))
    base, extra = divmod(n, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def parallel_for(fn: Callable[[int, int], T], n: int, grain: int) -> list[T]:
    """Call ``fn(start, stop)`` on every part of ``range(n)`` (see `parts`), in parallel.

    ``fn`` runs with one intra-op thread (in a pool thread) or in the calling thread, under
    the caller's grad and inference modes; it must only write to disjoint slices of
    shared outputs. While torch records the calling thread's ops (tracing, compiling,
    exporting), every part runs in the calling thread, so the recorded graph holds them all.
    Exceptions propagate.

    Args:
        fn: Work on items ``[start, stop)``; its return value is collected.
        n: Number of items.
        grain: Items per part (the unit of load balancing; a part should be large enough
            that its torch ops dominate Python overhead, e.g. >= 64K elements of work).

    Returns:
        list: ``fn``'s results in part order (independent of which thread ran which part).

    Examples:
        >>> import torch
        >>> x = torch.arange(10.0)
        >>> out = torch.empty(10)
        >>> sums = parallel_for(lambda a, b: torch.mul(x[a:b], 2, out=out[a:b]).sum(), 10, 4)
        >>> [float(s) for s in sums], out[-1].item()
        ([12.0, 30.0, 48.0], 18.0)
    """
    if recording():  # every part in this thread; a traced size is fixed, as tracing does
        n, grain = int(n), int(grain)
        return [fn(a, b) for a, b in parts(n, grain)]
    ranges = parts(n, grain)
    threads = min(torch.get_num_threads(), len(ranges))
    if threads <= 1 or getattr(_state, "in_pool", False):  # nested: inline, in this thread
        return [fn(a, b) for a, b in ranges]
    results: list = [None] * len(ranges)
    index = iter(range(len(ranges)))
    claim = threading.Lock()

    # Thread-local modes: the workers take the caller's.
    grad_mode, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def drain() -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad_mode):
            while True:
                with claim:
                    i = next(index, None)
                if i is None:
                    return
                results[i] = fn(*ranges[i])

    pool = _get_pool(threads - 1)
    futures: Sequence[Future] = [pool.submit(drain) for _ in range(threads - 1)]
    # The caller takes parts too, with one intra-op thread like the workers.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    _state.in_pool = True
    try:
        drain()
    finally:
        _state.in_pool = False
        torch.set_num_threads(before)
        for f in futures:  # even when the caller's part raised: no worker outlives the call
            f.exception()
    for f in futures:
        f.result()
    return results


def workspace(
    name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A scratch tensor owned by the calling thread, reused while shape/dtype/device match.

    Contents are undefined on return. Two names never alias; a thread holds one buffer per
    name (the last requested shape), so memory stays bounded.

    Examples:
        >>> import torch
        >>> a = workspace("doc", (4,), torch.float32, torch.device("cpu"))
        >>> b = workspace("doc", (4,), torch.float32, torch.device("cpu"))
        >>> a.data_ptr() == b.data_ptr()
        True
    """
    store = getattr(_state, "buffers", None)
    if store is None:
        store = _state.buffers = {}
    shape = tuple(shape)
    buf = store.get(name)
    if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
        with torch.inference_mode(False):  # a normal tensor: usable in and out of that mode
            buf = store[name] = torch.empty(shape, dtype=dtype, device=device)
    return buf
