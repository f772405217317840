"""What a benchmark case is, and the registry that holds them.

A case compares one of our functions (``ours``) with the same computation in a peer library
(``peer``) on inputs that ``setup`` builds once. Cases live in `CASES`; the built-in ones
are in the ``benchmarks/cases/*.py`` modules (``benchmarks.cases.<topic>``), imported the first
time the registry is listed or misses a name.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from visionblocks.registry import Registry

__all__ = [
    "CASES",
    "GROUPS",
    "BenchCase",
    "get_case",
    "list_cases",
    "register_case",
    "resolve_case",
    "select_cases",
]

CASES = Registry(
    "benchmarks",
    modules=(
        "benchmarks.cases.focal",
        "benchmarks.cases.iou_loss",
        "benchmarks.cases.boxes",
        "benchmarks.cases.assign",
        "benchmarks.cases.rotated",
        "benchmarks.cases.roi_align",
        "benchmarks.cases.rotated_roi_align",
        "benchmarks.cases.warp",
        "benchmarks.cases.local_filter",
        "benchmarks.cases.local_attention",
        "benchmarks.cases.channels_last",
        "benchmarks.cases.weights",
        "benchmarks.cases.coco",
        "benchmarks.cases.checkpointing",
        "benchmarks.cases.cuda",
        "benchmarks.cases.workloads",
        "benchmarks.cases.yolov8",
        "benchmarks.cases.maskrcnn",
        "benchmarks.cases.sweep",
        "benchmarks.cases.modern_assign",
        "benchmarks.cases.modern_blocks",
        "benchmarks.cases.deformable_detr",
        "benchmarks.cases.seg_metrics",
        "benchmarks.cases.lovasz",
        "benchmarks.cases.seg_losses",
    ),
    description="BenchCase, or a zero-argument callable returning one",
)
"""The registry of benchmark cases (a `visionblocks.registry.Registry`): case name →
`BenchCase`. It imports the ``benchmarks.cases`` modules listed here on its first lookup
miss, listing or iteration, and each of them registers its cases with `register_case`."""

GROUPS: tuple[str, ...] = ("workload", "micro", "sweep")
"""Kinds of case, in report order: ``"workload"`` (what users run: a model's training step, a
per-sample augmentation pipeline), ``"micro"`` (one op at one size: the microbenchmarks) and
``"sweep"`` (one op at one point of a size sweep, `benchmarks.cases.sweep`)."""


@dataclass(eq=False)
class BenchCase:
    """One benchmark: our implementation against a peer's, on inputs built once.

    A ``BenchCase`` is its own registry builder: calling it returns itself. `CASES`
    (a `visionblocks.registry.Registry`, which only stores callables) therefore holds
    case objects directly, and its builder contract is simply "a zero-argument callable
    returning a ``BenchCase``" — a case, or a factory that builds one lazily.

    Args:
        name: Registry name, e.g. ``"focal_loss_4m_fwd_bwd"``.
        setup: Builds the inputs once and returns a state object (tensors, a tuple, a dict...).
            Not timed and not counted in memory.
        ours: ``ours(state)`` runs our implementation once.
        peer: ``peer(state)`` runs the peer's implementation once, or ``None`` to time ours only.
        peer_name: Who the peer is (``"torchvision"``, ``"kornia"``, ``"naive torch"``).
        description: One line saying what is measured (sizes, forward/backward).
        min_speedup: Target: ours must be at least this many times faster than the peer
            (``1.0`` means "not slower"); ``None`` for no speed target.
        max_memory_ratio: Target: ours' peak extra memory divided by the peer's must be at most
            this; ``None`` for no memory target.
        max_memory_mib: Target: ours' peak extra memory must be at most this many MiB;
            ``None`` for no absolute memory target.
        memory: Measure peak memory (each side in a fresh process).
        threads: ``torch.set_num_threads`` while the case runs.
        device: ``"cpu"``, or ``"cuda"`` for a case that needs a GPU (run by
            ``visionblocks bench --device cuda``).
        bytes_moved: The least bytes one ``ours`` call must read and write (its performance
            model); the table then shows the achieved GB/s.
        min_busy_speedup: Target under load (``visionblocks bench --load busy``): ours at
            least this many times faster than the peer while busy neighbours run. Defaults
            to ``1.0`` ("no collapse"); ``None`` for no busy target. Ignored without a peer.
        check: ``check(ours_out, peer_out)`` raises ``AssertionError`` when the two sides'
            results of one call disagree (`benchmarks.harness.check.same_outputs` builds
            the usual one). Every case with a peer must have one: a test runs it.
        outputs: ``outputs(state)`` returns ``(ours_out, peer_out)`` for ``check`` when the
            timed calls return nothing comparable (a count, a load report); by default the
            check compares ``ours(state)`` with ``peer(state)``.
        small_setup: A faster ``setup`` on reduced sizes, used by the output check and by
            quick runs (``--quick``); ``None`` to use ``setup``'s inputs there too.
        group: ``"workload"``, ``"micro"`` (default) or ``"sweep"`` (see `GROUPS`): where the
            report lists the case, and what ``--group`` selects.
        params: What the case's point is, for reports and plots (e.g. ``{"op": "box_iou",
            "size": "100x100", "elements": 10000}``); ``None`` for none.
        min_sample_ms: Time calls in a loop, long enough that one timed sample takes at least
            this many milliseconds (the loop count is calibrated per side during warm-up; the
            time per call is the sample divided by it). For calls of microseconds, which one
            `time.perf_counter` pair cannot time; ``None`` (default): one call per sample.
        count_calls: Also count the Python-level function calls of one call of each side
            (`benchmarks.harness.calls.count_calls`, cProfile), shown in the report.
        verify: Run ``check`` (on ``small_setup``) as part of every benchmark run, not only
            in the tests; a mismatch makes the verdict ``error``.

    Examples:
        >>> import torch
        >>> case = BenchCase(
        ...     name="doc_add",
        ...     setup=lambda: (torch.ones(8), torch.ones(8)),
        ...     ours=lambda s: torch.add(*s),
        ...     peer=lambda s: s[0] + s[1],
        ...     peer_name="operator +",
        ...     min_speedup=1.0,
        ... )
        >>> case() is case
        True
        >>> case.ours(case.setup()).tolist()[:2]
        [2.0, 2.0]
    """

    name: str
    setup: Callable[[], Any]
    ours: Callable[[Any], Any]
    peer: Callable[[Any], Any] | None = None
    peer_name: str = ""
    description: str = ""
    min_speedup: float | None = None
    max_memory_ratio: float | None = None
    max_memory_mib: float | None = None
    memory: bool = True
    threads: int = 2
    device: str = "cpu"
    bytes_moved: int | None = None
    min_busy_speedup: float | None = 1.0
    check: Callable[[Any, Any], None] | None = None
    outputs: Callable[[Any], tuple[Any, Any]] | None = None
    small_setup: Callable[[], Any] | None = None
    group: str = "micro"
    params: dict[str, Any] | None = None
    min_sample_ms: float | None = None
    count_calls: bool = False
    verify: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"BenchCase name must be a non-empty str, got {self.name!r}")
        for field in ("setup", "ours"):
            if not callable(getattr(self, field)):
                raise TypeError(f"BenchCase {field} must be callable, got {getattr(self, field)!r}")
        for field in ("peer", "check", "outputs", "small_setup"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(f"BenchCase {field} must be callable or None, got {value!r}")
        for field in (
            "min_speedup",
            "max_memory_ratio",
            "max_memory_mib",
            "min_busy_speedup",
            "min_sample_ms",
        ):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(
                    f"BenchCase {field} must be a positive number or None, got {value!r}"
                )
        if self.group not in GROUPS:
            raise ValueError(
                f"BenchCase group must be one of {', '.join(map(repr, GROUPS))}, got {self.group!r}"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"BenchCase device must be 'cpu' or 'cuda', got {self.device!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"BenchCase threads must be an int >= 1, got {self.threads!r}")

    def __call__(self) -> BenchCase:
        """Return the case itself (a case is its own registry builder)."""
        return self


def register_case(case: BenchCase, *, force: bool = False) -> BenchCase:
    """Register ``case`` in `CASES` under ``case.name`` and return it.

    Args:
        case: The case to register.
        force: Replace a case already registered under the same name.

    Returns:
        BenchCase: ``case`` itself, so ``CASE = register_case(BenchCase(...))`` reads well.

    Raises:
        TypeError: If ``case`` is not a `BenchCase`.
        KeyError: If the name is taken and ``force`` is False.

    Examples:
        >>> case = register_case(BenchCase("doc_noop", setup=lambda: None, ours=lambda s: s))
        >>> get_case("doc_noop") is case
        True
        >>> CASES._remove("doc_noop")  # tests and examples clean up after themselves
    """
    if not isinstance(case, BenchCase):
        raise TypeError(f"register_case() takes a BenchCase, got {type(case).__name__}")
    CASES.register(case, name=case.name, force=force)
    return case


def get_case(name: str) -> BenchCase:
    """Return the case registered as ``name`` (building it when a factory was registered).

    Raises:
        KeyError: Unknown name; the message lists close matches.
        TypeError: The registered builder did not return a `BenchCase`.
    """
    case = CASES.build(name)
    if not isinstance(case, BenchCase):
        raise TypeError(
            f"benchmark builder {name!r} must return a BenchCase, got {type(case).__name__}"
        )
    return case


def list_cases(pattern: str = "*") -> list[str]:
    """Sorted names of registered cases matching the fnmatch ``pattern``."""
    return CASES.list(pattern)


def select_cases(patterns: Sequence[str] | None = None) -> list[BenchCase]:
    """Cases whose names match any of ``patterns`` (fnmatch), in name order.

    Args:
        patterns: fnmatch patterns; ``None`` or empty selects every case.

    Raises:
        ValueError: If a pattern matches no case; the message lists the available cases.
    """
    names = CASES.list()
    if not patterns:
        return [get_case(n) for n in names]
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        available = ", ".join(names) if names else "none registered"
        raise ValueError(
            f"no benchmark case matches {', '.join(repr(p) for p in unmatched)}; "
            f"available cases: {available}"
        )
    return [get_case(n) for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def case_origins(case: BenchCase) -> list[str]:
    """Modules (or script paths) defining the case's functions, for a fresh process to import.

    A script run as ``__main__`` is given by its file path, since ``__main__`` in the fresh
    process is another program.
    """
    origins: list[str] = []
    for fn in (case.setup, case.ours, case.peer):
        fn = getattr(fn, "func", fn)  # functools.partial
        module = getattr(fn, "__module__", None)
        if module == "__main__":
            module = getattr(sys.modules["__main__"], "__file__", None)
            module = os.path.abspath(module) if module else None
        if module and module not in origins:
            origins.append(module)
    return origins


def _import(origin: str) -> ModuleType:
    if not origin.endswith(".py"):
        return importlib.import_module(origin)
    name = "_visionblocks_bench_" + os.path.splitext(os.path.basename(origin))[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, origin)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import benchmark script {origin!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def resolve_case(spec: str, imports: Iterable[str] = ()) -> BenchCase:
    """Find a case from a string, as a fresh measuring process does.

    Args:
        spec: ``"module:attr"`` (an attribute holding a case or a factory), or a case name:
            looked up in `CASES` after importing ``imports``, then among the module-level
            ``BenchCase`` objects of those modules (cases that a test registers temporarily).
        imports: Module names or ``.py`` paths to import first.

    Raises:
        KeyError: No case found.
        TypeError: ``module:attr`` names something that is not a case or a case factory.
    """
    modules = [_import(origin) for origin in imports]
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        obj: Any = _import(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        case = obj()  # a BenchCase returns itself; a factory builds one
        if not isinstance(case, BenchCase):
            raise TypeError(
                f"{spec!r} must be a BenchCase or return one, got {type(case).__name__}"
            )
        return case
    if spec in CASES:
        return get_case(spec)
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, BenchCase) and value.name == spec:
                return value
    where = ", ".join(m.__name__ for m in modules) or "no modules"
    raise KeyError(
        f"benchmark case {spec!r} is neither registered nor a module-level BenchCase of {where}"
    )
