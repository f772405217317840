"""Batch detection samples of different sizes: pad the images into one tensor, keep the targets.

Convention:
    - Images are ``(C, H, W)``; padding is added at the **bottom and right** only, so pixel
      ``(y, x)`` of every image keeps its coordinates and boxes need no shift.
    - The padded height and width are the largest ``H`` and ``W`` in the batch, each rounded
      **up** to a multiple of ``size_divisible`` (``0`` and ``1`` mean no rounding, as
      detectron2's ``size_divisibility=0``).
    - ``image_sizes`` holds each image's own ``(H, W)`` before padding (torchvision's
      ``ImageList.image_sizes`` convention).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.data.prefetch import move_to_device

__all__ = ["DetectionBatch", "collate_detection"]
__dir__ = public_dir(__name__, __all__)


class DetectionBatch(NamedTuple):
    """A padded batch of detection samples, as made by `collate_detection`.

    Attributes:
        images (Tensor[B, C, H, W]): The images, padded, as a plain ``torch.Tensor``.
        targets (list[dict]): The samples' targets, the same objects the dataset returned.
        image_sizes (list[tuple[int, int]]): Each image's ``(H, W)`` before padding.
    """

    images: Tensor
    targets: list[Any]
    image_sizes: list[tuple[int, int]]

    def to(self, device: str | torch.device, non_blocking: bool = False) -> DetectionBatch:
        """Move the images and every tensor in the targets to ``device``.

        As `visionblocks.data.prefetch.move_to_device`: tv_tensors keep their subclass and
        metadata, a batch already on ``device`` is returned as it is.

        Examples:
            >>> import torch
            >>> batch = collate_detection([(torch.zeros(3, 4, 5), {"labels": torch.ones(2)})])
            >>> batch.to("cpu") is batch
            True
            >>> batch.to("meta").targets[0]["labels"].device
            device(type='meta')
        """
        return move_to_device(self, device, non_blocking=non_blocking)


def _check_batch(batch: Any) -> tuple[list[Tensor], list[Any]]:
    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)):
        raise TypeError(
            f"batch must be a sequence of (image, target) pairs, got {type(batch).__name__}"
        )
    if len(batch) == 0:
        raise ValueError("batch must hold at least one (image, target) pair, got an empty batch")
    images, targets = [], []
    for i, sample in enumerate(batch):
        if not isinstance(sample, (tuple, list)):
            raise TypeError(
                f"batch[{i}] must be an (image, target) pair, got {type(sample).__name__}"
            )
        if len(sample) != 2:
            raise ValueError(f"batch[{i}] must be an (image, target) pair, got {len(sample)} items")
        image, target = sample
        if not isinstance(image, Tensor):
            raise TypeError(f"batch[{i}] image must be a torch.Tensor, got {type(image).__name__}")
        if image.dim() != 3:
            raise ValueError(
                f"batch[{i}] image must have shape (C, H, W), got {tuple(image.shape)}"
            )
        first = images[0] if images else image
        if image.shape[0] != first.shape[0]:
            raise ValueError(
                f"all images must have the same number of channels: batch[0] has "
                f"{first.shape[0]}, batch[{i}] has {image.shape[0]}"
            )
        if image.dtype != first.dtype:
            raise ValueError(
                f"all images must have the same dtype: batch[0] is {first.dtype}, "
                f"batch[{i}] is {image.dtype}"
            )
        if image.device != first.device:
            raise ValueError(
                f"all images must be on the same device: batch[0] is on {first.device}, "
                f"batch[{i}] on {image.device}"
            )
        images.append(image)
        targets.append(target)
    return images, targets


_MAX_DIVISOR = 4096  # far above any network stride; larger values only waste memory


def _check_pad_value(pad_value: Any, dtype: torch.dtype) -> None:
    if not isinstance(pad_value, numbers.Real) or isinstance(pad_value, bool):
        raise TypeError(f"pad_value must be a real number, got {type(pad_value).__name__}")
    if not math.isfinite(pad_value):
        raise ValueError(f"pad_value must be finite, got {pad_value!r}")
    if dtype.is_floating_point or dtype == torch.bool:
        return
    info = torch.iinfo(dtype)
    if pad_value != int(pad_value) or not info.min <= pad_value <= info.max:
        raise ValueError(
            f"pad_value must be an integer in [{info.min}, {info.max}] for {dtype} images, "
            f"got {pad_value!r}"
        )


def _empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised plain tensor; in a DataLoader worker, in shared memory from the start
    (saves one copy of the batch, as ``default_collate`` does)."""
    if get_worker_info() is not None and like.device.type == "cpu":
        nbytes = math.prod(shape) * like.element_size()
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=like.dtype).set_(storage).view(shape)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def collate_detection(
    batch: Sequence[tuple[Tensor, Any]], size_divisible: int = 32, pad_value: float = 0
) -> DetectionBatch:
    """Pad a list of ``(image, target)`` samples into a `DetectionBatch`.

    Each image is copied once into a ``(B, C, H_pad, W_pad)`` tensor padded with
    ``pad_value``; the targets are passed through. Use it as
    ``DataLoader(collate_fn=collate_detection)`` (``functools.partial`` for other arguments).

    Args:
        batch: A list of ``(image, target)``: ``image (Tensor[C, H, W])`` (plain or
            ``tv_tensors.Image``, one ``C``, dtype and device for all) and any ``target``.
        size_divisible: ``H_pad`` and ``W_pad`` are rounded up to a multiple of this (the
            backbone's largest stride); ``0`` or ``1`` means no rounding.
        pad_value: The value of the padded pixels, representable in the images' dtype.

    Returns:
        DetectionBatch: ``images (Tensor[B, C, H_pad, W_pad])`` (plain), ``targets`` (the
        same objects) and ``image_sizes`` (Python ints).

    Raises:
        TypeError: If ``batch`` is not a sequence of pairs, an image is not a tensor, or an
            option has the wrong type.
        ValueError: If ``batch`` is empty, an image is not 3-D, the images differ in
            channels, dtype or device, or an option is out of range.

    Examples:
        >>> import torch
        >>> samples = [
        ...     (torch.ones(3, 20, 30, dtype=torch.uint8), {"image_id": 1}),
        ...     (torch.ones(3, 40, 10, dtype=torch.uint8), {"image_id": 2}),
        ... ]
        >>> batch = collate_detection(samples, size_divisible=32)
        >>> batch.images.shape, batch.images.dtype
        (torch.Size([2, 3, 64, 32]), torch.uint8)
        >>> batch.image_sizes
        [(20, 30), (40, 10)]
        >>> batch.targets[1] is samples[1][1]
        True
        >>> int(batch.images[0, :, :20, :30].min()), int(batch.images[0, :, 20:].max())
        (1, 0)
    """
    check_type("size_divisible", size_divisible, int)
    if isinstance(size_divisible, bool):
        raise TypeError(f"size_divisible must be int, got bool ({size_divisible!r})")
    if not 0 <= size_divisible <= _MAX_DIVISOR:
        raise ValueError(
            f"size_divisible must be in [0, {_MAX_DIVISOR}] (0 or 1: no rounding; detectors "
            f"use their largest stride, e.g. 32 or 128), got {size_divisible}"
        )
    images, targets = _check_batch(batch)
    _check_pad_value(pad_value, images[0].dtype)

    sizes = [(int(image.shape[1]), int(image.shape[2])) for image in images]
    step = max(size_divisible, 1)
    height = -(-max(h for h, _ in sizes) // step) * step
    width = -(-max(w for _, w in sizes) // step) * step
    out = _empty((len(images), images[0].shape[0], height, width), like=images[0])
    for slot, image, (h, w) in zip(out, images, sizes):
        slot[:, :h, :w].copy_(image.as_subclass(Tensor))
        slot[:, h:, :].fill_(pad_value)  # each pixel is written once: no full fill beforehand
        slot[:, :h, w:].fill_(pad_value)
    return DetectionBatch(out, targets, sizes)
