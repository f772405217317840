"""FCOS target assignment (private; the rule is `visionblocks.models.FCOSHead`'s)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks.ops._assign_blocks import reduce_blocks

__all__ = ["centerness_target", "grid_locations", "match_batch", "match_locations"]

_CHUNK = 1 << 22  # location-box pairs (all images) per block of the batched matching


def grid_locations(
    sizes: Sequence[tuple[int, int]], strides: Sequence[int], device: torch.device
) -> tuple[Tensor, Tensor]:
    """Locations of all levels, concatenated: ``(A, 2)`` ``(x, y)`` (FCOS's cell centres)
    and their level ``(A,)``."""
    points, levels = [], []
    for level, ((h, w), s) in enumerate(zip(sizes, strides)):
        ys = torch.arange(h, device=device, dtype=torch.float32) * s + s // 2
        xs = torch.arange(w, device=device, dtype=torch.float32) * s + s // 2
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack([grid_x.reshape(-1), grid_y.reshape(-1)], dim=1))
        levels.append(torch.full((h * w,), level, device=device, dtype=torch.long))
    return torch.cat(points), torch.cat(levels)


def match_locations(
    points: Tensor,
    point_strides: Tensor,
    point_ranges: Tensor,
    boxes: Tensor,
    labels: Tensor,
    num_classes: int,
    center_radius: float,
) -> tuple[Tensor, Tensor]:
    """Class target ``(A,)`` (``num_classes`` = background) and matched box ``(A, 4)`` of
    each location (``point_ranges``: its level's ``(low, high]`` bound on ``max(l, t, r,
    b)``; ``center_radius`` in strides, ``0``: the whole box)."""
    num_points = points.shape[0]
    if boxes.numel() == 0:
        background = torch.full((num_points,), num_classes, dtype=torch.long, device=points.device)
        return background, points.new_zeros(num_points, 4)
    boxes = boxes.to(points.dtype)
    area = _areas(
        points[:, 0, None], points[:, 1, None], boxes.unbind(1),
        point_strides[:, None].to(points.dtype) * center_radius, center_radius,
        point_ranges[:, :1], point_ranges[:, 1:],
    )  # fmt: skip
    best_area, best = area.min(dim=1)
    target = labels.to(torch.long)[best]
    target[torch.isinf(best_area)] = num_classes
    return target, boxes[best]


def _areas(
    x: Tensor,
    y: Tensor,
    box: Sequence[Tensor],
    r: Tensor,
    radius: float,
    low: Tensor,
    high: Tensor,
    valid: Tensor | None = None,
) -> Tensor:
    """Area of each box a location may take (inf for the others); the arguments broadcast
    (``x``, ``y``: the locations; ``box``: x0, y0, x1, y1; ``r``: the sampling radius)."""
    x0, y0, x1, y1 = box
    ltrb = torch.stack([x - x0, y - y0, x1 - x, y1 - y], dim=-1)
    inside = ltrb.min(dim=-1).values > 0
    if radius > 0:
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        left, top = torch.maximum(cx - r, x0), torch.maximum(cy - r, y0)
        right, bottom = torch.minimum(cx + r, x1), torch.minimum(cy + r, y1)
        inside &= (x > left) & (y > top) & (x < right) & (y < bottom)
    extent = ltrb.max(dim=-1).values
    fits = (extent > low) & (extent <= high)
    if valid is not None:
        fits &= valid
    area = ((x1 - x0) * (y1 - y0)).expand_as(extent)
    return torch.where(inside & fits, area, torch.full_like(area, float("inf")))


def match_batch(
    points: Tensor,
    point_strides: Tensor,
    point_ranges: Tensor,
    boxes: Sequence[Tensor],
    labels: Sequence[Tensor],
    num_classes: int,
    center_radius: float,
) -> tuple[Tensor, Tensor]:
    """`match_locations` of every image at once: ``(B, A)`` class targets and ``(B, A, 4)``
    matched boxes, the same values. Boxes are padded to the batch's largest count; the
    ``(B, A, N)`` areas are reduced block by block (`visionblocks.ops._assign_blocks.
    reduce_blocks`, at most ``_CHUNK`` location-box pairs a block)."""
    batch, device, num_points = len(boxes), points.device, points.shape[0]
    if num_points == 0:
        empty = torch.full((batch, 0), num_classes, dtype=torch.long, device=device)
        return empty, points.new_zeros(batch, 0, 4)
    width = max([1, *(len(b) for b in boxes)])
    padded = points.new_zeros(batch, width, 4)
    classes = torch.full((batch, width), num_classes, dtype=torch.long, device=device)
    valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
    counts = torch.tensor([len(b) for b in boxes], device=device)
    total = sum(len(b) for b in boxes)  # from the sizes: no host read of `counts`
    if total:
        image = torch.repeat_interleave(
            torch.arange(batch, device=device), counts, output_size=total
        )
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts, output_size=total)
        slot = torch.arange(len(image), device=device) - first
        padded[image, slot] = torch.cat(list(boxes)).to(points.dtype)
        classes[image, slot] = torch.cat(list(labels)).to(torch.long)
        valid[image, slot] = True
    box = [padded[:, None, :, k] for k in range(4)]  # (B, 1, N)

    def areas(start: int, stop: int) -> Tensor:
        """``(B, stop - start, N)`` `_areas` of locations ``start:stop`` (padding boxes come
        last and never match, so the first smallest box is `match_locations`')."""
        return _areas(
            points[None, start:stop, 0, None], points[None, start:stop, 1, None], box,
            point_strides[None, start:stop, None].to(points.dtype) * center_radius,
            center_radius, point_ranges[None, start:stop, :1], point_ranges[None, start:stop, 1:],
            valid[:, None, :],
        )  # fmt: skip

    block = max(1, _CHUNK // max(1, batch * width))
    best_area, best, _ = reduce_blocks(areas, num_points, block, largest=False)  # (B, A)
    target = torch.gather(classes, 1, best)
    target[torch.isinf(best_area)] = num_classes
    matched = torch.gather(padded, 1, best[..., None].expand(-1, -1, 4))
    return target, matched


def centerness_target(points: Tensor, boxes: Tensor) -> Tensor:
    """``sqrt(min(l, r) / max(l, r) * min(t, b) / max(t, b))`` of points inside their boxes."""
    left, top = points[:, 0] - boxes[:, 0], points[:, 1] - boxes[:, 1]
    right, bottom = boxes[:, 2] - points[:, 0], boxes[:, 3] - points[:, 1]
    lr = torch.minimum(left, right) / torch.maximum(left, right).clamp(min=1e-6)
    tb = torch.minimum(top, bottom) / torch.maximum(top, bottom).clamp(min=1e-6)
    return torch.sqrt((lr * tb).clamp(min=0))
