"""Busy neighbours: other torch processes competing for the cores while a case is timed.

A quiet-machine speed-up says little about a machine shared with experiments, an evaluator
or busy DataLoader workers: a CPU path that opens hundreds of small OpenMP parallel regions
per call waits, at each one, for a thread the kernel has descheduled. ``visionblocks bench
--load busy`` therefore times every case while `BusyNeighbours` run: ``count`` processes
(default 2), each ``python -m benchmarks.harness._neighbour`` multiplying 1024 x 1024 float32
matrices (``a @ a`` then ``tanh_``) in a loop with ``torch.set_num_threads(os.cpu_count())``.

The neighbours start once per run; `BusyNeighbours.start` returns once each has printed its
ready line (after its first product), so timing never begins before they compute, and
`BusyNeighbours.ensure_running` restarts one that died. `BusyNeighbours.stop` kills them
all (the context manager calls it on any exit, ``KeyboardInterrupt`` included), and a
neighbour whose parent exits stops by itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import TracebackType

from benchmarks.harness._neighbour import READY_LINE
from benchmarks.harness.memory import child_env

__all__ = ["BusyNeighbours"]

_STDERR_TAIL_CHARS = 2000


class BusyNeighbours:
    """Processes that keep every core busy with matrix products, as a context manager.

    Args:
        count: How many neighbour processes (>= 1).
        size: Side of the square float32 matrices each one multiplies (>= 1).
        threads: ``torch.set_num_threads`` of each neighbour; ``None`` for ``os.cpu_count()``.
        ready_timeout: Seconds a neighbour may take to start and finish its first product.

    Raises:
        ValueError: For ``count``, ``size`` or ``threads`` not an int >= 1.

    Examples:
        >>> with BusyNeighbours(count=1, size=64) as load:
        ...     running = len(load.pids)  # computing by now
        >>> running, load.pids
        (1, [])
    """

    def __init__(
        self,
        count: int = 2,
        size: int = 1024,
        threads: int | None = None,
        *,
        ready_timeout: float = 120.0,
    ) -> None:
        for name, value in (("count", count), ("size", size), ("threads", threads)):
            if name == "threads" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BusyNeighbours {name} must be an int >= 1, got {value!r}")
        self.count = count
        self.size = size
        self.threads = threads or os.cpu_count() or 1
        self.ready_timeout = ready_timeout
        self._procs: list[subprocess.Popen[str]] = []

    @property
    def description(self) -> str:
        """What runs beside the timed case, for the results (``busy_load`` in the JSON)."""
        return (
            f"{self.count} torch processes, each {self.size}x{self.size} float32 a @ a + tanh_ "
            f"in a loop with {self.threads} threads"
        )

    @property
    def pids(self) -> list[int]:
        """Process ids of the running neighbours (empty once stopped)."""
        return [p.pid for p in self._procs]

    def _spawn(self) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "benchmarks.harness._neighbour"]
        cmd += ["--size", str(self.size), "--threads", str(self.threads)]
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )

    def _wait_ready(self, proc: subprocess.Popen[str]) -> None:
        # A timer kills a neighbour that hangs, so readline() ends at EOF instead of blocking.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(self.ready_timeout, expire)
        timer.start()
        try:
            line = proc.stdout.readline() if proc.stdout else ""
        finally:
            timer.cancel()
        if line.strip() != READY_LINE:
            proc.kill()
            proc.wait()
            stderr = proc.stderr.read() if proc.stderr else ""
            if expired.is_set():
                why = f"no first product within {self.ready_timeout:g} s"
            else:
                why = f"exit status {proc.returncode}"
            raise RuntimeError(
                f"busy neighbour {proc.pid} did not start ({why}): "
                f"{stderr[-_STDERR_TAIL_CHARS:].strip() or 'no error output'}"
            )

    def start(self) -> None:
        """Start the neighbours and return once each has finished its first product.

        Raises:
            RuntimeError: A neighbour exited or hung before its first product (all are then
                stopped); the message holds the tail of its stderr.
        """
        if self._procs:
            return
        try:
            # Spawn all, then wait: their imports overlap, and none times a lonely start.
            self._procs = [self._spawn() for _ in range(self.count)]
            for proc in self._procs:
                self._wait_ready(proc)
        except BaseException:
            self.stop()
            raise

    def ensure_running(self) -> None:
        """Restart any neighbour that has exited (waiting until it computes again)."""
        for i, proc in enumerate(self._procs):
            if proc.poll() is not None:
                self._close(proc)
                self._procs[i] = self._spawn()
                self._wait_ready(self._procs[i])

    @staticmethod
    def _close(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        """Kill every neighbour and wait for it to exit (so no process is left behind)."""
        procs, self._procs = self._procs, []
        for proc in procs:
            self._close(proc)

    def __enter__(self) -> BusyNeighbours:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
