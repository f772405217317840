"""Drawing the synthetic COCO images (private; see `visionblocks.data.synthetic`).

Shapes as polygons, textured backgrounds, contrasting colours, non-overlapping placement,
rasterisation with pycocotools (so painted pixels are exactly ``COCO.annToMask``), crowd
regions as uncompressed RLE, and the key points of the ``figure`` class.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pycocotools.mask as mask_utils
from PIL import Image

__all__ = ["FIGURE", "SYNTHETIC_CLASSES", "figure_category", "render"]

SYNTHETIC_CLASSES: tuple[str, ...] = (
    "circle",
    "square",
    "triangle",
    "star",
    "cross",
    "diamond",
    "hexagon",
    "crescent",
    "arrow",
    "heart",
)
"""The shapes of `make_synthetic_coco`, in class order: class ``k`` (0-based) is drawn as
``SYNTHETIC_CLASSES[k]`` and its COCO category is named so. ``num_classes=K`` uses the first
``K`` (at most 10)."""

_MIN_DIAMETER = 10.0  # pixels: smaller shapes cannot be told apart
_EDGE = 1.0  # objects keep this many pixels from the image border
_GAP = 2.0  # and this many pixels between their boxes
_MIN_CONTRAST = 120.0  # Euclidean RGB distance between an object and the background under it
_PLACE_TRIES = 50  # positions tried for one drawn shape
_SHAPE_TRIES = 20  # shapes drawn for one object

FIGURE = "figure"
"""The class of ``make_synthetic_coco(keypoints=True)``: a gingerbread figure with key points."""
_FIGURE_KEYPOINTS = (
    "head",
    "left_shoulder",
    "right_shoulder",
    "left_hand",
    "right_hand",
    "left_hip",
    "right_hip",
    "left_foot",
    "right_foot",
)
# 1-based, as COCO's skeleton
_FIGURE_SKELETON = [[1, 2], [1, 3], [2, 3], [2, 4], [3, 5], [2, 6], [3, 7], [6, 7], [6, 8], [7, 9]]
_FIGURE_SIGMAS = [0.05, 0.079, 0.079, 0.062, 0.062, 0.107, 0.107, 0.089, 0.089]
_MIN_FIGURE = 24.0  # pixels: thinner limbs would not hold their key points
_FIGURE_TURN = 20.0  # degrees: figures stay upright
_UNLABELLED, _OCCLUDED = 0.1, 0.15  # chances that a key point is v = 0, v = 1


def _circle(n: int) -> np.ndarray:
    t = np.linspace(0.0, 2.0 * math.pi, n, endpoint=False)
    return np.stack([np.cos(t), np.sin(t)], axis=1)


def _crescent() -> np.ndarray:
    # The unit disc minus the disc of radius 0.8 centred at (0.45, 0): they cross at x = 0.625.
    y_cross = math.sqrt(1.0 - 0.625**2)
    a_out = math.atan2(y_cross, 0.625)
    a_in = math.atan2(y_cross, 0.625 - 0.45)
    outer = np.linspace(a_out, 2.0 * math.pi - a_out, 28)
    inner = np.linspace(2.0 * math.pi - a_in, a_in, 20)[1:-1]
    return np.concatenate(
        [
            np.stack([np.cos(outer), np.sin(outer)], axis=1),
            np.stack([0.45 + 0.8 * np.cos(inner), 0.8 * np.sin(inner)], axis=1),
        ]
    )


def _heart() -> np.ndarray:
    t = np.linspace(0.0, 2.0 * math.pi, 48, endpoint=False)
    x = 16.0 * np.sin(t) ** 3
    y = -(13.0 * np.cos(t) - 5.0 * np.cos(2 * t) - 2.0 * np.cos(3 * t) - np.cos(4 * t))
    xy = np.stack([x, y + 2.5], axis=1)  # y points down in images; roughly centre it
    return xy / np.abs(xy).max()


def _star() -> np.ndarray:
    t = -math.pi / 2 + np.arange(10) * math.pi / 5
    r = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=1)


def _figure() -> tuple[np.ndarray, np.ndarray]:
    """A gingerbread figure facing the viewer (its left on the image's right, +x, as COCO's
    persons) and its key points inside it, in `_FIGURE_KEYPOINTS` order; y points down."""
    t = np.radians(np.linspace(-90.0, 66.4, 9))
    head = np.stack([0.3 * np.cos(t), -0.7 + 0.3 * np.sin(t)], axis=1)
    body = [(0.12, -0.4), (0.35, -0.38), (0.95, -0.2), (0.95, 0.0), (0.35, -0.12)]
    body += [(0.32, 0.25), (0.6, 0.95), (0.6, 1.0), (0.3, 1.0), (0.0, 0.35)]
    half = np.concatenate([head, np.array(body)])  # the +x half, top to crotch
    other = half[1:-1][::-1] * np.array([-1.0, 1.0])  # mirrored, crotch back to the top
    outline = np.concatenate([half, other]) * 0.85
    points = [(0.0, -0.7), (0.28, -0.3), (-0.28, -0.3), (0.85, -0.125), (-0.85, -0.125)]
    points += [(0.2, 0.22), (-0.2, 0.22), (0.41, 0.88), (-0.41, 0.88)]
    return outline, np.array(points) * 0.85


_FIGURE_OUTLINE, _FIGURE_POINTS = _figure()


def figure_category(category_id: int) -> dict[str, Any]:
    """The COCO category of the figure: its key point names, 1-based skeleton and sigmas."""
    return {
        "id": category_id,
        "name": FIGURE,
        "supercategory": FIGURE,
        "keypoints": list(_FIGURE_KEYPOINTS),
        "skeleton": [list(bone) for bone in _FIGURE_SKELETON],
        "sigmas": list(_FIGURE_SIGMAS),
    }


def _unit_shapes() -> dict[str, tuple[np.ndarray, float]]:
    """``name -> (outline (K, 2) inside the unit disc, largest random rotation in degrees)``."""
    a, b = 0.3, 0.95
    cross = [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a)]
    cross += [(a, b), (-a, b), (-a, a), (-b, a), (-b, -a), (-a, -a)]
    arrow = [(-1.0, -0.22), (0.15, -0.22), (0.15, -0.6), (0.97, 0.0)]
    arrow += [(0.15, 0.6), (0.15, 0.22), (-1.0, 0.22)]
    s = 0.7
    return {
        "circle": (_circle(40), 0.0),
        "square": (np.array([(-s, -s), (s, -s), (s, s), (-s, s)]), 15.0),
        "triangle": (_circle(3), 180.0),
        "star": (_star(), 180.0),
        "cross": (np.array(cross), 15.0),
        "diamond": (np.array([(0.0, -1.0), (0.6, 0.0), (0.0, 1.0), (-0.6, 0.0)]), 15.0),
        "hexagon": (_circle(6), 180.0),
        "crescent": (_crescent(), 180.0),
        "arrow": (np.array(arrow) * 0.98, 180.0),
        "heart": (_heart(), 25.0),
        FIGURE: (_FIGURE_OUTLINE, _FIGURE_TURN),
    }


_SHAPES = _unit_shapes()


def _shape(rng: np.random.Generator, name: str, size: float) -> np.ndarray:
    """Outline of ``name`` about ``size`` pixels across, randomly stretched and turned."""
    return _shape_and_points(rng, name, size)[0]


def _shape_and_points(
    rng: np.random.Generator, name: str, size: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """`_shape`, and the figure's key points moved with it (None for other shapes)."""
    outline, max_turn = _SHAPES[name]
    stretch = rng.uniform(0.85, 1.15, size=2)
    turn = math.radians(rng.uniform(-max_turn, max_turn))
    c, s = math.cos(turn), math.sin(turn)
    rotation = np.array([[c, s], [-s, c]])
    points = (_FIGURE_POINTS * stretch * (size / 2.0)) @ rotation if name == FIGURE else None
    return (outline * stretch * (size / 2.0)) @ rotation, points


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A textured ``(H, W, 3)`` uint8 background: gradient, stripes, checkers or smooth noise."""
    base = rng.uniform(40.0, 215.0, size=3)
    other = np.clip(base + rng.uniform(-45.0, 45.0, size=3), 0.0, 255.0)
    ys = np.arange(h, dtype=np.float32)[:, None]
    xs = np.arange(w, dtype=np.float32)[None, :]
    angle = rng.uniform(0.0, math.pi)
    kind = int(rng.integers(4))
    if kind == 0:  # linear gradient
        proj = xs * math.cos(angle) + ys * math.sin(angle)
        t = (proj - proj.min()) / max(float(proj.max() - proj.min()), 1.0)
    elif kind == 1:  # soft stripes
        period = rng.uniform(6.0, 24.0)
        t = 0.5 + 0.5 * np.sin(
            (xs * math.cos(angle) + ys * math.sin(angle)) * (2 * math.pi / period)
        )
    elif kind == 2:  # checkers
        cell = int(rng.integers(8, 33))
        t = ((xs.astype(np.int64) // cell + ys.astype(np.int64) // cell) % 2).astype(np.float32)
    else:  # smooth noise: a coarse random grid, bilinearly upsampled
        grid = rng.random((int(rng.integers(3, 9)), int(rng.integers(3, 9))), dtype=np.float32)
        t = np.asarray(Image.fromarray(grid).resize((w, h), Image.Resampling.BILINEAR))
    t = np.broadcast_to(t, (h, w)).astype(np.float32)
    noise = (rng.random((h, w), dtype=np.float32) - 0.5) * 14.0  # grey, uniform, sigma ~4
    image = np.empty((h, w, 3), dtype=np.uint8)
    for c in range(3):  # plane by plane: numpy is slow on a trailing axis of size 3
        plane = float(base[c] + 0.5) + t * float(other[c] - base[c]) + noise
        image[..., c] = np.clip(plane, 0.0, 255.0, out=plane)  # + 0.5 above: rounds
    return image


def _contrasting_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A random RGB colour at least ``_MIN_CONTRAST`` away from the mean colour ``under``."""
    for _ in range(32):
        colour = rng.integers(0, 256, size=3)
        if np.linalg.norm(colour - under) >= _MIN_CONTRAST:
            return colour.astype(np.uint8)
    return np.where(under > 127.5, 0, 255).astype(np.uint8)


def _place(
    rng: np.random.Generator, extent: np.ndarray, h: int, w: int, taken: list[np.ndarray]
) -> np.ndarray | None:
    """Shift ``(dx, dy)`` that puts the box ``extent = [x0, y0, x1, y1]`` inside the image and
    at least ``_GAP`` pixels away from every box in ``taken``; None when no try succeeds."""
    lo = _EDGE - extent[:2]
    hi = np.array([w - _EDGE, h - _EDGE]) - extent[2:]
    if np.any(hi < lo):
        return None
    for _ in range(_PLACE_TRIES):
        shift = rng.uniform(lo, hi)
        box = extent + np.tile(shift, 2)
        if all(
            box[0] >= t[2] + _GAP
            or t[0] >= box[2] + _GAP
            or box[1] >= t[3] + _GAP
            or t[1] >= box[3] + _GAP
            for t in taken
        ):
            return shift
    return None


def _rasterise(polygon: list[float], h: int, w: int) -> tuple[np.ndarray, float]:
    """The ``(H, W)`` bool mask and area pycocotools gives ``polygon`` (as ``annToMask``)."""
    rle = mask_utils.merge(mask_utils.frPyObjects([polygon], h, w))
    with warnings.catch_warnings():  # pycocotools 2.0.x under numpy 2 warns about __array__
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        mask = mask_utils.decode(rle)
    return mask.astype(bool), float(mask_utils.area(rle))


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE: run lengths over the column-major mask, starting with zeros."""
    flat = mask.ravel(order="F")
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    if flat[0]:
        counts = [0, *counts]
    return {"counts": counts, "size": [int(mask.shape[0]), int(mask.shape[1])]}


def _draw(
    rng: np.random.Generator, name: str, size: tuple[float, float], h: int, w: int, taken: list
) -> tuple[list[float], np.ndarray, float, tuple[slice, slice], np.ndarray | None] | None:
    """A placed polygon of shape ``name`` with its mask, area, a window around it and, for
    the figure, its key points ``(K, 2)`` (pixel indices, 2 decimals; None for the others)."""
    for _ in range(_SHAPE_TRIES):
        diameter = max(rng.uniform(*size) * min(h, w), min(_MIN_DIAMETER, min(h, w) - 2 * _EDGE))
        if name == FIGURE:
            diameter = max(diameter, min(_MIN_FIGURE, min(h, w) - 2 * _EDGE))
        outline, points = _shape_and_points(rng, name, diameter)
        span = np.ptp(outline, axis=0)
        factor = min(1.0, (w - 2 * _EDGE) / span[0], (h - 2 * _EDGE) / span[1])
        outline = outline * factor
        shift = _place(rng, np.concatenate([outline.min(0), outline.max(0)]), h, w, taken)
        if shift is None:
            return None  # no room left: more tries would not help
        polygon = np.round(outline + shift, 2)
        box = np.concatenate([polygon.min(0), polygon.max(0)])
        polygon = polygon.ravel().tolist()
        mask, area = _rasterise(polygon, h, w)
        window = (
            slice(max(0, int(box[1]) - 1), min(h, math.ceil(box[3]) + 1)),
            slice(max(0, int(box[0]) - 1), min(w, math.ceil(box[2]) + 1)),
        )
        if points is not None:
            # continuous (pixel (i, j) covers [j, j + 1)) -> pixel indices (centres on integers)
            points = np.round(points * factor + shift - 0.5, 2)
            if not _on_mask(points, mask):
                continue
        if area > 0 and np.abs(_mask_box(mask[window], window) - box).max() <= 1.0:
            taken.append(box)
            return polygon, mask, area, window, points
    return None


def _on_mask(points: np.ndarray, mask: np.ndarray) -> bool:
    """Every point (pixel indices) lies on a pixel of ``mask``."""
    cols, rows = np.floor(points + 0.5).astype(np.int64).T
    h, w = mask.shape
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    return bool(inside.all() and mask[rows, cols].all())


def _keypoint_fields(rng: np.random.Generator, points: np.ndarray) -> dict[str, Any]:
    """COCO's ``keypoints`` and ``num_keypoints`` of ``points``, with random flags: v = 0
    (coordinates 0, as COCO writes them), 1 (labelled, not visible) or 2."""
    draws = rng.random(len(points))
    flags = np.where(draws < _UNLABELLED, 0, np.where(draws < _UNLABELLED + _OCCLUDED, 1, 2))
    values: list[float | int] = []
    for (x, y), v in zip(points.tolist(), flags.tolist()):
        values += [x, y, v] if v else [0, 0, 0]
    return {"keypoints": values, "num_keypoints": int((flags > 0).sum())}


def _mask_box(mask: np.ndarray, window: tuple[slice, slice]) -> np.ndarray:
    """Tight ``[x0, y0, x1, y1]`` box of a non-empty ``mask`` cut from the image at ``window``."""
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    top, left = window[0].start, window[1].start
    return np.array([left + cols[0], top + rows[0], left + cols[-1] + 1, top + rows[-1] + 1])


def _objects(
    rng: np.random.Generator, image: np.ndarray, taken: list[np.ndarray], opts: dict[str, Any]
) -> list[dict[str, Any]]:
    """Paint non-overlapping shapes on ``image`` and return their annotations."""
    h, w = image.shape[:2]
    ids, names = opts["category_ids"], _names(opts)
    anns = []
    for _ in range(int(rng.integers(opts["min_objects"], opts["max_objects"] + 1))):
        if opts.get("keypoints"):  # half the objects are figures (all, without shapes)
            shapes = len(ids) - 1
            label = shapes if not shapes or rng.random() < 0.5 else int(rng.integers(shapes))
        else:
            label = int(rng.integers(len(ids)))
        drawn = _draw(rng, names[label], opts["object_size"], h, w, taken)
        if drawn is None:
            continue
        polygon, mask, area, window, points = drawn
        # Paint through the window: much cheaper than indexing the whole image.
        patch, inside = image[window], mask[window]
        patch[inside] = _contrasting_colour(rng, patch[inside].mean(0))
        x0, y0, x1, y1 = taken[-1].tolist()
        ann = {
            "category_id": ids[label],
            "segmentation": [polygon],
            "bbox": [x0, y0, round(x1 - x0, 2), round(y1 - y0, 2)],
            "area": area,
            "iscrowd": 0,
        }
        if points is not None:
            ann.update(_keypoint_fields(rng, points))
        anns.append(ann)
    return anns


def _names(opts: dict[str, Any]) -> list[str]:
    """The class name of each category id: the shapes, then the figure with key points."""
    shapes = len(opts["category_ids"]) - (1 if opts.get("keypoints") else 0)
    return [*SYNTHETIC_CLASSES[:shapes], *([FIGURE] if opts.get("keypoints") else [])]


def _crowd(
    rng: np.random.Generator, image: np.ndarray, box: np.ndarray, opts: dict[str, Any]
) -> list[dict[str, Any]]:
    """Paint 3 to 8 small shapes of one class inside ``box``; one crowd annotation of them.
    With key points, the crowd is of figures, none of its key points labelled (as COCO's
    crowds of persons)."""
    h, w = image.shape[:2]
    ids, names = opts["category_ids"], _names(opts)
    label = len(ids) - 1 if opts.get("keypoints") else int(rng.integers(len(ids)))
    mask = np.zeros((h, w), dtype=bool)
    for _ in range(int(rng.integers(3, 9))):
        size = max(3.0, rng.uniform(0.04, 0.08) * min(h, w))
        outline = _shape(rng, names[label], size)
        lo, hi = box[:2] - outline.min(0), box[2:] - outline.max(0)
        if np.all(hi >= lo):
            polygon = np.round(outline + rng.uniform(lo, hi), 2).ravel().tolist()
            mask |= _rasterise(polygon, h, w)[0]
    if not mask.any():
        return []
    image[mask] = _contrasting_colour(rng, image[mask].mean(0))
    x0, y0, x1, y1 = _mask_box(mask, (slice(0, h), slice(0, w))).tolist()
    bbox = [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]
    ann = {
        "category_id": ids[label],
        "segmentation": _uncompressed_rle(mask),
        "bbox": bbox,
        "area": float(mask.sum()),
        "iscrowd": 1,
    }
    if opts.get("keypoints"):
        ann.update({"keypoints": [0] * (3 * len(_FIGURE_KEYPOINTS)), "num_keypoints": 0})
    return [ann]


def render(
    rng: np.random.Generator, h: int, w: int, opts: dict[str, Any]
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One ``(H, W, 3)`` uint8 image and its annotations (without ``id`` and ``image_id``)."""
    image = _background(rng, h, w)
    if rng.random() < opts["empty_prob"]:
        return image, []
    taken: list[np.ndarray] = []
    crowd_box = None
    if rng.random() < opts["crowd_prob"]:
        side = rng.uniform(0.2, 0.3) * min(h, w)
        extent = np.array([0.0, 0.0, side, side])
        shift = _place(rng, extent, h, w, taken)
        if shift is not None:
            crowd_box = extent + np.tile(shift, 2)
            taken.append(crowd_box)
    anns = _objects(rng, image, taken, opts)
    if crowd_box is not None:
        anns += _crowd(rng, image, crowd_box, opts)
    return image, anns
