"""`ModelEMA`: an exponential moving average of a model's weights, timm's ``ModelEmaV3``.

Convention: an update sets every averaged tensor to ``decay * ema + (1 - decay) * model``
(a ``lerp`` towards the model by ``1 - decay``); the parameters and the floating-point
buffers of the state dict are averaged, the other buffers copied.
"""

from __future__ import annotations

import copy
import math
import operator
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_int, check_number, check_type
from visionblocks._core.namespace import public_dir

__all__ = ["ModelEMA"]
__dir__ = public_dir(__name__, __all__)

_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside ``DataParallel``/``DistributedDataParallel`` and ``torch.compile``."""
    while True:
        if isinstance(model, _PARALLEL):
            model = model.module
        elif isinstance(model._modules.get("_orig_mod"), nn.Module):  # no __getattr__ miss
            model = model._modules["_orig_mod"]
        else:
            return model


def _slots(*modules: nn.Module) -> tuple[list[dict[str, Any]], list[str], list[Any]]:
    """Where every tensor and submodule of ``modules`` is held (dicts and keys), and what each
    holds: one replaced (an assignment, ``.to()`` of a buffer) changes the latter."""
    slots = [
        (d, k)
        for module in modules
        for m in module.modules()
        for d in (m._parameters, m._buffers, m._modules)
        for k in d
    ]
    return [d for d, _ in slots], [k for _, k in slots], [d[k] for d, k in slots]


def _state(module: nn.Module, buffers: bool) -> tuple[list[Tensor], list[Tensor]]:
    """The tensors an update averages and those it copies, each once, in a fixed order.

    ``buffers``: the state dict's floating-point buffers are averaged (its other buffers
    copied); otherwise every buffer is copied (timm's ``exclude_buffers``).
    """
    averaged: list[Tensor] = []
    copied: list[Tensor] = []
    seen: set[int] = set()
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                (averaged if p.is_floating_point() else copied).append(p)
        for name, b in m._buffers.items():
            if b is None or id(b) in seen:
                continue
            seen.add(id(b))
            if not buffers:
                copied.append(b)
            elif name not in m._non_persistent_buffers_set:
                (averaged if b.is_floating_point() else copied).append(b)
    return averaged, copied


class ModelEMA(nn.Module):
    """An exponential moving average of a model's weights (timm's ``ModelEmaV3``).

    ``.module`` is a deep copy of the model (unwrapped from ``DistributedDataParallel``,
    ``DataParallel`` and ``torch.compile``) in eval mode, without gradients; ``update`` moves
    it towards the model with one ``torch._foreach`` call per tensor group. Decay and
    arguments are timm's: ``update(model, step)`` uses ``decay`` when ``step`` is ``None``,
    ``0`` (a copy) for the first ``update_after_step + 1`` steps, then ``decay``, or with
    ``use_warmup`` the ramp ``1 - (1 + s / warmup_gamma) ** -warmup_power`` of
    ``s = step - update_after_step - 1``, clamped to ``[min_decay, decay]``. The state
    dict holds the copy's tensors under ``module.`` (as timm's) and the count of updates,
    so a run resumes with ``load_state_dict``. Differences from timm: a tensor shared by
    two modules is updated once (timm updates it once per state-dict entry), bfloat16 EMA
    tensors are rounded to nearest, not stochastically (keep a low-precision model's EMA in
    float32: ``dtype=torch.float32``), and there is no ``foreach=False`` path.

    ultralytics' ``ModelEMA`` (YOLOv8-11) is this with its ramp
    ``decay * (1 - exp(-updates / tau))`` over its own count of updates and the buffers
    averaged: ``ModelEMA(model, 0.9999, tau=2000)`` gives it (``step``, when given, replaces
    the count; the warm-up arguments then do not apply), except that ultralytics leaves the
    integer buffers (BatchNorm's ``num_batches_tracked``) as they were, where this copies
    them as timm does. Its ``ema.ema`` is our ``.module``.

    Args:
        model: The model to average (or its DDP, DataParallel or compiled wrapper).
        decay: The decay, or the ramp's ceiling, in ``[0, 1]``.
        min_decay: Floor of the warm-up ramp, in ``[0, 1]``.
        update_after_step: Steps that copy the model before averaging starts.
        use_warmup: Ramp the decay up with ``step`` (timm's warm-up).
        warmup_gamma: The warm-up's inverse gamma, positive.
        warmup_power: The warm-up's power, positive.
        tau: ultralytics' ramp time constant in updates, positive (``None``: no such ramp).
        exclude_buffers: Copy the buffers instead of averaging them.
        device: Keep the copy on this device (``None``: the model's).
        dtype: Keep the copy in this floating dtype (``None``: the model's).

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: An argument out of range, or ``tau`` with ``use_warmup``.

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> _ = torch.nn.init.zeros_(model.weight)
        >>> ema = ModelEMA(model, decay=0.9)
        >>> _ = torch.nn.init.ones_(model.weight)
        >>> ema.module.weight.requires_grad, ema.module.training
        (False, False)
        >>> ema.update(model)  # 0.9 * 0 + 0.1 * 1
        >>> ema.module.weight
        Parameter containing:
        tensor([[0.1000, 0.1000]])
        >>> ema.update(model, step=1)  # the first step copies the model
        >>> ema.module.weight.tolist(), ema.updates
        ([[1.0, 1.0]], 2)
    """

    def __init__(
        self, model: nn.Module, decay: float = 0.9999, *, min_decay: float = 0.0,
        update_after_step: int = 0, use_warmup: bool = False, warmup_gamma: float = 1.0,
        warmup_power: float = 2 / 3, tau: float | None = None, exclude_buffers: bool = False,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        check_type("model", model, nn.Module)
        self.decay = check_number("decay", decay, 0.0, 1.0)
        self.min_decay = check_number("min_decay", min_decay, 0.0, 1.0)
        self.update_after_step = check_int("update_after_step", update_after_step, 0)
        check_type("use_warmup", use_warmup, bool)
        self.warmup_gamma = check_number("warmup_gamma", warmup_gamma, 0.0, low_inclusive=False)
        self.warmup_power = check_number("warmup_power", warmup_power, 0.0, low_inclusive=False)
        if tau is not None:
            tau = check_number("tau", tau, 0.0, low_inclusive=False)
            if use_warmup:
                raise ValueError("tau (ultralytics' ramp) and use_warmup=True exclude each other")
        check_type("exclude_buffers", exclude_buffers, bool)
        if device is not None:
            check_type("device", device, (str, torch.device))
            try:
                device = torch.device(device)
            except RuntimeError:
                raise ValueError(f"device must name a torch device, got {device!r}") from None
        if dtype is not None:
            check_type("dtype", dtype, torch.dtype)
            if not dtype.is_floating_point:
                raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        self.use_warmup, self.tau, self.exclude_buffers = use_warmup, tau, exclude_buffers
        self.device, self.dtype = device, dtype
        self.updates = 0
        self.module = copy.deepcopy(_unwrap(model)).eval().requires_grad_(False)
        self._pairs: tuple[Any, ...] | None = None  # see `_tensors`
        if device is not None or dtype is not None:
            self.module.to(device=device, dtype=dtype)

    def get_decay(self, step: int | None = None) -> float:
        """The decay an update at ``step`` uses (timm's ``get_decay``, or the ``tau`` ramp
        over ``step``, by default the count of updates made)."""
        if self.tau is not None:
            n = self.updates if step is None else step
            return self.decay * (1.0 - math.exp(-n / self.tau))
        if step is None:
            return self.decay
        s = max(0, step - self.update_after_step - 1)
        if s <= 0:
            return 0.0
        if not self.use_warmup:
            return self.decay
        ramp = 1.0 - (1.0 + s / self.warmup_gamma) ** -self.warmup_power
        return max(min(ramp, self.decay), self.min_decay)

    def update(self, model: nn.Module, step: int | None = None) -> None:
        """Move the average towards ``model`` (the model trained, or its wrapper).

        Args:
            model: The model the EMA was made from, or one of the same structure.
            step: The optimizer step, for the warm-up (``None``: see the class).

        Raises:
            TypeError: ``model`` is not an ``nn.Module`` or ``step`` not an int.
            ValueError: ``step`` is negative, or ``model`` has another number of tensors.
        """
        cached = self._pairs
        if (  # the tensors of the last update, unless one of either side was replaced
            cached is None
            or cached[0] is not model
            or cached[1] is not self._modules["module"]
            or not all(map(operator.is_, map(dict.get, cached[2], cached[3]), cached[4]))
            or list(map(Tensor.data_ptr, cached[5])) != cached[6]  # `.to()`, `p.data = ...`
        ):
            check_type("model", model, nn.Module)
            cached = self._tensors(model)
        if step is not None:
            check_int("step", step, 0)
        ema_avg, avg, ema_copy, copied, same_dtypes = cached[7]
        self.__dict__["updates"] = self.updates + 1  # skips nn.Module.__setattr__
        weight = 1.0 - self.get_decay(step)
        # detached aliases: no autograd, whether the model's tensors require gradients or not
        if self.device is not None:
            avg = [t.to(self.device) for t in avg]
            copied = [t.to(self.device) for t in copied]
        if ema_copy:
            torch._foreach_copy_(ema_copy, copied)
        if not ema_avg:
            return
        if same_dtypes:
            torch._foreach_lerp_(ema_avg, avg, weight)
        else:  # as timm: add_ promotes in the kernel, no cast copy of the model
            torch._foreach_mul_(ema_avg, 1.0 - weight)
            torch._foreach_add_(ema_avg, avg, alpha=weight)

    def _tensors(self, model: nn.Module) -> tuple[Any, ...]:
        """What `update` holds between calls: ``model`` (as given), the EMA's module, where
        their tensors and submodules are held and what they hold, their parameters and their
        storage addresses, and detached aliases of the EMA's and the model's averaged, then copied,
        tensors and whether the averaged ones have equal dtypes."""
        module = self._modules["module"]
        ema_avg, ema_copy = _state(module, not self.exclude_buffers)
        avg, copied = _state(_unwrap(model), not self.exclude_buffers)
        if len(avg) != len(ema_avg) or len(copied) != len(ema_copy):
            raise ValueError(
                f"model must have the EMA's structure: {len(ema_avg)} averaged and "
                f"{len(ema_copy)} copied tensors, got {len(avg)} and {len(copied)}"
            )
        same = all(e.dtype == m.dtype for e, m in zip(ema_avg, avg, strict=True))
        # a parameter's `.data` may change (`.to()` does that); buffers are replaced
        held = [t for t in ema_avg + avg + ema_copy + copied if isinstance(t, nn.Parameter)]
        aliases = [[t.detach() for t in ts] for ts in (ema_avg, avg, ema_copy, copied)]
        ptrs = [t.data_ptr() for t in held]
        cached = (model, module, *_slots(model, module), held, ptrs, (*aliases, same))
        self.__dict__["_pairs"] = cached
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pairs"] = None  # holds the model: never copied nor pickled
        return state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the averaged model: ``self.module(*args, **kwargs)``."""
        return self.module(*args, **kwargs)

    def get_extra_state(self) -> dict[str, int]:
        return {"updates": self.updates}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.updates = int(state["updates"])
