"""Which framework wrote a checkpoint, told by its layout (private; shown by ``inspect``).

Only the keys and a few values of the outer object are looked at; nothing is imported.

| layout | what gives it away |
|---|---|
| whole model (torch.save(model)) | the object is a pickled ``nn.Module`` (see `visionblocks.weights._modules`) |
| YOLOv5/ultralytics checkpoint | ``model`` + ``ema`` + ``updates`` |
| Lightning checkpoint | ``pytorch-lightning_version`` (or ``state_dict`` + ``optimizer_states`` + ``loops``) |
| mmengine checkpoint | ``meta`` + ``message_hub``, or ``meta`` holding ``mmengine_version`` / ``mmcv_version`` |
| detectron2 model zoo | ``__author__`` or ``matching_heuristics`` (the ``.pkl`` files) |
| detectron2 checkpoint | ``model`` + ``optimizer`` + ``iteration`` |
| timm checkpoint | ``state_dict_ema``, or ``arch`` + ``state_dict`` |
| torchvision references | ``model`` + ``args`` + ``optimizer`` or ``lr_scheduler`` |
| DataParallel/DDP state dict | every tensor name starts with ``module.`` |
| training checkpoint | any other container (``state_dict``, ``model``, ...) |
| state dict | a flat mapping of names to tensors |
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from visionblocks.weights._modules import is_module

__all__ = ["detect_layout"]


def detect_layout(obj: Any, containers: Collection[str], tensor_names: Collection[str]) -> str:
    """The layout of a checkpoint's outer object (see the module table).

    Examples:
        >>> detect_layout({"state_dict": {}, "pytorch-lightning_version": "2.4.0"}, ["state_dict"], [])
        'Lightning checkpoint'
        >>> detect_layout({"module.fc.weight": None}, [], ["module.fc.weight"])
        'DataParallel/DDP state dict'
        >>> detect_layout({"model": None, "ema": None, "updates": 10, "epoch": -1}, [], [])
        'YOLOv5/ultralytics checkpoint'
    """
    if is_module(obj):
        return "whole model (torch.save(model))"
    keys = {k for k in obj if isinstance(k, str)} if isinstance(obj, Mapping) else set()
    meta = obj.get("meta") if isinstance(obj, Mapping) else None
    if "pytorch-lightning_version" in keys or {"state_dict", "optimizer_states", "loops"} <= keys:
        return "Lightning checkpoint"
    if "meta" in keys and (
        "message_hub" in keys
        or (isinstance(meta, Mapping) and ("mmengine_version" in meta or "mmcv_version" in meta))
    ):
        return "mmengine checkpoint"
    if {"model", "ema", "updates"} <= keys:
        return "YOLOv5/ultralytics checkpoint"
    if "__author__" in keys or "matching_heuristics" in keys:
        return "detectron2 model zoo"
    if {"model", "optimizer", "iteration"} <= keys:
        return "detectron2 checkpoint"
    if "state_dict_ema" in keys or {"arch", "state_dict"} <= keys:
        return "timm checkpoint"
    if {"model", "args"} <= keys and ("optimizer" in keys or "lr_scheduler" in keys):
        return "torchvision references"
    if tensor_names and all(name.startswith("module.") for name in tensor_names):
        return "DataParallel/DDP state dict"
    return "training checkpoint" if containers else "state dict"
