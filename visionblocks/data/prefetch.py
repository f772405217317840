"""Move batches to a device, and overlap the host-to-device copies with compute on CUDA.

Convention:
    - Tuples, lists, mappings (``dict`` subclasses keep their type) and NamedTuples are
      walked, and rebuilt only where a tensor inside moved: a batch already on ``device``
      comes back as the **same object**. Other objects are returned as they are.
    - ``torchvision.tv_tensors`` keep their subclass and metadata.
    - ``"cuda"`` without an index means the current CUDA device when the copy is made.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import cuda_unusable

__all__ = ["DevicePrefetcher", "move_to_device", "prefetch_to_device"]
__dir__ = public_dir(__name__, __all__)


def _map_tensors(data: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples/lists/mappings; rebuild only what changed."""
    if isinstance(data, Tensor):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        values = {key: _map_tensors(value, fn) for key, value in data.items()}
        if all(values[key] is data[key] for key in values):
            return data
        if isinstance(data, MutableMapping):
            clone = copy.copy(data)  # keeps OrderedDict, defaultdict, ... and their attributes
            clone.update(values)
            return clone
        return dict(values)
    if isinstance(data, (tuple, list)):
        items = [_map_tensors(item, fn) for item in data]
        if all(new is old for new, old in zip(items, data)):
            return data
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # NamedTuple
            return type(data)(*items)
        return tuple(items) if isinstance(data, tuple) else items
    return data


def _resolve(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _is_on(tensor: Tensor, device: torch.device) -> bool:
    if device.index is None:
        return tensor.device.type == device.type
    return tensor.device == device


def _tv_tensors() -> Any:
    """``torchvision.tv_tensors`` if something imported it (else no tensor is a tv_tensor)."""
    return sys.modules.get("torchvision.tv_tensors")


def _is_tv_tensor(tensor: Tensor) -> bool:
    tv = _tv_tensors() if type(tensor) is not Tensor else None
    return tv is not None and isinstance(tensor, tv.TVTensor)


def _rewrap(like: Tensor, output: Tensor) -> Tensor:
    """Give ``output`` the tv_tensor subclass and metadata of ``like``; plain stays plain."""
    if _is_tv_tensor(like):
        return _tv_tensors().wrap(output, like=like)
    return output


def _plain(tensor: Tensor) -> Tensor:
    return tensor.as_subclass(Tensor) if _is_tv_tensor(tensor) else tensor


def _copy_to(tensor: Tensor, device: torch.device, non_blocking: bool) -> Tensor:
    return _rewrap(tensor, _plain(tensor).to(device, non_blocking=non_blocking))


def _pinned(tensor: Tensor) -> Tensor:
    if tensor.device.type != "cpu" or tensor.is_pinned():
        return tensor
    return _rewrap(tensor, _plain(tensor).pin_memory())


def _as_device(device: Any) -> torch.device:
    check_type("device", device, (str, torch.device))
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"device must name a torch device, got {device!r}") from err
    return device


def move_to_device(data: Any, device: str | torch.device, *, non_blocking: bool = False) -> Any:
    """Move every tensor of a nested batch to ``device``, keeping containers and tv_tensors.

    Args:
        data: A tensor, or tuples / lists / mappings / NamedTuples of them, nested at will.
        device: Target device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        non_blocking: Passed to ``Tensor.to`` (asynchronous copies from pinned memory).

    Returns:
        The same structure with every tensor on ``device`` (see the Convention).

    Raises:
        TypeError: If ``device`` is neither a ``str`` nor a ``torch.device``.
        ValueError: If ``device`` names no device.

    Examples:
        >>> import torch
        >>> from torchvision import tv_tensors
        >>> boxes = tv_tensors.BoundingBoxes(torch.zeros(1, 4), format="XYXY", canvas_size=(4, 5))
        >>> batch = {"boxes": boxes, "labels": torch.tensor([1]), "image_id": 7}
        >>> moved = move_to_device(batch, "cpu")
        >>> moved is batch  # everything is on the CPU already: nothing is rebuilt
        True
        >>> moved = move_to_device(batch, "meta")
        >>> type(moved["boxes"]).__name__, moved["boxes"].canvas_size, moved["image_id"]
        ('BoundingBoxes', (4, 5), 7)
    """
    target = _resolve(_as_device(device))
    check_type("non_blocking", non_blocking, bool)

    def move(tensor: Tensor) -> Tensor:
        return tensor if _is_on(tensor, target) else _copy_to(tensor, target, non_blocking)

    return _map_tensors(data, move)


_DONE = object()


class DevicePrefetcher:
    """Iterate over ``loader`` with every batch moved to ``device``; see `prefetch_to_device`.

    Attributes:
        loader: The wrapped iterable (a ``DataLoader`` or any re-iterable of batches).
        device: The target device.
        non_blocking: Whether host-to-device copies are asynchronous (pinned memory).
    """

    def __init__(
        self, loader: Iterable[Any], device: str | torch.device, *, non_blocking: bool = True
    ) -> None:
        if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes)):
            raise TypeError(
                f"loader must be an iterable of batches (a DataLoader), got {type(loader).__name__}"
            )
        device = _as_device(device)
        check_type("non_blocking", non_blocking, bool)
        problem = cuda_unusable("device", device)
        if problem is not None:
            raise RuntimeError(problem)
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError as err:
            raise TypeError(
                f"the wrapped {type(self.loader).__name__} has no len(), so neither has the "
                "prefetcher"
            ) from err

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return (move_to_device(batch, self.device) for batch in self.loader)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(loader={type(self.loader).__name__}, "
            f"device={str(self.device)!r}, non_blocking={self.non_blocking})"
        )

    def _iter_cuda(self) -> Iterator[Any]:
        device = _resolve(self.device)
        copy_stream = torch.cuda.Stream(device=device)
        batches = iter(self.loader)

        def start_copy() -> Any:
            """Fetch the next batch and enqueue its copies on ``copy_stream`` (no waiting)."""
            batch = next(batches, _DONE)
            if batch is _DONE:
                return _DONE
            moved: list[Tensor] = []

            def move(tensor: Tensor) -> Tensor:
                if _is_on(tensor, device):
                    return tensor
                if self.non_blocking:
                    tensor = _pinned(tensor)
                out = _copy_to(tensor, device, self.non_blocking)
                moved.append(out)
                return out

            with torch.cuda.stream(copy_stream):  # new tensors are allocated on copy_stream
                return _map_tensors(batch, move), moved

        pending = start_copy()
        while pending is not _DONE:
            batch, moved = pending
            consumer = torch.cuda.current_stream(device)
            consumer.wait_stream(copy_stream)  # the caller's kernels start after the copies
            for tensor in moved:
                tensor.record_stream(consumer)  # keep the memory until the caller's work ends
            try:  # batch i + 1 is copied while the caller computes on batch i
                pending = start_copy()
            except Exception as err:  # the loader failed on batch i + 1: raise it in its turn
                yield batch
                raise err
            yield batch


def prefetch_to_device(
    loader: Iterable[Any], device: str | torch.device, *, non_blocking: bool = True
) -> DevicePrefetcher:
    """Wrap a loader so that its batches arrive on ``device``, copied ahead of time on CUDA.

    On a CUDA device, iteration works one batch ahead on a side stream: CPU tensors are
    pinned (unless they are already, e.g. by ``DataLoader(pin_memory=True)``, which pins in
    a background thread) and copied there; when batch ``i`` is handed out, the stream
    current at that moment waits for the side stream (a GPU-side dependency) and the copies
    get ``record_stream``, then the copies of batch ``i + 1`` are enqueued. The caller can
    use each batch on the current stream without synchronising (another stream it must
    order itself). On any other device each batch is `move_to_device`'d synchronously.

    Args:
        loader: A re-iterable of batches (``DataLoader``, list, ...), as `move_to_device`
            takes them.
        device: Target device; ``str`` or ``torch.device``.
        non_blocking: Pin CPU tensors and copy asynchronously (CUDA only).

    Returns:
        DevicePrefetcher: Re-iterable, with ``len(loader)`` when the loader has one.

    Raises:
        TypeError: If ``loader`` is not iterable, or an argument has the wrong type.
        ValueError: If ``device`` names no device.
        RuntimeError: If a CUDA device is asked for but not available.

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(torch.arange(6.0), batch_size=4)
        >>> batches = prefetch_to_device(loader, "cpu")
        >>> len(batches), [batch.tolist() for batch in batches]
        (2, [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]])
    """
    return DevicePrefetcher(loader, device, non_blocking=non_blocking)
