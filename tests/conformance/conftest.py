"""The conformance specs' scratch folder is removed when the session ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _remove_spec_folders() -> Iterator[None]:
    """Remove the folders the specs write to (`specs_data_core._folder`) after the last test;
    the temp-folder check in ``tests/conftest.py`` runs after that."""
    yield
    from tests.conformance import specs_data_core

    for folder in specs_data_core._TEMP:
        folder.cleanup()
