"""``torch.distributed`` helpers that are safe when no process group is initialised.

Every function works in a plain single-process run (as world size 1), under DDP and under
``torchrun``. Dividing each rank's loss sum by ``reduce_mean`` of its positives makes DDP's
gradient averaging yield the gradient of the global sum over the global count.

Examples:
    The same code runs in one process and under ``torchrun`` (here: one process, so the
    average is this rank's own count):

    >>> from visionblocks.losses import sigmoid_focal_loss
    >>> logits = torch.randn(6, 3)
    >>> targets = torch.tensor([0, 3, 3, 2, 3, 1])  # class indices; 3 (= C) is background
    >>> num_pos = reduce_mean(torch.tensor(float((targets < 3).sum()), device=logits.device))
    >>> num_pos
    tensor(3.)
    >>> loss = sigmoid_focal_loss(
    ...     logits, targets, reduction="sum", normalizer=num_pos.clamp_min(1.0)
    ... )
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from visionblocks._core.namespace import public_dir

__all__ = [
    "all_gather_object",
    "barrier",
    "get_rank",
    "get_world_size",
    "is_dist_initialized",
    "is_main_process",
    "reduce_mean",
]
__dir__ = public_dir(__name__, __all__)


def is_dist_initialized() -> bool:
    """Whether ``torch.distributed`` is available and a default process group exists.

    Examples:
        >>> is_dist_initialized()
        False
    """
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """Number of processes in the default group (1 when not distributed).

    Examples:
        >>> get_world_size()
        1
    """
    return dist.get_world_size() if is_dist_initialized() else 1


def get_rank() -> int:
    """Rank of this process in the default group (0 when not distributed).

    Examples:
        >>> get_rank()
        0
    """
    return dist.get_rank() if is_dist_initialized() else 0


def is_main_process() -> bool:
    """Whether this is rank 0 (always True when not distributed).

    Examples:
        >>> is_main_process()
        True
    """
    return get_rank() == 0


def barrier() -> None:
    """Synchronise all ranks; a no-op when not distributed.

    Examples:
        >>> barrier()
    """
    if get_world_size() > 1:
        dist.barrier()


def reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average ``tensor`` over all ranks (a detached copy when not distributed; integers in
    float32; the input is not modified).

    Args:
        tensor (Tensor[...]): The same shape on every rank, on the backend's device.

    Returns:
        Tensor[...]: The element-wise mean over ranks, detached from the graph.

    Raises:
        TypeError: If ``tensor`` is not a tensor.

    Examples:
        >>> import torch
        >>> reduce_mean(torch.tensor([2.0, 4.0]))
        tensor([2., 4.])
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    out = tensor.detach().clone()
    if not out.is_floating_point():
        out = out.float()
    world_size = get_world_size()
    if world_size > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= world_size
    return out


def all_gather_object(obj: Any) -> list[Any]:
    """Gather a picklable object from every rank; ``[obj]`` when not distributed.

    Args:
        obj: Any picklable object (e.g. a list of per-image predictions).

    Returns:
        list: One entry per rank, in rank order.

    Examples:
        >>> all_gather_object({"images": 3})
        [{'images': 3}]
    """
    world_size = get_world_size()
    if world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, obj)
    return gathered
