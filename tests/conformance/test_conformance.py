"""Generated bad-input and equivalence cases for every spec'd public callable.

See `tests.conformance.framework` for the contract; the specs live in ``specs_*.py``.
``make test`` runs one case per spec and argument kind (`QUICK`), and one equivalence per
spec; the others are marked ``slow`` (``make test-all`` runs them all).
"""

from __future__ import annotations

import pytest

from tests.conformance.framework import Generated, generate, verdict
from tests.conformance.specs import all_specs

CASES: list[Generated] = generate(all_specs())


def quick_cases(cases: list[Generated]) -> set[str]:
    """The ids of one case per (spec, argument kind) and one equivalence per spec. The
    mutation rotates from one group to the next, so the quick run still tries each kind's
    mutations somewhere."""
    groups: dict[tuple[str, str], list[Generated]] = {}
    for case in cases:
        kind = case.arg.kind if case.arg is not None else "equivalence"
        groups.setdefault((case.spec.id, kind), []).append(case)
    return {group[n % len(group)].id for n, group in enumerate(groups.values())}


QUICK = quick_cases(CASES)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id, marks=() if c.id in QUICK else pytest.mark.slow) for c in CASES],
)
def test_bad_input_is_rejected_clearly(case: Generated) -> None:
    verdict(case)


def test_quick_cases_cover_every_spec_and_kind():
    specs = {(c.spec.id, c.arg.kind if c.arg else "equivalence") for c in CASES}
    chosen = {(c.spec.id, c.arg.kind if c.arg else "equivalence") for c in CASES if c.id in QUICK}
    assert chosen == specs
    assert len(QUICK) == len(specs) < len(CASES)
