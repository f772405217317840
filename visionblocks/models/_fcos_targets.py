"""FCOS target assignment (private; see `visionblocks.models.fcos`).

Every location (the centre of a feature-map cell, in input pixels) is matched to at most one
ground-truth box: the smallest box that contains the location (within the centre-sampling
radius of the box centre) and whose regression extent suits the location's level.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["centerness_target", "grid_locations", "match_locations"]


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


def centerness_target(points: Tensor, boxes: Tensor) -> Tensor:
    """``sqrt(min(l, r) / max(l, r) * min(t, b) / max(t, b))`` of points inside their boxes."""
    left, top = points[:, 0] - boxes[:, 0], points[:, 1] - boxes[:, 1]
    right, bottom = boxes[:, 2] - points[:, 0], boxes[:, 3] - points[:, 1]
    lr = torch.minimum(left, right) / torch.maximum(left, right).clamp(min=1e-6)
    tb = torch.minimum(top, bottom) / torch.maximum(top, bottom).clamp(min=1e-6)
    return torch.sqrt((lr * tb).clamp(min=0))
