"""Peak extra memory of one call, measured in a fresh process.

Method (CPU): a fresh Python process (``python -m benchmarks.harness._worker``) finds the
case and runs ``setup``. It then **warms up**: one call of each side, ours and the peer's,
whichever side is measured, so both libraries' modules are imported (peers import lazily,
inside the case's functions), their one-time initialisation has run and one-time caches
exist. Both sides' processes do the same things up to this point. It drops the warm-up
outputs, runs ``gc.collect()`` and ``malloc_trim(0)`` (glibc) so freed memory goes back to
the OS, resets the kernel's resident-set high-water mark (``5`` written to
``/proc/self/clear_refs``) and reads the resident set size as the baseline. It then makes a
second call of the measured side and reads the high-water mark (``VmHWM``):

    extra peak = VmHWM after the measured call - VmRSS before it

So the figure is the memory one call of an already-imported, already-used function needs
(a step in a training loop), never the cost of importing torchvision, kornia or
visionblocks, and not a cache that the first call built and keeps (that is in the baseline).
The returned value is kept alive until the reading, so the output's own memory counts.

``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is not used on Linux: a child process inherits
the *parent's* resident size at ``exec`` into ``ru_maxrss``, so under a large parent (pytest,
or a benchmark run holding big tensors) the child's own peak stays hidden. It is the fallback
where ``/proc`` is missing (macOS); as it cannot be reset, the fallback skips the warm-up and
measures the first call, imports included (an upper bound), and setup's own high-water mark
can hide the call's.

Limits: resident memory is page-granular and counts only touched pages (``torch.empty``
that is never written costs nothing); expect noise of a few MiB, so compare cases that
allocate tens of MiB or more. CUDA: when the state holds CUDA tensors, the peak (after the
same warm-up) is ``torch.cuda.max_memory_allocated()`` minus ``torch.cuda.memory_allocated()``
before the call (tensor memory only; the caching allocator's reserve and the CUDA context
are not counted).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from benchmarks.harness.timing import uses_cuda

if TYPE_CHECKING:
    from benchmarks.harness.case import BenchCase

__all__ = ["RESULT_PREFIX", "MemoryResult", "measure_here", "measure_memory"]

Side = Literal["ours", "peer"]
RESULT_PREFIX = "VISIONBLOCKS-BENCH-MEMORY "
"""Start of the stdout line on which the measuring process reports its `MemoryResult`, as
JSON; `measure_memory` reads the last such line and ignores whatever else the case prints."""
_STDERR_TAIL_LINES = 15


@dataclass
class MemoryResult:
    """Peak extra memory of one side of a case.

    Attributes:
        side: ``"ours"`` or ``"peer"``.
        extra_bytes: Peak memory above the baseline during the call, or ``None`` on error.
        baseline_bytes: Memory in use after setup, before the call.
        method: ``"vmhwm"`` (Linux resident set), ``"ru_maxrss"`` (fallback) or ``"cuda"``.
        error: What went wrong (with the tail of the process's stderr), or ``None``.
    """

    side: str
    extra_bytes: int | None = None
    baseline_bytes: int | None = None
    method: str = ""
    error: str | None = None


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_bytes("VmHWM") is not None


def _ru_maxrss_bytes() -> int:
    import resource  # Unix only; imported here so the CLI still starts elsewhere

    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024  # bytes on macOS, KiB on Linux


def _trim_heap() -> None:
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):  # malloc_trim is glibc only
        ctypes.CDLL(name).malloc_trim(0)


def _warm_up(case: BenchCase, state: Any) -> None:
    """One call of each side: imports, one-time initialisation and caches happen here."""
    for fn in (case.ours, case.peer):
        if fn is not None:
            fn(state)  # the output is dropped at once


def measure_here(case: BenchCase, side: Side) -> MemoryResult:
    """Measure one side of ``case`` in *this* process (what the fresh process runs).

    Runs ``setup``, the warm-up (one call of each side) and the measured call, as the module
    docstring says. Call it only in a process made for it: the measurement resets this
    process's high-water mark, and anything that ran before may already hold the memory the
    call would allocate. Use `measure_memory` instead.

    Raises:
        ValueError: For a ``side`` other than ``"ours"``/``"peer"``, or ``"peer"`` without a peer.
    """
    if side not in ("ours", "peer"):
        raise ValueError(f"side must be 'ours' or 'peer', got {side!r}")
    fn = case.ours if side == "ours" else case.peer
    if fn is None:
        raise ValueError(f"case {case.name!r} has no peer to measure")
    torch.set_num_threads(case.threads)
    state = case.setup()
    if uses_cuda(state) or _reset_high_water():  # the ru_maxrss fallback cannot forget it
        _warm_up(case, state)
    gc.collect()
    if uses_cuda(state):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        out = fn(state)
        torch.cuda.synchronize()
        peak, method = torch.cuda.max_memory_allocated(), "cuda"
    else:
        _trim_heap()
        if _reset_high_water():
            baseline, method = _status_bytes("VmRSS") or 0, "vmhwm"
            out = fn(state)
            peak = _status_bytes("VmHWM") or 0
        else:
            baseline, method = _ru_maxrss_bytes(), "ru_maxrss"
            out = fn(state)
            peak = _ru_maxrss_bytes()
    del out
    return MemoryResult(side, max(0, peak - baseline), baseline, method)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder holding the ``benchmarks`` package (a visionblocks checkout)."""


def child_env() -> dict[str, str]:
    """This process's environment, with ``PYTHONPATH`` set so a child imports what it can.

    `REPO_ROOT` comes first, so ``python -m benchmarks.harness._worker`` (and ``_neighbour``)
    finds the ``benchmarks`` package from any working directory.

    Examples:
        >>> child_env()["PYTHONPATH"].split(os.pathsep)[0] == REPO_ROOT
        True
    """
    # The child must import whatever this process can (a test module, a script's folder).
    paths = [REPO_ROOT] + [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _tail(text: str) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[-_STDERR_TAIL_LINES:])


def measure_memory(case: BenchCase | str, side: Side, *, timeout: float = 600.0) -> MemoryResult:
    """Peak extra memory of one call of ``case``'s ``side``, in a fresh process.

    The fresh process finds the case by name after importing the modules that define its
    functions (so built-in, plugin, script and test-module cases all work), or from a
    ``"module:attr"`` string. See the module docstring for the method and its limits.

    Args:
        case: A case, or a string for `benchmarks.harness.case.resolve_case`
            (a registered name or ``"module:attr"``).
        side: ``"ours"`` or ``"peer"``.
        timeout: Seconds before the process is killed and an error is reported.

    Returns:
        MemoryResult: ``extra_bytes`` in bytes; never raises for a failing case: ``error``
        then holds the reason and the tail of the process's stderr.

    Raises:
        ValueError: For a ``side`` other than ``"ours"``/``"peer"``.

    Examples:
        >>> result = measure_memory("no_such_case", "ours")  # runs a fresh process
        >>> result.extra_bytes is None, "no_such_case" in result.error
        (True, True)
    """
    from benchmarks.harness.case import BenchCase, case_origins

    if side not in ("ours", "peer"):
        raise ValueError(f"side must be 'ours' or 'peer', got {side!r}")
    if isinstance(case, BenchCase):
        spec, imports = case.name, case_origins(case)
    elif isinstance(case, str):
        spec, imports = case, []
    else:
        raise TypeError(f"case must be a BenchCase or a str, got {type(case).__name__}")
    cmd = [sys.executable, "-m", "benchmarks.harness._worker", spec, side]
    for origin in imports:
        cmd += ["--import", origin]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), check=False
        )
    except subprocess.TimeoutExpired:
        return MemoryResult(side, error=f"timed out after {timeout:g} s")
    except OSError as exc:
        return MemoryResult(side, error=f"could not start {sys.executable}: {exc}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        return MemoryResult(side, error=f"exit status {proc.returncode}\n{_tail(proc.stderr)}")
    data: dict[str, Any] = json.loads(lines[-1][len(RESULT_PREFIX) :])
    return MemoryResult(**data)
