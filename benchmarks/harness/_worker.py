"""Fresh-process entry point of the memory measurement (run by ``measure_memory``).

Usage: ``python -m benchmarks.harness._worker CASE ours|peer [--import MODULE_OR_PATH ...]``.
Prints one line, ``VISIONBLOCKS-BENCH-MEMORY {json}``, and exits 0; on failure prints the
traceback to stderr and exits 1. Not imported by ``benchmarks.harness`` (so ``-m`` runs it
without a double-import warning).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from benchmarks.harness.case import resolve_case
from benchmarks.harness.memory import RESULT_PREFIX, measure_here


def main(argv: Sequence[str] | None = None) -> int:
    """Measure one side of one case and print the result line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness._worker")
    parser.add_argument("case", help="registered case name, or module:attr")
    parser.add_argument("side", choices=("ours", "peer"))
    parser.add_argument("--import", dest="imports", action="append", default=[])
    args = parser.parse_args(argv)
    case = resolve_case(args.case, args.imports)
    result = measure_here(case, args.side)
    print(RESULT_PREFIX + json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
