"""Tight boxes after a warp: each instance's box from its warped polygons or mask (`warp_sample`).

Warping the four corners of a box gives the box around the turned box, larger than the object
once the warp rotates or shears. Where a sample carries the objects themselves, their warped
shape gives the tight box: polygon vertices move like box corners (edge convention,
``M (p - 0.5) + 0.5``; see `visionblocks.ops.warp_targets`), a mask's box is that of its
object pixels. Nothing here reads tensor values on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._core.reduce import compute_dtype

_AXIS_TOLERANCE = 1e-6


def maps_axes_to_axes(matrix: Tensor) -> Tensor:
    """0-dim bool tensor: the ``(2, 3)`` matrix maps the x and y axes onto axes (no rotation
    or shear; flips, anisotropic scales and 90° turns included), up to ``1e-6`` relative (the
    rounding of ``cos 90°``). Nothing is read: a tensor for `torch.where`."""
    a, b = matrix[0, 0].abs(), matrix[0, 1].abs()
    c, d = matrix[1, 0].abs(), matrix[1, 1].abs()
    diagonal, off = torch.maximum(a, d), torch.maximum(b, c)
    return (off <= _AXIS_TOLERANCE * diagonal) | (diagonal <= _AXIS_TOLERANCE * off)


def check_polygons(polygons: object) -> list[list[Tensor]]:
    """``target["polygons"]``: one entry per instance, each a list of floating ``(P, 2)``."""
    what = (
        "target['polygons'] must be a list with one entry per instance, each a list of "
        "floating (P, 2) tensors"
    )
    if isinstance(polygons, (str, bytes, Tensor)) or not isinstance(polygons, Sequence):
        raise TypeError(f"{what}; got {type(polygons).__name__}")
    for i, entry in enumerate(polygons):
        if isinstance(entry, (str, bytes, Tensor)) or not isinstance(entry, Sequence):
            raise TypeError(f"{what}; got {type(entry).__name__} for instance {i}")
        for j, polygon in enumerate(entry):
            where = f"target['polygons'][{i}][{j}]"
            if not isinstance(polygon, Tensor) or not polygon.is_floating_point():
                got = polygon.dtype if isinstance(polygon, Tensor) else type(polygon).__name__
                raise TypeError(f"{where} must be a floating tensor of shape (P, 2), got {got}")
            if polygon.dim() != 2 or polygon.shape[-1] != 2:
                raise ValueError(f"{where} must have shape (P, 2), got {tuple(polygon.shape)}")
    return [[p.as_subclass(Tensor) for p in entry] for entry in polygons]


def warp_polygons(
    polygons: list[list[Tensor]], matrix: Tensor
) -> tuple[list[list[Tensor]], Tensor | None, list[int]]:
    """Warp every vertex like a box corner, ``M (p - 0.5) + 0.5``, in one call.

    Returns the warped polygons in their dtypes (on the matrix's device), all warped
    vertices in the computation dtype (None if there are none) and each instance's count.
    """
    flat = [p for entry in polygons for p in entry]
    counts = [sum(p.shape[0] for p in entry) for entry in polygons]
    if not flat:
        return [[] for _ in polygons], None, counts
    dtype = flat[0].dtype
    for p in flat[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    work = compute_dtype(torch.promote_types(dtype, matrix.dtype))
    stacked = torch.cat([p.to(device=matrix.device, dtype=work) for p in flat])
    m = matrix.to(work)
    p = stacked - 0.5  # as warp_points, element-wise (no bfloat16 matmul under autocast)
    moved = (
        torch.stack(
            (
                p[:, 0] * m[0, 0] + p[:, 1] * m[0, 1] + m[0, 2],
                p[:, 0] * m[1, 0] + p[:, 1] * m[1, 1] + m[1, 2],
            ),
            dim=-1,
        )
        + 0.5
    )
    pieces = iter(zip(moved.split([p.shape[0] for p in flat]), flat, strict=True))
    out = [[piece.to(p.dtype) for piece, p in (next(pieces) for _ in entry)] for entry in polygons]
    return out, moved, counts


def polygon_boxes(
    vertices: Tensor, counts: list[int], size: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """Each instance's box (min/max of its warped vertices, clipped to ``size``) and whether
    it has vertices at all; scatter-reduced, nothing read."""
    n = len(counts)
    repeats = torch.tensor(counts, dtype=torch.int64)
    index = torch.repeat_interleave(torch.arange(n), repeats, output_size=sum(counts))
    index = index.to(vertices.device).unsqueeze(-1).expand(-1, 2)
    low = vertices.new_full((n, 2), float("inf")).scatter_reduce(0, index, vertices, "amin")
    high = vertices.new_full((n, 2), float("-inf")).scatter_reduce(0, index, vertices, "amax")
    h, w = size
    limit = torch.tensor([w, h, w, h], dtype=vertices.dtype, device=vertices.device)
    boxes = torch.minimum(torch.cat((low, high), dim=-1).clamp(min=0), limit)
    found = torch.tensor([c > 0 for c in counts], dtype=torch.bool, device=vertices.device)
    return boxes, found


def mask_boxes(warped: Tensor, source: Tensor, mask_fill: int) -> tuple[Tensor, Tensor]:
    """Boxes of warped ``(N, H, W)`` masks, ``[min col, min row, max col + 1, max row + 1]``
    of their object pixels (nonzero and, for a nonzero ``mask_fill``, not equal to it), zeros
    for an empty one; and which instances' source mask has pixels (the others have nothing
    to measure). First/last nonzero by ``argmax``: nothing read."""
    solid = warped != 0
    if mask_fill != 0:
        solid = solid & (warped != mask_fill)
    cols = solid.any(-2).to(torch.uint8)  # (N, W)
    rows = solid.any(-1).to(torch.uint8)  # (N, H)
    w, h = cols.shape[-1], rows.shape[-1]
    first_x, first_y = cols.argmax(-1), rows.argmax(-1)
    end_x, end_y = w - cols.flip(-1).argmax(-1), h - rows.flip(-1).argmax(-1)
    boxes = torch.stack((first_x, first_y, end_x, end_y), dim=-1)
    boxes = boxes.masked_fill((cols.amax(-1) == 0).unsqueeze(-1), 0)
    drawn = (source != 0).flatten(1).any(-1)
    return boxes, drawn


def object_boxes(
    num: int,
    polygons: tuple[Tensor, Tensor] | None,
    masks: list[tuple[Tensor, Tensor]],
    mask_fill: int,
) -> tuple[Tensor, Tensor] | None:
    """The boxes of ``num`` instances from their warped objects — polygons first, else the
    first ``(num, H, W)`` mask — and which instances have an object; None if neither."""
    boxes = found = None
    mask = next(((m, src) for m, src in masks if m.shape[0] == num), None)
    if mask is not None:
        boxes, found = mask_boxes(*mask, mask_fill)
    if polygons is not None and polygons[0].shape[0] == num:
        poly_boxes, poly_found = polygons
        if boxes is None or found is None:
            return poly_boxes, poly_found
        boxes = torch.where(poly_found.unsqueeze(-1), poly_boxes, boxes.to(poly_boxes.dtype))
        found = poly_found | found
    if boxes is None or found is None:
        return None
    return boxes, found
