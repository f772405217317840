"""A strict build of the docs site, made once per test session and shared by xdist workers."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .pages import ROOT


def build_site(site: Path) -> Path:
    """``mkdocs build --strict`` into ``site``, once: later calls (any worker) reuse it."""
    done_marker = site / ".built"
    site.parent.mkdir(parents=True, exist_ok=True)
    with open(site.parent / ".site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done_marker.exists():
            env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
            done = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if done.returncode != 0:
                pytest.fail(f"mkdocs build --strict failed:\n{done.stderr[-4000:]}")
            done_marker.touch()
    return site


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The built site's folder (skips when the docs extra is not installed)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]'")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the base folder all workers share
    return build_site(shared / "docs-site")
