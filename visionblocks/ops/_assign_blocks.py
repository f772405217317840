"""Blocked best-match reductions: a score matrix reduced block of rows by block of rows.

The assignment ops (`visionblocks.ops.assign`) and FCOS's target assignment
(`visionblocks.models._fcos_targets`) need, for each row of a ``rows x columns`` score
matrix (anchors or locations x objects), the best column and its score, and sometimes, for
each column, the best score over all rows. Building the matrix costs ``rows x columns``
memory (400 MB in float32 for 200,000 anchors x 500 objects, several times that for the
temporaries of its formula); here ``score(start, stop)`` builds the rows ``start:stop``
only, ``rows_per_block`` of them at a time, so the peak is that of one block plus the
``O(rows + columns)`` results.

The results do not depend on the block size, bit for bit: each row is reduced whole inside
its block (``Tensor.max(dim=-1)``), and the per-column best is a maximum, which is exact
whatever the order. Ties go to the first column (the lowest index), as ``torch.max`` and
``torch.min`` document; NaN scores win, as there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["any_equal", "reduce_blocks", "rows_per_block"]

Score = Callable[[int, int], Tensor]
"""``score(start, stop)``: the scores of rows ``start:stop``, a ``(..., stop - start, C)``
tensor (leading batch dims allowed)."""


def rows_per_block(columns: int, pair_bytes: int, block_bytes: int) -> int:
    """How many rows fit ``block_bytes`` when a row of ``columns`` costs ``pair_bytes`` each.

    Args:
        columns: Scores per row (times any batch size).
        pair_bytes: Bytes of temporaries one score costs while its block is computed.
        block_bytes: The budget of one block.

    Returns:
        int: At least 1.

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
    """Best score and its column for every row, and optionally the best of every column.

    Args:
        score: ``score(start, stop) -> Tensor[..., stop - start, C]``.
        rows: Number of rows (``>= 1``).
        block: Rows per block (``>= 1``).
        largest: Best is the largest score (else the smallest).
        columns: Also reduce each column over all rows.

    Returns:
        tuple: ``values (..., rows)``, ``indices (..., rows)`` (int64, first best column on
        ties) and the columns' best ``(..., C)`` (None without ``columns``).

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
    """Whether each row holds, in some column ``j``, exactly ``targets[..., j]``.

    Args:
        score: ``score(start, stop) -> Tensor[..., stop - start, C]``.
        rows: Number of rows (``>= 1``).
        block: Rows per block (``>= 1``).
        targets (Tensor[..., C]): One value per column (NaN never equals anything).

    Returns:
        Tensor[..., rows]: bool.

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
