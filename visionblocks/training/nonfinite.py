"""`find_nonfinite`: stop at the first NaN or inf, and say which module made it."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.distributed import get_rank, get_world_size

__all__ = ["NonFiniteError", "NonFiniteFinder", "find_nonfinite"]
__dir__ = public_dir(__name__, __all__)

MIN_SCALE = 1.0
"""Under a ``GradScaler``, gradients are checked only while its scale is below this."""


class NonFiniteError(FloatingPointError):
    """A NaN or inf found by `find_nonfinite`.

    Attributes:
        kind (str): ``"forward input"``, ``"forward output"``, ``"gradient"``, ``"loss"`` or
            ``"parameter"``.
        module (str): Path of the module (``"backbone.layer1.0.conv1"``; ``""`` is the
            model itself), or of the parameter.
        tensor (str): Which tensor (``"input 0"``, ``"output['loss']"``, ``"grad of weight"``).
        shape (tuple[int, ...]): Its shape.
        count (int): How many of its values are NaN or inf.
    """

    def __init__(
        self, message: str, *, kind: str, module: str, tensor: str, shape: tuple[int, ...],
        count: int,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.kind, self.module, self.tensor = kind, module, tensor
        self.shape, self.count = shape, count


def _tensors(value: Any, name: str) -> Iterator[tuple[str, Tensor]]:
    """The floating-point tensors in a (nested) output, with their names."""
    if isinstance(value, Tensor):
        if value.is_floating_point() or value.is_complex():
            yield name, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{name}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{name}[{i}]")


def _bad(t: Tensor) -> bool:
    return not bool(torch.isfinite(t.detach()).all())


def _rank() -> str:
    return f" on rank {get_rank()}" if get_world_size() > 1 else ""


class NonFiniteFinder:
    """The hooks of `find_nonfinite`; a context manager that removes them on exit.

    Args:
        model: The model (a ``DistributedDataParallel`` wrapper is looked through).
        optimizer: Check every parameter after each of its steps.
        scaler: The ``torch.amp.GradScaler`` of an fp16 run, if any: gradients are checked
            only once its scale is below 1 (overflows above are the scaler's business).
        enabled: ``False`` registers nothing (no cost).
        forward: Check forward inputs and outputs.
        backward: Check the gradients of module outputs and of parameters.
    """

    def __init__(
        self, model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None, enabled: bool = True, forward: bool = True, backward: bool = True,
    ) -> None:  # fmt: skip
        check_type("model", model, nn.Module)
        if optimizer is not None:
            check_type("optimizer", optimizer, torch.optim.Optimizer)
        if scaler is not None and not callable(getattr(scaler, "get_scale", None)):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        for flag, value in (("enabled", enabled), ("forward", forward), ("backward", backward)):
            check_type(flag, value, bool)
        self.model = getattr(model, "module", model) if _is_ddp(model) else model
        self.optimizer, self.scaler = optimizer, scaler
        self.enabled, self._forward, self._backward = enabled, forward, backward
        self.steps = 0
        self._handles: list[RemovableHandle] = []
        self._callers: list[str] = []
        # Tensors found finite in this forward, by id: (the tensor, its version then). A
        # module's output is the next module's input: unchanged since, it is not checked again.
        self._finite: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        self._check_grads = True
        if enabled:
            self._register()

    def _register(self) -> None:
        for path, module in self.model.named_modules():
            self._handles.append(
                module.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True)
            )
            self._handles.append(module.register_forward_hook(self._post_hook(path)))
        if self._backward:
            for path, param in self.model.named_parameters():
                if param.requires_grad:
                    self._handles.append(param.register_hook(self._grad_hook(path, "param")))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_post_hook(self._after_step))

    def remove(self) -> None:
        """Remove every hook (hooks already put on tensors of a live graph go quiet)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.enabled = False

    def __enter__(self) -> NonFiniteFinder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _raise(self, kind: str, module: str, tensor: str, t: Tensor, why: str) -> None:
        values = t.detach()
        nan = int(torch.isnan(values).sum())
        count = int((~torch.isfinite(values)).sum())
        shape = tuple(values.shape)
        if kind in ("parameter", "loss"):
            what = repr(module)
        else:
            what = f"module {module!r}" if module else "the model"
        raise NonFiniteError(
            f"non-finite {kind}{_rank()}: {tensor} of {what}, "
            f"Tensor[{', '.join(map(str, shape))}] {str(values.dtype).removeprefix('torch.')}, has "
            f"{count:,} non-finite values of {values.numel():,} ({nan:,} nan, {count - nan:,} "
            f"inf); {why}",
            kind=kind, module=module, tensor=tensor, shape=shape, count=count,
        )  # fmt: skip

    def _pre_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self.enabled:
                return
            if not path:  # a new call of the model: forget an unfinished one
                self._callers.clear()
                self._check_grads = self._grads_checked()
            if not self._callers:  # a new outermost call (of the model or of a submodule)
                self._finite.clear()
            caller = self._callers[-1] if self._callers else None
            self._callers.append(path)
            if not self._forward:
                return
            inputs = [*enumerate(args), *kwargs.items()]
            for name, t in (x for key, v in inputs for x in _tensors(v, f"input {key!r}")):
                if self._finite_now(t):
                    continue
                if _bad(t):
                    why = ("it is the model's input" if caller is None else
                           f"it was made by the forward code of {_name(caller)} (or its "
                           "caller), outside its submodules")  # fmt: skip
                    self._raise("forward input", path, name, t, why)

        return hook

    def _post_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.enabled:
                return
            if self._callers and self._callers[-1] == path:
                self._callers.pop()
            for name, t in _tensors(output, "output"):
                if self._forward and not self._finite_now(t) and _bad(t):
                    self._raise("forward output", path, name, t,
                                f"{type(module).__name__}'s own forward made it "
                                "from finite inputs")  # fmt: skip
                if self._backward and t.requires_grad:
                    t.register_hook(self._grad_hook(path, name))

        return hook

    def _finite_now(self, t: Tensor) -> bool:
        """Whether ``t`` was already found finite in this forward and not modified in place
        since; the caller checks it otherwise, so it counts as found finite from now on."""
        seen = self._finite.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return True
        self._finite[id(t)] = (weakref.ref(t), t._version)
        return False

    def _grad_hook(self, path: str, name: str) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if not (self.enabled and self._check_grads) or not _bad(grad):
                return
            if name == "param":
                module, _, param = path.rpartition(".")
                why = (f"the backward of module {module!r} made it from a finite gradient "
                       "of its output")  # fmt: skip
                self._raise("gradient", path, f"grad of {param}", grad, why)
            self._raise("gradient", path, f"grad of {name}", grad,
                        "the backward of what used this output made it")  # fmt: skip

        return hook

    def _grads_checked(self) -> bool:
        if self.scaler is None or not self.scaler.is_enabled():
            return True
        return float(self.scaler.get_scale()) < MIN_SCALE

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.enabled:
            self.steps += 1
            self.check_parameters()

    def check(self, value: Tensor | Mapping[str, Any], name: str = "loss") -> None:
        """Raise `NonFiniteError` if a loss (a tensor, or a dict of them) is not finite.

        Args:
            value: The loss, or a dict of losses (``{"loss_cls": ..., "loss_box": ...}``).
            name: Its name in the message.

        Raises:
            NonFiniteError: ``kind="loss"``.
        """
        if not self.enabled:
            return
        for tensor, t in _tensors(value, name):
            if _bad(t):
                self._raise("loss", name, tensor, t, "the model's outputs were finite")

    def check_parameters(self) -> None:
        """Raise `NonFiniteError` if a parameter of the model is not finite.

        Raises:
            NonFiniteError: ``kind="parameter"``, naming the parameter.
        """
        for path, param in self.model.named_parameters():
            if _bad(param):
                why = (f"the optimizer's step {self.steps} made it" if self.steps else
                       "it was not finite when checked")  # fmt: skip
                self._raise("parameter", path, "value", param, why)


def _name(path: str) -> str:
    return f"module {path!r}" if path else "the model"


def _is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def find_nonfinite(
    model: nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any = None,
    enabled: bool = True,
    forward: bool = True,
    backward: bool = True,
) -> NonFiniteFinder:
    """Raise at the first NaN or inf in a model's forward, backward, losses or parameters.

    A context manager around the training steps, to debug. It checks every module's
    floating-point **inputs** and **outputs**, the **gradients** reaching module outputs and
    parameters, the losses given to `NonFiniteFinder.check` and, with ``optimizer``, every
    **parameter** after each step; the first non-finite value raises `NonFiniteError`
    naming the module (the one whose own code made it), the tensor, its shape and the bad
    count. Each check synchronises (eager mode); ``enabled=False`` registers nothing. Under
    DDP, pass the wrapper or the model (the message names the rank).

    Args:
        model: The model (any ``nn.Module``).
        optimizer: Also check the parameters after each step.
        scaler: The run's ``torch.amp.GradScaler`` (see `NonFiniteFinder`).
        enabled: ``False`` makes this a no-op.
        forward: Check forward inputs and outputs.
        backward: Check gradients.

    Returns:
        NonFiniteFinder: The hooks; leaving the ``with`` block (or ``.remove()``) removes them.

    Raises:
        NonFiniteError: In the hooks, at the first non-finite value.
        TypeError: Arguments of the wrong type.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.LogSigmoid()))
        >>> with torch.no_grad():
        ...     _ = model[1][0].weight.fill_(float("inf"))
        >>> with find_nonfinite(model):
        ...     model(torch.ones(3, 2))
        Traceback (most recent call last):
        ...
        visionblocks.training.nonfinite.NonFiniteError: non-finite forward output: output of module '1.0', Tensor[3, 2] float32, has 6 non-finite values of 6 (...); Linear's own forward made it from finite inputs
    """
    return NonFiniteFinder(
        model, optimizer=optimizer, scaler=scaler, enabled=enabled, forward=forward,
        backward=backward,
    )  # fmt: skip
