"""Drawing the synthetic COCO images (private; see `visionblocks.data.synthetic`).

Shapes as polygons, textured backgrounds, contrasting colours, non-overlapping placement,
rasterisation with pycocotools (so painted pixels are exactly ``COCO.annToMask``) and
crowd regions as uncompressed RLE.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pycocotools.mask as mask_utils
from PIL import Image

__all__ = ["SYNTHETIC_CLASSES", "render"]

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


def _unit_shapes() -> dict[str, tuple[np.ndarray, float]]:
    """``name -> (outline (K, 2) inside the unit disc, largest random rotation in degrees)``.

    Square, cross and diamond turn only a little so that they stay distinguishable (a square
    turned by 45 degrees is a diamond); the other shapes turn freely.
    """
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
    }


_SHAPES = _unit_shapes()


def _shape(rng: np.random.Generator, name: str, size: float) -> np.ndarray:
    """Outline of ``name`` about ``size`` pixels across, randomly stretched and turned."""
    outline, max_turn = _SHAPES[name]
    stretch = rng.uniform(0.85, 1.15, size=2)
    turn = math.radians(rng.uniform(-max_turn, max_turn))
    c, s = math.cos(turn), math.sin(turn)
    return (outline * stretch * (size / 2.0)) @ np.array([[c, s], [-s, c]])


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
) -> tuple[list[float], np.ndarray, float, tuple[slice, slice]] | None:
    """A placed polygon of shape ``name`` with its mask, area and a window around it.

    Draws are rejected until the mask is non-empty and its tight box is within 1 pixel of the
    polygon's box (a sharp tip thinner than a pixel can miss every pixel centre).
    """
    for _ in range(_SHAPE_TRIES):
        diameter = max(rng.uniform(*size) * min(h, w), min(_MIN_DIAMETER, min(h, w) - 2 * _EDGE))
        outline = _shape(rng, name, diameter)
        span = np.ptp(outline, axis=0)
        outline = outline * min(1.0, (w - 2 * _EDGE) / span[0], (h - 2 * _EDGE) / span[1])
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
        if area > 0 and np.abs(_mask_box(mask[window], window) - box).max() <= 1.0:
            taken.append(box)
            return polygon, mask, area, window
    return None


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
    ids = opts["category_ids"]
    anns = []
    for _ in range(int(rng.integers(opts["min_objects"], opts["max_objects"] + 1))):
        label = int(rng.integers(len(ids)))
        drawn = _draw(rng, SYNTHETIC_CLASSES[label], opts["object_size"], h, w, taken)
        if drawn is None:
            continue
        polygon, mask, area, window = drawn
        # Paint through the window: much cheaper than indexing the whole image.
        patch, inside = image[window], mask[window]
        patch[inside] = _contrasting_colour(rng, patch[inside].mean(0))
        x0, y0, x1, y1 = taken[-1].tolist()
        anns.append(
            {
                "category_id": ids[label],
                "segmentation": [polygon],
                "bbox": [x0, y0, round(x1 - x0, 2), round(y1 - y0, 2)],
                "area": area,
                "iscrowd": 0,
            }
        )
    return anns


def _crowd(
    rng: np.random.Generator, image: np.ndarray, box: np.ndarray, ids: list[int]
) -> list[dict[str, Any]]:
    """Paint 3 to 8 small shapes of one class inside ``box``; one crowd annotation of them."""
    h, w = image.shape[:2]
    label = int(rng.integers(len(ids)))
    mask = np.zeros((h, w), dtype=bool)
    for _ in range(int(rng.integers(3, 9))):
        size = max(3.0, rng.uniform(0.04, 0.08) * min(h, w))
        outline = _shape(rng, SYNTHETIC_CLASSES[label], size)
        lo, hi = box[:2] - outline.min(0), box[2:] - outline.max(0)
        if np.all(hi >= lo):
            polygon = np.round(outline + rng.uniform(lo, hi), 2).ravel().tolist()
            mask |= _rasterise(polygon, h, w)[0]
    if not mask.any():
        return []
    image[mask] = _contrasting_colour(rng, image[mask].mean(0))
    x0, y0, x1, y1 = _mask_box(mask, (slice(0, h), slice(0, w))).tolist()
    bbox = [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]
    return [
        {
            "category_id": ids[label],
            "segmentation": _uncompressed_rle(mask),
            "bbox": bbox,
            "area": float(mask.sum()),
            "iscrowd": 1,
        }
    ]


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
        anns += _crowd(rng, image, crowd_box, opts["category_ids"])
    return image, anns
