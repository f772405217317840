"""``torch.use_deterministic_algorithms(True)`` and the kernels (issue 18).

- Routing (`visionblocks.kernels._dispatch.resolve_impl`): a kernel listed in
  `visionblocks.kernels._support.NONDETERMINISTIC` is never picked by ``impl="auto"`` in
  deterministic mode, and forcing it on CUDA raises (warns with ``warn_only=True``). No real
  kernel is listed, so the tests list a fake one and fake a CUDA tensor, as
  ``tests/_core/test_dispatch.py`` does.
- The claim that no real kernel belongs in that table: the kernel sources are scanned for
  atomics and autotuning (the two ways a triton kernel's bits can depend on scheduling or
  timing), and the C kernels for atomics and OpenMP pragmas.

That every CPU path runs unchanged in deterministic mode is checked with the cases, in
``tests/package/test_determinism.py``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.package.test_determinism import deterministic_algorithms
from visionblocks import kernels
from visionblocks._core.dispatch import use_impl
from visionblocks.kernels import _dispatch, _support
from visionblocks.kernels._dispatch import resolve_impl

KERNELS_DIR = Path(kernels.__file__).parent
PACKAGE = KERNELS_DIR.parent


@pytest.fixture
def deterministic() -> Iterator[Callable[..., None]]:
    """``set(mode, warn_only=False)`` for the test; the previous setting is restored."""
    with deterministic_algorithms(torch.are_deterministic_algorithms_enabled()):
        yield lambda mode, warn_only=False: torch.use_deterministic_algorithms(
            mode, warn_only=warn_only
        )


class FakeCuda:
    is_cuda = True
    device = torch.device("cuda", 0)
    dtype = torch.float32


@pytest.fixture
def gpu_ops(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A nondeterministic and a deterministic fake kernel op, on a faked sm_90 with triton."""
    for op in ("atomic_op", "plain_op"):
        monkeypatch.setitem(kernels.KERNEL_OPS, op, "nowhere:fn")
    monkeypatch.setitem(_support.NONDETERMINISTIC, "atomic_op", "backward adds with tl.atomic_add")
    monkeypatch.setattr(_support, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(_dispatch, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    return "atomic_op", "plain_op"


def test_auto_avoids_nondeterministic_kernels_only_in_deterministic_mode(gpu_ops, deterministic):
    atomic, plain = gpu_ops
    deterministic(False)
    assert resolve_impl("auto", atomic, FakeCuda()) == "triton"
    deterministic(True)
    assert resolve_impl("auto", atomic, FakeCuda()) == "torch"
    assert resolve_impl("auto", plain, FakeCuda()) == "triton"  # deterministic: still used
    deterministic(True, warn_only=True)  # auto has a deterministic path: no warning needed
    assert resolve_impl("auto", atomic, FakeCuda()) == "torch"
    deterministic(True)
    for op in sorted(kernels.KERNEL_OPS):  # the real kernels are all deterministic: kept
        if op not in gpu_ops:
            assert resolve_impl("auto", op, FakeCuda()) == "triton", op
            assert resolve_impl("triton", op, FakeCuda()) == "triton", op


def test_forcing_a_nondeterministic_kernel_raises_or_warns_like_torch(gpu_ops, deterministic):
    atomic, plain = gpu_ops
    deterministic(True)
    with pytest.raises(RuntimeError, match=r"'atomic_op'.*tl.atomic_add.*warn_only=True"):
        resolve_impl("triton", atomic, FakeCuda())
    with use_impl("triton"), pytest.raises(RuntimeError, match="not deterministic"):
        resolve_impl("auto", atomic, FakeCuda())  # forced by the process default
    assert resolve_impl("triton", plain, FakeCuda()) == "triton"
    deterministic(True, warn_only=True)
    with pytest.warns(UserWarning, match="use_deterministic_algorithms"):
        assert resolve_impl("triton", atomic, FakeCuda()) == "triton"
    deterministic(False)
    assert resolve_impl("triton", atomic, FakeCuda()) == "triton"


def test_the_interpreter_is_not_affected(gpu_ops, deterministic, monkeypatch):
    """The interpreter runs programs one after the other: CPU tensors keep the kernel."""
    monkeypatch.setattr(kernels, "interpret_mode", lambda: True)
    deterministic(True)
    assert resolve_impl("triton", gpu_ops[0], torch.zeros(2)) == "triton"
    assert resolve_impl("auto", gpu_ops[0], torch.zeros(2)) == "torch"  # CPU: torch anyway


def _kernel_hazards(source: str) -> set[str]:
    """Names in ``source`` that make a kernel's bits depend on scheduling or timing:
    ``tl.atomic_*`` calls and ``triton.autotune``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        if name.startswith("atomic_") or name in ("autotune", "Autotuner"):
            found.add(name)
    return found


def test_the_hazard_scan_finds_atomics_and_autotuning():
    source = (
        "import triton\nimport triton.language as tl\nfrom triton import autotune\n"
        "@triton.autotune(configs=[], key=[])\n@triton.jit\n"
        "def k(p):\n    tl.atomic_add(p, 1.0)\n    tl.atomic_max(p, 1.0)\n"
    )
    assert _kernel_hazards(source) == {"atomic_add", "atomic_max", "autotune"}
    assert _kernel_hazards("def f(atomics):\n    '''tl.atomic_add in a docstring'''\n") == set()


def test_only_listed_kernels_use_atomics_and_none_autotunes():
    modules = {v.partition(":")[0]: [] for v in kernels.KERNEL_OPS.values()}
    for op, target in kernels.KERNEL_OPS.items():
        modules[target.partition(":")[0]].append(op)
    sources = sorted(KERNELS_DIR.glob("*.py"))
    assert {p.stem for p in sources} >= set(modules)  # the scan sees every kernel module
    for path in sources:
        hazards = _kernel_hazards(path.read_text(encoding="utf-8"))
        assert "autotune" not in hazards and "Autotuner" not in hazards, path.name
        if hazards:  # allowed only in a module whose ops are all listed, with a reason
            ops = modules.get(path.stem, [])
            unlisted = [op for op in ops if not _support.nondeterministic_reason(op)]
            assert ops and not unlisted, (
                f"{path.name} uses {sorted(hazards)}: list {unlisted or 'its ops'} in "
                "visionblocks.kernels._support.NONDETERMINISTIC"
            )
    assert set(_support.NONDETERMINISTIC) <= set(kernels.KERNEL_OPS)


def test_c_kernels_use_no_atomics_and_no_openmp():
    """Parts of the C kernels write disjoint outputs and per-part sums; only the team's part
    counter (``_native_team.h``) is atomic, and it decides who runs a part, not a result."""
    sources = sorted(PACKAGE.rglob("*.c"))
    assert [p.name for p in sources] == ["_warp_kernel.c"]  # the one C kernel left
    for path in sources:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"__atomic|_Atomic|stdatomic|#\s*pragma\s+omp", text), path.name
    header = (PACKAGE / "_core" / "_native_team.h").read_text(encoding="utf-8")
    assert re.findall(r"__atomic_\w+\(&job->(\w+)", header) == ["next", "failed"]
