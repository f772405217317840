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

    * ``.safetensors``: read with ``safetensors.torch.load_file``.
    * ``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``.tar``: ``torch.load(weights_only=True)``,
      memory-mapped (``mmap=True``) when the file has the zip format of ``torch.save``; legacy
      files (``_use_new_zipfile_serialization=False``) are read into memory instead. Any other
      extension is tried as a torch file.
    * When ``torch.load`` refuses the file because it pickles other globals (Lightning,
      mmengine, timm and torchvision training checkpoints hold ``argparse.Namespace``,
      NumPy scalars, framework classes), it is read again by visionblocks' own unpickler,
      still memory-mapped: tensors, NumPy arrays and plain containers are rebuilt, and every
      other class or function becomes an inert placeholder: never imported, never called.
      Such tensors are on the CPU unless ``map_location`` names a device.
    * ``.pkl``, ``.pickle`` (detectron2's model zoo): the same unpickler; NumPy arrays
      become tensors.
    * Whole models saved with ``torch.save(model)``, alone or as entries of a dict (YOLOv5
      and ultralytics: ``{"model": <model>, "ema": <model>, "optimizer": ..., ...}``), need
      their class's code to be unpickled; visionblocks does not run it: the model's state
      dict is rebuilt from what the pickle stores (each module's ``_parameters``,
      ``_buffers`` and ``_modules``), with the names and order ``model.state_dict()``
      gives, tensors as stored (half precision stays half). The classes are only seen,
      never imported. What only their code could add is refused (a state-dict hook), or
      missing (entries a class adds by overriding ``get_extra_state`` or
      ``_save_to_state_dict``). ``key="ema"`` picks the EMA model; the default picks
      ``model``.
    * Training checkpoints are unwrapped: the first of ``state_dict``, ``model_state_dict``,
      ``model_state``, ``model`` and ``module`` that holds a mapping is descended into (again
      and again, for nested containers). EMA weights (``state_dict_ema``, ``model_ema``) are
      not picked automatically, since the plain weights are what the run's model held; select
      them with ``key="state_dict_ema"``.
    * Entries that are not tensors (``epoch``, ``optimizer``, nested dicts, ...) are dropped.
    * A ``module.`` prefix (``DataParallel``/``DistributedDataParallel``) is removed when
      *every* key has it.

    Args:
        path: The checkpoint file.
        map_location: Where tensors go, as for ``torch.load`` (a device for safetensors).
        key: Take the state dict from this top-level entry instead of guessing.

    Returns:
        dict[str, Tensor]: The tensors by name. Tensors of a memory-mapped file are views of
        it (copy-on-write: changing them never changes the file).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the weights of the file would only come out of code it names (a
            placeholder where the state dict's tensors are, or no tensors at all besides
            placeholders; nothing runs and the message explains ``weights_only``), a
            pickled whole model is malformed or has a state-dict hook (its state dict
            cannot be rebuilt without its code), the file is not a valid torch or pickle
            file, or it holds no tensors where a state dict is looked for (when entries
            hold whole models, such as ultralytics' ``ema``, the message names them and
            says to pass ``key=``).
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
