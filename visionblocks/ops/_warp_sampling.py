"""Sampling internals of `visionblocks.ops.warp`: validation, grids and the torch samplers.

The samplers work on **inverse** matrices (destination pixel → source pixel), already
checked; the public functions in ``warp.py`` and ``warp_targets.py`` validate and invert.
They are the reference path (gradients, CUDA, tracing, machines without OpenCV); on CPU
`visionblocks.ops._warp_opencv` runs ``cv2.warpAffine`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import (
    check_finite,
    is_finite,
)
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.tensor_checks import check_floating, check_real, compute_dtype
from visionblocks.ops._warp_opencv import eager_cpu

__all__ = [
    "after",
    "as_float",
    "check_fill",
    "check_matrix",
    "check_size",
    "invert_checked",
    "normaliser",
    "warp_bilinear",
    "warp_nearest",
]


def as_float(name: str, value: object, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A number, a sequence of numbers or a tensor as a floating tensor (`affine_matrix`)."""
    if isinstance(value, Tensor):
        return check_real(name, value).to(dtype=dtype, device=device)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(check_finite(name, float(value)), dtype=dtype, device=device)
    if isinstance(value, Sequence) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        if not all(is_finite(v) for v in value):
            raise ValueError(f"{name} must hold finite numbers, got {tuple(value)!r}")
        return torch.tensor([float(v) for v in value], dtype=dtype, device=device)
    raise TypeError(f"{name} must be a number, a sequence of numbers or a tensor, got {value!r}")


def check_matrix(
    name: str, matrix: object, *, batched: bool = False, square: bool = False
) -> Tensor:
    """A floating ``(2, 3)`` or ``(B, 2, 3)`` tensor (``(..., 2, 3)`` with ``batched``); with
    ``square`` also the ``(3, 3)`` form, returned as its top two rows once its last row is
    ``[0, 0, 1]`` (a value check: one read on CPU, a device-side assert on CUDA)."""
    matrix = check_floating(name, matrix)
    rows = matrix.shape[-2] if matrix.dim() >= 2 and matrix.shape[-1] == 3 else 0
    if rows not in ((2, 3) if square else (2,)) or (matrix.dim() > 3 and not batched):
        expected = "(..., 2, 3)" if batched else "(2, 3) or (B, 2, 3)"
        if square:
            expected += " (or the (3, 3) form, last row [0, 0, 1])"
        raise ValueError(f"{name} must have shape {expected}, got {tuple(matrix.shape)}")
    if rows == 2:
        return matrix
    last = matrix[..., 2, :].detach()
    affine = (last[..., 0] == 0) & (last[..., 1] == 0) & (last[..., 2] == 1)
    message = (
        f"{name} is a (3, 3) matrix whose last row is not [0, 0, 1]: a projective warp (a "
        "homography), which an affine warp cannot apply (cv2.warpPerspective or torchvision's "
        "v2.functional.perspective can); an affine matrix in (3, 3) form ends in [0, 0, 1]"
    )
    if reads_values(matrix):
        if not bool(affine.all()):
            raise ValueError(f"{message}; got last row {last[~affine][0].tolist()}")
    elif asserts_on_device(matrix):
        assert_on_device(affine, message)
    return matrix[..., :2, :]


def check_size(name: str, size: object) -> tuple[int, int]:
    """Check a ``(H, W)`` size: two positive ints (a tuple, list or ``torch.Size``)."""
    if not isinstance(size, (tuple, list, torch.Size)):
        raise TypeError(f"{name} must be a (H, W) tuple of two ints, got {type(size).__name__}")
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise ValueError(f"{name} must be (H, W), two ints, got {tuple(size)!r}")
    if size[0] <= 0 or size[1] <= 0:
        raise ValueError(f"{name} must be positive, got {tuple(size)!r}")
    return int(size[0]), int(size[1])


def inverse_entries(a: Any, b: Any, tx: Any, c: Any, d: Any, ty: Any) -> tuple[Any, ...]:
    """The closed-form inverse of ``[[a, b, tx], [c, d, ty]]`` and its determinant, for tensors
    or Python floats alike (the same IEEE operations in the same order)."""
    det = a * d - b * c
    # `0.0 - x` rather than `-x`: no negative zeros in exact results.
    ia, ib, ic, id_ = d / det, (0.0 - b) / det, (0.0 - c) / det, a / det
    return ia, ib, 0.0 - (ia * tx + ib * ty), ic, id_, 0.0 - (ic * tx + id_ * ty), det


def singular_error(name: str, index: tuple[int, ...], det: float, entries: list) -> ValueError:
    at = f" at index {index}" if index else ""
    return ValueError(
        f"{name} must be an invertible affine matrix with finite entries; got a singular or "
        f"non-finite one{at} (determinant {det:g}, entries {entries}): it maps the image "
        "onto a line or a point, and warping with it gives NaN"
    )


def invert_checked(name: str, matrix: Tensor) -> Tensor:
    """Closed-form inverse of checked ``(..., 2, 3)`` matrices, with `invert_affine`'s value
    check. One eager float64 CPU matrix is inverted in Python floats (same result, bit for
    bit)."""
    if matrix.dtype == torch.float64 and matrix.numel() == 6 and eager_cpu(matrix):
        entries = matrix.reshape(6).tolist()
        try:
            *values, det = inverse_entries(*entries)
        except ZeroDivisionError:  # a singular matrix: the tensor path gives inf/NaN or raises
            values = None
        if values is not None and all(map(is_finite, values)):
            return torch.tensor(values, dtype=matrix.dtype).view(matrix.shape)
    *values, det = inverse_entries(*matrix.to(compute_dtype(matrix.dtype)).flatten(-2).unbind(-1))
    inverse = torch.stack(values, dim=-1).unflatten(-1, (2, 3))
    inverse = inverse.to(matrix.dtype)  # half matrices: inverted in float32
    if inverse.numel() and reads_values(inverse) and not bool(inverse.detach().isfinite().all()):
        bad = ~torch.isfinite(inverse.detach()).flatten(-2).all(-1)
        index = tuple(bad.nonzero()[0].tolist())
        entries = matrix.detach()[index].flatten().tolist()
        raise singular_error(name, index, float(det.detach()[index]), entries)
    if inverse.numel() and asserts_on_device(inverse):  # CUDA: no host sync
        assert_on_device(
            torch.isfinite(inverse.detach()),
            f"{name} must be an invertible affine matrix with finite entries",
        )
    return inverse


def check_fill(name: str, fill: object, nonzero_ok: bool) -> None:
    """A finite number, a sequence of them or a tensor (values unread); anything but the
    number 0 needs ``nonzero_ok`` (``padding_mode="fill"``)."""
    number = isinstance(fill, (int, float)) and not isinstance(fill, bool)
    if not isinstance(fill, Tensor):
        sequence = isinstance(fill, Sequence) and not isinstance(fill, str)
        values = [fill] if number else list(fill) if sequence else [None]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise TypeError(
                f"{name} must be a number, a sequence of numbers or a tensor, got {fill!r}"
            )
        if not all(is_finite(v) for v in values):
            raise ValueError(f"{name} must hold finite numbers, got {fill!r}")
    if not nonzero_ok and not (number and fill == 0):
        raise ValueError(f"{name}={fill!r} needs padding_mode='fill'")


def after(first: Tensor, second: Tensor) -> Tensor:
    """``first ∘ second`` for ``(..., 2, 3)`` matrices, element-wise (no matmul for autocast)."""
    lin = first[..., :, :1] * second[..., :1, :] + first[..., :, 1:2] * second[..., 1:2, :]
    return torch.cat((lin[..., :2], lin[..., 2:] + first[..., 2:]), dim=-1)


def normaliser(size: tuple[int, int], like: Tensor) -> Tensor:
    """Pixel → ``align_corners=False`` normalised coordinates, as a ``(2, 3)`` matrix."""
    h, w = size
    rows = [[2 / w, 0.0, 1 / w - 1], [0.0, 2 / h, 1 / h - 1]]
    return torch.tensor(rows, dtype=like.dtype, device=like.device)


def fill_tensor(fill: object, channels: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``fill`` as a tensor broadcastable to ``(C, 1, 1)``."""
    if isinstance(fill, Tensor):
        value = fill.to(dtype=dtype, device=device)
    elif isinstance(fill, (int, float)) and not isinstance(fill, bool):
        return torch.tensor(fill, dtype=dtype, device=device)
    elif isinstance(fill, Sequence) and all(isinstance(v, (int, float)) for v in fill):
        value = torch.tensor(list(fill), dtype=dtype, device=device)
    else:
        raise TypeError(f"fill must be a number, a sequence of numbers or a tensor, got {fill!r}")
    if value.numel() == 1:
        return value.reshape(())
    if value.dim() != 1 or value.numel() != channels:
        raise ValueError(
            f"fill must be a scalar or have one value per channel ({channels}), "
            f"got shape {tuple(value.shape)}"
        )
    return value.view(channels, 1, 1)


def source_coords(inv: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Source coordinates ``(Bm, H, W)`` of every destination pixel, from ``inv (Bm, 2, 3)``."""
    h, w = size
    xs = torch.arange(w, dtype=inv.dtype, device=inv.device)
    ys = torch.arange(h, dtype=inv.dtype, device=inv.device)
    k = inv.unsqueeze(-1)  # (Bm, 2, 3, 1): separable, two multiply-adds per output pixel
    gx = (k[:, 0, 1] * ys + k[:, 0, 2]).unsqueeze(-1) + (k[:, 0, 0] * xs).unsqueeze(-2)
    gy = (k[:, 1, 1] * ys + k[:, 1, 2]).unsqueeze(-1) + (k[:, 1, 0] * xs).unsqueeze(-2)
    return gx, gy


def reflect_index(idx: Tensor, n: int) -> Tensor:
    """``cv2.BORDER_REFLECT`` (``fedcba|abcdef|fedcba``) on integer indices."""
    idx = torch.remainder(idx, 2 * n)
    return torch.where(idx >= n, 2 * n - 1 - idx, idx)


def warp_nearest(
    img: Tensor, inv: Tensor, size: tuple[int, int], padding_mode: str, fill: object
) -> Tensor:
    """Nearest sampling by gather: exact for any dtype; ``img (B, C, H, W)``, ``inv (Bm, 2, 3)``."""
    b, c, h, w = img.shape
    gx, gy = source_coords(inv, size)
    ix = torch.round(gx).long()  # half to even, as OpenCV 5 and grid_sample
    iy = torch.round(gy).long()
    valid = None
    if padding_mode == "border":
        ix, iy = ix.clamp(0, w - 1), iy.clamp(0, h - 1)
    elif padding_mode == "reflection":
        ix, iy = reflect_index(ix, w), reflect_index(iy, h)
    else:
        valid = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        ix, iy = ix.clamp(0, w - 1), iy.clamp(0, h - 1)
    index = (iy * w + ix).flatten(1).unsqueeze(1).expand(b, c, -1)
    out = img.flatten(2).gather(2, index).unflatten(2, size)
    if valid is None:
        return out
    valid = valid.unsqueeze(1)
    if padding_mode == "zeros":
        return out.masked_fill(~valid, 0)
    value = fill_tensor(fill, c, img.dtype, img.device)
    if value.dim() == 0 and not value.requires_grad:
        return out.masked_fill(~valid, value)
    return torch.where(valid, out, value)


def warp_bilinear(
    img: Tensor, inv: Tensor, size: tuple[int, int], padding_mode: str, fill: object
) -> Tensor:
    """Bilinear ``grid_sample`` (``align_corners=False``) of ``img (B, C, H, W)``, with the
    module Dtypes of `visionblocks.ops.warp`."""
    work = torch.float64 if img.dtype == torch.float64 else torch.float32
    b, c, h, w = img.shape
    src = img.to(work)
    if padding_mode == "fill":
        # A one-pixel frame of `fill` sampled with "border" equals OpenCV's BORDER_CONSTANT.
        value = fill_tensor(fill, c, work, img.device)
        framed = value.expand(b, c, h + 2, w + 2).clone()
        framed[:, :, 1:-1, 1:-1] = src
        src, h, w, padding_mode = framed, h + 2, w + 2, "border"
        shift = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=inv.dtype, device=inv.device)
        inv = inv + shift
    to_grid = normaliser((h, w), inv)
    gx, gy = source_coords(after(to_grid, inv), size)
    grid = torch.stack((gx, gy), dim=-1).to(work)
    if grid.shape[0] != b:
        grid = grid.expand(b, -1, -1, -1)  # a shared matrix: one grid, no copy
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)
    if not img.dtype.is_floating_point:
        info = torch.iinfo(img.dtype)
        out = out.round().clamp(info.min, info.max)
    return out.to(img.dtype)
