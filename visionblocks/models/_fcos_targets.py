"""FCOS target assignment (private; see `visionblocks.models.fcos`).

Every location (the centre of a feature-map cell, in input pixels) is matched to at most one
ground-truth box: the smallest box that contains the location (within the centre-sampling
radius of the box centre) and whose regression extent suits the location's level.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["centerness_target", "grid_locations", "match_batch", "match_locations"]

_CHUNK = 1 << 22  # locations x boxes per batched matching pass


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
    instead of that many per image). Images go in chunks of at most ``2**22`` location-box
    pairs, so memory stays that of a few images.
    """
    num_points, start, outputs = points.shape[0], 0, []
    while start < len(boxes):
        stop, widest = start, 1
        while stop < len(boxes):
            widest_next = max(widest, boxes[stop].shape[0])
            if stop > start and (stop + 1 - start) * num_points * widest_next > _CHUNK:
                break
            widest, stop = widest_next, stop + 1
        outputs.append(
            _match_chunk(points, point_strides, point_ranges, boxes[start:stop],
                         labels[start:stop], num_classes, center_radius, widest)
        )  # fmt: skip
        start = stop
    classes, matched = zip(*outputs)
    return torch.cat(classes), torch.cat(matched)


def _match_chunk(
    points: Tensor,
    point_strides: Tensor,
    point_ranges: Tensor,
    boxes: Sequence[Tensor],
    labels: Sequence[Tensor],
    num_classes: int,
    center_radius: float,
    width: int,
) -> tuple[Tensor, Tensor]:
    """`match_batch` of images whose boxes are padded to ``width`` (zero boxes that are never
    a match: their area is set to infinity, and they come after the real ones, so a
    location's first smallest box and the no-match index 0 are those of `match_locations`)."""
    batch, device = len(boxes), points.device
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
    x, y = points[None, :, 0, None], points[None, :, 1, None]  # (1, A, 1)
    x0, y0, x1, y1 = (padded[:, None, :, k] for k in range(4))  # (B, 1, N)
    ltrb = torch.stack([x - x0, y - y0, x1 - x, y1 - y], dim=3)  # (B, A, N, 4)
    inside = ltrb.min(dim=3).values > 0
    if center_radius > 0:
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        r = point_strides[None, :, None].to(points.dtype) * center_radius
        left, top = torch.maximum(cx - r, x0), torch.maximum(cy - r, y0)
        right, bottom = torch.minimum(cx + r, x1), torch.minimum(cy + r, y1)
        inside &= (x > left) & (y > top) & (x < right) & (y < bottom)
    extent = ltrb.max(dim=3).values
    low, high = point_ranges[None, :, :1], point_ranges[None, :, 1:]
    fits = (extent > low) & (extent <= high) & valid[:, None, :]
    area = ((x1 - x0) * (y1 - y0)).expand_as(extent)
    area = torch.where(inside & fits, area, torch.full_like(area, float("inf")))
    best_area, best = area.min(dim=2)  # (B, A)
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
