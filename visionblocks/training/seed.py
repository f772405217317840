"""Seeding and determinism: `seed_everything`, and the DataLoader helpers `seed_worker` and
`loader_generator`.

A seeded run repeats when every source of randomness is seeded *and* every operation gives
the same bits each time (the "Training recipes" page lists the deterministic ops). On the
CPU, keep ``torch.set_num_threads`` fixed between the runs you compare.
"""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import torch

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.distributed import get_rank

__all__ = ["loader_generator", "seed_everything", "seed_worker"]
__dir__ = public_dir(__name__, __all__)

MAX_SEED = 2**32 - 1
"""Largest seed: NumPy's legacy global generator takes 32-bit seeds."""

CUBLAS_WORKSPACE = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` value that makes cuBLAS deterministic (CUDA >= 10.2)."""


def seed_everything(seed: int, *, deterministic: bool = False, warn_only: bool = False) -> int:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA
    device); optionally switch PyTorch to deterministic algorithms.

    ``PYTHONHASHSEED`` is set to ``seed`` (unless set) for the processes this one starts;
    this process's string hashing was fixed when it started.

    With ``deterministic=True``:

    - ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``;
    - ``torch.backends.cudnn.deterministic = True`` and ``benchmark = False``;
    - ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless already set (call this before the first
      CUDA operation; a warning says when it is too late).

    ``deterministic=False`` (the default) leaves those settings as they are.

    Args:
        seed: The seed, in ``[0, 2**32 - 1]``.
        deterministic: Also switch PyTorch to deterministic algorithms (see above).
        warn_only: With ``deterministic``, warn instead of raising for an operation that
            has no deterministic implementation.

    Returns:
        int: ``seed``.

    Raises:
        TypeError: ``seed`` is not an int, or a flag is not a bool.
        ValueError: ``seed`` is outside ``[0, 2**32 - 1]``.

    Examples:
        >>> import random
        >>> import torch
        >>> seed_everything(7)
        7
        >>> a = torch.rand(3), random.random()
        >>> _ = seed_everything(7)
        >>> b = torch.rand(3), random.random()
        >>> torch.equal(a[0], b[0]) and a[1] == b[1]
        True
    """
    check_int("seed", seed, 0, MAX_SEED)
    check_type("deterministic", deterministic, bool)
    check_type("warn_only", warn_only, bool)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every CUDA device too (lazily, when CUDA starts)
    if deterministic:
        _deterministic(warn_only)
    return seed


def _deterministic(warn_only: bool) -> None:
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        if torch.cuda.is_initialized():
            warnings.warn(
                "seed_everything(deterministic=True) set CUBLAS_WORKSPACE_CONFIG after CUDA "
                "started, so cuBLAS may not read it: call seed_everything before the first "
                "CUDA operation, or set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment",
                RuntimeWarning,
                stacklevel=3,
            )
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` that seeds the worker's Python ``random`` and NumPy
    global generator from its torch seed.

    PyTorch gives each worker the torch seed ``base_seed + worker_id``, ``base_seed`` drawn
    from the loader's ``generator`` (see `loader_generator`) per iterator; augmentations
    written with ``random`` or ``np.random`` then follow the same rule.

    Args:
        worker_id: The worker's index (checked, otherwise unused: the torch seed already
            includes it).

    Raises:
        TypeError, ValueError: ``worker_id`` is not an int >= 0.

    Examples:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(range(4), num_workers=0, worker_init_fn=seed_worker,
        ...                     generator=loader_generator(0))
        >>> [batch.tolist() for batch in loader]
        [[0], [1], [2], [3]]
    """
    check_int("worker_id", worker_id, 0)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def loader_generator(seed: int, *, rank: int | None = None) -> torch.Generator:
    """A CPU ``torch.Generator`` for a DataLoader (and its sampler): runs repeat, ranks
    differ.

    Seeded with ``seed`` mixed with the process rank.

    Args:
        seed: The run's seed, in ``[0, 2**32 - 1]``.
        rank: The process rank; ``None`` reads it from ``torch.distributed`` (0 when no
            process group is initialized).

    Returns:
        torch.Generator: A seeded CPU generator.

    Raises:
        TypeError: ``seed`` or ``rank`` is not an int.
        ValueError: ``seed`` outside ``[0, 2**32 - 1]``, or a negative ``rank``.

    Examples:
        >>> import torch
        >>> a = torch.randperm(5, generator=loader_generator(3))
        >>> b = torch.randperm(5, generator=loader_generator(3))
        >>> torch.equal(a, b)
        True
        >>> loader_generator(3, rank=1).initial_seed() != loader_generator(3, rank=0).initial_seed()
        True
    """
    check_int("seed", seed, 0, MAX_SEED)
    if rank is None:
        rank = get_rank()
    check_int("rank", rank, 0)
    # Rank 0 keeps the plain seed; other ranks get a well-mixed offset (splitmix64's odd
    # constant), far from the seeds a user would pick for other runs.
    return torch.Generator().manual_seed((seed + rank * 0x9E3779B97F4A7C15) % 2**64)
