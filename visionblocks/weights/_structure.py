"""Pairing checkpoint tensors with model tensors by structure (private; see `load_partial`).

`match_structure` pairs two state dicts in passes and refuses (`AmbiguousMatch`, a
``ValueError``) rather than guesses:

1. **Names.** A checkpoint key that prefix stripping and ``rename`` turn into the key of a
   compatible model tensor is paired with it (how a user settles an ambiguity).
2. **Alignment.** The remaining tensors, in state-dict order, are aligned like a longest
   common subsequence (`_forward`), maximising in turn the paired mass (each module weighs
   1, shared by its tensors, so four BatchNorm vectors do not outweigh the convolution that
   places them), pairs whose module names agree (``conv3`` in ``res2.0.conv3.weight`` and
   ``layer1.0.conv3.weight``; numbers do not count), adjacent pairs, and shallow cuts where
   unpaired stretches begin and end. A tensor with several partners on the best alignments,
   or two crossing pairs, is ambiguous.
3. **Runs.** Runs of unpaired tensors left by sibling modules registered in another order
   (detectron2's ``shortcut`` before ``conv1``) are paired when compatible one by one and
   each is the other's only candidate.
4. **Fused and split projections.** ``k`` (2 or 3) repeats of a unit of ``p`` (1 or 2)
   tensors (``q``, ``k``, ``v`` weights and biases) pair with ``p`` tensors ``k`` times as
   large along dim 0 (``qkv``), either way, when each is the other's only candidate.
5. **Bookkeeping scalars.** One-element integer tensors (``num_batches_tracked``) that follow
   two paired tensors pair in order when both sides have as many.

Two tensors are *compatible* when their dtypes are of one kind and their shapes are equal
once dimensions of size 1 are dropped (loaded with ``reshape``). A model's tied tensors count
once; a checkpoint's tied names are paired one by one, and one left over still loads when
another name of its tensor was paired.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from visionblocks._core.checks import format_shape

__all__ = ["AmbiguousMatch", "StructureMatch", "match_structure"]

Shape = tuple[int, ...]

_NEG = -(2**62)  # the score of no alignment: far below any sum of real scores
_SHOW = 10  # ambiguous tensors named in the error
_MODULE_MASS = 60  # a module's tensors share it (exactly for up to 6, as 60 / count)
_DEEPEST_CUT = 4  # module-tree depths beyond this count as this
_FUSED_COUNTS = (2, 3)  # k: q/k/v or k/v projections
_UNIT_LENGTHS = (1, 2)  # p: a weight, or a weight and a bias


class AmbiguousMatch(ValueError):
    """Structure matching found several equally good pairings and refuses to guess."""


@dataclass
class StructureMatch:
    """How `match_structure` paired a checkpoint with a model.

    Attributes:
        pairs: ``{checkpoint key: model key}``, one to one, in checkpoint order.
        reshaped: ``{model key: (checkpoint shape, model shape)}`` for pairs of
            different shapes (equal once dimensions of size 1 are dropped).
        fused: ``{model key: [checkpoint keys]}``: the model tensor is their
            concatenation along dim 0.
        split: ``{model key: (checkpoint key, chunk, chunks)}``: the model tensor is chunk
            ``chunk`` (from 0) of the checkpoint tensor cut into ``chunks`` along dim 0.
        tied: ``{checkpoint key: first key}`` for every key of a checkpoint tensor stored
            under several names (one view of one storage): the group's first key. Each
            name is paired on its own; one that stays unpaired while another name of its
            group is paired was loaded all the same.
    """

    pairs: dict[str, str] = field(default_factory=dict)
    reshaped: dict[str, tuple[Shape, Shape]] = field(default_factory=dict)
    fused: dict[str, list[str]] = field(default_factory=dict)
    split: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)


def _kind(tensor: torch.Tensor) -> str:
    if tensor.is_floating_point():
        return "float"
    if tensor.is_complex():
        return "complex"
    return "bool" if tensor.dtype == torch.bool else "int"


def _module_name(key: str) -> str | None:
    """The name before the tensor's own (``conv3`` in ``res2.0.conv3.weight``), unless numbered."""
    parts = key.split(".")
    if len(parts) < 2 or parts[-2].isdigit():
        return None
    return parts[-2]


class _Side:
    """One state dict as the passes see it: compatibility ids (shared through ``ids``), module
    paths, masses, bookkeeping scalars apart; with ``tied_once``, tied tensors once."""

    def __init__(
        self, state: Mapping[str, torch.Tensor], ids: dict[object, int], tied_once: bool
    ) -> None:
        self.keys: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.twins: dict[str, str] = {}  # a tied tensor's later key -> its first key
        seen: dict[int, str] = {}
        for key, tensor in state.items():
            if tied_once and id(tensor) in seen:
                self.twins[key] = seen[id(tensor)]
                continue
            seen[id(tensor)] = key
            self.keys.append(key)
            self.tensors.append(tensor)
        self.position = {key: p for p, key in enumerate(self.keys)}
        self.compat = [
            ids.setdefault((_kind(t), tuple(s for s in t.shape if s != 1)), len(ids))
            for t in self.tensors
        ]
        # Integer scalars (num_batches_tracked): bookkeeping, paired after the others.
        self.scalar = [_kind(t) == "int" and t.numel() == 1 for t in self.tensors]
        self.core = [p for p, scalar in enumerate(self.scalar) if not scalar]
        self.paths = [tuple(key.split(".")[:-1]) for key in self.keys]
        sizes = Counter(self.paths[p] for p in self.core)
        self.mass = [_MODULE_MASS // sizes[path] if path in sizes else 0 for path in self.paths]
        self.trailing: dict[int, list[int]] = {-1: []}  # core position (-1: start) -> scalars
        last = -1
        for p, scalar in enumerate(self.scalar):
            if scalar:
                self.trailing[last].append(p)
            else:
                last = p
                self.trailing[p] = []

    def sequence(self, positions: list[int], name_ids: dict[str, int]) -> _Sequence:
        """The tensors at ``positions`` as `_align` sees them (``name_ids`` shared by both sides)."""
        names = [_module_name(self.keys[p]) for p in positions]
        return _Sequence(
            [self.compat[p] for p in positions],
            [-1 if n is None else name_ids.setdefault(n, len(name_ids)) for n in names],
            [self.paths[p] for p in positions],
            [self.mass[p] for p in positions],
        )

    def describe(self, p: int) -> str:
        return f"{self.keys[p]!r} {format_shape(tuple(self.tensors[p].shape))}"


def _tied(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``{key: first key}`` for the keys of one view of one storage (the same object on the
    meta device; empty tensors never)."""
    first: dict[object, str] = {}
    groups: dict[str, str] = {}
    for key, tensor in state.items():
        if tensor.is_meta:
            view: object = id(tensor)
        elif tensor.numel():
            view = (
                tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device,
            )  # fmt: skip
        else:
            continue
        if view in first:
            groups[first[view]] = groups[key] = first[view]
        else:
            first[view] = key
    return groups


@dataclass
class _Sequence:
    """One side of the alignment: per tensor its compatibility id, module-name id (-1: none),
    module path and mass."""

    compat: list[int]
    names: list[int]
    paths: list[tuple[str, ...]]
    mass: list[int]

    def framed(self) -> _Sequence:
        """With a start and an end marker (ids -2 and -3: each pairs with its own only)."""
        return _Sequence(
            [-2, *self.compat, -3], [-1, *self.names, -1], [(), *self.paths, ()],
            [0, *self.mass, 0],
        )  # fmt: skip

    def reversed(self) -> _Sequence:
        return _Sequence(self.compat[::-1], self.names[::-1], self.paths[::-1], self.mass[::-1])

    def cuts(self) -> np.ndarray:
        """``cut[t]``: how deep in the module tree the boundary between ``t - 1`` and ``t``
        lies (the number of leading module names they share; 0 for ``t == 0``)."""
        depth = [0]
        for a, b in itertools.pairwise(self.paths):
            shared = 0
            while shared < min(len(a), len(b), _DEEPEST_CUT) and a[shared] == b[shared]:
                shared += 1
            depth.append(shared)
        return np.array(depth, dtype=np.int64)


def _weights(ckpt: _Sequence, model: _Sequence) -> tuple[int, int, int]:
    """``(w_mass, w_name, w_adjacent)`` that make the score lexicographic: paired mass, then
    agreeing module names, then adjacent pairs, then (weight 1) shallow gaps."""
    longest = min(len(ckpt.compat), len(model.compat))
    w_adjacent = 4 * _DEEPEST_CUT * (longest + 1) + 1  # more than all gap costs together
    w_name = (longest + 2) * w_adjacent
    w_mass = (longest + 1) * w_name
    if (sum(ckpt.mass) + sum(model.mass) + 1) * w_mass >= 2**61:
        raise ValueError(
            f"match='structure' cannot align {len(ckpt.compat)} checkpoint tensors with "
            f"{len(model.compat)} model tensors (too many to score exactly); use match='names'"
        )
    return w_mass, w_name, w_adjacent


def _forward(
    ckpt: _Sequence, model: _Sequence, weights: tuple[int, int, int]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per row ``i`` of the framed sequences: the compatible model columns, their pair
    scores and ``F[i, j]``, the best score of an alignment from the start marker to ``(i, j)``.

    A pair scores ``w_mass`` times its masses plus ``w_name`` for agreeing module names; a
    step scores ``w_adjacent`` when both sides advance by one, else costs the depths of the
    cuts where its gaps open and close. Running maxima over the rows above and the columns
    to the left give the four kinds of steps.
    """
    w_mass, w_name, w_adjacent = weights
    n, m = len(ckpt.compat), len(model.compat)
    cut_c, cut_m = ckpt.cuts(), model.cuts()
    open_c = np.append(cut_c[1:], 0)  # a gap after t opens at the cut t + 1
    open_m = np.append(cut_m[1:], 0)
    model_names = np.array(model.names, dtype=np.int64)
    model_mass = np.array(model.mass, dtype=np.int64)
    columns: dict[int, list[int]] = {}
    for j, c in enumerate(model.compat):
        columns.setdefault(c, []).append(j)
    cols_of = {c: np.array(js, dtype=np.int64) for c, js in columns.items()}
    no_cols = np.zeros(0, dtype=np.int64)

    zero = np.zeros(1, dtype=np.int64)
    rows = [(zero, zero, zero)]  # the start marker: F[0, 0] = 0
    prev = np.full(m, _NEG, dtype=np.int64)
    prev[0] = 0
    col_best = np.full(m, _NEG, dtype=np.int64)  # max over i' <= i-2 of F - open_c
    corner = np.full(m + 1, _NEG, dtype=np.int64)  # [j + 1]: that, over j' <= j, - open_m
    left = np.full(m + 1, _NEG, dtype=np.int64)  # [j + 1]: max over j' <= j of F[i-1] - open_m
    for i in range(1, n):
        cols = cols_of.get(ckpt.compat[i], no_cols)
        score = w_mass * (ckpt.mass[i] + model_mass[cols])  # 0 at the end marker
        if ckpt.names[i] >= 0:
            score += w_name * (model_names[cols] == ckpt.names[i])
        np.maximum.accumulate(prev - open_m, out=left[1:])
        step = np.maximum(prev[cols - 1] + w_adjacent, left[cols - 1] - cut_m[cols])
        np.maximum(step, col_best[cols - 1] - cut_c[i], out=step)
        np.maximum(step, corner[cols - 1] - cut_c[i] - cut_m[cols], out=step)
        values = score + step
        rows.append((cols, score, values))
        above = prev - open_c[i - 1]
        np.maximum(col_best, above, out=col_best)
        np.maximum(corner[1:], np.maximum.accumulate(above - open_m), out=corner[1:])
        prev = np.full(m, _NEG, dtype=np.int64)
        prev[cols] = values
    return rows


def _align(ckpt: _Sequence, model: _Sequence) -> list[tuple[int, int]]:
    """Every pair ``(i, j)`` that lies on some best alignment of the two sequences (see
    `_forward` for the score), in order of ``i`` then ``j``.

    ``F`` from the start and, on the reversed sequences, ``G`` from the end: ``(i, j)`` is on
    a best alignment when ``F + G - score`` is the best score.
    """
    if not ckpt.compat or not model.compat:
        return []
    ckpt, model = ckpt.framed(), model.framed()
    weights = _weights(ckpt, model)
    forward = _forward(ckpt, model, weights)
    backward = _forward(ckpt.reversed(), model.reversed(), weights)
    best = int(forward[-1][2][-1])  # F at the end marker
    n, m = len(ckpt.compat), len(model.compat)
    possible: list[tuple[int, int]] = []
    for i in range(1, n - 1):
        cols, score, values = forward[i]
        from_end = backward[n - 1 - i][2][::-1]  # the same cells, reversed
        on_best = cols[values + from_end - score == best]
        possible.extend((i - 1, j - 1) for j in on_best.tolist() if 0 < j < m - 1)
    return possible


def _ambiguity(
    possible: list[tuple[int, int]], c_text: Sequence[str], m_text: Sequence[str]
) -> list[str]:
    """What makes the optimal pairs ambiguous, one line each (none when they are one
    alignment: each tensor has one partner and no two pairs cross)."""
    c_partners: dict[int, list[int]] = {}
    m_partners: dict[int, list[int]] = {}
    for i, j in possible:
        c_partners.setdefault(i, []).append(j)
        m_partners.setdefault(j, []).append(i)
    lines = [
        f"checkpoint {c_text[i]} could be model " + " or ".join(m_text[j] for j in js)
        for i, js in c_partners.items()
        if len(js) > 1
    ]
    lines += [
        f"model {m_text[j]} could be checkpoint " + " or ".join(c_text[i] for i in is_)
        for j, is_ in m_partners.items()
        if len(is_) > 1
    ]
    if not lines:  # one partner each: the pairs must keep both orders
        for (i, j), (i2, j2) in itertools.pairwise(possible):
            if j2 <= j:
                lines.append(
                    f"checkpoint {c_text[i]} -> model {m_text[j]} and checkpoint "
                    f"{c_text[i2]} -> model {m_text[j2]} cross (either, not both)"
                )
    return lines


def _runs(core: list[int], matched: set[int]) -> list[list[int]]:
    """Maximal runs of consecutive unmatched positions of ``core``."""
    runs: list[list[int]] = []
    current: list[int] = []
    for p in core:
        if p in matched:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(p)
    if current:
        runs.append(current)
    return runs


def _unique_pairs(candidates: dict[int, list[int]]) -> list[tuple[int, int]]:
    """``(a, b)`` where ``b`` is ``a``'s only candidate and ``a`` is ``b``'s."""
    wanted_by: dict[int, int] = {}
    for bs in candidates.values():
        for b in bs:
            wanted_by[b] = wanted_by.get(b, 0) + 1
    return [(a, bs[0]) for a, bs in candidates.items() if len(bs) == 1 and wanted_by[bs[0]] == 1]


def _stacks(unit: Sequence[torch.Tensor], whole: Sequence[torch.Tensor], count: int) -> bool:
    """``unit`` repeated ``count`` times fills ``whole`` along dim 0 (one tensor per unit
    member): ``unit`` is ``count * len(whole)`` tensors, and each repeat has the same shapes."""
    p = len(whole)
    for u in range(p):
        first = unit[u]
        if first.dim() == 0 or _kind(first) != _kind(whole[u]):
            return False
        if tuple(whole[u].shape) != (count * first.shape[0], *first.shape[1:]):
            return False
        for t in range(1, count):
            other = unit[t * p + u]
            if other.shape != first.shape or _kind(other) != _kind(first):
                return False
    return True


def _stack_shape(many: int, few: int) -> int | None:
    """``k`` when ``many == k * few`` for an allowed ``k`` and ``few`` an allowed unit length."""
    if few not in _UNIT_LENGTHS or many % few:
        return None
    k = many // few
    return k if k in _FUSED_COUNTS else None


def match_structure(
    state: Mapping[str, torch.Tensor],
    model_state: Mapping[str, torch.Tensor],
    names: Mapping[str, str],
) -> StructureMatch:
    """Pair ``state``'s tensors with ``model_state``'s by names, order and shape (see the module).

    Args:
        state: The checkpoint's tensors, in the checkpoint's own order.
        model_state: ``model.state_dict(keep_vars=True)``.
        names: ``{checkpoint key: name}`` after prefix stripping and ``rename``.

    Returns:
        StructureMatch: The pairs, with reshapes, fused and split tensors and tied twins.

    Raises:
        AmbiguousMatch: The order and shapes allow more than one best pairing.

    Examples:
        >>> import torch
        >>> state = {"stem.w": torch.ones(4, 3), "stem.scale": torch.ones(4)}
        >>> model = {"conv.weight": torch.zeros(4, 3), "gamma": torch.zeros(4, 1, 1)}
        >>> found = match_structure(state, model, {k: k for k in state})
        >>> found.pairs, found.reshaped
        ({'stem.w': 'conv.weight', 'stem.scale': 'gamma'}, {'gamma': ((4,), (4, 1, 1))})
    """
    ids: dict[object, int] = {}
    ckpt = _Side(state, ids, tied_once=False)  # tied or not, each name is paired
    model = _Side(model_state, ids, tied_once=True)  # tied tensors are one object, paired once
    found = StructureMatch(tied=_tied(state))
    pairs: dict[int, int] = {}  # checkpoint position -> model position

    # 1. Names.
    taken: set[int] = set()
    by_name: set[int] = set()  # paired, or named after a model tensor another name fills
    for p, key in enumerate(ckpt.keys):
        name = names.get(key, key)
        q = model.position.get(model.twins.get(name, name))
        if q is not None and ckpt.compat[p] == model.compat[q]:
            by_name.add(p)
            if q not in taken:
                pairs[p] = q
                taken.add(q)

    # 2. Alignment of the remaining core tensors.
    c_seq = [p for p in ckpt.core if p not in by_name]
    m_seq = [q for q in model.core if q not in taken]
    name_ids: dict[str, int] = {}
    possible = _align(ckpt.sequence(c_seq, name_ids), model.sequence(m_seq, name_ids))
    problems = _ambiguity(
        possible, [ckpt.describe(p) for p in c_seq], [model.describe(q) for q in m_seq]
    )
    if problems:
        listed = "\n".join(f"  {line}" for line in problems[:_SHOW])
        more = f"\n  ... and {len(problems) - _SHOW} more" if len(problems) > _SHOW else ""
        raise AmbiguousMatch(
            "match='structure' is ambiguous: the order of the module tree, the shapes and the "
            f"module names allow more than one best pairing of these tensors:\n{listed}{more}\n"
            "Add rename rules that turn the checkpoint keys into the right model keys (such "
            "keys are paired by name before the rest is matched by structure), or use "
            "match='names'"
        )
    for i, j in possible:
        pairs[c_seq[i]] = m_seq[j]

    # 3. Runs of sibling modules registered in another order.
    c_runs = _runs(ckpt.core, set(pairs) | by_name)
    m_runs = _runs(model.core, set(pairs.values()))
    signature = [tuple(model.compat[q] for q in run) for run in m_runs]
    candidates = {
        a: [b for b, sig in enumerate(signature) if sig == tuple(ckpt.compat[p] for p in run)]
        for a, run in enumerate(c_runs)
    }
    for a, b in _unique_pairs(candidates):
        pairs.update(zip(c_runs[a], m_runs[b]))
        c_runs[a], m_runs[b] = [], []

    # 4. Fused and split projections.
    candidates = {}
    for a, c_run in enumerate(c_runs):
        c_tensors = [ckpt.tensors[p] for p in c_run]
        for b, m_run in enumerate(m_runs):
            m_tensors = [model.tensors[q] for q in m_run]
            k = _stack_shape(len(c_run), len(m_run))
            fuse = k is not None and _stacks(c_tensors, m_tensors, k)
            k = _stack_shape(len(m_run), len(c_run))
            cut = k is not None and _stacks(m_tensors, c_tensors, k)
            if c_run and m_run and (fuse or cut):
                candidates.setdefault(a, []).append(b)
    for a, b in _unique_pairs(candidates):
        c_run, m_run = c_runs[a], m_runs[b]
        if len(c_run) > len(m_run):  # split checkpoint, fused model
            for u, q in enumerate(m_run):
                found.fused[model.keys[q]] = [ckpt.keys[p] for p in c_run[u :: len(m_run)]]
        else:
            unit, count = len(c_run), len(m_run) // len(c_run)
            for t, q in enumerate(m_run):
                found.split[model.keys[q]] = (ckpt.keys[c_run[t % unit]], t // unit, count)

    # 5. Bookkeeping scalars after paired tensors (and at the start).
    used = set(pairs.values())
    for p, q in [(-1, -1), *sorted(pairs.items())]:
        if p not in ckpt.trailing or q not in model.trailing:
            continue
        mine = [s for s in ckpt.trailing[p] if s not in pairs and s not in by_name]
        theirs = [t for t in model.trailing[q] if t not in used]
        fits = all(ckpt.compat[s] == model.compat[t] for s, t in zip(mine, theirs))
        if mine and len(mine) == len(theirs) and fits:
            pairs.update(zip(mine, theirs))
            used.update(theirs)

    for p in sorted(pairs):
        key, target = ckpt.keys[p], model.keys[pairs[p]]
        found.pairs[key] = target
        shape, model_shape = tuple(ckpt.tensors[p].shape), tuple(model.tensors[pairs[p]].shape)
        if shape != model_shape:
            found.reshaped[target] = (shape, model_shape)
    return found
