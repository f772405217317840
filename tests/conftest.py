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
from visionblocks._dispatch import set_impl

torch.set_num_threads(min(2, torch.get_num_threads()))

_TRITON_RUNNABLE = kernels.triton_available() and (
    torch.cuda.is_available() or kernels.interpret_mode()
)
_NO_TRITON = f"triton cannot run here: {kernels.triton_unavailable_reason() or 'no CUDA and no TRITON_INTERPRET=1'}"


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
