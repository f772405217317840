"""Sampling internals of `visionblocks.ops.warp`: validation, grids and the two samplers.

Everything here works on **inverse** matrices (destination pixel → source pixel), already
checked; the public functions in ``warp.py`` and ``warp_targets.py`` validate and invert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from visionblocks._core.checks import (
    check_choice,
    check_finite,
    check_range,
    check_type,
    is_finite,
)
from visionblocks._core.native import plain
from visionblocks._core.reduce import compute_dtype
from visionblocks._core.tensor_checks import (
    assert_on_device,
    asserts_on_device,
    check_floating,
    check_real,
    reads_values,
)
from visionblocks.ops._warp_native import warp_native

__all__ = [
    "as_float",
    "check_batch",
    "check_fill",
    "check_matrix",
    "check_sample_options",
    "check_size",
    "compose_affine",
    "drop_instances",
    "invert_checked",
    "normaliser",
    "promoted_dtype",
    "tv_tensors_module",
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


def check_matrix(name: str, matrix: object, *, batched: bool = False) -> Tensor:
    """Check an affine matrix: a floating tensor of shape ``(2, 3)`` or ``(B, 2, 3)``.

    With ``batched=True`` any leading dims ``(..., 2, 3)`` are accepted.
    """
    matrix = check_floating(name, matrix)
    ok = matrix.shape[-2:] == (2, 3) and (matrix.dim() in (2, 3) or (batched and matrix.dim() > 3))
    if not ok:
        expected = "(..., 2, 3)" if batched else "(2, 3) or (B, 2, 3)"
        raise ValueError(f"{name} must have shape {expected}, got {tuple(matrix.shape)}")
    return matrix


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
    """Closed-form inverse of checked ``(..., 2, 3)`` affine matrices (`invert_affine`).

    A value check (`visionblocks.value_checks_enabled`; one read of the small result on CPU,
    a device-side assert on CUDA): a singular or non-finite matrix, whose inverse is not
    finite, raises ``ValueError`` naming ``name`` instead of giving NaN images downstream.

    One float64 CPU matrix outside autograd and tracing (`warp_affine`'s and `warp_sample`'s
    case) is inverted in Python floats: the same operations, bit for bit, without a dozen
    tensor ops (0.6 ms of a 6 ms `warp_sample` call, measured with caches cold from warping).
    """
    if matrix.dtype == torch.float64 and matrix.numel() == 6 and plain([matrix]):
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
    """Check a fill value: a finite number, a sequence of them or a tensor (values unread).

    Anything but the number 0 needs ``nonzero_ok`` (``padding_mode="fill"``).
    """
    number = isinstance(fill, (int, float)) and not isinstance(fill, bool)
    if number:
        if not is_finite(fill):
            raise ValueError(f"{name} must be finite, got {fill!r}")
    elif isinstance(fill, Sequence) and not isinstance(fill, str):
        values = list(fill)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise TypeError(
                f"{name} must be a number, a sequence of numbers or a tensor, got {fill!r}"
            )
        if not all(is_finite(v) for v in values):
            raise ValueError(f"{name} must hold finite numbers, got {fill!r}")
    elif not isinstance(fill, Tensor):
        raise TypeError(
            f"{name} must be a number, a sequence of numbers or a tensor, got "
            f"{type(fill).__name__} ({fill!r})"
        )
    if not nonzero_ok and not (number and fill == 0):
        raise ValueError(f"{name}={fill!r} needs padding_mode='fill'")


def check_sample_options(
    target: object, mode: object, fill: object, mask_fill: object, min_size: object, keys: object
) -> None:
    """Type and range checks of `warp_sample`'s options, before anything is warped.

    ``mask_fill`` must fit the dtype of every integer ``Mask`` in ``target``.
    """
    from torchvision.tv_tensors import Mask

    check_type("mode", mode, str)
    check_choice("mode", mode, ("bilinear", "nearest"))
    check_fill("fill", fill, nonzero_ok=True)
    check_type("mask_fill", mask_fill, int)
    masks = [v for v in (target or {}).values() if isinstance(v, Mask)]
    for mask in masks:
        if mask.is_floating_point():
            continue
        info = None if mask.dtype == torch.bool else torch.iinfo(mask.dtype)
        low, high = (0, 1) if info is None else (info.min, info.max)
        if not low <= mask_fill <= high:
            raise ValueError(
                f"mask_fill={mask_fill} does not fit the masks' dtype {mask.dtype} "
                f"([{low}, {high}])"
            )
    if min_size is not None:
        check_type("min_size", min_size, (int, float))
        check_range("min_size", min_size, 0.0)
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(
            f"instance_keys must be a sequence of target keys (a tuple of str), got "
            f"{type(keys).__name__} ({keys!r})"
        )
    for i, key in enumerate(keys):
        check_type(f"instance_keys[{i}]", key, str)


def compose_affine(first: Tensor, second: Tensor) -> Tensor:
    """``first ∘ second`` for ``(..., 2, 3)`` affine matrices (apply ``second``, then ``first``).

    Element-wise products, not ``@``: ``torch.autocast`` would run a matmul in bfloat16/float16
    and move sample positions by up to a pixel.
    """
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


def native_warp(
    img: Tensor,
    inv: Tensor,
    size: tuple[int, int],
    mode: str,
    padding_mode: str,
    fill: object,
    fill_dtype: torch.dtype,
) -> Tensor | None:
    """The C kernel's result for constant padding on CPU, or ``None`` (see `warp_native`)."""
    if padding_mode not in ("zeros", "fill") or img.device.type != "cpu":
        return None
    value = None
    if padding_mode == "fill":
        if isinstance(fill, Tensor) and fill.device.type != "cpu":
            return None
        c = img.shape[1]
        value = fill_tensor(fill, c, fill_dtype, img.device).reshape(-1).expand(c)
    return warp_native(img, inv, size, mode, value)


def warp_nearest(
    img: Tensor, inv: Tensor, size: tuple[int, int], padding_mode: str, fill: object
) -> Tensor:
    """Nearest sampling by gather: exact for any dtype; ``img (B, C, H, W)``, ``inv (Bm, 2, 3)``.

    Constant padding on CPU without autograd runs the C kernel of `_warp_native` when it is
    available (the same values: it rounds the same float64 coordinates).
    """
    out = native_warp(img, inv, size, "nearest", padding_mode, fill, img.dtype)
    if out is not None:
        return out
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
    """Bilinear ``grid_sample`` (``align_corners=False``) on a numeric ``img (B, C, H, W)``.

    Sampled in float32 (float64 for float64 images); integer images are rounded half to even
    and clamped to their dtype's range. Constant padding on CPU without autograd runs the C
    kernel of `_warp_native` when it is available (same values up to float32 rounding).
    """
    work = torch.float64 if img.dtype == torch.float64 else torch.float32
    # The C kernel takes uint8 as it is (and rounds as below), other dtypes in `work`.
    src = img if img.dtype == torch.uint8 else img.to(work)
    out = native_warp(src, inv, size, "bilinear", padding_mode, fill, work)
    if out is not None:
        return out.to(img.dtype)
    if img.device.type == "cpu" and work != torch.float64:
        inv = inv.float()  # inverted in float64 for the kernel; a float32 grid is as good
    b, c, h, w = img.shape
    src = src.to(work)
    if padding_mode == "fill":
        # A one-pixel frame of `fill` sampled with "border" equals OpenCV's BORDER_CONSTANT:
        # neighbours outside the image take the fill value, and positions farther out clamp
        # onto the frame. One grid_sample instead of warping a ones-mask as well.
        value = fill_tensor(fill, c, work, img.device)
        framed = value.expand(b, c, h + 2, w + 2).clone()
        framed[:, :, 1:-1, 1:-1] = src
        src, h, w, padding_mode = framed, h + 2, w + 2, "border"
        shift = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=inv.dtype, device=inv.device)
        inv = inv + shift
    to_grid = normaliser((h, w), inv)
    gx, gy = source_coords(compose_affine(to_grid, inv), size)
    grid = torch.stack((gx, gy), dim=-1).to(work)
    if grid.shape[0] != b:
        grid = grid.expand(b, -1, -1, -1)  # a shared matrix: one grid, no copy
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)
    if not img.dtype.is_floating_point:
        info = torch.iinfo(img.dtype)
        out = out.round().clamp(info.min, info.max)
    return out.to(img.dtype)


def promoted_dtype(x: Tensor, matrix: Tensor) -> torch.dtype:
    """The result dtype of `warp_points` / `warp_boxes`: the promoted floating dtype."""
    dtype = torch.promote_types(x.dtype, matrix.dtype)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


def check_batch(name: str, x: Tensor, matrix: Tensor) -> None:
    """``matrix``'s leading dims must broadcast with ``x``'s ``(..., N, k)`` leading dims."""
    if matrix.dim() == 2:  # one matrix broadcasts with anything (and costs no shape algebra)
        return
    try:
        torch.broadcast_shapes(x.shape[:-2], matrix.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"matrix of shape {tuple(matrix.shape)} does not broadcast with {name} of shape "
            f"{tuple(x.shape)}: the leading dims {tuple(matrix.shape[:-2])} and "
            f"{tuple(x.shape[:-2])} must broadcast (e.g. (B, 2, 3) matrices with (B, N, "
            f"{x.shape[-1]}) {name})"
        ) from None


def tv_tensors_module() -> Any:
    """``torchvision.tv_tensors``, imported on first use (the ops import without torchvision)."""
    from torchvision import tv_tensors

    return tv_tensors


def drop_instances(
    out: dict[str, Any], keep: Tensor, num_boxes: int, instance_keys: Sequence[str]
) -> None:
    """Filter, in place, every per-box entry of a warped target by ``keep`` (`warp_sample`).

    Per-box entries: the ``BoundingBoxes``, ``(N, H, W)`` masks, ``(N, ..., 2)`` key points
    with their visibility (``f"{key}_visibility"``), the list under ``"polygons"`` (one entry
    per box) and the plain tensors under ``instance_keys``, whose lengths must equal
    ``num_boxes``.
    """
    tv = tv_tensors_module()
    key_points = getattr(tv, "KeyPoints", None)  # torchvision >= 0.23
    for key in instance_keys:
        value = out.get(key)
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] != num_boxes:
            raise ValueError(
                f"target[{key!r}] has {value.shape[0]} rows but there are {num_boxes} boxes"
            )
    if bool(keep.all()):
        return

    def take(value: Tensor) -> Tensor:
        kept = value.as_subclass(Tensor)[keep]
        return tv.wrap(kept, like=value) if isinstance(value, tv.TVTensor) else kept

    snapshot = dict(out)
    done: set[str] = set()
    for key, value in snapshot.items():
        if key in done:
            continue
        if key == "polygons" and isinstance(value, list) and len(value) == num_boxes:
            out[key] = [entry for entry, k in zip(value, keep.tolist(), strict=True) if k]
            continue
        if not isinstance(value, Tensor) or value.dim() == 0:
            continue
        per_box = value.shape[0] == num_boxes
        if isinstance(value, tv.TVTensor):
            is_points = key_points is not None and isinstance(value, key_points)
            is_instance = isinstance(value, tv.BoundingBoxes) or (
                per_box
                and (
                    (isinstance(value, tv.Mask) and value.dim() == 3)
                    or (is_points and value.dim() >= 3)
                )
            )
            if is_instance:
                out[key] = take(value)
                visibility = snapshot.get(f"{key}_visibility")
                if is_points and isinstance(visibility, Tensor):
                    out[f"{key}_visibility"] = take(visibility)  # (N, K) as the points
                    done.add(f"{key}_visibility")
        elif key in instance_keys:
            out[key] = value[keep]
        done.add(key)
