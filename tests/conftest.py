"""Suite-wide test plumbing.

Sets ``TRITON_INTERPRET=1`` before anything imports triton (on machines without CUDA), so
every triton kernel runs on CPU tensors and is compared against the torch path.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from visionblocks import kernels
from visionblocks._core.dispatch import set_impl

torch.set_num_threads(min(2, torch.get_num_threads()))

_TRITON_RUNNABLE = kernels.triton_available() and (
    torch.cuda.is_available() or kernels.interpret_mode()
)
_NO_TRITON = (
    "triton kernels cannot run here: "
    + (
        kernels.triton_unavailable_reason()
        or "no CUDA device, and TRITON_INTERPRET=1 was not set before triton was imported"
    )
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
    GPU when there is one). ``pytest -m cuda`` runs them all."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kernel_module = item.path.name.endswith("_kernel.py") and "device" not in params
        if params.get("device") == "cuda" or kernel_module:
            item.add_marker(pytest.mark.cuda)
