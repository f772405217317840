"""Run the visionblocks benchmarks and save the results (``make bench``).

Takes the same arguments as ``visionblocks bench`` (``python benchmarks/run.py --help``),
with two different defaults: it times each case both on a quiet machine and beside busy
neighbours (``--load both``; ``--load quiet`` for the quick run), and writes
``benchmarks/results.json`` and ``benchmarks/results.md`` unless ``--json`` / ``--markdown``
say otherwise. Exits 0 even when targets are missed: read the verdict column.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script (from any folder), Python puts this file's folder on sys.path, not the
# repository root that holds the `benchmarks` package: put the root first.
if sys.path[:1] != [str(HERE.parent)]:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.harness import add_arguments, run_from_cli  # noqa: E402

DEFAULT_JSON = HERE / "results.json"
DEFAULT_MARKDOWN = HERE / "results.md"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the selected cases and write the result files."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py", description="Time visionblocks against peer libraries."
    )
    add_arguments(parser)
    parser.set_defaults(json=str(DEFAULT_JSON), markdown=str(DEFAULT_MARKDOWN), load="both")
    return run_from_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
