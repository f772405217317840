"""Plot benchmark results (``benchmarks/results.json``) for the docs Benchmarks page.

Writes a horizontal bar chart of quiet speed-ups (peer time / visionblocks time, log scale)
with each case's target marked and, where a busy run was recorded, the busy speed-up as a
diamond; where memory was measured, the memory ratio beside it::

    python benchmarks/plot.py [RESULTS_JSON] [OUTPUT_PNG]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
# Run as a script (from any folder), Python puts this file's folder on sys.path, not the
# repository root that holds the `benchmarks` package: put the root first.
if sys.path[:1] != [str(HERE.parent)]:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.harness import results_from_json  # noqa: E402

DEFAULT_JSON = HERE / "results.json"
DEFAULT_PNG = HERE.parent / "docs" / "assets" / "benchmarks.png"


def plot(results_json: Path, output: Path) -> Path:
    """Draw the speed-up (and memory-ratio) chart of ``results_json`` into ``output``."""
    try:
        every = results_from_json(json.loads(results_json.read_text()))
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        raise SystemExit(f"cannot read benchmark results from {results_json}: {err}") from None
    results = [r for r in every if r.speedup]
    if not results:
        raise SystemExit(f"{results_json} holds no timed results to plot")
    names = [r.case for r in results]
    with_memory = [r for r in results if r.memory_ratio is not None]
    ncols = 2 if with_memory else 1
    fig, axes = plt.subplots(
        1, ncols, figsize=(6 * ncols, 0.5 * len(names) + 1.5), squeeze=False, sharey=True
    )
    ax = axes[0][0]
    y = range(len(names))
    colours = ["tab:green" if r.speed_met is not False else "tab:red" for r in results]
    ax.barh(y, [r.speedup for r in results], color=colours)
    for i, r in enumerate(results):
        if r.min_speedup:
            ax.plot([r.min_speedup] * 2, [i - 0.4, i + 0.4], color="black", lw=2)
        ax.text(r.speedup, i, f" {r.speedup:.2f}x", va="center", fontsize=8)
    busy = [(i, r.busy_speedup) for i, r in enumerate(results) if r.busy_speedup]
    if busy:
        ax.plot(
            [s for _, s in busy],
            [i for i, _ in busy],
            "D",
            color="tab:orange",
            label="beside busy neighbours",
        )
        ax.legend(loc="lower right", fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up vs peer (higher is better; black tick = target)")
    if with_memory:
        mx = axes[0][1]
        ratios = [r.memory_ratio if r.memory_ratio is not None else 0.0 for r in results]
        mx.barh(y, ratios, color="tab:blue")
        for i, r in enumerate(results):
            if r.max_memory_ratio:
                mx.plot([r.max_memory_ratio] * 2, [i - 0.4, i + 0.4], color="black", lw=2)
        mx.axvline(1.0, color="grey", lw=0.8, ls="--")
        mx.set_xlabel("peak extra memory / peer's (lower is better)")
    fig.suptitle("visionblocks vs peers, CPU, 2 threads")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str]) -> int:
    """``plot.py [RESULTS_JSON] [OUTPUT_PNG]``."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/plot.py",
        description="Draw the Benchmarks page's speed-up and memory-ratio chart.",
    )
    parser.add_argument(
        "results_json",
        nargs="?",
        type=Path,
        default=DEFAULT_JSON,
        help="results of benchmarks/run.py --json (default: benchmarks/results.json)",
    )
    parser.add_argument(
        "output",
        nargs="?",
        type=Path,
        default=DEFAULT_PNG,
        help="the PNG to write (default: docs/assets/benchmarks.png)",
    )
    args = parser.parse_args(argv)
    print(plot(args.results_json, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
