"""The cases' write-once inputs (`benchmarks.cases._cache`) go under this run's temp folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.cases._cache import ENV_VAR


@pytest.fixture(scope="session")
def bench_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache per run (per xdist worker): the checkpoint file is written once, not per
    test, and removed at the end (pytest keeps its last runs' folders: 100 MiB each)."""
    folder = tmp_path_factory.mktemp("bench-cache")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _bench_cache_env(bench_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(bench_cache))
