"""Key points: the left/right pairs a mirroring warp swaps.

A mirroring warp (a 2 x 2 part with a negative determinant) moves a left wrist to where the
right wrist was: the coordinates follow the warp, but the *names* must be swapped too, or the
model learns a mirrored skeleton. `keypoint_flip_pairs` reads the pairs from COCO's names
(``left_eye`` / ``right_eye``); `flip_permutation` turns pairs into the index that swaps
them. `visionblocks.ops.warp_targets.warp_keypoints` and `visionblocks.transforms.warp_sample`
take the pairs as ``flip_pairs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._core.namespace import public_dir

__all__ = ["flip_permutation", "keypoint_flip_pairs"]
__dir__ = public_dir(__name__, __all__)


def _partner(name: str) -> str | None:
    """The name of the other side (``left_eye`` -> ``right_eye``), or None (no side)."""
    low = name.lower()
    for this, other in (("left_", "right_"), ("right_", "left_")):
        if low.startswith(this) and len(low) > len(this):
            return other + low[len(this) :]
    for this, other in (("_left", "_right"), ("_right", "_left")):
        if low.endswith(this) and len(low) > len(this):
            return low[: -len(this)] + other
    return None


def keypoint_flip_pairs(names: Sequence[str]) -> list[tuple[int, int]]:
    """Left/right pairs of key points, from their names.

    A name that starts with ``left_`` / ``right_`` or ends with ``_left`` / ``_right``
    (any case) pairs with the same name on the other side. Names without a side
    (``nose``) are in no pair.

    Args:
        names: The category's ``keypoints`` names, in order (COCO's ``categories[i]
            ["keypoints"]``).

    Returns:
        list[tuple[int, int]]: ``(left index, right index)`` pairs, in the order of their left
        names.

    Raises:
        TypeError: ``names`` is not a sequence of str.
        ValueError: A name appears twice, or a sided name has no partner (``left_eye``
            without ``right_eye``): a flip could not swap it.

    Examples:
        >>> keypoint_flip_pairs(["nose", "left_eye", "right_eye", "left_ear", "right_ear"])
        [(1, 2), (3, 4)]
        >>> keypoint_flip_pairs(["head", "hand_left", "hand_right"])
        [(1, 2)]
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"names must be a sequence of str, got {type(names).__name__}")
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"names[{i}] must be a str, got {type(name).__name__}")
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name.lower() in index:
            raise ValueError(f"names must be unique, got {name!r} twice")
        index[name.lower()] = i
    pairs = []
    for i, name in enumerate(names):
        other = _partner(name)
        if other is None:
            continue
        if other not in index:
            raise ValueError(
                f"key point {name!r} has no partner {other!r} in names; pass the pairs explicitly"
            )
        j = index[other]
        low = name.lower()
        if low.startswith("left_") or low.endswith("_left"):
            pairs.append((i, j))
    return pairs


def checked_pairs(
    name: str, pairs: object, num_keypoints: int | None = None
) -> list[tuple[int, int]]:
    """``pairs`` as checked ``(i, j)`` int pairs: each index in one pair at most, no
    ``(i, i)``, indices in ``[0, num_keypoints)``. Errors name the argument ``name``."""
    if isinstance(pairs, str) or not isinstance(pairs, Sequence):
        raise TypeError(f"{name} must be a sequence of (int, int), got {type(pairs).__name__}")
    seen: set[int] = set()
    out = []
    for pair in pairs:
        ok = isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2
        if not ok or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
            raise TypeError(f"{name} must hold (int, int) pairs, got {pair!r}")
        i, j = int(pair[0]), int(pair[1])
        for v in (i, j):
            if v < 0 or (num_keypoints is not None and v >= num_keypoints):
                bound = "" if num_keypoints is None else f", num_keypoints={num_keypoints}"
                raise ValueError(f"{name}: pair {tuple(pair)!r} has an index outside [0, K{bound})")
            if v in seen:
                raise ValueError(f"{name}: index {v} is in two pairs of {list(pairs)!r}")
        if i == j:
            raise ValueError(f"{name}: pair {tuple(pair)!r} pairs a key point with itself")
        seen.update((i, j))
        out.append((i, j))
    return out


def permutation_list(num_keypoints: int, pairs: list[tuple[int, int]]) -> list[int]:
    """The swap of checked ``pairs`` as a list: ``perm[i] = j`` and ``perm[j] = i``."""
    perm = list(range(num_keypoints))
    for i, j in pairs:
        perm[i], perm[j] = j, i
    return perm


def flip_permutation(
    num_keypoints: int, pairs: Sequence[tuple[int, int]], device: torch.device | None = None
) -> Tensor:
    """The index that swaps each pair: ``points[..., perm, :]`` is the mirrored naming.

    Args:
        num_keypoints: ``K``, the number of key points per instance.
        pairs: ``(i, j)`` index pairs (from `keypoint_flip_pairs`, or explicit); each index
            in at most one pair.
        device: Device of the result.

    Returns:
        Tensor[K]: int64 permutation, its own inverse.

    Raises:
        TypeError: ``num_keypoints`` not an int, ``pairs`` not a sequence of int pairs.
        ValueError: A negative ``num_keypoints``, an index outside ``[0, K)``, a pair
            ``(i, i)``, or an index in two pairs.

    Examples:
        >>> flip_permutation(5, [(1, 2), (3, 4)])
        tensor([0, 2, 1, 4, 3])
        >>> points = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]])  # nose, l_eye, r_eye
        >>> points[..., flip_permutation(3, [(1, 2)]), :]
        tensor([[[0., 0.],
                 [2., 0.],
                 [1., 0.]]])
    """
    if isinstance(num_keypoints, bool) or not isinstance(num_keypoints, int):
        raise TypeError(f"num_keypoints must be an int, got {type(num_keypoints).__name__}")
    if num_keypoints < 0:
        raise ValueError(f"num_keypoints must be >= 0, got {num_keypoints}")
    checked = checked_pairs("pairs", pairs, num_keypoints)
    return torch.tensor(permutation_list(num_keypoints, checked), dtype=torch.int64, device=device)
