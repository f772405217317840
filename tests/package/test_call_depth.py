"""How many package modules one call enters: the structure an op's call pays for.

A focal loss call (validation, the decision kernel-or-formula, the formula or the kernel,
the reduction) enters at most 3 package modules on the torch path and 5 on the kernel path
(the op, its reduction, the decision, the kernel module and the shared launcher). Counted
as the distinct modules of the Python functions called (``sys.setprofile``), forward and
backward, after a warm-up call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from visionblocks.losses import sigmoid_focal_loss


def entered(fn: Callable[[], object]) -> list[str]:
    """The package modules whose functions ``fn`` calls, in first-call order."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("visionblocks") and name not in seen:
                seen.append(name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _focal(impl: str) -> Callable[[], object]:
    x = torch.randn(8, 5, requires_grad=True)
    t = torch.randint(0, 6, (8,))

    def run():
        sigmoid_focal_loss(x, t, reduction="mean", impl=impl).backward()

    run()  # warm up: imports and first-call caches
    return run


def test_a_focal_call_enters_three_modules_on_the_torch_path():
    assert entered(_focal("auto")) == [
        "visionblocks.losses.focal",
        "visionblocks.losses._reduce",
        "visionblocks._core.dispatch",
    ]


@pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)
def test_a_focal_call_enters_five_modules_on_the_kernel_path():
    assert sorted(entered(_focal("triton"))) == [
        "visionblocks._core.dispatch",
        "visionblocks.kernels._launch",
        "visionblocks.kernels.focal",
        "visionblocks.losses._reduce",
        "visionblocks.losses.focal",
    ]
