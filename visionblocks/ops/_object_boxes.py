"""Boxes of warped objects for `warp_sample`: tight boxes from polygons and masks, and
rotated boxes (the rules are in `visionblocks.transforms.sample`). Nothing here reads tensor
values on the host, except the boxes of CPU ``uint8``/``bool`` masks measured by OpenCV."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._core.tensor_checks import compute_dtype
from visionblocks.ops._warp_opencv import eager_cpu, opencv

_AXIS_TOLERANCE = 1e-6


def maps_axes_to_axes(matrix: Tensor) -> Tensor:
    """0-dim bool tensor: the ``(2, 3)`` matrix maps axes onto axes (flips, scales, 90° turns;
    no rotation or shear), up to ``1e-6`` relative (the rounding of ``cos 90°``)."""
    a, b = matrix[0, 0].abs(), matrix[0, 1].abs()
    c, d = matrix[1, 0].abs(), matrix[1, 1].abs()
    diagonal, off = torch.maximum(a, d), torch.maximum(b, c)
    return (off <= _AXIS_TOLERANCE * diagonal) | (diagonal <= _AXIS_TOLERANCE * off)


def move_edge_points(points: Tensor, matrix: Tensor) -> Tensor:
    """``M (p - 0.5) + 0.5`` for edge-convention ``points (..., 2)``, element-wise."""
    p = points - 0.5
    x = p[..., 0] * matrix[0, 0] + p[..., 1] * matrix[0, 1] + matrix[0, 2]
    y = p[..., 0] * matrix[1, 0] + p[..., 1] * matrix[1, 1] + matrix[1, 2]
    return torch.stack((x, y), dim=-1) + 0.5


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
    """The warped polygons (their dtypes, the matrix's device), all warped vertices in the
    computation dtype (None if none) and each instance's vertex count."""
    flat = [p for entry in polygons for p in entry]
    counts = [sum(p.shape[0] for p in entry) for entry in polygons]
    if not flat:
        return [[] for _ in polygons], None, counts
    dtype = flat[0].dtype
    for p in flat[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    work = compute_dtype(torch.promote_types(dtype, matrix.dtype))
    stacked = torch.cat([p.to(device=matrix.device, dtype=work) for p in flat])
    moved = move_edge_points(stacked, matrix.to(work))
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


def _occupied(masks: Tensor, mask_fill: int, dim: int) -> Tensor:
    """uint8, 1 where ``masks`` has an object pixel (nonzero, not a nonzero ``mask_fill``)
    along ``dim``; uint8 and bool masks reduce with ``amax`` directly."""
    if mask_fill == 0 and masks.dtype in (torch.uint8, torch.bool):
        flat = masks.view(torch.uint8) if masks.dtype == torch.bool else masks
        return (flat.amax(dim) != 0).to(torch.uint8)
    solid = masks != 0
    if mask_fill != 0:
        solid = solid & (masks != mask_fill)
    return solid.any(dim).to(torch.uint8)


def mask_boxes(warped: Tensor, source: Tensor, mask_fill: int) -> tuple[Tensor, Tensor]:
    """Boxes of the object pixels of warped ``(N, H, W)`` masks (zeros for an empty one) and
    which source masks have pixels; ``cv2.boundingRect`` where `eager_cpu` allows."""
    cv2 = opencv()
    plain = warped.dtype in (torch.uint8, torch.bool) and source.dtype in (torch.uint8, torch.bool)
    if cv2 is not None and plain and mask_fill == 0 and eager_cpu(warped, source):
        boxes = [cv2.boundingRect(m) for m in warped.contiguous().view(torch.uint8).numpy()]
        sources = source.contiguous().view(torch.uint8).numpy()  # read only for empty results
        drawn = [w > 0 or cv2.hasNonZero(m) for (_, _, w, _), m in zip(boxes, sources)]
        xyxy = [[x, y, x + w, y + h] for x, y, w, h in boxes]
        return torch.tensor(xyxy, dtype=torch.int64).view(-1, 4), torch.tensor(
            drawn, dtype=torch.bool
        )
    cols = _occupied(warped, mask_fill, -2)  # (N, W): 1 where a column has object pixels
    rows = _occupied(warped, mask_fill, -1)  # (N, H)
    w, h = cols.shape[-1], rows.shape[-1]
    first_x, first_y = cols.argmax(-1), rows.argmax(-1)
    end_x, end_y = w - cols.flip(-1).argmax(-1), h - rows.flip(-1).argmax(-1)
    boxes = torch.stack((first_x, first_y, end_x, end_y), dim=-1)
    boxes = boxes.masked_fill((cols.amax(-1) == 0).unsqueeze(-1), 0)
    drawn = _occupied(source.flatten(1), 0, -1).bool()
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


# ---------------------------------------------------------------------------- rotated boxes

_MIRRORED_ORDER = [1, 0, 3, 2]
"""Corner order that restores torchvision's after a mirroring warp (its ``horizontal_flip``)."""


def warp_rotated_boxes(boxes: Tensor, fmt: str, matrix: Tensor) -> tuple[Tensor, Tensor]:
    """Rotated ``boxes`` of torchvision format ``fmt`` warped by one ``(2, 3)`` matrix, as
    `visionblocks.transforms.sample` states, and their warped corners ``(..., 4, 2)``; both
    in the computation dtype. The enclosing rectangle of a parallelogram lies along its
    longer side (rotating calipers), picked in closed form with `torch.where`."""
    from torchvision.transforms.v2.functional import convert_bounding_box_format as convert

    floating = boxes.dtype if boxes.is_floating_point() else torch.get_default_dtype()
    work = compute_dtype(torch.promote_types(floating, matrix.dtype))
    boxes, m = boxes.to(work), matrix.to(work)
    mirrored = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0] < 0
    corners = convert(boxes, old_format=fmt, new_format="XYXYXYXY").unflatten(-1, (4, 2))
    moved = move_edge_points(corners, m)
    if fmt == "XYXYXYXY":
        out = torch.where(mirrored, moved[..., _MIRRORED_ORDER, :], moved)
        return out.flatten(-2), moved
    cx, cy, w, h, angle = convert(boxes, old_format=fmt, new_format="CXCYWHR").unbind(-1)
    rad = angle * (torch.pi / 180.0)
    cos, sin = rad.cos(), rad.sin()
    # torchvision's sides: width along u = (cos, -sin), height along v = (sin, cos).
    sign = torch.where(mirrored, -1.0, 1.0).to(work)  # mirrored: the width side turns back
    ax = sign * (m[0, 0] * cos - m[0, 1] * sin)
    ay = sign * (m[1, 0] * cos - m[1, 1] * sin)
    bx = m[0, 0] * sin + m[0, 1] * cos
    by = m[1, 0] * sin + m[1, 1] * cos
    len_a, len_b = torch.hypot(ax, ay), torch.hypot(bx, by)
    # The enclosing rectangle along the longer warped side is the smaller (a tie: the width's).
    along_b = (h * len_b).abs() > (w * len_a).abs()
    ux = torch.where(along_b, by / len_b, ax / len_a)
    uy = torch.where(along_b, -bx / len_b, ay / len_a)
    nx, ny = -uy, ux  # the new height side, torchvision's v for u
    width = (w * (ax * ux + ay * uy)).abs() + (h * (bx * ux + by * uy)).abs()
    height = (w * (ax * nx + ay * ny)).abs() + (h * (bx * nx + by * ny)).abs()
    centre = move_edge_points(torch.stack((cx, cy), dim=-1), m)
    turned = torch.atan2(-uy, ux) * (180.0 / torch.pi)
    fitted = torch.cat((centre, torch.stack((width, height, turned), dim=-1)), dim=-1)
    return convert(fitted, old_format="CXCYWHR", new_format=fmt), moved
