"""``visionblocks bench``: find the benchmark suite and run it.

The suite is the repository's ``benchmarks`` package, not part of the wheel (see
`find_suite`). Without a suite, ``visionblocks bench`` says how to get one and exits with
status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

__all__ = ["ENV_VAR", "NOT_FOUND", "add_bench_parser", "find_suite", "load_harness"]

ENV_VAR = "VISIONBLOCKS_BENCHMARKS"
"""Environment variable naming a checkout's ``benchmarks`` folder."""

CLONE_SUITE = Path(__file__).resolve().parents[2] / "benchmarks"
"""Where the suite is when ``visionblocks`` is imported from a clone."""

NOT_FOUND = (
    "the benchmark suite is not part of the visionblocks wheel. To run it, clone the "
    "repository and run `make bench` (or `python benchmarks/run.py`, or `visionblocks "
    f"bench` inside the clone), or set {ENV_VAR} to the `benchmarks` folder of a checkout."
)
"""What ``visionblocks bench`` prints when no suite is found."""


def _is_suite(folder: Path) -> bool:
    return folder.name == "benchmarks" and (folder / "harness" / "__init__.py").is_file()


def find_suite() -> Path | None:
    """The suite's ``benchmarks`` folder, or ``None``: next to the imported package (a
    clone), then in the current directory, then ``$VISIONBLOCKS_BENCHMARKS``."""
    candidates = [CLONE_SUITE, Path.cwd() / "benchmarks"]
    if os.environ.get(ENV_VAR):
        candidates.append(Path(os.environ[ENV_VAR]).expanduser().absolute())
    for folder in candidates:
        if _is_suite(folder):
            return folder
    return None


def load_harness(suite: Path) -> ModuleType:
    """Put ``suite``'s parent first on ``sys.path`` and import ``benchmarks.harness`` from it."""
    root = str(suite.parent)
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    import benchmarks.harness as harness

    where = Path(harness.__file__).resolve().parent.parent
    if where != suite.resolve():
        raise ImportError(f"another 'benchmarks' package ({where}) was imported before {suite}")
    return harness


def _not_found(reason: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if any(a in ("-h", "--help") for a in args.args):
            args.bench_parser.print_help()
            return 0
        print(f"visionblocks bench: {reason}", file=sys.stderr)
        return 2

    return run


def add_bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to ``sub``: the harness's, or one saying how to get it."""
    suite = find_suite()
    reason = NOT_FOUND
    if suite is not None:
        try:
            harness = load_harness(suite)
        except Exception as exc:  # a broken checkout must not break the other commands
            reason = f"cannot import the benchmark suite at {suite}: {exc}"
        else:
            parser = sub.add_parser("bench", help="run benchmarks against peer implementations")
            harness.add_arguments(parser)
            parser.set_defaults(func=harness.run_from_cli)
            return parser
    # No option may fail to parse before the message is shown: '-' is no prefix here, so
    # every argument (--help too) lands in `args`.
    parser = sub.add_parser(
        "bench",
        help="run benchmarks against peer implementations (from a clone; not in the wheel)",
        description=f"{reason[0].upper()}{reason[1:]}",
        prefix_chars="+",
        add_help=False,
    )
    parser.add_argument("args", nargs="*", metavar="ARGS", help="the suite's arguments")
    parser.set_defaults(func=_not_found(reason), bench_parser=parser)
    return parser
