"""``torch.use_deterministic_algorithms(True)`` and the kernels (issue 18).

Every Triton kernel gives the same bits from run to run: each output element is written by
exactly one program, reductions inside a program run in a fixed order, cross-program sums
are left to torch, and block sizes are fixed. So deterministic mode needs no routing of its
own: the kernels run in it as they run outside it. The sources are scanned here for the two
ways a kernel's bits could come to depend on scheduling or timing: atomics and autotuning.

That every CPU path runs unchanged in deterministic mode is checked with the cases, in
``tests/package/test_determinism.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from visionblocks import kernels

KERNELS_DIR = Path(kernels.__file__).parent


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


def test_no_kernel_uses_atomics_or_autotuning():
    sources = sorted(KERNELS_DIR.glob("*.py"))
    assert {p.stem for p in sources} >= set(kernels.available()["kernels"])
    for path in sources:
        assert not _kernel_hazards(path.read_text(encoding="utf-8")), path.name
