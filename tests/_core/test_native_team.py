"""Parts of C kernels on torch's OpenMP team (`visionblocks._core.native`, ``_native_team.h``).

Every part must run exactly once, on two threads when two are allowed, both on the team and
on the Python-thread fallback, and a failed part must raise.
"""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from visionblocks._core import native as _native
from visionblocks._core.native import NativeLibrary, team_address

_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <time.h>

typedef struct { int64_t *hits; uint64_t *threads; int64_t fail_at, wait, started; } job;

static int part(void *ctx, int64_t i) {
    job *j = (job *)ctx;
    __atomic_fetch_add(&j->started, 1, __ATOMIC_SEQ_CST);
    if (i == 0 && j->wait) { /* hold part 0 until another thread has started a part (<= 10 s) */
        time_t end = time(0) + 10;
        while (__atomic_load_n(&j->started, __ATOMIC_SEQ_CST) < 2 && time(0) < end) {}
    }
    __atomic_fetch_add(&j->hits[i], 1, __ATOMIC_RELAXED);
    j->threads[i] = (uint64_t)pthread_self();
    return i == j->fail_at;
}

int64_t probe(int64_t *hits, uint64_t *threads, int64_t fail_at, int64_t wait, int64_t start,
              int64_t stop, int64_t nthreads) {
    job j = {hits, threads, fail_at, wait, 0};
    return vb_run_parts(part, &j, start, stop, nthreads);
}
"""
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.setenv("VISIONBLOCKS_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "probe.c"
    source.write_text(_SOURCE)
    lib = NativeLibrary("probe", source, {"probe": ([_PTR, _PTR] + [_I64] * 5, _I64)})
    if lib.reason():
        pytest.skip(lib.reason())
    yield lib
    _native._libraries.remove(lib)


def _probe(lib, parts, fail_at=-1, wait=False):
    hits = torch.zeros(parts, dtype=torch.int64)
    threads = torch.zeros(parts, dtype=torch.int64)
    args = (hits.data_ptr(), threads.data_ptr(), fail_at, int(wait))
    lib.run_parts(lib.functions()["probe"], args, parts)
    return hits, set(threads.tolist())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp.so.1: Linux wheels")
def test_finds_torchs_openmp_runtime():
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch built without OpenMP")
    assert team_address() is not None


@pytest.mark.slow
@pytest.mark.parametrize("team", [True, False], ids=["openmp-team", "python-threads"])
def test_every_part_runs_once_on_two_threads(library, team):
    if team and team_address() is None:
        pytest.skip("no OpenMP runtime")
    library.use_team(team)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        hits, threads = _probe(library, 40, wait=True)
        assert hits.tolist() == [1] * 40
        assert len(threads) == 2
        torch.set_num_threads(1)
        hits, threads = _probe(library, 7)
        assert hits.tolist() == [1] * 7 and len(threads) == 1
    finally:
        torch.set_num_threads(before)
    hits, _ = _probe(library, 0)
    assert hits.numel() == 0


@pytest.mark.parametrize("team", [True, False], ids=["openmp-team", "python-threads"])
def test_a_failed_part_raises(library, team):
    library.use_team(team)
    with pytest.raises(MemoryError, match="probe: 1 part"):
        _probe(library, 10, fail_at=3)
