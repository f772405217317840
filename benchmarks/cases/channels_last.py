"""Benchmark cases: ``channels_last`` against contiguous NCHW, same op (CPU, 2 threads).

"Ours" runs a block on ``x.contiguous(memory_format=torch.channels_last)`` (and, for
modules, ``module.to(memory_format=torch.channels_last)``); the "peer" runs the same block
on contiguous NCHW tensors with the same weights. Both time forward + backward (the
gradients of the input and of the parameters for one fixed random output gradient,
``torch.autograd.grad``, so no ``.grad`` accumulation is timed). There is no speed target: the cases measure what the memory format
does to each block on CPU (the table's speedup above 1 means channels_last is faster).

- ``channels_last_conv_stack_fwd_bwd``: a detection-neck `ConvNormAct` stack (3x3 stride 2
  64 -> 128, 3x3 128 -> 128, 1x1 128 -> 128; BatchNorm, SiLU, train mode) on
  1 x 64 x 128 x 128: oneDNN convolutions in either layout.
- ``channels_last_local_filter_fwd_bwd``: `local_filter2d` on 2 x 64 x 80 x 80, 7 x 7
  windows, 16 groups (kernels 2 x 784 x 80 x 80): the torch path works on NCHW planes,
  so channels_last ``x`` and kernels are converted once per call (``planar``).
- ``channels_last_local_attention_fwd_bwd``: `local_attention2d` on q, k, v
  2 x 64 x 80 x 80, 7 x 7 windows, 8 heads: the same conversion of q, k and v.
- ``channels_last_involution_fwd_bwd``: an `Involution2d` layer (64 channels, 7 x 7,
  16 groups) on 2 x 64 x 80 x 80: channels_last convolutions generate the kernels, which
  the filter converts.

The output check compares the outputs and every gradient at a small size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = [
    "CHANNELS_LAST_CONV_STACK",
    "CHANNELS_LAST_INVOLUTION",
    "CHANNELS_LAST_LOCAL_ATTENTION",
    "CHANNELS_LAST_LOCAL_FILTER",
]

_CL = torch.channels_last
_B, _C, _K = 2, 64, 7
_SIDE = 80  # local ops: the stride-8 map of a 640 x 640 detection input
_STACK_SIDE = 128  # conv stack: stride 4 of a 512 x 512 input


def _randn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _module_state(module: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Both sides' modules and inputs, the same weights and values in two layouts."""
    with torch.no_grad():
        shape = module(x).shape
    return {
        "ours": (copy.deepcopy(module).to(memory_format=_CL), x.contiguous(memory_format=_CL)),
        "peer": (module, x.contiguous()),
        "grad": torch.randn(shape, generator=torch.Generator().manual_seed(1)),
    }


def _run_module(side: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        module, x = state[side]
        x = x.detach().requires_grad_()
        out = module(x)
        grads = torch.autograd.grad(out, (x, *module.parameters()), state["grad"])
        return (out.detach(), *grads)

    return run


def _conv_stack(side: int = _STACK_SIDE) -> dict[str, Any]:
    from visionblocks.nn import ConvNormAct

    torch.manual_seed(0)
    stack = nn.Sequential(
        ConvNormAct(_C, 128, 3, stride=2, act="silu"),
        ConvNormAct(128, 128, 3, act="silu"),
        ConvNormAct(128, 128, 1, act="silu"),
    )
    return _module_state(stack, _randn(1, _C, side, side, gen=torch.Generator().manual_seed(0)))


def _involution(side: int = _SIDE) -> dict[str, Any]:
    from visionblocks.nn import Involution2d

    torch.manual_seed(0)
    layer = Involution2d(_C, _K, groups=16)
    return _module_state(layer, _randn(_B, _C, side, side, gen=torch.Generator().manual_seed(0)))


def _tensors_state(*shapes: tuple[int, ...]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    plain = [_randn(*s, gen=gen) for s in shapes]
    return {
        "ours": [t.contiguous(memory_format=_CL).requires_grad_() for t in plain],
        "peer": [t.clone().requires_grad_() for t in plain],
        "grad": _randn(*shapes[0], gen=gen),
    }


def _local_filter(side: int = _SIDE) -> dict[str, Any]:
    return _tensors_state((_B, _C, side, side), (_B, 16 * _K * _K, side, side))


def _local_attention(side: int = _SIDE) -> dict[str, Any]:
    return _tensors_state(*((_B, _C, side, side),) * 3)


def _run_op(side: str, op: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]:
    def run(state: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        from visionblocks.ops import local_attention2d, local_filter2d

        inputs = state[side]
        if op == "local_filter":
            out = local_filter2d(*inputs, _K, impl="torch")
        else:
            out = local_attention2d(*inputs, _K, num_heads=8, impl="torch")
        grads = torch.autograd.grad(out, inputs, state["grad"])
        return (out.detach(), *grads)

    return run


def _case(
    name: str,
    setup: Callable[..., Any],
    ours: Callable,
    peer: Callable,
    what: str,
    rtol: float = 1e-4,
) -> BenchCase:
    return register_case(
        BenchCase(
            name=name,
            setup=setup,
            ours=ours,
            peer=peer,
            peer_name="contiguous NCHW",
            description=f"{what}, channels_last vs NCHW, forward + backward, 2 threads",
            min_speedup=None,
            min_busy_speedup=None,
            check=same_outputs(rtol=rtol, atol=1e-4),
            small_setup=lambda: setup(16),
        )
    )


CHANNELS_LAST_CONV_STACK = _case(
    "channels_last_conv_stack_fwd_bwd",
    _conv_stack,
    _run_module("ours"),
    _run_module("peer"),
    f"3 ConvNormAct (BN, SiLU, train) on 1x{_C}x{_STACK_SIDE}x{_STACK_SIDE}",
)
CHANNELS_LAST_LOCAL_FILTER = _case(
    "channels_last_local_filter_fwd_bwd",
    _local_filter,
    _run_op("ours", "local_filter"),
    _run_op("peer", "local_filter"),
    f"local_filter2d x {_B}x{_C}x{_SIDE}x{_SIDE}, k={_K}, G=16",
)
CHANNELS_LAST_LOCAL_ATTENTION = _case(
    "channels_last_local_attention_fwd_bwd",
    _local_attention,
    _run_op("ours", "local_attention"),
    _run_op("peer", "local_attention"),
    f"local_attention2d q/k/v {_B}x{_C}x{_SIDE}x{_SIDE}, k={_K}, 8 heads",
)
CHANNELS_LAST_INVOLUTION = _case(
    "channels_last_involution_fwd_bwd",
    _involution,
    _run_module("ours"),
    _run_module("peer"),
    f"Involution2d({_C}, k={_K}, G=16) on {_B}x{_C}x{_SIDE}x{_SIDE}",
    rtol=1e-3,  # weight gradients: float32 sums over 32 x 32 taken in two memory orders
)
