"""What ``torch.jit.script`` compiles of a layer that checkpoints its activations (private).

`visionblocks.training.set_grad_checkpointing` gives a layer an instance ``forward`` that
runs the class's ``forward`` through ``torch.utils.checkpoint``; TorchScript can compile
neither. The layers of `visionblocks.nn` that take ``grad_checkpointing=`` return
`without_checkpointing` from ``__prepare_scriptable__`` (which ``torch.jit.script`` calls
first), so they script with the class's ``forward``: a scripted layer does not checkpoint.
"""

from __future__ import annotations

import copy

from torch import nn

from visionblocks._core.checkpointing import enable_one, is_grad_checkpointing

__all__ = ["without_checkpointing"]


def without_checkpointing(module: nn.Module) -> nn.Module:
    """``module`` itself, or when it checkpoints its forward a shallow copy that does not.

    The copy holds the same parameters, buffers and submodules (nothing is duplicated, the
    scripted module shares them with ``module``, as it would without checkpointing);
    ``module`` keeps checkpointing.
    """
    if not is_grad_checkpointing(module):
        return module
    plain = copy.copy(module)
    enable_one(plain, False)
    return plain
