"""Every kernel specialisation the library can launch, compiled for real GPUs (no GPU needed).

Triton's own compiler and ``ptxas`` (shipped in the triton wheel) compile each specialisation
recorded from the launchers (`benchmarks.kernel_specs`) for ``sm_75``, ``sm_80`` and
``sm_90``: a cubin must come out, with no spill stores and shared memory within the target.
About three minutes on two cores on a fresh machine (triton caches the results).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from tests.conftest import _REASON
from visionblocks._core.dispatch import capability_reason

if _REASON:
    pytest.skip(
        f"triton is not installed or disabled ({_REASON}); "
        "install visionblocks[triton] to compile the kernels",
        allow_module_level=True,
    )

from benchmarks.compile_kernels import TARGETS, compile_all, format_table, summarize
from benchmarks.kernel_specs import kernel_modules, launched_specializations

pytestmark = pytest.mark.slow  # compiles every kernel specialisation for three GPU targets

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "kernels.md"
_DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return compile_all(launched_specializations(), jobs=os.cpu_count())


def _launched_kernels() -> set[str]:
    """Every ``*_kernel`` jit function of the kernel modules (what the launchers launch)."""
    found = set()
    for module in kernel_modules():
        for name, obj in vars(module).items():
            if name.endswith("_kernel") and hasattr(obj, "fn"):
                found.add(f"{module.__name__}:{name}")
    return found


def test_every_kernel_is_launched_and_compiled_for_every_target(rows):
    compiled = defaultdict(set)
    for row in rows:
        compiled[row["kernel"]].add(row["target"])
    assert set(compiled) == _launched_kernels()
    assert all(targets == set(TARGETS) for targets in compiled.values())


def test_compiled_with_no_spills_and_shared_memory_within_the_target(rows):
    bad = [
        f"{r['target']} {r['kernel']} {r['spec']['constexprs']}: {r['error']}"
        for r in rows
        if not r["ok"]
    ]
    assert not bad, "\n".join(bad)
    assert all(r["regs"] > 0 and r["shared"] <= r["shared_limit"] for r in rows)


def test_dispatcher_routing_agrees_with_the_compile_results(rows):
    # A target where a specialisation does not compile must be routed to torch, and a target
    # where everything compiles must not be: the capability table and the compiler agree.
    for row in rows:
        dtypes = [_DTYPES[t[1:]] for _, t in row["spec"]["signature"] if t[1:] in _DTYPES]
        cc = TARGETS[row["target"]][0]
        reason = capability_reason((cc // 10, cc % 10), dtypes)
        assert bool(reason) == (not row["ok"]), (row["target"], row["kernel"], reason)


def test_every_constexpr_value_and_dtype_is_reached(rows):
    values = defaultdict(set)
    pointer_dtypes = defaultdict(set)
    for row in rows:
        spec = row["spec"]
        for name, value in spec["constexprs"]:
            values[(spec["kernel"], name)].add(value)
        pointer_dtypes[spec["kernel"]].add(spec["signature"][0][1])
    for (kernel, name), seen in values.items():
        if any(isinstance(v, bool) for v in seen):
            assert seen == {False, True}, (kernel, name, seen)
        if name == "CDT":
            assert seen == {"tl.float32", "tl.float64"}, (kernel, seen)
    for kernel, seen in pointer_dtypes.items():
        expected = {"*fp32", "*fp64"} if kernel in COMPUTE_DTYPES_ONLY else ALL_POINTER_DTYPES
        assert seen == expected, (kernel, seen)


ALL_POINTER_DTYPES = {"*fp16", "*bf16", "*fp32", "*fp64"}
COMPUTE_DTYPES_ONLY = {
    # The RoI ops run torchvision's forward in float32 for half inputs and cast the output
    # back, so their backward kernel only ever receives float32 or float64 gradients.
    "visionblocks.kernels.roi_align:_roi_pool_bwd_kernel",
}


def test_kernels_page_shows_the_current_compile_table(rows):
    table = format_table(summarize(rows))
    assert table in DOCS.read_text(encoding="utf-8"), (
        "docs/reference/kernels.md must show the table that `python -m "
        f"benchmarks.compile_kernels` prints now:\n{table}"
    )
