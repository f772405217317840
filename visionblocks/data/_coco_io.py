"""Decoding COCO images and segmentations (private; see `visionblocks.data.coco`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["decode_rgb", "exif_orientation", "rles_of", "segmentation_masks", "size_mismatch"]

_EXIF_ORIENTATION = 0x0112
_TRANSPOSING = (5, 6, 7, 8)  # EXIF orientations that swap width and height when applied


def decode_rgb(path: str | os.PathLike[str], image_id: Any) -> Tensor:
    """``path`` as a ``uint8`` ``(3, H, W)`` RGB tensor (``torchvision.io``, else Pillow;
    16-bit images keep their high byte; EXIF orientation is not applied)."""
    try:
        from torchvision.io import ImageReadMode, decode_image, read_file

        image = decode_image(read_file(os.fspath(path)), mode=ImageReadMode.RGB)
    except (RuntimeError, ImportError, AttributeError):  # a missing file, a format (or a
        # torchvision) without these decoders; the file is looked for only then (one system
        # call less per image)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"image file of image id {image_id!r} not found: '{path}'"
            ) from None
        image = _decode_with_pillow(Path(path), image_id)
    if image.dtype == torch.uint16:  # 16-bit PNG: keep the high byte
        image = (image.to(torch.int32) >> 8).to(torch.uint8)
    return image


def _decode_with_pillow(path: Path, image_id: Any) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as pil:
            if pil.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey: the high byte
                grey = (np.asarray(pil, dtype=np.int64) >> 8).clip(0, 255).astype(np.uint8)
                array = np.repeat(grey[..., None], 3, axis=2)
            else:
                array = np.asarray(pil.convert("RGB"))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"cannot decode '{path}' (image id {image_id!r}): {exc}") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def exif_orientation(path: Path) -> int:
    """The EXIF orientation tag of ``path`` (1, upright, when it has none or is unreadable)."""
    from PIL import Image

    try:
        with Image.open(path) as pil:
            return int(pil.getexif().get(_EXIF_ORIENTATION, 1))
    except Exception:  # any unreadable file: no orientation to report
        return 1


def size_mismatch(path: Path, image_id: Any, size: tuple[int, int], height: int, width: int) -> str:
    """The message for an image whose pixels are ``size`` but whose entry says otherwise;
    says so when the EXIF orientation explains it (width and height swapped)."""
    message = (
        f"image '{path}' (image id {image_id!r}) is {size[0]} x {size[1]}, but the annotation "
        f"file says {height} x {width}; the annotations would not fit it"
    )
    orientation = exif_orientation(path)
    if size == (width, height) and orientation in _TRANSPOSING:
        message += (
            f". The file has EXIF orientation {orientation} (rotated on display): the annotation "
            "tool measured the displayed image. visionblocks, like pycocotools and COCO, uses "
            "the pixels as stored; rotate the file itself (e.g. PIL.ImageOps.exif_transpose, "
            "then save) so that stored and displayed images agree"
        )
    return message


def rles_of(segmentations: Sequence[Any], height: int, width: int) -> list[dict[str, Any] | None]:
    """One RLE per segmentation (``None`` for an empty one), as ``COCO.annToRLE`` builds it."""
    from pycocotools import mask as mask_utils

    rles: list[dict[str, Any] | None] = []
    for seg in segmentations:
        if not seg:
            rles.append(None)
        elif isinstance(seg, list):
            parts = mask_utils.frPyObjects(seg, height, width)
            # One polygon needs no merge (which would compress and parse it once more).
            rles.append(parts[0] if len(parts) == 1 else mask_utils.merge(parts))
        elif isinstance(seg, dict) and "counts" in seg and "size" in seg:
            if list(seg["size"]) != [height, width]:
                raise ValueError(
                    f"an RLE segmentation has size {seg['size']}, but the image is "
                    f"{height} x {width}"
                )
            counts = seg["counts"]
            rles.append(
                seg
                if isinstance(counts, (str, bytes))
                else mask_utils.frPyObjects(seg, height, width)
            )
        else:
            raise ValueError(
                "a segmentation must be a list of polygons or an RLE dict with 'counts' and "
                f"'size', got {str(seg)[:80]}"
            )
    return rles


def segmentation_masks(segmentations: Sequence[Any], height: int, width: int) -> Tensor:
    """``uint8`` masks ``(N, H, W)``, the bytes ``pycocotools.mask.decode`` gives (empty
    ones all zero), through `visionblocks.data._coco_rle`."""
    from visionblocks.data._coco_rle import decode_into

    rles = rles_of(segmentations, height, width)
    masks = np.zeros((len(rles), height, width), dtype=np.uint8)
    if any(rle is not None for rle in rles) and not decode_into(masks, rles):
        masks = _decode_with_pycocotools(rles, height, width)
    return torch.from_numpy(masks)


def _decode_with_pycocotools(
    rles: Sequence[dict[str, Any] | None], height: int, width: int
) -> np.ndarray:
    from pycocotools import mask as mask_utils

    masks = np.zeros((len(rles), height, width), dtype=np.uint8)
    present = [i for i, rle in enumerate(rles) if rle is not None]
    decoded = mask_utils.decode([rles[i] for i in present])  # (H, W, n), Fortran order
    masks[present] = decoded.transpose(2, 0, 1)
    return masks
