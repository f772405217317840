"""A busy neighbour: a torch process that keeps every core busy with matrix products.

Usage: ``python -m benchmarks.harness._neighbour [--size N] [--threads T]``. Runs
``b = a @ a; b.tanh_()`` on ``N x N`` float32 matrices forever with
``torch.set_num_threads(T)`` (default: ``os.cpu_count()``, its own OpenMP team on every
core, as a training job or a busy DataLoader beside ours would), prints `READY_LINE` after its
first product, and exits by itself when its parent goes away, so a killed benchmark run
leaves no neighbour behind. Started and stopped by `benchmarks.harness.busy.BusyNeighbours`;
not imported by ``benchmarks.harness``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

READY_LINE = "VISIONBLOCKS-BENCH-NEIGHBOUR-READY"


def main(argv: Sequence[str] | None = None) -> int:
    """Compute until the parent process exits; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness._neighbour")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    parent = os.getppid()

    import torch

    torch.set_num_threads(args.threads)
    a = torch.rand(args.size, args.size, generator=torch.Generator().manual_seed(0))
    a /= args.size**0.5  # tanh keeps the entries in (-1, 1): no overflow, no denormals
    b = torch.empty_like(a)
    ready = False
    while os.getppid() == parent:
        torch.matmul(a, a, out=b)
        b.tanh_()
        a, b = b, a
        if not ready:
            print(READY_LINE, flush=True)
            ready = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
