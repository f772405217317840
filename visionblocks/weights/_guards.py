"""The guards of `load_partial` (private; see `visionblocks.weights`).

`failed_guard` returns the message of the first guard that fails, or None; the caller raises
`LoadError` with it, so every guard is checked before anything is copied.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from visionblocks._core.checks import check_range, check_type

if TYPE_CHECKING:
    from visionblocks.weights.report import LoadReport

__all__ = ["check_flags", "check_min_loaded", "failed_guard", "require_patterns"]

_SHOW = 10  # keys named in a message


def require_patterns(require: str | Sequence[str] | None) -> list[str]:
    """``require`` as a list of fnmatch patterns (a single str is one pattern)."""
    if require is None:
        return []
    check_type("require", require, (str, list, tuple))
    patterns = [require] if isinstance(require, str) else list(require)
    for p in patterns:
        check_type("require pattern", p, str)
    return patterns


def check_flags(**flags: Any) -> None:
    """Raise ``TypeError`` for any flag that is not a bool (naming it)."""
    for name, flag in flags.items():
        check_type(name, flag, bool)


def check_min_loaded(min_loaded: float | None) -> None:
    """Raise unless ``min_loaded`` is None or a number in ``[0, 1]``."""
    if min_loaded is not None:
        check_type("min_loaded", min_loaded, (int, float))
        check_range("min_loaded", float(min_loaded), 0.0, 1.0)


def _nothing_loaded(report: LoadReport, model_keys: Collection[str]) -> str:
    if report.mismatched:
        seen = f"{len(report.mismatched)} matched a name but not the shape"
    elif report.unexpected:
        seen = (
            f"checkpoint keys look like {report.unexpected[0]!r}, "
            f"model keys like {next(iter(model_keys))!r}"
        )
    else:
        seen = "the checkpoint holds no tensors"
    return (
        f"nothing loaded: none of the model's {report.num_model_keys} keys got a tensor "
        f"({seen}); pass min_loaded=0 to accept loading nothing"
    )


def failed_guard(
    report: LoadReport,
    model_keys: Collection[str],
    skip_mismatched: bool,
    strict: bool,
    patterns: list[str],
    min_loaded: float | None,
) -> str | None:
    """The message of the first failing guard, or None when all pass.

    Raises:
        ValueError: A ``require`` pattern matches no model key.
    """
    if report.mismatched and not skip_mismatched:
        return (
            f"{len(report.mismatched)} tensor(s) have a different shape in the checkpoint "
            "(skip_mismatched=False)"
        )
    if strict and not report.ok:
        return (
            f"strict load failed: {len(report.missing)} missing, "
            f"{len(report.mismatched)} mismatched, {len(report.unexpected)} unexpected key(s)"
        )
    if patterns:
        loaded = set(report.loaded)
        failed: list[str] = []
        for pattern in patterns:
            matched = fnmatch.filter(model_keys, pattern)
            if not matched:
                raise ValueError(
                    f"require pattern {pattern!r} matches no key of the model "
                    f"(fnmatch on model keys, e.g. {next(iter(model_keys), '')!r})"
                )
            failed.extend(k for k in matched if k not in loaded and k not in failed)
        if failed:
            status = ["mismatched" if k in report.mismatched else "missing" for k in failed]
            listed = ", ".join(f"{k} ({s})" for k, s in zip(failed[:_SHOW], status))
            more = f" and {len(failed) - _SHOW} more" if len(failed) > _SHOW else ""
            return f"{len(failed)} required key(s) not loaded: {listed}{more}"
    if min_loaded is None:  # the default guard: loading nothing is an error
        if report.num_model_keys and not report.num_loaded:
            return _nothing_loaded(report, model_keys)
    elif report.fraction_loaded < min_loaded:
        return (
            f"only {report.num_loaded}/{report.num_model_keys} model keys "
            f"({100 * report.fraction_loaded:.1f}%) loaded; min_loaded={min_loaded}"
        )
    return None
