"""Plot benchmark results (``benchmarks/results.json``) for the docs Benchmarks page.

Writes a horizontal bar chart of quiet speed-ups (peer time / visionblocks time, log scale)
of the workload and microbenchmark cases, with each case's target marked and, where a busy
run was recorded, the busy speed-up as a diamond; where memory was measured, the memory
ratio beside it. When the results hold size-sweep points (``--group sweep``), it also draws
the sweep chart (``--sweep-output``): the ours/peer speed ratio against size, one panel per
op, one line per thread count, with the 0.9 target line::

    python benchmarks/plot.py [RESULTS_JSON] [OUTPUT_PNG] [--sweep-output SWEEP_PNG]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

HERE = Path(__file__).resolve().parent
# Run as a script (from any folder), Python puts this file's folder on sys.path, not the
# repository root that holds the `benchmarks` package: put the root first.
if sys.path[:1] != [str(HERE.parent)]:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.harness import BenchResult, results_from_json  # noqa: E402

DEFAULT_JSON = HERE / "results.json"
DEFAULT_PNG = HERE.parent / "docs" / "assets" / "benchmarks.png"
DEFAULT_SWEEP_PNG = HERE.parent / "docs" / "assets" / "benchmarks-sweep.png"
SWEEP_TARGET = 0.9
_SWEEP_XLABELS = {
    "box_iou": "box pairs (N x M)",
    "generalized_box_iou": "box pairs (N x M)",
    "generalized_box_iou_loss": "aligned box pairs",
    "sigmoid_focal_loss": "logits",
}


def _read(results_json: Path) -> list[BenchResult]:
    try:
        return results_from_json(json.loads(results_json.read_text()))
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        raise SystemExit(f"cannot read benchmark results from {results_json}: {err}") from None


def plot(results_json: Path, output: Path, sweep_output: Path | None = None) -> list[Path]:
    """Draw the charts of ``results_json``: the speed-up (and memory-ratio) chart of its
    workload and microbenchmark results into ``output``, and the size-sweep chart of its
    sweep results into ``sweep_output`` (default `DEFAULT_SWEEP_PNG`). Returns the paths
    written; exits with a message when there is nothing to plot."""
    every = _read(results_json)
    timed = [r for r in every if r.speedup]
    cases = [r for r in timed if r.group != "sweep"]
    sweep = [r for r in timed if r.group == "sweep"]
    if not cases and not sweep:
        raise SystemExit(f"{results_json} holds no timed results to plot")
    written = []
    if cases:
        written.append(_plot_cases(cases, output))
    if sweep:
        written.append(plot_sweep(sweep, sweep_output or DEFAULT_SWEEP_PNG))
    return written


def plot_sweep(results: list[BenchResult], output: Path) -> Path:
    """Ratio (ours' speed / the peer's) against size: a panel per op, a line per thread
    count (square sizes and assignment shapes apart for the pairwise IoUs)."""
    ops: dict[str, list[BenchResult]] = {}
    for r in results:
        ops.setdefault(str((r.params or {}).get("op", r.case)), []).append(r)
    ncols = min(2, len(ops))
    nrows = -(-len(ops) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 3.6 * nrows), squeeze=False)
    colours = {1: "tab:blue", 2: "tab:orange"}
    for ax, (op, points) in zip(axes.flat, ops.items()):
        series: dict[tuple[int, bool], list[tuple[float, float, str]]] = {}
        for r in points:
            params = r.params or {}
            size = str(params.get("size", ""))
            rows, _, cols = size.partition("x")
            square = not cols or rows == cols
            key = (r.threads, square)
            series.setdefault(key, []).append((float(params.get("elements", 0)), r.speedup, size))
        for (threads, square), values in sorted(
            series.items(), key=lambda kv: (kv[0][0], not kv[0][1])
        ):
            values.sort()
            xs, ys, labels = zip(*values)
            style = "o-" if square else "s--"
            what = (", N x N" if square else ", N x M") if "x" in labels[0] else ""
            ax.plot(xs, ys, style, color=colours.get(threads, "tab:green"),
                    label=f"{threads} thread{'s' * (threads > 1)}{what}")  # fmt: skip
            if not square:
                for x, y, label in values:
                    ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3),
                                textcoords="offset points")  # fmt: skip
        ax.axhline(SWEEP_TARGET, color="tab:red", lw=1, ls="--", label=f"target {SWEEP_TARGET}")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(op, fontsize=10)
        ax.set_xlabel(_SWEEP_XLABELS.get(op, "elements"))
        ax.set_ylabel("ours / torchvision speed")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    fig.suptitle("visionblocks vs torchvision across sizes, CPU (higher is better)")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def _plot_cases(results: list[BenchResult], output: Path) -> Path:
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
    """``plot.py [RESULTS_JSON] [OUTPUT_PNG] [--sweep-output SWEEP_PNG]``."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/plot.py",
        description="Draw the Benchmarks page's speed-up and memory-ratio chart, and the "
        "size-sweep chart when the results hold sweep points.",
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
    parser.add_argument(
        "--sweep-output",
        type=Path,
        default=DEFAULT_SWEEP_PNG,
        help="the size-sweep PNG, written when the results hold sweep points "
        "(default: docs/assets/benchmarks-sweep.png)",
    )
    args = parser.parse_args(argv)
    for path in plot(args.results_json, args.output, args.sweep_output):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
