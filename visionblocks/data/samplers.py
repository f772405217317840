"""Batch images of similar aspect ratio together, so that padding wastes little.

Convention:
    - The aspect ratio is ``W / H`` of the image as stored (before any transform).
    - Bin edges are ``2 ** (i / bins_per_octave)`` for ``i = -bins_per_octave ...
      bins_per_octave`` (from 0.5 to 2); group ``g`` holds the ratios in
      ``[edge[g - 1], edge[g])``, so there are ``2 * bins_per_octave + 2`` groups. With
      ``bins_per_octave=0`` the single edge is 1: group 0 is portrait (``W < H``), group 1
      landscape or square. These are the groups of torchvision's detection references
      (``create_aspect_ratio_groups(dataset, k)``, ``k = bins_per_octave``).
"""

from __future__ import annotations

import bisect
import numbers
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import ConcatDataset, Sampler, Subset

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir

__all__ = ["GroupedBatchSampler", "aspect_ratio_groups"]
__dir__ = public_dir(__name__, __all__)


def _size_from_metadata(dataset: Any, index: int) -> tuple[tuple[int, int] | None, Any]:
    """``(H, W)`` of ``dataset[index]`` without decoding (None when nothing tells it), and the
    innermost dataset asked."""
    while True:
        if isinstance(dataset, Subset):
            dataset, index = dataset.dataset, int(dataset.indices[index])
        elif isinstance(dataset, ConcatDataset):
            part = bisect.bisect_right(dataset.cumulative_sizes, index)
            start = dataset.cumulative_sizes[part - 1] if part else 0
            dataset, index = dataset.datasets[part], index - start
        else:
            break
    if hasattr(dataset, "get_height_and_width"):
        return dataset.get_height_and_width(index), dataset
    coco, ids = getattr(dataset, "coco", None), getattr(dataset, "ids", None)
    if coco is not None and ids is not None:  # torchvision.datasets.CocoDetection
        info = coco.imgs[ids[index]]
        return (info["height"], info["width"]), dataset
    return None, dataset


_MAX_BINS = 64  # 129 groups from ratio 1/2 to 2: finer bins only make batches rarer


def _as_index(index: Any) -> int:
    """A sampler's index as an int; anything but an integer is a clear error."""
    if isinstance(index, torch.Tensor) and index.dim() == 0 and not index.is_floating_point():
        return int(index)
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        return int(index)
    raise TypeError(
        f"the sampler yielded {index!r} ({type(index).__name__}); a sampler must yield integer "
        "dataset indices"
    )


def aspect_ratio_groups(dataset: Any, bins_per_octave: int = 0) -> list[int]:
    """Group id of every image of ``dataset`` by aspect ratio, read from the metadata.

    The size of image ``i`` comes from ``dataset.get_height_and_width(i)`` (as
    `visionblocks.data.coco.CocoInstances` provides) or ``dataset.coco`` / ``dataset.ids``
    (torchvision's ``CocoDetection``), through ``Subset`` and ``ConcatDataset``. Without such
    metadata, a warning, and every image is **loaded and decoded** once (after the
    dataset's transforms).

    Args:
        dataset: A map-style dataset with ``len()``.
        bins_per_octave: Bins per factor of two between ratios 1/2 and 2 (torchvision's
            ``k``); ``0`` gives two groups, portrait and landscape.

    Returns:
        list[int]: The group of each index (``len(dataset)`` of them), in
        ``0 .. 2 * bins_per_octave + 1`` (see the module's Convention).

    Raises:
        TypeError: If ``bins_per_octave`` is not an int or ``dataset`` has no ``len()``.
        ValueError: If ``bins_per_octave`` is negative or an image size is not positive.

    Examples:
        >>> class Sizes:
        ...     def __init__(self, sizes):
        ...         self.sizes = sizes
        ...     def __len__(self):
        ...         return len(self.sizes)
        ...     def get_height_and_width(self, index):
        ...         return self.sizes[index]
        >>> dataset = Sizes([(480, 640), (640, 480), (500, 500), (100, 400)])
        >>> aspect_ratio_groups(dataset)
        [1, 0, 1, 1]
        >>> aspect_ratio_groups(dataset, bins_per_octave=1)  # edges 0.5, 1, 2
        [2, 1, 2, 3]
    """
    check_type("bins_per_octave", bins_per_octave, int)
    if isinstance(bins_per_octave, bool) or not 0 <= bins_per_octave <= _MAX_BINS:
        raise ValueError(
            f"bins_per_octave must be an int in [0, {_MAX_BINS}] (torchvision's recipes use 0 "
            f"or 3), got {bins_per_octave!r}"
        )
    readable = hasattr(dataset, "__getitem__") or hasattr(dataset, "get_height_and_width")
    if not hasattr(dataset, "__len__") or not readable or isinstance(dataset, (str, bytes)):
        raise TypeError(
            "dataset must be a map-style dataset (len() and indexing, or "
            f"get_height_and_width(index)), got {type(dataset).__name__}"
        )
    k = bins_per_octave
    edges = [2.0 ** (i / k) for i in range(-k, k + 1)] if k else [1.0]
    groups, decoded = [], 0
    for index in range(len(dataset)):
        size, inner = _size_from_metadata(dataset, index)
        if size is None:
            if decoded == 0:
                warnings.warn(
                    f"{type(inner).__name__} has no get_height_and_width(index): "
                    "aspect_ratio_groups loads and decodes every image to read its size",
                    stacklevel=2,
                )
            # Imported here: importing torchvision takes seconds and only this fallback needs it.
            from torchvision.transforms.v2.functional import get_size

            decoded += 1
            size = tuple(get_size(dataset[index][0]))  # tensor, tv_tensor or PIL image
        height, width = size
        if not (height > 0 and width > 0):
            raise ValueError(f"image {index} must have a positive (H, W), got {size!r}")
        groups.append(bisect.bisect_right(edges, width / height))
    return groups


def _group_list(group_ids: Any) -> list[int]:
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.is_floating_point() or group_ids.is_complex():
            raise ValueError(
                f"group_ids must be a 1-D integer tensor, got {group_ids.dtype} "
                f"of shape {tuple(group_ids.shape)}"
            )
        return [int(g) for g in group_ids.tolist()]
    if not isinstance(group_ids, Sequence) or isinstance(group_ids, (str, bytes)):
        raise TypeError(f"group_ids must be a sequence of ints, got {type(group_ids).__name__}")
    for i, g in enumerate(group_ids):
        if not isinstance(g, numbers.Integral) or isinstance(g, bool):
            raise TypeError(f"group_ids[{i}] must be an int, got {type(g).__name__} ({g!r})")
    return [int(g) for g in group_ids]


def _dataset_length(sampler: Any) -> int | None:
    """Length of the dataset behind a torch sampler, when it tells."""
    source = getattr(sampler, "data_source", None)  # SequentialSampler, RandomSampler
    if source is None:
        source = getattr(sampler, "dataset", None)  # DistributedSampler
    try:
        return len(source) if source is not None else None
    except TypeError:
        return None


class GroupedBatchSampler(Sampler[list[int]]):
    """Batches of indices whose images share an aspect-ratio group, in ``sampler``'s order.

    A group's buffer is yielded as soon as it holds ``batch_size`` indices; the leftovers
    are concatenated in group-id order at the end of the pass (so they may mix groups). An
    epoch holds the same indices, and as many batches, as ``torch.utils.data.BatchSampler(
    sampler, batch_size, drop_last)``: every rank of a ``DistributedSampler`` yields the same
    number, as DDP needs.

    Args:
        sampler: Yields dataset indices (any ``Sampler`` or iterable with ``len()``).
        group_ids: The group of every dataset index (`aspect_ratio_groups`): ints or a 1-D
            integer tensor.
        batch_size: Indices per batch, ``>= 1``.
        drop_last: Drop the last, incomplete batch.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If ``batch_size < 1``, or ``len(group_ids)`` differs from the length of
            the sampler's dataset (when it tells); during iteration, an index outside
            ``group_ids``.

    Examples:
        >>> from torch.utils.data import SequentialSampler
        >>> group_ids = [0, 1, 0, 1, 1, 0, 1]
        >>> batches = GroupedBatchSampler(SequentialSampler(range(7)), group_ids, batch_size=2)
        >>> list(batches), len(batches)
        ([[0, 2], [1, 3], [4, 6], [5]], 4)
        >>> list(GroupedBatchSampler(range(7), group_ids, batch_size=3, drop_last=True))
        [[1, 3, 4], [0, 2, 5]]
    """

    def __init__(
        self,
        sampler: Iterable[int],
        group_ids: Sequence[int],
        batch_size: int,
        drop_last: bool = False,
    ) -> None:
        if (
            not isinstance(sampler, Iterable)
            or not hasattr(sampler, "__len__")
            or isinstance(sampler, (str, bytes))
        ):
            raise TypeError(
                f"sampler must be an iterable of indices with len(), got {type(sampler).__name__}"
            )
        check_type("batch_size", batch_size, int)
        if isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        check_type("drop_last", drop_last, bool)
        self.group_ids = _group_list(group_ids)
        expected = _dataset_length(sampler)
        if expected is not None and expected != len(self.group_ids):
            raise ValueError(
                f"group_ids must have one entry per dataset index: the sampler's dataset has "
                f"{expected} items, group_ids has {len(self.group_ids)}"
            )
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        buffers: dict[int, list[int]] = {}
        num_ids = len(self.group_ids)
        for index in self.sampler:
            index = _as_index(index)
            if not 0 <= index < num_ids:
                raise ValueError(
                    f"the sampler yielded index {index}, outside group_ids (length {num_ids})"
                )
            buffer = buffers.setdefault(self.group_ids[index], [])
            buffer.append(index)
            if len(buffer) == self.batch_size:
                yield buffer
                buffers[self.group_ids[index]] = []
        leftovers = [index for group in sorted(buffers) for index in buffers[group]]
        for start in range(0, len(leftovers), self.batch_size):
            batch = leftovers[start : start + self.batch_size]
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return -(-len(self.sampler) // self.batch_size)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the sampler's ``set_epoch`` (``DistributedSampler`` reshuffles
        with it); a no-op for samplers without one.

        Examples:
            >>> from torch.utils.data import DistributedSampler
            >>> inner = DistributedSampler(range(8), num_replicas=2, rank=0)
            >>> GroupedBatchSampler(inner, [0] * 8, batch_size=2).set_epoch(3)
            >>> inner.epoch
            3
        """
        check_type("epoch", epoch, int)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sampler={type(self.sampler).__name__}, "
            f"groups={len(set(self.group_ids))}, batch_size={self.batch_size}, "
            f"drop_last={self.drop_last})"
        )
