"""A workload case shared by the local layers: the eager layer against the same layer compiled
by inductor (the best alternative a user would pick), forward and gradients of the input and
the weights.

The output check (small sizes) traces with ``aot_eager``: the same graph, no C++ compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs


def compiled_layer_case(
    name: str, make_layer: Callable[[], nn.Module], shape: tuple[int, int, int], what: str
) -> BenchCase:
    """Register ``name``: ``make_layer()`` on ``(B, C, side, side)`` inputs, ``shape`` being
    ``(B, C, side)``; eager (ours) against ``torch.compile(fullgraph=True)`` (the peer)."""
    batch, channels, full = shape

    def layer_setup(compiled: bool, side: int) -> dict[str, Any]:
        torch.manual_seed(0)
        layer = make_layer()
        x = torch.randn(batch, channels, side, side, requires_grad=True)
        backend = "inductor" if side == full else "aot_eager"
        run = torch.compile(layer, fullgraph=True, backend=backend) if compiled else layer
        grad_out = torch.randn(batch, channels, side, side)
        return {"layer": layer, "run": run, "x": x, "grad_out": grad_out}

    def step(side: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        inputs = (side["x"], *side["layer"].parameters())
        return torch.autograd.grad(side["run"](side["x"]), inputs, side["grad_out"])

    return register_case(
        BenchCase(
            name=name,
            setup=lambda: {"eager": layer_setup(False, full), "compiled": layer_setup(True, full)},
            ours=lambda state: step(state["eager"]),
            peer=lambda state: step(state["compiled"]),
            peer_name="torch.compile (inductor)",
            description=(
                f"{what} on {batch}x{channels}x{full}x{full} float32, forward + grads of x and "
                "the weights, eager vs compiled, 2 threads"
            ),
            min_busy_speedup=None,
            # float32 weight gradients summed over the batch in another order
            check=same_outputs(rtol=1e-2, atol=1e-3),
            small_setup=lambda: {
                "eager": layer_setup(False, 16),
                "compiled": layer_setup(True, 16),
            },
            group="workload",
        )
    )
