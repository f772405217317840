"""Benchmark cases: `local_filter2d` against the plain ``F.unfold`` implementation (CPU, 2 threads).

An involution-sized layer: ``x`` 2 x 64 x 128 x 128 float32, 7 x 7 windows, ``G = 16``
kernel groups of 4 channels (`visionblocks.nn.involution.Involution2d`'s defaults),
kernels 2 x 784 x 128 x 128. The peer is the usual unfold implementation (the involution
authors' naive version, most re-implementations): ``F.unfold`` into ``B x C*49 x H*W``, a
broadcast product with the kernels and a sum over the taps, which materialises two
49-times-the-input tensors. Ours runs the torch path (shift and accumulate).

- ``local_filter_fwd``: forward only, inputs not requiring grad.
- ``local_filter_fwd_bwd``: forward and the gradients with respect to ``x`` and the
  kernels (``torch.autograd.grad``, so no ``.grad`` accumulation is timed).

The output check compares the outputs (the gradients for ``_fwd_bwd``) at 32 x 32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["LOCAL_FILTER_FWD", "LOCAL_FILTER_FWD_BWD"]

_B, _C, _H, _W, _K, _G = 2, 64, 128, 128, 7, 16


def _setup(grad: bool, h: int = _H, w: int = _W) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_B, _C, h, w, generator=gen)
    kernels = torch.randn(_B, _G * _K * _K, h, w, generator=gen) / _K
    grad_out = torch.randn(_B, _C, h, w, generator=gen)
    return {
        "x": x.requires_grad_(grad),
        "kernels": kernels.requires_grad_(grad),
        "grad_out": grad_out,
    }


def _setup_fwd() -> dict[str, Any]:
    return _setup(False)


def _setup_fwd_bwd() -> dict[str, Any]:
    return _setup(True)


def _small_fwd() -> dict[str, Any]:
    return _setup(False, 32, 32)


def _small_fwd_bwd() -> dict[str, Any]:
    return _setup(True, 32, 32)


def _ours(state: dict[str, Any]) -> torch.Tensor:
    from visionblocks.ops.local import local_filter2d

    return local_filter2d(state["x"], state["kernels"], _K, impl="torch")


def _unfold(state: dict[str, Any]) -> torch.Tensor:
    x, kernels = state["x"], state["kernels"]
    b, c, h, w = x.shape
    cols = F.unfold(x, _K, padding=_K // 2).view(b, _G, c // _G, _K * _K, h, w)
    out = (cols * kernels.view(b, _G, 1, _K * _K, h, w)).sum(3)
    return out.view(b, c, h, w)


def _grads(fn: Any, state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    out = fn(state)
    return torch.autograd.grad(out, (state["x"], state["kernels"]), state["grad_out"])


def _ours_fwd_bwd(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    return _grads(_ours, state)


def _unfold_fwd_bwd(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    return _grads(_unfold, state)


_SIZES = f"x {_B}x{_C}x{_H}x{_W} float32, k={_K}, G={_G}"

LOCAL_FILTER_FWD = register_case(
    BenchCase(
        name="local_filter_fwd",
        setup=_setup_fwd,
        ours=_ours,
        peer=_unfold,
        peer_name="F.unfold",
        description=f"local_filter2d {_SIZES}, forward, 2 threads",
        min_speedup=5.0,
        max_memory_ratio=0.25,
        check=same_outputs(rtol=1e-4, atol=1e-5),
        small_setup=_small_fwd,
    )
)

LOCAL_FILTER_FWD_BWD = register_case(
    BenchCase(
        name="local_filter_fwd_bwd",
        setup=_setup_fwd_bwd,
        ours=_ours_fwd_bwd,
        peer=_unfold_fwd_bwd,
        peer_name="F.unfold",
        description=f"local_filter2d {_SIZES}, forward + grads of x and kernels, 2 threads",
        min_speedup=10.0,
        max_memory_ratio=0.25,
        check=same_outputs(rtol=1e-4, atol=1e-5),
        small_setup=_small_fwd_bwd,
    )
)
