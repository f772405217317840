"""FCOS target assignment (private; see `visionblocks.models.fcos`).

Every location (the centre of a feature-map cell, in input pixels) is matched to at most one
ground-truth box: the smallest box that contains the location (within the centre-sampling
radius of the box centre) and whose regression extent suits the location's level.
`match_batch` finds it for a whole batch with the blocked best-match reduction of the anchor
assignment ops (`visionblocks.ops._assign_blocks.reduce_blocks`), block of locations by block
of locations, so the ``(B, A, N)`` location-box matrices are never built whole.
"""

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
    """Locations of all levels, concatenated: ``(A, 2)`` ``(x, y)`` and their level ``(A,)``.

    Cell ``(i, j)`` of a level with stride ``s`` is at ``(j * s + s // 2, i * s + s // 2)``,
    as in FCOS.
    """
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
    """Class target ``(A,)`` (``num_classes`` = background) and matched box ``(A, 4)``.

    Args:
        points (Tensor[A, 2]): Locations ``(x, y)``.
        point_strides (Tensor[A]): Stride of each location's level.
        point_ranges (Tensor[A, 2]): ``(low, high]`` bound on ``max(l, t, r, b)`` for the
            location's level.
        boxes (Tensor[N, 4]): Ground truth, XYXY.
        labels (Tensor[N]): Their classes.
        num_classes: The background value of the class target.
        center_radius: Centre sampling radius in strides (``0`` or less: the whole box).
    """
    num_points = points.shape[0]
    if boxes.numel() == 0:
        background = torch.full((num_points,), num_classes, dtype=torch.long, device=points.device)
        return background, points.new_zeros(num_points, 4)
    boxes = boxes.to(points.dtype)
    x, y = points[:, 0, None], points[:, 1, None]  # (A, 1)
    ltrb = torch.stack(
        [x - boxes[:, 0], y - boxes[:, 1], boxes[:, 2] - x, boxes[:, 3] - y], dim=2
    )  # (A, N, 4)
    inside = ltrb.min(dim=2).values > 0
    if center_radius > 0:
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        r = point_strides[:, None].to(points.dtype) * center_radius
        left = torch.maximum(cx - r, boxes[:, 0])
        top = torch.maximum(cy - r, boxes[:, 1])
        right = torch.minimum(cx + r, boxes[:, 2])
        bottom = torch.minimum(cy + r, boxes[:, 3])
        inside &= (x > left) & (y > top) & (x < right) & (y < bottom)
    extent = ltrb.max(dim=2).values
    fits = (extent > point_ranges[:, :1]) & (extent <= point_ranges[:, 1:])
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))[None].expand(num_points, -1)
    area = torch.where(inside & fits, area, torch.full_like(area, float("inf")))
    best_area, best = area.min(dim=1)
    target = labels.to(torch.long)[best]
    target[torch.isinf(best_area)] = num_classes
    return target, boxes[best]


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
    matched boxes, the same values (each image's boxes are padded to the batch's largest
    count with boxes that match nothing; a whole batch is a few dozen tensor operations
    instead of that many per image). The ``(B, A, N)`` areas are never built whole: the
    smallest matching box of each location is a blocked reduction over blocks of locations
    (`visionblocks.ops._assign_blocks.reduce_blocks`, the reduction of the anchor
    assignment ops) of at most ``_CHUNK`` location-box pairs, so memory stays that of one
    block, and the results do not depend on the block size.
    """
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
    x0, y0, x1, y1 = (padded[:, None, :, k] for k in range(4))  # (B, 1, N)
    box_area = (x1 - x0) * (y1 - y0)

    def areas(start: int, stop: int) -> Tensor:
        """Areas ``(B, stop - start, N)`` of the boxes that locations ``start:stop`` may take
        (padding boxes come after the real ones and are never a match: infinity, so a
        location's first smallest box and the no-match index 0 are `match_locations`')."""
        x, y = points[None, start:stop, 0, None], points[None, start:stop, 1, None]
        ltrb = torch.stack([x - x0, y - y0, x1 - x, y1 - y], dim=3)  # (B, rows, N, 4)
        inside = ltrb.min(dim=3).values > 0
        if center_radius > 0:
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            r = point_strides[None, start:stop, None].to(points.dtype) * center_radius
            left, top = torch.maximum(cx - r, x0), torch.maximum(cy - r, y0)
            right, bottom = torch.minimum(cx + r, x1), torch.minimum(cy + r, y1)
            inside &= (x > left) & (y > top) & (x < right) & (y < bottom)
        extent = ltrb.max(dim=3).values
        low, high = point_ranges[None, start:stop, :1], point_ranges[None, start:stop, 1:]
        fits = (extent > low) & (extent <= high) & valid[:, None, :]
        area = box_area.expand_as(extent)
        return torch.where(inside & fits, area, torch.full_like(area, float("inf")))

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
