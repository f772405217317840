"""Decoding COCO run-length encodings straight into ``(N, H, W)`` masks, the bytes
``pycocotools.mask.decode`` gives (private; see `visionblocks.data._coco_io.
segmentation_masks`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["decode_into", "rle_runs"]


def rle_runs(counts: Sequence[str | bytes]) -> list[list[int]] | None:
    """The run lengths of each compressed COCO RLE string; None if one is malformed.

    The format (``rleFrString`` in pycocotools' ``maskApi.c``): a run is 5 bits a character
    (``chr(48 + bits)``), 0x20 saying that more characters follow, 0x10 in the last one the
    sign; from the fourth run on, each is stored as the difference to the run two before.
    """
    datas = [c.encode("latin-1") if isinstance(c, str) else c for c in counts]
    if not all(isinstance(d, bytes) and d for d in datas):
        return None
    chars = np.frombuffer(b"".join(datas), dtype=np.uint8) - np.uint8(48)
    bounds = np.cumsum([len(d) for d in datas])
    # A character out of range (below 48 wraps around), or a string ending inside a run.
    if chars.max() > 63 or np.any(chars[bounds - 1] & 0x20):
        return None
    ends = np.flatnonzero((chars & 0x20) == 0)  # the last character of each run
    starts = np.concatenate(([0], ends[:-1] + 1))
    widths = ends - starts + 1
    if widths.max() > 12:  # more than 60 bits
        return None
    bits = (chars & 0x1F).astype(np.int64) << (5 * (np.arange(len(chars)) - starts.repeat(widths)))
    values = np.add.reduceat(bits, starts)
    values -= (chars[ends] & 0x10).astype(bool) << (5 * widths)  # negative: sign-extend
    flat = values.tolist()
    runs, first = [], 0
    for last in np.searchsorted(ends, bounds).tolist():
        chain = flat[first:last]
        # Run m > 2 adds run m - 2: the runs from 2 on (even) and from 1 on (odd) are sums.
        chain[2::2] = itertools.accumulate(chain[2::2])
        chain[1::2] = itertools.accumulate(chain[1::2])
        runs.append(chain)
        first = last
    return runs


def decode_into(out: np.ndarray, rles: Sequence[dict[str, Any] | None]) -> bool:
    """Paint each compressed RLE's foreground into the zeroed ``out[i]`` (``uint8``
    ``(N, H, W)``, C order); ``None`` entries stay zero. False (``out`` untouched) when an
    RLE is not one this decoder reads: then decode with pycocotools. The masks are expanded
    column-major with one ``np.repeat``; only each one's bounding box is copied, transposed.
    """
    from pycocotools import mask as mask_utils

    _, height, width = out.shape
    present = [i for i, rle in enumerate(rles) if rle is not None]
    if not present:
        return True
    parsed = rle_runs([rles[i]["counts"] for i in present])
    if parsed is None or not all(parsed):
        return False
    sizes = [len(r) for r in parsed]
    chain = itertools.chain.from_iterable
    runs = np.fromiter(chain(parsed), np.int64, sum(sizes))
    offsets = np.cumsum([0, *sizes[:-1]])
    if runs.min() < 0 or np.any(np.add.reduceat(runs, offsets) != height * width):
        return False
    pattern = [0, 1] * (max(sizes) // 2 + 1)  # background first
    values = np.fromiter(chain(pattern[:n] for n in sizes), np.uint8, len(runs))
    planes = np.repeat(values, runs).reshape(len(present), width, height)
    boxes = mask_utils.toBbox([rles[i] for i in present]).astype(np.int64).tolist()
    for index, plane, (x, y, w, h) in zip(present, planes, boxes):
        if w > 0 and h > 0:
            out[index, y : y + h, x : x + w] = plane[x : x + w, y : y + h].T
    return True
