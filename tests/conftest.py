"""Suite-wide test plumbing.

Sets ``TRITON_INTERPRET=1`` before anything imports triton (on machines without CUDA), so
every triton kernel runs on CPU tensors and is compared against the torch path. Fails the
run when it leaves new entries in the system temp folder (`pytest_sessionfinish`).
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Iterator

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# onnxruntime's telemetry writes a device id under ~/.cache; tests write under their tmp_path.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import pytest

from visionblocks import kernels
from visionblocks._core.dispatch import set_impl
from visionblocks.kernels._launch import INTERPRET

# One thread per core among pytest-xdist's workers (at most 2 each): more threads than cores
# makes OpenMP's waiting threads spin against each other. The processes a test starts (docs
# pages, examples, the demo) get the same count.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(THREADS)
if _WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)

_REASON = kernels.available()["reason"]
"""Why triton cannot run here ("" when it can)."""
_TRITON_RUNNABLE = not _REASON and (torch.cuda.is_available() or INTERPRET)
_NO_TRITON = (
    "triton kernels cannot run here: "
    + (_REASON or "no CUDA device, and TRITON_INTERPRET=1 was not set before triton was imported")
    + " (a CPU-only torch has no triton: pip install visionblocks[triton])"
)
"""Why kernel tests are skipped: the same text in every kernel test module."""


@pytest.fixture(
    params=[
        "torch",
        pytest.param("triton", marks=pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)),
    ]
)
def impl(request: pytest.FixtureRequest) -> str:
    """Run a test once per available implementation (``"torch"``, ``"triton"``)."""
    return request.param


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
        ),
    ]
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Run a test on CPU and, when present, on CUDA."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _reset_global_state():
    """Each test starts from the default implementation and a fixed seed."""
    torch.manual_seed(0)
    yield
    set_impl(None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``cuda`` every test that runs on CUDA when a GPU is present: the ``device="cuda"``
    cases, and the kernel parity modules' tests without a device parameter (they run on the
    GPU when there is one). ``pytest -m cuda`` runs them all. Mark ``slow`` every
    ``distributed`` test (it starts processes: ``make test-all`` runs them)."""
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)
        params = getattr(getattr(item, "callspec", None), "params", {})
        kernel_module = item.path.name.endswith("_kernel.py") and "device" not in params
        if params.get("device") == "cuda" or kernel_module:
            item.add_marker(pytest.mark.cuda)


TEMP_ALLOWED = ("pytest-of-*", "torchinductor_*")
"""Temp-folder entries a run may add: pytest's own base folder (it keeps the last three
runs' ``tmp_path`` folders and prunes older ones) and torch.compile's cache."""


def _temp_entries() -> set[str]:
    return set(os.listdir(tempfile.gettempdir()))


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        session.config.stash[_TEMP_BEFORE] = _temp_entries()
    # ultralytics (an oracle) probes the network and writes a settings file when imported:
    # offline, and into this run's temp folder.
    os.environ.setdefault("YOLO_OFFLINE", "1")
    base = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    os.environ.setdefault("YOLO_CONFIG_DIR", str(base / "ultralytics"))


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Fail the run when it left new entries in the temp folder: a test writes only under
    its ``tmp_path`` (or in a folder it removes), also from the subprocesses it starts.
    A wrapper, so it looks after pytest-xdist has stopped its workers."""
    result = yield
    before = session.config.stash.get(_TEMP_BEFORE, None)
    if before is None:
        return result
    new = sorted(
        name
        for name in _temp_entries() - before
        if not any(fnmatch.fnmatch(name, pattern) for pattern in TEMP_ALLOWED)
    )
    if new:
        folder = tempfile.gettempdir()
        shown = ", ".join(new[:20]) + (f" and {len(new) - 20} more" if len(new) > 20 else "")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the run left {len(new)} new entries in {folder}: {shown}"
        if reporter is not None:
            reporter.write_sep("=", "temp folder", red=True)
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


_TEMP_BEFORE = pytest.StashKey[set[str]]()
