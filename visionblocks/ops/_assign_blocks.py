"""Blocked best-match reductions of a ``rows x columns`` score matrix that is never built.

Used by `visionblocks.ops.assign` and FCOS's targets (`visionblocks.models._fcos_targets`):
``score(start, stop)`` builds rows ``start:stop`` only, so the peak memory is one block plus
the ``O(rows + columns)`` results. Results do not depend on the block size, bit for bit
(each row is reduced whole; a column's best is a maximum, exact in any order). Ties go to
the first column and NaN scores win, as in ``torch.max`` / ``torch.min``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["any_equal", "reduce_blocks", "rows_per_block"]

Score = Callable[[int, int], Tensor]
"""``score(start, stop)``: the ``(..., stop - start, C)`` scores of rows ``start:stop``."""


def rows_per_block(columns: int, pair_bytes: int, block_bytes: int) -> int:
    """Rows (at least 1) that fit ``block_bytes`` when each of ``columns`` costs ``pair_bytes``.

    Examples:
        >>> rows_per_block(500, 24, 16 * 2**20)
        1398
        >>> rows_per_block(0, 24, 1024), rows_per_block(10**6, 24, 1024)
        (1024, 1)
    """
    return max(1, block_bytes // max(1, columns * pair_bytes))


def reduce_blocks(
    score: Score, rows: int, block: int, *, largest: bool = True, columns: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``values (..., rows)``, ``indices (..., rows)`` (int64) of every row's best score (the
    largest, or the smallest), and with ``columns`` every column's best ``(..., C)`` (else None).

    Examples:
        >>> import torch
        >>> m = torch.tensor([[1.0, 3.0, 3.0], [4.0, 0.0, 2.0], [0.0, 5.0, 1.0]])
        >>> values, indices, best = reduce_blocks(lambda a, b: m[a:b], 3, 2, columns=True)
        >>> values, indices, best
        (tensor([3., 4., 5.]), tensor([1, 0, 1]), tensor([4., 5., 3.]))
    """
    values, indices, best = [], [], None
    for start in range(0, rows, block):
        scores = score(start, min(start + block, rows))
        v, i = scores.max(dim=-1) if largest else scores.min(dim=-1)
        values.append(v)
        indices.append(i)
        if columns:
            c = scores.amax(dim=-2) if largest else scores.amin(dim=-2)
            # maximum / minimum propagate NaN, as amax over the whole matrix would.
            best = c if best is None else (torch.maximum if largest else torch.minimum)(best, c)
    return torch.cat(values, dim=-1), torch.cat(indices, dim=-1), best


def any_equal(score: Score, rows: int, block: int, targets: Tensor) -> Tensor:
    """Bool ``(..., rows)``: whether a row holds, in some column ``j``, exactly ``targets[..., j]``.

    Examples:
        >>> import torch
        >>> m = torch.tensor([[1.0, 3.0], [4.0, 0.0], [0.0, 5.0]])
        >>> any_equal(lambda a, b: m[a:b], 3, 2, torch.tensor([4.0, 3.0]))
        tensor([ True,  True, False])
    """
    hits = []
    for start in range(0, rows, block):
        scores = score(start, min(start + block, rows))
        hits.append((scores == targets.unsqueeze(-2)).any(dim=-1))
    return torch.cat(hits, dim=-1)
