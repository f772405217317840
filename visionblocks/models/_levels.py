"""Input checks of the necks and heads (private): lists of feature levels and output sizes."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_int
from visionblocks._core.tensor_checks import check_image_batch, is_tracing
from visionblocks.nn._limits import MAX_SIDE, MAX_STRIDE

__all__ = [
    "check_image_sizes",
    "check_levels",
    "check_measured_strides",
    "check_size",
    "check_strides",
    "padded_sizes",
    "unpad_detections",
]


def check_strides(strides: Any, *, powers_of_two: bool = False) -> list[int]:
    """Increasing int strides in ``[1, MAX_STRIDE]``, finest first (``powers_of_two``: each a
    power of two times the finest)."""
    if isinstance(strides, (str, bytes)) or not isinstance(strides, Sequence):
        raise TypeError(f"strides must be a non-empty list of ints, got {strides!r}")
    if not strides:
        raise ValueError("strides is empty; give one stride per input level")
    out = [check_int(f"strides[{i}]", s, 1, MAX_STRIDE) for i, s in enumerate(strides)]
    increasing = all(b > a for a, b in itertools.pairwise(out))
    if powers_of_two and not (
        increasing and not any(s % out[0] or (s // out[0]) & (s // out[0] - 1) for s in out)
    ):
        raise ValueError(f"strides must be increasing powers of two of the finest one, got {out}")
    if not increasing:
        raise ValueError(f"strides must increase from level to level (finest first), got {out}")
    return out


def check_levels(
    name: str, features: Any, channels: Sequence[int], module: nn.Module | None
) -> list[Tensor]:
    """The levels of ``features`` (a dict or list of ``(B, C_l, H_l, W_l)``, finest first):
    floating-point, ``channels[l]`` channels, on the device (and, outside autocast, of the
    dtype) of ``module.weight`` (not read while tracing), one batch size, finest first."""
    if isinstance(features, Mapping):
        keys = [f"{name}[{k!r}]" for k in features]
        levels = list(features.values())
    elif isinstance(features, (list, tuple)):
        keys = [f"{name}[{i}]" for i in range(len(features))]
        levels = list(features)
    else:
        raise TypeError(
            f"{name} must be a dict or list of (B, C, H, W) tensors, one per level (finest "
            f"first), got {type(features).__name__}"
        )
    if len(levels) != len(channels):
        raise ValueError(
            f"{name} must hold {len(channels)} levels (finest first), got {len(levels)}"
        )
    if is_tracing(*levels):
        return levels
    weight = None if module is None else module.weight
    for key, level, c in zip(keys, levels, channels):
        check_image_batch(key, level, c, weight=weight)
    for (key_a, a), (key_b, b) in zip(zip(keys, levels), zip(keys[1:], levels[1:])):
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"{name}: every level must have the same batch size, got {key_a} of shape "
                f"{tuple(a.shape)} and {key_b} of shape {tuple(b.shape)}"
            )
        if b.shape[2] > a.shape[2] or b.shape[3] > a.shape[3]:
            raise ValueError(
                f"{name} must be ordered finest first (each level at most as large as the "
                f"one before), got {key_a} of shape {tuple(a.shape)} before {key_b} of shape "
                f"{tuple(b.shape)}"
            )
    return levels


def check_measured_strides(
    features: Mapping[str, Tensor] | Sequence[Tensor], levels: list[Tensor], strides: list[int]
) -> None:
    """Consecutive levels must be as far apart as ``strides`` say: side ``n`` at stride ``s``
    gives ``floor(n / r)`` or ``ceil(n / r)`` at ``r s``. Eager calls only (comparing sizes
    would specialise them while tracing, compiling or exporting)."""
    if is_tracing(*levels) or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return
    keys = list(features) if isinstance(features, Mapping) else list(range(len(levels)))
    names = [f"features[{k!r}]" for k in keys]
    for i in range(len(levels) - 1):
        ratio = strides[i + 1] // strides[i]
        fine, coarse = tuple(levels[i].shape[-2:]), tuple(levels[i + 1].shape[-2:])
        if all(n // ratio <= m <= -(-n // ratio) for n, m in zip(fine, coarse)):
            continue
        measured = " x ".join(f"{n / m:g}" if m else "inf" for n, m in zip(fine, coarse))
        raise ValueError(
            f"features do not match strides={strides}: {names[i]} of size {fine} and "
            f"{names[i + 1]} of size {coarse} are {measured} apart (height x width), but "
            f"strides[{i}]={strides[i]} and strides[{i + 1}]={strides[i + 1]} say {ratio} "
            f"(size {tuple(n // ratio for n in fine)} to {tuple(-(-n // ratio) for n in fine)}"
            f"); give the levels of these strides, finest first, or the strides of these "
            f"levels (the backbone's feature_info)"
        )


def check_size(name: str, size: Any) -> tuple[int, int]:
    """An ``(H, W)`` pair of ints in ``[1, MAX_SIDE]`` (16,384); symbolic sizes pass under
    ``torch.export`` (checking them would specialise them)."""
    if isinstance(size, (str, bytes)) or not isinstance(size, Sequence):
        raise TypeError(f"{name} must be a pair of ints (H, W), got {type(size).__name__}")
    if len(size) != 2:
        raise ValueError(f"{name} must be a pair of ints (H, W), got {size!r}")
    if torch.compiler.is_exporting() and any(isinstance(v, torch.SymInt) for v in size):
        return (size[0], size[1])
    return (
        check_int(f"{name}[0]", size[0], 1, MAX_SIDE),
        check_int(f"{name}[1]", size[1], 1, MAX_SIDE),
    )


def check_image_sizes(image_sizes: Any, batch: int) -> list[tuple[int, int]]:
    """A head's ``predict`` argument: one ``(H, W)`` pair of positive ints per image."""
    if isinstance(image_sizes, (str, bytes)) or not isinstance(image_sizes, Sequence):
        raise TypeError(f"image_sizes must be a list of (H, W) pairs, got {image_sizes!r}")
    if len(image_sizes) != batch:
        raise ValueError(f"image_sizes must hold {batch} (H, W) pairs, got {len(image_sizes)}")
    return [check_size(f"image_sizes[{i}]", s) for i, s in enumerate(image_sizes)]


def padded_sizes(
    image_sizes: Tensor | Sequence[tuple[int, int]] | None,
    finest: Sequence[Any],
    stride: int,
    batch: int,
    device: torch.device,
) -> Tensor:
    """A head's ``predict_padded`` sizes as a ``(B, 2)`` tensor; ``None``: the padded size,
    the ``finest`` level's ``(h, w)`` (symbolic under export) times its ``stride``."""
    if image_sizes is None:
        h, w = finest
        size = torch.stack([torch.full((), h * stride), torch.full((), w * stride)])
        return size.to(device).expand(batch, 2)
    if not isinstance(image_sizes, Tensor):
        return torch.tensor([list(s) for s in image_sizes], device=device)
    return image_sizes


def unpad_detections(padded: Mapping[str, Tensor], max_detections: int) -> list[dict[str, Tensor]]:
    """The padded form's detections of each image, cut to its ``num_detections`` (what
    ``predict`` returns under ``torch.export``)."""
    results = []
    for b, count in enumerate(padded["num_detections"].unbind(0)):
        n = count.item()
        torch._check(n >= 0)
        torch._check(n <= max_detections)
        results.append({k: padded[k][b].narrow(0, 0, n) for k in ("boxes", "scores", "labels")})
    return results
