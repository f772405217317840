"""`warp_affine` on CPU through ``cv2.warpAffine``, when ``cv2`` (5 or later) imports.

OpenCV's warp is the one users compare against; calling it gives its results exactly (see
`visionblocks.ops.warp`, Paths). OpenCV 5 computes exactly (float coordinates) only for 1, 3
or 4 channels of ``uint8``, ``uint16`` and ``float32``, so an image in ``H x W x C`` memory
with 3 or 4 channels is warped as it is (1-byte data through 4 channels, OpenCV's faster
kernel), other channels as planes (1-byte data interleaved in groups of 4 with ``cv2.merge``);
other dtypes bilinearly in float32 (then rounded and clamped as the torch path does) and
nearest sampling copies any dtype as bits of those dtypes; binary masks go eight to a byte.
The result keeps the input's layout. ``cv2`` gets the forward
matrix and inverts it itself. `warp_opencv` returns ``None`` (the caller runs the torch path)
for tensors that are not plain CPU tensors, need a gradient or are being recorded, a singular
or non-finite matrix, bilinear ``float64`` and complex images.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd import forward_ad

from visionblocks._core.dispatch import recording

__all__ = ["eager_cpu", "opencv", "warp_opencv"]

_EXACT = {torch.uint8, torch.uint16, torch.float32}  # OpenCV 5's exact bilinear dtypes
# Nearest sampling: any dtype as bits of the same size (8 bytes: four 2-byte lanes).
_LANES = {1: torch.uint8, 2: torch.uint16, 4: torch.float32, 8: torch.uint16}
_module: list[Any] = []


def opencv() -> Any:
    """The ``cv2`` module if it imports and is OpenCV 5 or later, else ``None`` (imported
    once, on the first call)."""
    if not _module:
        try:
            import cv2

            major = int(str(cv2.__version__).split(".")[0])
        except Exception:  # not installed, or a broken install: the torch path
            cv2, major = None, 0
        _module.append(cv2 if major >= 5 else None)
    return _module[0]


def _has_data(t: Tensor) -> bool:
    try:  # a vmap/grad wrapper raises; a fake tensor (shape inference) has a null pointer
        return t.data_ptr() != 0 or t.numel() == 0
    except RuntimeError:
        return False


def eager_cpu(*tensors: Tensor | None) -> bool:
    """Whether these tensors may be read and written outside torch: real CPU storage, no
    gradient needed, no forward-mode dual, and torch not recording the call."""
    if recording():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cpu" or not _has_data(t) or (grad and t.requires_grad):
            return False
        if forward_ad.unpack_dual(t).tangent is not None:
            return False
    return True


def _border_values(
    fill: object, channels: int, dtype: torch.dtype, view: torch.dtype
) -> list | None:
    """``fill`` converted to ``dtype`` as the torch path does and reinterpreted as ``view``;
    ``None`` for a tensor of another shape (the torch path raises)."""
    value = fill if isinstance(fill, Tensor) else torch.tensor(fill, dtype=torch.float64)
    value = value.detach().to(dtype).reshape(-1)
    if value.numel() == 1:
        value = value.expand(channels)
    if value.numel() != channels:
        return None
    value = value.contiguous().view(view)
    if view == torch.float32 and bool(value.isnan().any()):
        return None  # a NaN's bits may not survive the double of a cv::Scalar
    return value.tolist()


def _matrix(matrices: list[list[float]], i: int) -> np.ndarray:
    """The ``(2, 3)`` float64 matrix of image ``i`` (one shared, or one per image)."""
    return np.array(matrices[i if len(matrices) > 1 else 0], dtype=np.float64).reshape(2, 3)


def _warp_bits(
    cv2: Any,
    planes: Tensor,
    out: Tensor,
    matrices: list[list[float]],
    dsize: tuple[int, int],
    values: list,
    options: dict[str, int],
) -> None:
    """Nearest warp of binary byte planes ``(B, C, H, W)`` into ``out``, eight to a byte."""
    shifts = torch.arange(8, dtype=torch.uint8).view(-1, 1, 1)
    for i in range(planes.shape[0]):
        m = _matrix(matrices, i)
        for c in range(0, planes.shape[1], 8):
            part, target = planes[i, c : c + 8], out[i, c : c + 8]
            bits = shifts[: part.shape[0]]
            packed = (part << bits).sum(0, dtype=torch.uint8).numpy()
            fill = sum(int(v) << k for k, v in enumerate(values[c : c + 8]))
            warped = cv2.warpAffine(packed, m, dsize, borderValue=(fill,), **options)
            torch.bitwise_right_shift(torch.from_numpy(warped), bits, out=target)
            target.bitwise_and_(1)


def warp_opencv(
    img: Tensor,
    matrix: Tensor,
    size: tuple[int, int],
    mode: str,
    padding_mode: str,
    fill: object,
) -> Tensor | None:
    """``cv2.warpAffine`` of every channel of ``img (B, C, H, W)`` with the forward
    ``matrix (Bm, 2, 3)`` (``Bm`` 1 or ``B``), or ``None``."""
    cv2 = opencv()
    fill_tensor = fill if isinstance(fill, Tensor) else None
    if cv2 is None or img.numel() == 0 or not eager_cpu(img, matrix, fill_tensor):
        return None
    dtype, nearest = img.dtype, mode == "nearest"
    if nearest:
        work, view = dtype, _LANES[dtype.itemsize]
    elif dtype == torch.float64 or dtype.is_complex:  # OpenCV: 1/32-pixel positions, or none
        return None
    else:  # computed in float32 and rounded as the torch path does, by OpenCV's exact kernel
        work = view = dtype if dtype in _EXACT else torch.float32
    matrices = matrix.detach().to(torch.float64).reshape(-1, 6).tolist()
    for a, b, tx, c, d, ty in matrices:  # singular or not finite: the torch path says why
        det = a * d - b * c
        if not (det and all(map(math.isfinite, (a, b, tx, c, d, ty, det, 1 / det)))):
            return None
    bsz, channels = img.shape[:2]
    lanes = work.itemsize // view.itemsize
    values: list | None = [0] * (channels * lanes)
    if padding_mode == "fill":
        values = _border_values(fill, channels, work, view)
        if values is None:
            return None
    border = {"border": cv2.BORDER_REPLICATE, "reflection": cv2.BORDER_REFLECT}
    options = {
        "flags": cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR,
        "borderMode": border.get(padding_mode, cv2.BORDER_CONSTANT),
    }
    dsize = (size[1], size[0])
    src_t = img.detach().to(work)  # keeps an interleaved (H, W, C) memory layout
    if lanes == 1 and channels in (3, 4) and src_t.permute(0, 2, 3, 1).is_contiguous():
        # Interleaved channels (an OpenCV or PIL image seen as (C, H, W)): one call per
        # image, no copy, and the result in the same layout.
        out = torch.empty(bsz, *size, channels, dtype=work).permute(0, 3, 1, 2)
        src = src_t.view(view).permute(0, 2, 3, 1).numpy()
        dst = out.view(view).permute(0, 2, 3, 1).numpy()
        for i in range(bsz):
            m = _matrix(matrices, i)
            if src.itemsize == 1 and channels == 3:  # 8-bit: OpenCV's 4-channel kernel is faster
                four = cv2.cvtColor(src[i], cv2.COLOR_RGB2RGBA)
                warped = cv2.warpAffine(four, m, dsize, borderValue=[*values, 0], **options)
                cv2.cvtColor(warped, cv2.COLOR_RGBA2RGB, dst[i])
            else:
                cv2.warpAffine(src[i], m, dsize, dst[i], borderValue=values, **options)
        return _converted(out, dtype)
    src = src_t.contiguous().view(view).numpy()
    out = torch.empty(bsz, channels, *size, dtype=work)
    dst = out.view(view).numpy()
    if lanes > 1:
        src, dst = src.reshape(*img.shape, lanes), dst.reshape(*out.shape, lanes)
    # 8-bit data in interleaved groups of 4 channels (a third one padded), wider data by plane.
    group = 4 if src.itemsize == 1 else 1
    if group == 4 and nearest and channels > 1 and set(values) <= {0, 1}:
        planes = img.detach().contiguous().view(torch.uint8)
        if dtype == torch.bool or int(planes.max()) <= 1:  # binary masks: 8 to a byte
            _warp_bits(cv2, planes, out.view(torch.uint8), matrices, dsize, values, options)
            return out
    for i in range(bsz):
        m = _matrix(matrices, i)
        c = 0
        while c < channels:
            n = min(group, channels - c)
            if n < 3:  # one plane, written in place
                value = values[c * lanes : (c + 1) * lanes]
                cv2.warpAffine(src[i, c], m, dsize, dst[i, c], borderValue=value, **options)
                c += 1
                continue
            planes, targets = [src[i, k] for k in range(c, c + n)], list(dst[i, c : c + n])
            value = values[c : c + n]
            if n == 3:  # a fourth channel
                planes, value = [*planes, planes[0]], [*value, value[0]]
                targets.append(np.empty_like(targets[0]))
            warped = cv2.warpAffine(cv2.merge(planes), m, dsize, borderValue=value, **options)
            cv2.split(warped, targets)
            c += n
    return _converted(out, dtype)


def _converted(out: Tensor, dtype: torch.dtype) -> Tensor:
    """``out`` (computed in float32 for other dtypes) as ``dtype``, rounded and clamped as the
    torch path does."""
    if out.dtype == dtype:
        return out
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        out = out.round_().clamp_(info.min, info.max)
    return out.to(dtype)
