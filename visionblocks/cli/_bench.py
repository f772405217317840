"""``visionblocks bench``: find the benchmark suite and run it.

The suite (harness and cases) is the ``benchmarks`` package of the repository; it is not
part of the wheel, and nothing in ``visionblocks`` imports it. The command looks for it, in
this order:

1. the checkout holding the imported ``visionblocks`` package (an editable install from a
   clone): ``<checkout>/benchmarks/harness``;
2. ``./benchmarks`` in the current directory;
3. the folder named by the environment variable ``VISIONBLOCKS_BENCHMARKS`` (the
   ``benchmarks`` folder of a checkout).

The folder's parent goes first on ``sys.path`` and ``benchmarks.harness`` is imported, which
adds the ``bench`` options. Without a suite, ``visionblocks bench`` says how to get one and
exits with status 2.
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
    """The ``benchmarks`` folder of the suite, or ``None`` when there is none to find.

    Looks next to the imported package (a clone), then in the current directory, then in
    ``$VISIONBLOCKS_BENCHMARKS``.
    """
    candidates = [CLONE_SUITE, Path.cwd() / "benchmarks"]
    if os.environ.get(ENV_VAR):
        candidates.append(Path(os.environ[ENV_VAR]).expanduser().absolute())
    for folder in candidates:
        if _is_suite(folder):
            return folder
    return None


def load_harness(suite: Path) -> ModuleType:
    """Put ``suite``'s parent first on ``sys.path`` and import ``benchmarks.harness`` from it.

    Raises:
        ImportError: The import failed, or another ``benchmarks`` package was imported first.
    """
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
    """Add the ``bench`` subcommand to ``sub`` (the ``visionblocks`` subparsers).

    With a suite, its options are the harness's (``benchmarks.harness.add_arguments``) and it
    runs ``benchmarks.harness.run_from_cli``. Without one, ``bench --help`` says how to get
    the suite and any other call prints that to stderr and exits with status 2.
    """
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
