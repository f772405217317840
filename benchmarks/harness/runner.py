"""Running selected cases, and the ``visionblocks bench`` command built on it."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from benchmarks.harness.busy import BusyNeighbours
from benchmarks.harness.calls import count_calls
from benchmarks.harness.case import (
    CASES,
    GROUPS,
    BenchCase,
    get_case,
    list_cases,
    select_cases,
)
from benchmarks.harness.check import verify_outputs
from benchmarks.harness.memory import measure_memory
from benchmarks.harness.report import BenchResult, results_to_json
from benchmarks.harness.table import format_table
from benchmarks.harness.timing import TimingResult, num_threads, time_pair

__all__ = ["LOADS", "add_arguments", "copy_bandwidth", "run_cases", "run_from_cli"]

Load = Literal["quiet", "busy", "both"]
LOADS: tuple[str, ...] = ("quiet", "busy", "both")
"""Values of ``load``: time on a quiet machine, beside busy neighbours, or each case both ways."""
_TRACEBACK_LINES = 15
QUICK_REPEATS, QUICK_WARMUP = 3, 1
"""Timed pairs and warm-up calls of a quick run (``--quick``)."""


def _new_result(case: BenchCase, copy_gbps: float | None, quick: bool = False) -> BenchResult:
    return BenchResult(
        case=case.name,
        peer_name=case.peer_name,
        description=case.description,
        min_speedup=case.min_speedup,
        max_memory_ratio=case.max_memory_ratio,
        max_memory_mib=case.max_memory_mib,
        threads=case.threads,
        device=case.device,
        bytes_moved=case.bytes_moved,
        copy_gbps=copy_gbps,
        min_busy_speedup=case.min_busy_speedup if case.peer is not None else None,
        group=case.group,
        params=dict(case.params) if case.params is not None else None,
        quick=quick,
    )


def _failed(result: BenchResult, prefix: str = "") -> None:
    """Record the traceback tail of the exception being handled in ``result.error``."""
    lines = traceback.format_exc().strip().splitlines()
    result.error = prefix + "\n".join(lines[-_TRACEBACK_LINES:])


def _time(
    case: BenchCase, result: BenchResult, repeats: int, warmup: int, small: bool = False
) -> TimingResult | None:
    """Time the case; on failure record the traceback tail in ``result.error``."""
    try:
        return time_pair(case, repeats=repeats, warmup=warmup, small=small)
    except Exception:
        _failed(result)
        return None


def _verify(case: BenchCase, result: BenchResult) -> None:
    """Run the case's output check (``verify=True``); a mismatch becomes ``result.error``."""
    try:
        verify_outputs(case)
    except Exception:
        _failed(result, "outputs differ or the check failed:\n")
        return
    result.verified = True


def _count(case: BenchCase, result: BenchResult, small: bool) -> None:
    """Python-level calls of one call of each side (``count_calls=True``), after a warm call."""
    setup = case.small_setup if small and case.small_setup is not None else case.setup
    try:
        with num_threads(case.threads):
            state = setup()
            case.ours(state)
            result.ours_calls = count_calls(case.ours, state)
            if case.peer is not None:
                case.peer(state)
                result.peer_calls = count_calls(case.peer, state)
    except Exception:
        _failed(result, "counting calls failed:\n")


def _line(timing: TimingResult | None) -> str:
    if timing is None:
        return "error"
    return f"{timing.speedup:.2f}x" if timing.speedup is not None else f"{timing.ours_ms:.3g} ms"


def run_cases(
    patterns: Sequence[str] | None = None,
    repeats: int = 20,
    warmup: int = 3,
    memory: bool = True,
    *,
    load: Load = "quiet",
    neighbours: int = 2,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
    groups: Sequence[str] | None = None,
    quick: bool = False,
) -> list[BenchResult]:
    """Time (and measure the memory of) every case matching ``patterns``.

    The run has up to two passes. The quiet pass (``load`` ``"quiet"`` or ``"both"``) times
    each case and measures its memory; with ``load="busy"`` it only measures memory, since
    memory is always measured quiet. The busy pass (``"busy"`` or ``"both"``) starts
    ``neighbours`` `benchmarks.harness.busy.BusyNeighbours` once, times each case while they
    compute (restarting one that died) and kills them at the end, whatever happens.

    A case that fails is reported in its result (``error``, verdict ``"error"``; it is not
    timed again in the busy pass) and the run goes on; so does a failed memory measurement.
    Missed targets are reported, not raised.

    Args:
        patterns: fnmatch patterns over case names; ``None`` or empty runs every case.
        repeats: Timed pairs per case and pass (see `benchmarks.harness.timing.time_pair`).
        warmup: Untimed calls of each side before timing.
        memory: Measure peak memory (of cases with ``memory=True``), each side in a fresh
            process (see `benchmarks.harness.memory.measure_memory`).
        load: ``"quiet"``, ``"busy"`` or ``"both"`` (see above).
        neighbours: Busy neighbour processes of the busy pass.
        device: Run the cases of this device (``"cpu"`` or ``"cuda"``); a pattern that
            names cases of the other device only matches nothing.
        progress: Called with a line of text after each case and pass (e.g. ``print``).
        groups: Run only the cases of these groups (`benchmarks.harness.case.GROUPS`:
            ``"workload"``, ``"micro"``, ``"sweep"``); ``None`` or empty: every group.
        quick: A smoke run: each case on its ``small_setup`` inputs where it has one, with
            ``repeats`` and ``warmup`` capped at 3 and 1; results are marked ``quick``.

    Returns:
        list[BenchResult]: One result per case, in name order.

    Raises:
        ValueError: If a pattern matches no case, ``repeats < 1``, ``warmup < 0``,
            ``neighbours < 1``, ``load`` is not one of `LOADS` or a group not one of `GROUPS`.
        RuntimeError: If the busy neighbours cannot start (none is left running).

    Examples:
        >>> import torch
        >>> from benchmarks.harness import BenchCase, register_case
        >>> _ = register_case(BenchCase("doc_mul", setup=lambda: torch.ones(4), ours=torch.square))
        >>> [r.verdict for r in run_cases(["doc_mul"], repeats=2, warmup=0, memory=False)]
        ['-']
        >>> CASES._remove("doc_mul")
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if load not in LOADS:
        raise ValueError(f"load must be one of {', '.join(map(repr, LOADS))}, got {load!r}")
    if not isinstance(neighbours, int) or neighbours < 1:
        raise ValueError(f"neighbours must be an int >= 1, got {neighbours!r}")
    unknown = [g for g in groups or () if g not in GROUPS]
    if unknown:
        raise ValueError(f"groups must be among {', '.join(map(repr, GROUPS))}, got {unknown}")
    cases = [
        c
        for c in select_cases(patterns)
        if c.device == device and (not groups or c.group in groups)
    ]
    if not cases:
        where = f" in group {', '.join(groups)}" if groups else ""
        raise ValueError(f"no {device} benchmark case{where} matches {list(patterns or ['*'])}")
    if quick:
        repeats, warmup = min(repeats, QUICK_REPEATS), min(warmup, QUICK_WARMUP)
    copy_gbps = copy_bandwidth(device) if any(c.bytes_moved for c in cases) else None
    pairs = [(case, _new_result(case, copy_gbps, quick)) for case in cases]
    say = progress or (lambda line: None)
    _quiet_pass(pairs, repeats, warmup, memory, load, say, quick)
    if load != "quiet":
        _busy_pass(pairs, repeats, warmup, neighbours, say)
    return [result for _, result in pairs]


def _quiet_pass(
    pairs: list[tuple[BenchCase, BenchResult]],
    repeats: int,
    warmup: int,
    memory: bool,
    load: Load,
    say: Callable[[str], None],
    quick: bool = False,
) -> None:
    """Output checks (``verify``), quiet timings (unless ``load="busy"``), call counts and
    memory measurements, case by case."""
    for i, (case, result) in enumerate(pairs, 1):
        if case.verify and case.check is not None and case.peer is not None:
            _verify(case, result)
        if load != "busy":
            result.timing = _time(case, result, repeats, warmup, quick)
        if case.count_calls and result.error is None:
            _count(case, result, quick)
        if memory and case.memory and result.error is None:
            result.ours_memory = measure_memory(case, "ours")
            if case.peer is not None:
                result.peer_memory = measure_memory(case, "peer")
        if load != "busy":
            done = f" -> {result.verdict}" if load == "quiet" else ""
            say(f"[{i}/{len(pairs)}] {case.name} quiet: {_line(result.timing)}{done}")


def _busy_pass(
    pairs: list[tuple[BenchCase, BenchResult]],
    repeats: int,
    warmup: int,
    neighbours: int,
    say: Callable[[str], None],
) -> None:
    """Busy timings: neighbours started once, running during every timing, always killed."""
    with BusyNeighbours(neighbours) as busy:
        for i, (case, result) in enumerate(pairs, 1):
            if result.error is None:
                busy.ensure_running()
                result.busy_timing = _time(case, result, repeats, warmup, result.quick)
                result.busy_load = busy.description
            line = f"{case.name} busy: {_line(result.busy_timing)} -> {result.verdict}"
            say(f"[{i}/{len(pairs)}] {line}")


def copy_bandwidth(device: str, nbytes: int = 1 << 28, repeats: int = 10) -> float:
    """Measured copy bandwidth of ``device`` in GB/s (bytes read plus written per second).

    The best of ``repeats`` copies of an ``nbytes`` buffer: the practical ceiling that the
    bandwidth-bound kernels are compared with (``"of copy"`` in the table).

    Examples:
        >>> copy_bandwidth("cpu", nbytes=1 << 20, repeats=2) > 0
        True
    """
    import time

    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)
    best = float("inf")
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best / 1e9


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``visionblocks bench`` arguments to ``parser``.

    Examples:
        >>> import argparse
        >>> parser = argparse.ArgumentParser()
        >>> add_arguments(parser)
        >>> args = parser.parse_args(["focal*", "--repeats", "5", "--no-memory", "--load", "both"])
        >>> args.patterns, args.repeats, args.warmup, args.memory, args.list, args.load
        (['focal*'], 5, 3, False, False, 'both')
    """
    parser.add_argument(
        "patterns",
        nargs="*",
        metavar="PATTERN",
        help="fnmatch patterns of case names (default: all)",
    )
    parser.add_argument(
        "--repeats", type=_int_at_least(1), default=20, help="timed pairs per case (default: 20)"
    )
    parser.add_argument(
        "--warmup", type=_int_at_least(0), default=3, help="untimed calls per side (default: 3)"
    )
    parser.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the peak-memory measurement (one fresh process per case and side)",
    )
    parser.add_argument(
        "--load",
        choices=LOADS,
        default="quiet",
        help="time on a quiet machine (default), while two busy neighbour processes run "
        "matrix products on every core (busy), or each case both ways (both); memory is "
        "always measured quiet",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="write results as JSON")
    parser.add_argument(
        "--markdown", metavar="PATH", default=None, help="write the results tables as Markdown"
    )
    parser.add_argument(
        "--group",
        dest="groups",
        action="append",
        choices=GROUPS,
        default=None,
        help="run only the cases of this group: workload (a model's training step, an "
        "augmentation pipeline), micro (one op at one size) or sweep (ops across sizes and "
        "thread counts); repeat for several (default: every group)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: reduced inputs (each case's small_setup), at most {QUICK_REPEATS} "
        f"repeats and {QUICK_WARMUP} warm-up, no memory, quiet only; not for quoting",
    )
    parser.add_argument("--list", action="store_true", help="list the case names and exit")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="run the CPU cases (default) or the CUDA kernel cases (needs a GPU)",
    )


def _print_list(patterns: Sequence[str], groups: Sequence[str] = ()) -> None:
    names = sorted({n for p in (patterns or ["*"]) for n in list_cases(p)})
    names = [n for n in names if not groups or get_case(n).group in groups]
    if not names:
        what = f"match {', '.join(map(repr, patterns))}" if patterns else "are registered yet"
        print(f"no benchmark cases {what}")
    for name in names:
        case = get_case(name)
        peer = f"vs {case.peer_name}" if case.peer is not None else "no peer"
        if case.device != "cpu":
            peer += f", {case.device}"
        about = f": {case.description}" if case.description else ""
        print(f"{name}  ({peer}){about}")


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)


def run_from_cli(args: argparse.Namespace) -> int:
    """Run ``visionblocks bench`` with parsed ``args``; returns the exit status.

    Prints the table and returns 0, missed targets included (they show in the table). Returns
    1 when a pattern matches no case, with a message listing the available cases. With no
    cases registered at all (and no pattern), says so and returns 0.
    """
    patterns = list(args.patterns or [])
    groups = list(getattr(args, "groups", None) or [])
    quick = bool(getattr(args, "quick", False))
    if args.list:
        _print_list(patterns, groups)
        return 0
    if not patterns and not CASES.list():
        print(
            "visionblocks bench: no benchmark cases are registered yet "
            "(see benchmarks/README.md to add one); nothing to run",
            file=sys.stderr,
        )
        return 0
    device = getattr(args, "device", "cpu")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "visionblocks bench: --device cuda needs a CUDA GPU; none is visible",
                file=sys.stderr,
            )
            return 1
    try:
        results = run_cases(
            patterns,
            repeats=args.repeats,
            warmup=args.warmup,
            memory=args.memory and not quick,
            load="quiet" if quick else getattr(args, "load", "quiet"),
            device=device,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            groups=groups,
            quick=quick,
        )
    except (ValueError, RuntimeError) as exc:
        print(f"visionblocks bench: {exc}", file=sys.stderr)
        return 1
    table = format_table(results)
    print(table)
    if args.json:
        _write(args.json, json.dumps(results_to_json(results), indent=2) + "\n")
    if args.markdown:
        _write(args.markdown, table + "\n")
    return 0
