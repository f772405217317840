"""The CPU thread pool: parts, results in order, modes, errors, fork safety."""

from __future__ import annotations

import itertools
import os
import sys
import threading

import pytest
import torch

from visionblocks.ops._parallel import parallel_for, parts, workspace


def test_parts_cover_range_and_do_not_depend_on_threads():
    for n in (1, 7, 100, 1001):
        for grain in (1, 3, 64, 5000):
            ranges = parts(n, grain)
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
    assert parts(0, 5) == [] and parts(-3, 5) == []


def test_results_in_part_order_and_work_runs_on_several_threads():
    seen = set()
    lock = threading.Lock()

    def fn(a, b):
        with lock:
            seen.add(threading.get_ident())
        assert torch.get_num_threads() == 1  # one intra-op thread per worker
        torch.randn(20000).exp()  # real work, so the pool threads get parts
        return (a, b)

    with_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = parallel_for(fn, 40, 1)
    finally:
        torch.set_num_threads(with_threads)
    assert out == parts(40, 1)
    assert torch.get_num_threads() == with_threads  # the caller's setting is restored
    assert len(seen) >= 1


def test_sum_is_identical_for_any_thread_count():
    x = torch.randn(100_003, dtype=torch.float32)

    def total():
        return torch.stack(parallel_for(lambda a, b: x[a:b].sum(), x.numel(), 4096)).sum()

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = total()
        torch.set_num_threads(2)
        two = total()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_modes_propagate_to_workers():
    torch.set_num_threads(2)
    with torch.no_grad():
        assert not any(parallel_for(lambda a, b: torch.is_grad_enabled(), 8, 1))
    with torch.inference_mode():
        assert all(parallel_for(lambda a, b: torch.is_inference_mode_enabled(), 8, 1))
    assert all(parallel_for(lambda a, b: torch.is_grad_enabled(), 8, 1))


def test_errors_propagate_and_every_worker_has_finished():
    done = []

    def fn(a, b):
        if a == 0:
            raise ValueError("boom")
        done.append(a)

    torch.set_num_threads(2)
    with pytest.raises(ValueError, match="boom"):
        parallel_for(fn, 10, 1)
    count = len(done)
    assert count == 9  # the other parts all ran, before the call returned


def test_workspace_is_per_thread_and_a_normal_tensor():
    with torch.inference_mode():
        a = workspace("test.ws", (3,), torch.float32, torch.device("cpu"))
    assert not a.is_inference()
    a.fill_(1.0)  # usable outside inference mode
    assert workspace("test.ws", (3,), torch.float32, torch.device("cpu")).data_ptr() == a.data_ptr()
    other = []
    thread = threading.Thread(
        target=lambda: other.append(
            workspace("test.ws", (3,), torch.float32, torch.device("cpu")).data_ptr()
        )
    )
    thread.start()
    thread.join()
    assert other[0] != a.data_ptr()  # another thread gets its own buffer
    b = workspace("test.ws", (4,), torch.float64, torch.device("cpu"))
    assert b.shape == (4,) and b.dtype == torch.float64


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_pool_works_in_a_forked_child():
    torch.set_num_threads(2)
    parallel_for(lambda a, b: None, 4, 1)  # start the pool in the parent
    pid = os.fork()
    if pid == 0:  # child: the parent's pool threads do not exist here
        try:
            torch.set_num_threads(2)
            out = parallel_for(lambda a, b: b - a, 6, 1)
            os._exit(0 if out == [1] * 6 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_worker_keeps_one_thread_after_the_caller_restores_its_count():
    # torch initialises a thread's OpenMP count lazily from the process-wide setting; a worker
    # initialised while the caller had set 1 must not switch to the caller's restored count.
    from visionblocks.ops import _parallel

    before = torch.get_num_threads()
    initialised, restored, seen = threading.Event(), threading.Event(), []

    def worker():
        _parallel._worker_init()
        initialised.set()
        restored.wait()
        seen.append(torch.get_num_threads())

    try:
        torch.set_num_threads(1)
        t = threading.Thread(target=worker)
        t.start()
        initialised.wait()
        torch.set_num_threads(2)
        restored.set()
        t.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
