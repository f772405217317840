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

from visionblocks._core.checks import check_int, check_number, check_type, format_shape
from visionblocks._core.namespace import public_dir

__all__ = ["ModelEMA"]
__dir__ = public_dir(__name__, __all__)

_PARALLEL = (nn.DataParallel, nn.parallel.DistributedDataParallel)
_SHAPE = operator.attrgetter("shape")
_OPEN = {"low_inclusive": False, "high_inclusive": False}


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside ``DataParallel``/``DistributedDataParallel`` and ``torch.compile``."""
    while True:
        if isinstance(model, _PARALLEL):
            model = model.module
        elif isinstance(model._modules.get("_orig_mod"), nn.Module):  # no __getattr__ miss
            model = model._modules["_orig_mod"]
        else:
            return model


def _entries(module: nn.Module, buffers: bool) -> tuple[list[str], list[Tensor], list[bool]]:
    """The names and tensors an update reads, each tensor once, in a fixed order, and whether
    each is averaged (else copied).

    ``buffers``: the state dict's floating-point buffers are averaged (its other buffers
    copied); otherwise every buffer is copied (timm's ``exclude_buffers``).
    """
    names: list[str] = []
    tensors: list[Tensor] = []
    averaged: list[bool] = []
    seen: set[int] = set()
    for prefix, m in module.named_modules():
        for is_buffer, d in ((False, m._parameters), (True, m._buffers)):
            for key, t in d.items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                if is_buffer and buffers and key in m._non_persistent_buffers_set:
                    continue
                names.append(f"{prefix}.{key}" if prefix else key)
                tensors.append(t)
                averaged.append(t.is_floating_point() and (buffers or not is_buffer))
    return names, tensors, averaged


def _eq_may_hide(value: Any) -> bool:
    """Whether ``value == other`` may be true for another object ``other``: a tensor of one
    element compared with an equal one, an object whose class defines ``__eq__``."""
    if isinstance(value, Tensor):
        return value.numel() == 1
    return type(value).__eq__ is not object.__eq__


def _kind(dtype: torch.dtype) -> str:
    """What an update may convert within (the floating dtypes, the integer ones)."""
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating"
    return "bool" if dtype == torch.bool else "integer"


def _describe(entry: tuple[str, Tensor] | None) -> str:
    if entry is None:
        return "nothing"
    name, t = entry
    holder = "parameter" if isinstance(t, nn.Parameter) else "buffer"
    return f"{holder} {name!r} of shape {format_shape(t.shape)}, {t.dtype} on {t.device}"


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
    float32: ``dtype=torch.float32``), and there is no ``foreach=False`` path. ``update``
    refuses a model whose tensors differ from the EMA's (see its Raises); it checks them
    again whenever a tensor or submodule of either side is set, added or removed, or a
    parameter's storage or shape changed.

    ultralytics' ``ModelEMA`` (YOLOv8-11) is this with its ramp
    ``decay * (1 - exp(-updates / tau))`` over its own count of updates and the buffers
    averaged: ``ModelEMA(model, 0.9999, tau=2000)`` gives it (``step``, when given, replaces
    the count; the warm-up arguments then do not apply), except that ultralytics leaves the
    integer buffers (BatchNorm's ``num_batches_tracked``) as they were, where this copies
    them as timm does. Its ``ema.ema`` is our ``.module``.

    Args:
        model: The model to average (or its DDP, DataParallel or compiled wrapper).
        decay: The decay, or the ramp's ceiling, in ``[0, 1]``.
        min_decay: Floor of the warm-up ramp, in ``[0, decay]``.
        update_after_step: Steps that copy the model before averaging starts.
        use_warmup: Ramp the decay up with ``step`` (timm's warm-up).
        warmup_gamma: The warm-up's inverse gamma, positive and finite.
        warmup_power: The warm-up's power, positive.
        tau: ultralytics' ramp time constant in updates, positive and finite (``None``: no
            such ramp).
        exclude_buffers: Copy the buffers instead of averaging them.
        device: Keep the copy on this device (``None``: the model's).
        dtype: Keep the copy in this floating dtype (``None``: the model's).

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: An argument out of range, ``min_decay`` above ``decay``, or ``tau``
            with ``use_warmup``.

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
        if min_decay > decay:
            raise ValueError(f"min_decay must be at most decay ({decay!r}), got {min_decay!r}")
        self.update_after_step = check_int("update_after_step", update_after_step, 0)
        check_type("use_warmup", use_warmup, bool)
        # an infinite gamma or tau never ramps up: the "average" would stay a copy
        self.warmup_gamma = check_number("warmup_gamma", warmup_gamma, 0.0, math.inf, **_OPEN)
        self.warmup_power = check_number("warmup_power", warmup_power, 0.0, low_inclusive=False)
        if tau is not None:
            tau = check_number("tau", tau, 0.0, math.inf, **_OPEN)
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
        over ``step``, by default the count of updates made).

        Raises:
            TypeError: ``step`` is not an int.
            ValueError: ``step`` is negative.
        """
        if step is not None:
            check_int("step", step, 0)
        return self._decay(step)

    def _decay(self, step: int | None) -> float:
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
            ValueError: ``step`` is negative, or a tensor of ``model`` differs from the EMA's
                (in number, name, shape, dtype kind or device; the message names the first),
                checked before anything changes.
        """
        cached = self._pairs
        try:  # the tensors of the last update, unless a tensor or submodule of either side changed
            fresh = (
                cached is not None
                and cached[0] is model
                and cached[1] is self._modules["module"]
                and (not cached[3] or all(map(operator.is_, map(dict.get, *cached[2]), cached[3])))
                and cached[4] == cached[5]  # see `_tensors`
                and [*map(Tensor.data_ptr, cached[6]), *map(_SHAPE, cached[7])] == cached[8]
            )
        except Exception:  # `==` on a replaced tensor of several elements raises
            fresh = False
        if not fresh:
            check_type("model", model, nn.Module)
            cached = self._tensors(model)
        if step is not None:
            check_int("step", step, 0)
        ema_avg, avg, ema_copy, copied, same_dtypes = cached[9]
        self.__dict__["updates"] = self.updates + 1  # skips nn.Module.__setattr__
        weight = 1.0 - self._decay(step)
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
        """Check ``model`` against the EMA; return (and keep) what `update` holds between
        calls: ``model`` (as given) and the EMA's module; the slots (dicts, keys) whose value
        `_eq_may_hide` its replacement, and these values; the dicts that hold both sides'
        tensors and submodules, and a copy of each (``==`` compares their values by identity,
        in C; a replaced tensor of several elements makes it raise); the tensors whose
        storage address or shape is checked, and these; detached aliases of the EMA's and
        the model's averaged, then copied, tensors, and whether the averaged ones have equal
        dtypes."""
        module = self._modules["module"]
        ema_names, ema_ts, ema_flags = _entries(module, not self.exclude_buffers)
        names, ts, flags = _entries(_unwrap(model), not self.exclude_buffers)
        for i in range(max(len(ema_ts), len(ts))):
            if i < min(len(ts), len(ema_ts)):
                e, t = ema_ts[i], ts[i]
                if (
                    names[i] == ema_names[i]
                    and t.shape == e.shape
                    and flags[i] == ema_flags[i]
                    and _kind(t.dtype) == _kind(e.dtype)
                    and (t.device == e.device if self.device is None else t.device.type != "meta")
                ):
                    continue
            expected = _describe((ema_names[i], ema_ts[i]) if i < len(ema_ts) else None)
            got = _describe((names[i], ts[i]) if i < len(ts) else None)
            raise ValueError(
                f"model must have the EMA's tensors in order ({len(ema_ts)}, got {len(ts)}); "
                f"the first that differs, tensor {i}: expected {expected}, got {got}"
            )
        pairs = list(zip(ema_ts, ts, flags))
        ema_avg = [e.detach() for e, _, f in pairs if f]
        avg = [t.detach() for _, t, f in pairs if f]
        ema_copy = [e.detach() for e, _, f in pairs if not f]
        copied = [t.detach() for _, t, f in pairs if not f]
        same = all(e.dtype == t.dtype for e, t in zip(ema_avg, avg, strict=True))
        dicts = [
            d
            for side in (model, module)
            for m in side.modules()
            for d in (m._parameters, m._buffers, m._modules)
        ]
        by_id = [(d, k, v) for d in dicts for k, v in d.items() if _eq_may_hide(v)]
        # `.to()` sets a parameter's `.data` (and replaces a buffer): the model's tensors'
        # and the EMA's parameters' storage addresses, the model's parameters' shapes
        params = [t for t in ts if isinstance(t, nn.Parameter)]
        ptrs = ts + [e for e in ema_ts if isinstance(e, nn.Parameter)]
        cached = (
            model, module, ([d for d, _, _ in by_id], [k for _, k, _ in by_id]),
            [v for _, _, v in by_id], dicts, [dict(d) for d in dicts], ptrs, params,
            [*map(Tensor.data_ptr, ptrs), *map(_SHAPE, params)],
            (ema_avg, avg, ema_copy, copied, same),
        )  # fmt: skip
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
