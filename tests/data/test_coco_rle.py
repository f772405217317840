"""The NumPy RLE decoder of CocoInstances' masks gives pycocotools' bytes, or hands over."""

from __future__ import annotations

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from visionblocks.data._coco_io import rles_of, segmentation_masks
from visionblocks.data._coco_rle import decode_into, rle_runs


def _pycocotools(rles, height, width) -> np.ndarray:
    out = np.zeros((len(rles), height, width), dtype=np.uint8)
    for i, rle in enumerate(rles):
        if rle is not None:
            out[i] = mask_utils.decode(rle)
    return out


def _masks(rng, height, width, kind) -> np.ndarray:
    mask = np.zeros((height, width), dtype=np.uint8)
    if kind == "noise":  # runs of every length, many wrapping from column to column
        mask[:] = rng.random((height, width)) < rng.random()
    elif kind == "full":
        mask[:] = 1
    elif kind == "corner":  # touches the last row and column
        mask[rng.integers(0, height) :, rng.integers(0, width) :] = 1
    elif kind == "column":  # whole columns: one run across several columns
        mask[:, rng.integers(0, width) : rng.integers(0, width) + 2] = 1
    elif kind == "blob":
        y, x = rng.integers(0, height), rng.integers(0, width)
        mask[y : y + 7, x : x + 5] = 1
    return mask  # "empty": all zero


@pytest.mark.parametrize("kind", ["noise", "full", "corner", "column", "blob", "empty"])
def test_the_decoder_gives_the_bytes_of_pycocotools(kind):
    rng = np.random.default_rng(0)
    for _ in range(40):
        height, width = (int(v) for v in rng.integers(1, 40, 2))
        masks = [_masks(rng, height, width, kind) for _ in range(int(rng.integers(1, 4)))]
        rles = [mask_utils.encode(np.asfortranarray(m)) for m in masks]
        rles.insert(int(rng.integers(0, len(rles) + 1)), None)  # a mask without segmentation
        out = np.zeros((len(rles), height, width), dtype=np.uint8)
        assert decode_into(out, rles)
        np.testing.assert_array_equal(out, _pycocotools(rles, height, width))


def test_polygons_uncompressed_and_string_rles_decode_as_with_pycocotools():
    rng = np.random.default_rng(1)
    height, width = 48, 64
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[5:30, 7:50] = 1
    flat = mask.ravel(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    counts = np.diff(np.concatenate(([0], changes, [flat.size]))).tolist()
    compressed = mask_utils.encode(np.asfortranarray(mask))
    segmentations = [
        [rng.uniform(0, 60, 12).round(2).tolist()],  # one polygon
        [[1, 1, 20, 2, 10, 30], [30, 30, 60, 35, 40, 47]],  # two, merged
        {"size": [height, width], "counts": counts},  # uncompressed
        {"size": [height, width], "counts": compressed["counts"].decode()},  # a str
        None,
    ]
    rles = rles_of(segmentations, height, width)
    np.testing.assert_array_equal(
        segmentation_masks(segmentations, height, width).numpy(),
        _pycocotools(rles, height, width),
    )


def test_runs_of_compressed_strings_with_negative_differences():
    mask = np.zeros((30, 30), dtype=np.uint8)
    mask[2:28, 3] = 1  # long runs, then short ones: the differences go negative
    mask[10:12, 20:25] = 1
    compressed = mask_utils.encode(np.asfortranarray(mask))["counts"]
    (runs,) = rle_runs([compressed])
    assert sum(runs) == 900 and min(runs) > 0
    assert mask_utils.decode({"size": [30, 30], "counts": compressed}).sum() == sum(runs[1::2])


@pytest.mark.parametrize(
    "counts",
    [b"", b"0\x01", b"a", b"\x7f1", b"1" * 5 + b"P", b"3" * 2],  # empty, out of range, open...
)
def test_what_the_decoder_does_not_read_goes_to_pycocotools(counts):
    out = np.zeros((1, 3, 3), dtype=np.uint8)
    rle = {"size": [3, 3], "counts": counts}
    assert rle_runs([counts]) is None or not decode_into(out, [rle])
    assert not out.any()  # left untouched
