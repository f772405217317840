"""Key points: the left/right pairs a mirroring warp swaps.

A mirroring warp (a 2 x 2 part with a negative determinant) moves a left wrist to where the
right wrist was: the coordinates follow the warp, but the *names* must be swapped too, or the
model learns a mirrored skeleton. `keypoint_flip_pairs` reads the pairs from the names, in
COCO's style (``left_eye`` / ``right_eye``) and the other common ones (``l_hip``, ``LShoulder``,
``leftWrist``...); `flip_permutation` turns pairs into the index that swaps them. `visionblocks.ops.warp_targets.warp_keypoints` and `visionblocks.transforms.warp_sample`
take the pairs as ``flip_pairs``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._core.namespace import public_dir

__all__ = ["flip_permutation", "keypoint_flip_pairs"]
__dir__ = public_dir(__name__, __all__)


# Words of a name: camelCase humps, upper-case runs, digits, and runs of separators.
_TOKENS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^A-Za-z\d]+")
_OTHER = {"left": "right", "right": "left", "l": "r", "r": "l"}


def _side_token(tokens: list[str]) -> int | None:
    """The index of the one token naming a side, or None: a word ``left`` / ``right`` (any
    case) anywhere, else a letter ``l`` / ``r`` first or last next to a separator
    (``l_hip``, ``Hand.L``) or a capitalised word (``LShoulder``, ``HandR``)."""
    words = [i for i, t in enumerate(tokens) if t.lower() in ("left", "right")]
    if words:
        return words[0] if len(words) == 1 else None
    if len(tokens) < 2:
        return None
    first, second, last, before = tokens[0], tokens[1], tokens[-1], tokens[-2]
    starts = first.lower() in ("l", "r") and (not second.isalnum() or second[0].isupper())
    ends = last.lower() in ("l", "r") and (
        not before.isalnum() or (last.isupper() and before[-1].islower())
    )
    if starts == ends:  # neither, or both (``l_hand_r``): no side
        return None
    return 0 if starts else len(tokens) - 1


def _swap(token: str) -> str:
    """The other side, in ``token``'s case (``L`` -> ``R``, ``Left`` -> ``Right``)."""
    other = _OTHER[token.lower()]
    if token.isupper():
        return other.upper()
    return other.capitalize() if token[0].isupper() else other


def keypoint_flip_pairs(names: Sequence[str]) -> list[tuple[int, int]]:
    """Left/right pairs of key points, from their names, in the common naming styles.

    A name has a side when one of its words is ``left`` or ``right`` (any case, any place:
    ``left_eye``, ``hand_right``, ``leftWrist``, ``LeftHand``, ``front-left paw``), or when it
    starts or ends with a letter ``l`` / ``r`` beside a separator or a capitalised word
    (``l_shoulder``, ``R_ankle``, ``r ankle``, ``LShoulder``, ``Hand.L``, ``HandR``). It
    pairs with the name written the same way with the other side (``L_ankle`` with
    ``R_ankle``; case aside). Names without a side (``nose``, ``L1``) are in no pair;
    ``lefthand`` pairs with ``righthand`` only if both are there.

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

    Warns:
        UserWarning: Names that contain ``left`` or ``right`` but are in no pair
            (``leftover``, ``left_right_x``): a flip keeps their names, so if one has a side,
            pass the pairs explicitly.

    Examples:
        >>> keypoint_flip_pairs(["nose", "left_eye", "right_eye", "left_ear", "right_ear"])
        [(1, 2), (3, 4)]
        >>> keypoint_flip_pairs(["head", "hand_left", "hand_right"])
        [(1, 2)]
        >>> keypoint_flip_pairs(["Neck", "RShoulder", "LShoulder", "r_ankle", "l_ankle"])
        [(2, 1), (4, 3)]
        >>> keypoint_flip_pairs(["leftWrist", "rightWrist", "L_ankle", "R_ankle"])
        [(0, 1), (2, 3)]
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
    sides: dict[tuple[bool, str], dict[bool, int]] = {}  # (letter?, template) -> {left?: i}
    partners, unsided = {}, []
    for i, name in enumerate(names):
        tokens = _TOKENS.findall(name)
        at = _side_token(tokens)
        if at is None or not any(t.isalnum() for j, t in enumerate(tokens) if j != at):
            unsided.append(i)
            continue
        token = tokens[at]
        template = "".join([*tokens[:at], "\0", *tokens[at + 1 :]]).lower()
        sides.setdefault((len(token) == 1, template), {})[token.lower()[0] == "l"] = i
        partners[i] = "".join([*tokens[:at], _swap(token), *tokens[at + 1 :]])
    pairs = []
    for found in sides.values():
        if len(found) == 1:
            i = next(iter(found.values()))
            raise ValueError(
                f"key point {names[i]!r} has no partner {partners[i]!r} in names; pass the "
                "pairs explicitly"
            )
        pairs.append((found[True], found[False]))
    lowered = {names[i].lower(): i for i in unsided}
    looks_sided = []
    for i in unsided:
        low = names[i].lower()
        if low.count("left") + low.count("right") != 1:
            if "left" in low or "right" in low:
                looks_sided.append(names[i])
            continue
        j = lowered.get(low.replace("left", "right")) if "left" in low else None
        if j is not None:
            pairs.append((i, j))
        elif "right" not in low or low.replace("right", "left") not in lowered:
            looks_sided.append(names[i])
    if looks_sided:
        warnings.warn(
            f"key point names {looks_sided} contain 'left' or 'right' but pair with no other "
            "name: a flip keeps their names. If one has a side, pass the flip pairs explicitly "
            "(flip_pairs=[(left, right), ...])",
            UserWarning,
            stacklevel=2,
        )
    return sorted(pairs)


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
