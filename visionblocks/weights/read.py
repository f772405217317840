"""`read_state_dict`: a checkpoint file's tensors, never running stored code (see `visionblocks.weights`)."""

from __future__ import annotations

import os
from typing import Any

import torch

from visionblocks._core.namespace import public_dir
from visionblocks.weights._io import read_checkpoint

__all__ = ["read_state_dict"]
__dir__ = public_dir(__name__, __all__)


def read_state_dict(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, key: str | None = None
) -> dict[str, torch.Tensor]:
    """Read a checkpoint file into a flat ``{name: Tensor}`` state dict, safely.

    * ``.safetensors``: ``safetensors.torch.load_file``.
    * ``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``.tar`` and any other extension:
      ``torch.load(weights_only=True)``, memory-mapped when the file has the zip format of
      ``torch.save`` (legacy files are read into memory).
    * When ``torch.load`` refuses the file for the globals it pickles (``argparse.Namespace``,
      NumPy values, a training framework's classes), it is read again with those names
      allowed as inert placeholders (``torch.serialization.safe_globals``): never imported,
      never called. What torch's unpickler cannot express, and ``.pkl``/``.pickle`` files
      (detectron2), are read by visionblocks' own restricted unpickler, whose tensors are on
      the CPU unless ``map_location`` names a device.
    * A whole model saved with ``torch.save(model)``, alone or as a dict entry (YOLOv5 and
      ultralytics: ``model``, ``ema``), gives the state dict ``model.state_dict()`` would,
      rebuilt from the pickled module tree without its class's code (half stays half); a
      state-dict hook is refused, entries only its code adds are missing. ``key="ema"``
      picks the EMA model.
    * Training checkpoints are unwrapped: the first of ``state_dict``, ``model_state_dict``,
      ``model_state``, ``model`` and ``module`` that holds a mapping, repeatedly. EMA weights
      (``state_dict_ema``) are only taken with ``key=``. Entries that are not tensors are
      dropped, and a ``module.`` prefix is removed when *every* key has it.

    Args:
        path: The checkpoint file.
        map_location: Where tensors go, as for ``torch.load`` (a device for safetensors).
        key: Take the state dict from this top-level entry instead of guessing.

    Returns:
        dict[str, Tensor]: The tensors by name. Tensors of a memory-mapped file are views of
        it (copy-on-write: changing them never changes the file).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the weights would only come out of code the file names (a
            placeholder where the tensors are, or no tensors besides placeholders), a pickled
            whole model is malformed or has a state-dict hook, the file is not a valid torch
            or pickle file, or it holds no tensors where a state dict is looked for (the
            message names entries holding whole models, for ``key=``).
        KeyError: If ``key`` is given and the file has no mapping under it.
        TypeError: If the file holds something other than a mapping.

    Examples:
        >>> import os, tempfile, torch
        >>> folder = tempfile.TemporaryDirectory()
        >>> path = os.path.join(folder.name, "ckpt.pt")
        >>> model = torch.nn.Linear(2, 3)
        >>> torch.save({"epoch": 7, "state_dict": model.state_dict()}, path)
        >>> sorted(read_state_dict(path))
        ['bias', 'weight']

        A training checkpoint that pickles other objects: they become inert placeholders.

        >>> import argparse
        >>> torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
        >>> sorted(read_state_dict(path))
        ['bias', 'weight']

        A whole model saved with ``torch.save(model)``: its state dict, no code run.

        >>> torch.save({"model": torch.nn.Sequential(model).half(), "epoch": 3}, path)
        >>> {name: tensor.dtype for name, tensor in read_state_dict(path).items()}
        {'0.weight': torch.float16, '0.bias': torch.float16}
        >>> read_state_dict(os.path.join(folder.name, "nope.pt"))
        Traceback (most recent call last):
        ...
        FileNotFoundError: checkpoint file not found: '.../nope.pt'
        >>> folder.cleanup()
    """
    state, _ = read_checkpoint(path, map_location, key)
    if state and all(k.startswith("module.") for k in state):  # DataParallel's prefix
        return {k[len("module.") :]: v for k, v in state.items()}
    return state
