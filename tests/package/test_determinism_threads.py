"""Threaded CPU paths give the same bits with 1 and 2 threads (issue 18).

The torch paths that `parallel_for` cuts into parts promise results independent of the thread
count: parts depend only on the shapes, each part writes its own rows, and sums are added per
part, in part order. Each case here is large enough for several parts (checked: a test with
one part would prove nothing) and runs with 1 thread and with 2 threads. Outputs and gradients
must be bitwise equal. (OpenCV's warp on 1 and 2 of its threads: tests/ops/test_warp_opencv.py.)

Not claimed (the determinism table of the docs says so): a torch path whose input fits in one
part runs that part in the calling thread with all of torch's intra-op threads, and torch's
own ``sum`` of more than 32,768 elements depends on the thread count, so the summed box IoU
losses and the summed sigmoid focal loss (one torch formula each, not cut into parts: not
cases here) can differ in the last bit there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from tests.package.test_determinism import _gen, _run, on_path
from visionblocks import ops
from visionblocks.ops import _parallel as parallel


def _local_filter() -> tuple:
    g = _gen(36)  # one plane of 256 x 256 x 8 outputs: two blocks of rows
    x, k = torch.randn(1, 8, 256, 256, generator=g), torch.randn(1, 9, 256, 256, generator=g)
    return _run(lambda a, b: ops.local_filter2d(a, b, 3), x, k)


def _local_attention() -> tuple:
    q, k, v = torch.randn(3, 1, 4, 256, 256, generator=_gen(37)).unbind(0)  # 3 blocks of rows
    return _run(lambda a, b, c: ops.local_attention2d(a, b, c, 5, num_heads=2), q, k, v)


THREADED: dict[str, tuple[str, Callable[[], tuple]]] = {
    "local_filter2d-torch": ("torch", _local_filter),
    "local_attention2d-torch": ("torch", _local_attention),
}


@contextmanager
def _counting_parts() -> Iterator[list[int]]:
    """Record the number of parts of every `parallel_for` call."""
    counts: list[int] = []
    real_parts = parallel.parts

    def parts(n: int, grain: int) -> list[tuple[int, int]]:
        out = real_parts(n, grain)
        counts.append(len(out))
        return out

    with mock.patch.object(parallel, "parts", parts):
        yield counts


def _with_threads(threads: int, path: str, fn: Callable[[], tuple]) -> tuple:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with on_path(path):
            return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", sorted(THREADED))
def test_one_and_two_threads_give_the_same_bits(name: str) -> None:
    path, fn = THREADED[name]
    with _counting_parts() as counts:
        one = _with_threads(1, path, fn)
    assert counts and max(counts) >= 2, f"{name}: one part only, nothing to compare"
    runs = {"2 threads": _with_threads(2, path, fn)}
    for label, other in runs.items():
        assert len(one) == len(other) > 0
        for i, (a, b) in enumerate(zip(one, other, strict=True)):
            assert torch.equal(a, b), f"{name}: result {i} differs between 1 thread and {label}"
