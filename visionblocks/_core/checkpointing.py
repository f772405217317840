"""Activation checkpointing of chosen submodules: `set_grad_checkpointing`.

A checkpointed module keeps only its inputs during the forward; its activations are
computed again, from those inputs, when the backward needs them
(``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``): less memory, at the cost
of one more forward of the module. The gradients are those of the plain module.

How it is done: `set_grad_checkpointing` gives each chosen module an instance attribute
``forward`` (a `CheckpointedForward`) that runs the class's ``forward`` through
``checkpoint``. No wrapper module is inserted, so parameters, state-dict keys and ``repr``
are unchanged, the module deep-copies and pickles (the copy checkpoints too), and
``enable=False`` deletes the attribute again.

The checkpoint is taken only when it can help and cannot disturb: the module is in training
mode, autograd is on, and nothing records the graph (``torch.jit.trace``, ``torch.export``,
``torch.compile``, ``torch.fx``); otherwise the plain forward runs. Inside a checkpointed
module, checkpointed submodules run plainly (the outer checkpoint covers them).

Normalisation layers with running statistics (BatchNorm, SyncBatchNorm, InstanceNorm with
``track_running_stats``) would update them twice: once in the forward, again in the
recomputation. The recomputation runs them on copies of ``running_mean``, ``running_var``
and ``num_batches_tracked`` (``checkpoint``'s ``context_fn``), so after a training step the
statistics equal those of the plain module. Dropout draws the same masks again
(``preserve_rng_state``).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from visionblocks._core.dispatch import recording
from visionblocks._core.tensor_checks import is_tracing

__all__ = [
    "CheckpointedForward",
    "checkpointed_modules",
    "enable_one",
    "is_grad_checkpointing",
    "set_grad_checkpointing",
    "without_checkpointing",
]

_STATE = threading.local()
"""``_STATE.depth``: checkpointed forwards running in this thread (nested ones run plainly)."""

_RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _depth() -> int:
    return getattr(_STATE, "depth", 0)


@contextlib.contextmanager
def _inside() -> Iterator[None]:
    _STATE.depth = _depth() + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Run the norm layers of ``module`` that track statistics on copies of their buffers
    (the recomputation's context: the buffers keep the forward's update only)."""
    swapped = []
    for m in module.modules():
        if isinstance(m, _NormBase) and m.training and m.track_running_stats:
            for name in _RUNNING_STATS:
                buffer = m._buffers.get(name)
                if buffer is not None:
                    swapped.append((m, name, buffer))
                    m._buffers[name] = buffer.clone()
    try:
        yield
    finally:
        for m, name, buffer in swapped:
            m._buffers[name] = buffer


def _contexts(module: nn.Module) -> tuple[contextlib.AbstractContextManager[None], ...]:
    return contextlib.nullcontext(), _running_stats_kept(module)


def _guarded(forward: Callable[..., Any], kwargs: dict[str, Any], *args: Any) -> Any:
    """``forward(*args, **kwargs)`` with nested checkpoints off (forward and recomputation)."""
    with _inside():
        return forward(*args, **kwargs)


def _should_checkpoint(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return (
        module.training
        and torch.is_grad_enabled()
        and _depth() == 0
        and not recording()
        and not torch.compiler.is_exporting()
        and not is_tracing(*args, *kwargs.values())
    )


class CheckpointedForward:
    """The ``forward`` attribute of a checkpointed module (see the module docstring).

    Args:
        module: The module it belongs to.
        previous: The instance ``forward`` it replaced (restored when checkpointing is
            turned off), or ``None`` when the class's ``forward`` ran.
    """

    def __init__(self, module: nn.Module, previous: Callable[..., Any] | None = None) -> None:
        self.module = module
        self.previous = previous

    def _plain(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return type(self.module).forward.__get__(self.module)

    # torch.export reads the forward's signature and code object: those of the plain forward.
    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self._plain())

    @property
    def __code__(self) -> Any:
        return self._plain().__code__

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        """The plain forward (the class's function called directly: torch.compile traces it)."""
        if self.previous is not None:
            return self.previous(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _should_checkpoint(self.module, args, kwargs):
            return self._run(*args, **kwargs)
        return checkpoint(
            functools.partial(_guarded, self._run, kwargs),
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=functools.partial(_contexts, self.module),
        )

    def __repr__(self) -> str:
        return f"<checkpointed forward of {type(self.module).__name__}>"


def is_grad_checkpointing(module: nn.Module) -> bool:
    """True when ``module``'s own forward runs through activation checkpointing.

    Examples:
        >>> from torch import nn
        >>> block = set_grad_checkpointing(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
        >>> is_grad_checkpointing(block), is_grad_checkpointing(block[0])
        (True, False)
    """
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


def checkpointed_modules(module: nn.Module) -> list[str]:
    """Names (as in ``named_modules()``; ``""`` for ``module`` itself) of the checkpointed
    modules in ``module``.

    Examples:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
        >>> checkpointed_modules(set_grad_checkpointing(net, ["1"]))
        ['1']
    """
    return [name for name, m in module.named_modules() if is_grad_checkpointing(m)]


def enable_one(module: nn.Module, enable: bool = True) -> None:
    """Turn checkpointing of ``module``'s own forward on or off (its submodules untouched).

    Raises:
        TypeError: ``module`` is a ``torch.jit.ScriptModule`` (its forward is compiled).
        ValueError: ``module`` has no ``forward`` (an ``nn.ModuleList`` or ``nn.ModuleDict``).
    """
    current = module.__dict__.get("forward")
    if not enable:
        if isinstance(current, CheckpointedForward):
            if current.previous is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = current.previous
        return
    if isinstance(current, CheckpointedForward):
        return
    if isinstance(module, torch.jit.ScriptModule):
        raise TypeError(
            f"cannot checkpoint {type(module).__name__}: a ScriptModule's forward is compiled; "
            "checkpoint the module before scripting it"
        )
    if getattr(type(module), "forward", None) is nn.Module.forward:
        raise ValueError(
            f"{type(module).__name__} has no forward (it is never called); checkpoint the "
            "modules it holds or the module that runs them"
        )
    module.__dict__["forward"] = CheckpointedForward(module, current)


def _named(module: nn.Module, names: Sequence[Any]) -> list[nn.Module]:
    modules = dict(module.named_modules(remove_duplicate=False))
    found = []
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(
                f"enable[{i}] must be a module name (str), got {type(name).__name__} ({name!r})"
            )
        if name not in modules:
            close = difflib.get_close_matches(name, [n for n in modules if n], n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise ValueError(
                f"enable names no submodule of {type(module).__name__}: {name!r}{hint}"
            )
        found.append(modules[name])
    return found


def set_grad_checkpointing(module: nn.Module, enable: bool | Sequence[str] = True) -> nn.Module:
    """Run ``module`` (or named submodules of it) through activation checkpointing.

    Activation memory is traded for one more forward of the module; gradients, BatchNorm
    statistics, dropout masks, parameters and state-dict keys are those of the plain module,
    and recorded calls (tracing, export, compile) and eval mode run the plain forward (the
    module docstring says how). Checkpoint whole blocks (a ResNet bottleneck, a transformer block): a single convolution
    saves its input anyway, so checkpointing it alone only costs time. A visionblocks
    ``Backbone`` picks its blocks itself: ``backbone.set_grad_checkpointing()`` (what the
    builders' ``grad_checkpointing=`` option calls). Forward hooks of
    modules *inside* a checkpointed module may run again in the recomputation (torch stops
    it once it has what the backward needs); hooks of the checkpointed module run once. Not
    for ``nn.DataParallel``, whose replicas are shallow copies (use
    ``DistributedDataParallel``).

    Args:
        module: The model.
        enable: ``True``: checkpoint ``module`` itself. ``False``: turn checkpointing off for
            ``module`` and every submodule. A list of names (as in ``named_modules()``, e.g.
            ``["layer1.0", "layer1.1"]``): checkpoint those submodules (the others are left
            as they are).

    Returns:
        nn.Module: ``module``.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` (or is a ``ScriptModule``), ``enable``
            is neither a bool nor a list of names.
        ValueError: A name that names no submodule, or a module without a forward
            (``nn.ModuleList``).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3))
        >>> keys = list(net.state_dict())
        >>> set_grad_checkpointing(net, ["0", "1"]) is net
        True
        >>> net(torch.randn(2, 3, 16, 16)).sum().backward()  # activations of 0, 1 recomputed
        >>> list(net.state_dict()) == keys, int(net[1].num_batches_tracked)
        (True, 1)
        >>> checkpointed_modules(set_grad_checkpointing(net, False))
        []
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if isinstance(enable, bool):
        if enable:
            enable_one(module)
        else:
            for m in module.modules():
                enable_one(m, False)
        return module
    if isinstance(enable, (str, bytes)) or not isinstance(enable, (list, tuple)):
        raise TypeError(
            "enable must be a bool or a list of submodule names, got "
            f"{type(enable).__name__} ({enable!r})"
        )
    for m in _named(module, enable):
        enable_one(m)
    return module


def without_checkpointing(module: nn.Module) -> nn.Module:
    """``module`` itself, or when it checkpoints its forward a shallow copy that does not.

    What a layer's ``__prepare_scriptable__`` returns (``torch.jit.script`` calls it first and
    compiles neither an instance ``forward`` nor ``checkpoint``): a scripted layer does not
    checkpoint. The copy shares ``module``'s parameters, buffers and submodules; ``module``
    keeps checkpointing.
    """
    if not is_grad_checkpointing(module):
        return module
    plain = copy.copy(module)
    enable_one(plain, False)
    return plain
