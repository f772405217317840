"""Finding the key prefix that makes a checkpoint fit a model (private; see `load_partial`).

`find_prefix_change` tries removing every dotted prefix of the keys that are not model keys
and adding every dotted prefix of model keys, and keeps the change that loads the most keys
(at least one more than none does; ties: removing, then shorter, then alphabetical), never
one that gives two checkpoint keys one name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

__all__ = ["find_prefix_change"]

PrefixChange = tuple[str, str]
"""``(removed, added)``: one of them is the empty string."""


def _splits(key: str) -> Iterator[tuple[str, str]]:
    """``("a.", "b.c")``, ``("a.b.", "c")`` for ``"a.b.c"``: every dotted prefix and the rest."""
    pos = key.find(".")
    while pos != -1:
        yield key[: pos + 1], key[pos + 1 :]
        pos = key.find(".", pos + 1)


def _apply(key_map: Mapping[str, str], change: PrefixChange, model: Mapping[str, object]):
    removed, added = change
    result: dict[str, str] = {}
    for old, new in key_map.items():
        if new not in model and new.startswith(removed):
            new = added + new[len(removed) :]
        result[old] = new
    return result if len(set(result.values())) == len(result) else None


def find_prefix_change(
    key_map: Mapping[str, str],
    state: Mapping[str, torch.Tensor],
    model_state: Mapping[str, torch.Tensor],
) -> tuple[PrefixChange, dict[str, str]] | None:
    """The best prefix change for ``key_map`` (checkpoint key -> model name) and its result.

    Args:
        key_map: ``{checkpoint key: name}`` after the explicit prefix stripping and renaming.
        state: The checkpoint's tensors by checkpoint key.
        model_state: The model's tensors by name.

    Returns:
        ``((removed, added), new key_map)``, or None when no change makes more keys load.

    Examples:
        >>> import torch
        >>> model = {"conv.weight": torch.zeros(2, 3), "fc.bias": torch.zeros(2)}
        >>> state = {"model.conv.weight": torch.ones(2, 3), "model.fc.bias": torch.ones(2)}
        >>> change, names = find_prefix_change({k: k for k in state}, state, model)
        >>> change, names["model.fc.bias"]
        (('model.', ''), 'fc.bias')
    """
    taken = {new for new in key_map.values() if new in model_state}
    loose = {new: old for old, new in key_map.items() if new not in model_state}
    if not loose or len(taken) == len(model_state):
        return None
    gains: dict[PrefixChange, int] = {}

    def fits(old: str, model_key: str) -> bool:
        target = model_state.get(model_key)
        return target is not None and model_key not in taken and target.shape == state[old].shape

    for new, old in loose.items():
        for prefix, rest in _splits(new):
            if fits(old, rest):
                gains[(prefix, "")] = gains.get((prefix, ""), 0) + 1
    for model_key in model_state:
        if model_key in taken:
            continue
        for prefix, rest in _splits(model_key):
            if rest in loose and fits(loose[rest], model_key):
                gains[("", prefix)] = gains.get(("", prefix), 0) + 1
    ranked = sorted(gains, key=lambda c: (-gains[c], c[0] == "", len(c[0] + c[1]), c))
    for change in ranked:
        applied = _apply(key_map, change, model_state)
        if applied is not None:
            return change, applied
    return None
