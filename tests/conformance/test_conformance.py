"""Generated bad-input and equivalence cases for every spec'd public callable.

See `tests.conformance.framework` for the contract; the specs live in ``specs_*.py``.
"""

from __future__ import annotations

import pytest

from tests.conformance.framework import Generated, generate, verdict
from tests.conformance.specs import all_specs

CASES: list[Generated] = generate(all_specs())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_rejected_clearly(case: Generated) -> None:
    verdict(case)
