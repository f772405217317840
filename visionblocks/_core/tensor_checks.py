"""Tensor input validation: types, shapes, devices, sizes (see `visionblocks._core.checks`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def check_tensor(name: str, value: Any) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a ``torch.Tensor``; return it.

    Examples:
        >>> check_tensor("x", torch.zeros(1)).shape
        torch.Size([1])
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(name: str, value: Any) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a floating-point tensor; return it.

    Examples:
        >>> check_floating("logits", torch.zeros(2, dtype=torch.long))
        Traceback (most recent call last):
        ...
        TypeError: logits must be a floating-point tensor, got dtype torch.int64
    """
    check_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def check_real(name: str, value: Any) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a real (floating or integer) tensor; return it.

    Examples:
        >>> check_real("boxes", torch.zeros(1, 4, dtype=torch.complex64))
        Traceback (most recent call last):
        ...
        TypeError: boxes must be a real tensor (floating or integer), got dtype torch.complex64
    """
    check_tensor(name, value)
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(
            f"{name} must be a real tensor (floating or integer), got dtype {value.dtype}"
        )
    return value


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Raise ``ValueError`` unless two tensors have the same shape.

    Examples:
        >>> check_same_shape("inputs", torch.zeros(2, 3), "targets", torch.zeros(2, 4))
        Traceback (most recent call last):
        ...
        ValueError: inputs and targets must have the same shape, got (2, 3) and (2, 4)
    """
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_last_dim(name: str, value: torch.Tensor, size: int, *, what: str = "") -> None:
    """Raise ``ValueError`` unless ``value.shape[-1] == size`` (and ``value.dim() >= 1``).

    Examples:
        >>> check_last_dim("boxes", torch.zeros(5, 3), 4, what="(x1, y1, x2, y2)")
        Traceback (most recent call last):
        ...
        ValueError: boxes must have shape (..., 4) (x1, y1, x2, y2), got (5, 3)
    """
    if value.dim() == 0 or value.shape[-1] != size:
        suffix = f" {what}" if what else ""
        raise ValueError(f"{name} must have shape (..., {size}){suffix}, got {tuple(value.shape)}")


def check_feature_map(name: str, value: Any, channels: int) -> torch.Tensor:
    """Raise unless ``value`` is a ``(B, channels, H, W)`` floating-point tensor; return it.

    Examples:
        >>> check_feature_map("x", torch.zeros(32, 9, 9), 32)
        Traceback (most recent call last):
        ...
        ValueError: x must have shape (B, 32, H, W), got (32, 9, 9)
    """
    check_floating(name, value)
    if value.dim() != 4 or value.shape[1] != channels:
        raise ValueError(f"{name} must have shape (B, {channels}, H, W), got {tuple(value.shape)}")
    return value


def is_tracing(*values: Any) -> bool:
    """True under ``torch.jit.trace`` or when a value is a ``torch.fx`` proxy.

    Checks of shapes and devices are skipped then: proxies have neither, and comparing traced
    sizes would bake one input's shape into the trace.
    """
    return torch.jit.is_tracing() or any(isinstance(v, torch.fx.Proxy) for v in values)


def check_device(name: str, value: torch.Tensor, device: torch.device, where: str) -> None:
    """Raise ``ValueError`` unless ``value`` is on ``device`` (the device of ``where``).

    Examples:
        >>> check_device("x", torch.zeros(1, device="meta"), torch.device("cpu"), "the weights")
        Traceback (most recent call last):
        ...
        ValueError: x is on meta but the weights are on cpu; move one to the other's device
    """
    if value.device != device:
        raise ValueError(
            f"{name} is on {value.device} but {where} are on {device}; move one to the "
            "other's device"
        )


def check_image_batch(
    name: str, value: Any, channels: int | None = None, *, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Raise unless ``value`` is a floating ``(B, channels, H, W)`` tensor fit for ``weight``.

    The input check of a module's ``forward``: ``TypeError`` for the type, a non-floating
    dtype or (outside ``torch.autocast``) not ``weight``'s; ``ValueError`` for the shape (3-D:
    a hint to add the batch dim) or not ``weight``'s device. Skipped while tracing.

    Examples:
        >>> check_image_batch("x", torch.zeros(8, 5, 5), 8)
        Traceback (most recent call last):
        ...
        ValueError: x must have shape (B, 8, H, W), got (8, 5, 5) (one image? add the batch dimension: x.unsqueeze(0))
    """
    if is_tracing(value):
        return value
    check_floating(name, value)
    if value.dim() != 4 or (channels is not None and value.shape[1] != channels):
        hint = f" (one image? add the batch dimension: {name}.unsqueeze(0))"
        raise ValueError(
            f"{name} must have shape (B, {'C' if channels is None else channels}, H, W), got "
            f"{tuple(value.shape)}{hint if value.dim() == 3 else ''}"
        )
    if weight is not None:
        check_device(name, value, weight.device, "the module's parameters")
        if value.dtype != weight.dtype and not torch.is_autocast_enabled(value.device.type):
            raise TypeError(
                f"{name} has dtype {value.dtype} but the module's parameters have "
                f"{weight.dtype}; cast one to the other (or run under torch.autocast)"
            )
    return value


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless every tensor given (``None`` skipped) is on one device.

    Examples:
        >>> check_same_device(pred=torch.zeros(1), target=torch.zeros(1, device="meta"))
        Traceback (most recent call last):
        ...
        ValueError: pred and target must be on the same device, got pred on cpu, target on meta
    """
    given = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in given.values()}
    if len(devices) > 1:
        names = list(given)
        joined = ", ".join(names[:-1]) + " and " + names[-1]
        where = ", ".join(f"{k} on {v.device}" for k, v in given.items())
        raise ValueError(f"{joined} must be on the same device, got {where}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype losses and ops compute in for inputs of ``dtype``: float64 stays float64,
    everything else (float16, bfloat16, float32, integers) is computed in float32.

    Examples:
        >>> compute_dtype(torch.float16), compute_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def exact_ignore(values: torch.Tensor, ignore: float | None) -> float | None:
    """``ignore`` as a number to compare ``values`` with, or None where no value of their
    dtype can equal it. torch compares a Python int with an integer tensor in the tensor's
    own dtype and wraps it there (``uint8``: 256 matches 0, -100 matches 156).

    Examples:
        >>> mask = torch.tensor([0, 156, 255], dtype=torch.uint8)
        >>> (mask == -100).tolist(), exact_ignore(mask, -100), exact_ignore(mask, 255)
        ([False, True, False], None, 255)
    """
    if ignore is None or not isinstance(ignore, int) or values.is_floating_point():
        return ignore
    if values.dtype == torch.bool or values.is_complex():
        return ignore  # bool promotes to int64; complex is refused by the callers
    info = torch.iinfo(values.dtype)
    return ignore if info.min <= ignore <= info.max else None


MAX_ALLOCATION_BYTES = 2**48


def check_allocation(what: str, shape: Sequence[int], dtype: torch.dtype) -> None:
    """Raise ``ValueError`` before allocating a tensor of ``shape`` no machine could hold.

    Skipped under ``torch.compile`` (the allocator's own error remains).

    Examples:
        >>> check_allocation("the windows", (1, 3, 10**9 * 10**9, 4, 4), torch.float32)
        Traceback (most recent call last):
        ...
        ValueError: the windows would need a tensor of shape (1, 3, 1000000000000000000, 4, 4) (192000000000000000000 bytes); some size is absurdly large
    """
    if torch.compiler.is_compiling():  # symbolic sizes: int() would specialise them
        return
    numel = math.prod(int(s) for s in shape)
    size = numel * dtype.itemsize
    if size > MAX_ALLOCATION_BYTES:
        raise ValueError(
            f"{what} would need a tensor of shape {tuple(int(s) for s in shape)} ({size} bytes); "
            "some size is absurdly large"
        )


def cuda_unusable(name: str, device: torch.device) -> str | None:
    """Why ``device`` (argument ``name``) cannot be used here (no CUDA, no such index), or None.

    Examples:
        >>> cuda_unusable("device", torch.device("cpu")) is None
        True
    """
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return (
            f"{name}={str(device)!r} asks for CUDA, but CUDA is not available "
            f"(torch.cuda.is_available() is False); use {name}='cpu'"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"{name}={str(device)!r}, but only {count} CUDA device(s) are visible"
    return None
