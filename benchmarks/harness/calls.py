"""How many Python-level calls one call of a case's side makes (cProfile).

An op that is one torch formula makes a handful of calls (its checks, the torch functions
it uses); one that dispatches through helpers, wrappers and per-chunk loops makes many more,
and each costs about a microsecond: what decides speed at tiny sizes. `count_calls` runs
the call once under `cProfile` and returns the number of calls it recorded: Python
functions and the built-in functions (torch's included) they call.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

__all__ = ["count_calls"]


def count_calls(fn: Callable[[Any], Any], state: Any) -> int:
    """Function calls (Python and built-in) made by one ``fn(state)``, the call itself excluded.

    Run ``fn`` once before counting, so that first-call work (imports, caches) is not counted.

    Examples:
        >>> def two(state):
        ...     return abs(min(state))
        >>> count_calls(two, [3, -1])
        2
    """
    profile = cProfile.Profile()
    profile.runcall(fn, state)
    stats = pstats.Stats(profile)
    # The profile holds fn itself and the profiler's own `disable` call.
    return max(0, stats.total_calls - 2)  # type: ignore[attr-defined]
