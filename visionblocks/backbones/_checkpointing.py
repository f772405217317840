"""Activation checkpointing of a backbone's stages (private; see `Backbone.set_grad_checkpointing`).

A stage's *blocks* are the modules that run from the end of the previous stage to the module
ending it, when both sit in one ordered container (else the stage's own module); an
``nn.Sequential`` of composite modules is split into them, and single layers are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from visionblocks._core.checkpointing import enable_one
from visionblocks.backbones._options import normalize_stage_indices

__all__ = ["StageCheckpointing", "check_option", "stage_blocks", "timm_level_names"]

Blocks = tuple[tuple[str, ...] | None, ...]
"""Per stage that runs, the names of its blocks (``None``: not known, cannot checkpoint)."""


def check_option(value: Any, arg: str = "grad_checkpointing") -> bool | tuple[int, ...]:
    """``value`` as a bool or a tuple of ints (``TypeError`` otherwise)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{arg} must be a bool or a list of stage indices, got {type(value).__name__} "
            f"({value!r})"
        )
    for i, index in enumerate(value):
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(
                f"{arg}[{i}] must be a stage index (int), got {type(index).__name__} ({index!r})"
            )
    return tuple(value)


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _split(modules: dict[str, nn.Module], name: str) -> list[str]:
    """``name``, or its children when it is an ``nn.Sequential`` of composite modules."""
    module = modules[name]
    children = list(module._modules.items())
    if (
        isinstance(module, nn.Sequential)
        and children
        and all(c is not None and len(c._modules) for _, c in children)
    ):
        return [_join(name, key) for key, _ in children]
    return [name]


def stage_blocks(
    root: nn.Module,
    levels: Sequence[str | None],
    stages: Sequence[int],
    ordered: tuple[type[nn.Module], ...] = (nn.Sequential,),
) -> Blocks:
    """The blocks of each stage (its index into ``levels``, the module names of every feature
    level of ``root`` in execution order; ``ordered``: containers that run their children in
    order)."""
    modules = dict(root.named_modules())
    out: list[tuple[str, ...] | None] = []
    for level in stages:
        name = levels[level]
        if name is None or name not in modules or not name:
            out.append(None)
            continue
        parent, _, key = name.rpartition(".")
        span = [name]
        previous = levels[level - 1] if level > 0 else ""
        if isinstance(modules[parent], ordered) and previous is not None:
            keys = list(modules[parent]._modules)
            start = 0
            for i, sibling in enumerate(keys[: keys.index(key)]):
                full = _join(parent, sibling)
                if previous and (previous == full or previous.startswith(full + ".")):
                    start = i + 1
            span = [_join(parent, k) for k in keys[start : keys.index(key) + 1]]
        blocks = [block for n in span for block in _split(modules, n)]
        out.append(tuple(b for b in blocks if modules[b]._modules))  # no single layers
    return tuple(out)


def timm_level_names(model: nn.Module, names: Sequence[str]) -> list[str | None]:
    """The names in ``model`` (a timm feature model) of timm's feature-info module names:
    as they are, flattened (``stages.0`` -> ``stages_0``) or under ``model.`` (getter
    wrappers); ``None`` when none of them is a module of ``model``."""
    modules = dict(model.named_modules())
    found: list[str | None] = []
    for name in names:
        options = (name, name.replace(".", "_", 1), f"model.{name}")
        found.append(next((o for o in options if o and o in modules), None))
    return found


def _stage_indices(backbone: Any, value: Any, arg: str) -> tuple[int, ...]:
    """The stages ``value`` selects (frozen stages left out), checked against the backbone."""
    value = check_option(value, arg)
    blocks: Blocks = backbone._stage_blocks
    frozen = getattr(backbone, "frozen_stages", 0)
    if value is False:
        return ()
    if not blocks:
        raise ValueError(
            f"{arg}: this {type(backbone).__name__} does not know its stage modules (it was "
            "not made by build_backbone or backbone_from_model); checkpoint modules by name "
            "with visionblocks.training.set_grad_checkpointing(module, [names])"
        )
    if value is True:
        return tuple(i for i, b in enumerate(blocks) if i >= frozen and b is not None)
    normalized = normalize_stage_indices(arg, value, backbone.num_stages, "the backbone")
    for index in normalized:
        if index >= len(blocks):
            raise ValueError(
                f"{arg}: stage {index} does not run in this backbone (it returns stages "
                f"{list(backbone.out_indices)}, so stages after {len(blocks) - 1} are left out)"
            )
        if blocks[index] is None:
            raise ValueError(
                f"{arg}: the modules of stage {index} are not known; checkpoint modules by "
                "name with visionblocks.training.set_grad_checkpointing(module, [names])"
            )
    return tuple(i for i in normalized if i >= frozen)


def configure(backbone: Any, value: Any, arg: str = "grad_checkpointing") -> None:
    """Checkpoint exactly the blocks of the stages ``value`` selects."""
    stages = _stage_indices(backbone, value, arg)
    root = backbone._originals[-1] if getattr(backbone, "_originals", ()) else backbone
    for index, names in enumerate(backbone._stage_blocks):
        for name in names or ():
            enable_one(root.get_submodule(name), index in stages)
    backbone.grad_checkpointing = stages


class StageCheckpointing:
    """Mixin of `Backbone`: activation checkpointing by stage."""

    grad_checkpointing: tuple[int, ...] = ()
    """The stages whose blocks run through activation checkpointing (``()``: none)."""

    _stage_blocks: Blocks = ()

    def set_grad_checkpointing(self, enable: bool | Sequence[int] = True) -> Any:
        """Run the blocks of every stage (``True``), of none (``False``) or of the listed
        stages through activation checkpointing (`visionblocks.training.set_grad_checkpointing`).

        Each block (a ResNet bottleneck, an inverted residual, a timm stage block) keeps only
        its input in the forward and recomputes its activations in the backward; gradients
        and BatchNorm statistics are unchanged. In eval mode, without autograd and when
        exported or compiled, the backbone runs as usual. Frozen stages are skipped. The
        selection replaces the previous one; ``grad_checkpointing`` holds it.

        Args:
            enable: ``True``, ``False``, or stage indices (Python-style: ``-1`` is the last
                stage; a stage after the last one the backbone returns does not run).

        Returns:
            Backbone: The backbone.

        Raises:
            TypeError: ``enable`` is neither a bool nor a list of ints.
            ValueError: A stage out of range, named twice or not run by this backbone.

        Examples:
            >>> from visionblocks.backbones import build_backbone
            >>> backbone = build_backbone("resnet18", frozen_stages=1)
            >>> backbone.set_grad_checkpointing().grad_checkpointing  # stage 0 is frozen
            (1, 2, 3)
            >>> backbone.set_grad_checkpointing([-1]).grad_checkpointing
            (3,)
        """
        configure(self, enable, "enable")
        return self
