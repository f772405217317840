"""Whether torch is recording the calling thread's ops instead of only running them.

One test for every fast path that must step aside while a graph is recorded: C kernels
(torch would not see their work), thread pools (ops in other threads are not recorded) and
forward hooks (`visionblocks.features` switches to its traced path).
"""

from __future__ import annotations

import torch
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

__all__ = ["recording"]


def recording() -> bool:
    """True under ``torch.export``, ``torch.compile``, ``torch.jit.trace`` or ``torch.fx``
    symbolic tracing (``is_fx_tracing`` would log a warning on every call).

    Examples:
        >>> recording()
        False
    """
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing() or is_fx_symbolic_tracing())
