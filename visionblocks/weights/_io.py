"""Reading checkpoint files safely (private; the rules are `read_state_dict`'s).

`read_checkpoint` tries ``torch.load(weights_only=True)`` (memory-mapped for zip files); for a
zip file naming foreign globals, again with `_rebuild.torch_allowlist`'s placeholders allowed;
else `_unpickle`'s reader, which ``.pkl`` files also go to. Pickled modules are rebuilt by
`_modules`, and a file whose weights would be other placeholders is refused.
"""

from __future__ import annotations

import os
import pickle
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from visionblocks._core.tensor_checks import cuda_unusable
from visionblocks.weights._formats import detect_layout
from visionblocks.weights._modules import ModuleStateDict, rebuild_modules
from visionblocks.weights._rebuild import Placeholder, allowed, python3_name, torch_allowlist
from visionblocks.weights._unpickle import load_torch_file, read_pickle

__all__ = ["CONTAINER_KEYS", "ReadInfo", "read_checkpoint", "source_state", "unwrap_state_dict"]

CONTAINER_KEYS = ("state_dict", "model_state_dict", "model_state", "model", "module")
"""Keys under which training checkpoints keep the model's state dict, in order of preference
(``state_dict_ema`` / ``model_ema`` only with ``key=``)."""

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
_PICKLE_SUFFIXES = (".pkl", ".pickle")
_SAFETENSORS_SUFFIX = ".safetensors"


@dataclass
class ReadInfo:
    """What reading a checkpoint found besides its tensors (shown by ``visionblocks inspect``).

    Attributes:
        format: How the file was read: ``"torch (zip, mmap)"``, ``"torch (legacy)"``,
            ``"safetensors"``, or, with foreign names made placeholders, ``"torch (zip,
            mmap, safe unpickler)"``, ``"torch (legacy, safe unpickler)"``, ``"pickle (safe
            unpickler)"``.
        layout: The framework layout told by the keys (``"Lightning checkpoint"``, ...).
        containers: Keys descended into to reach the state dict (``["state_dict"]``).
        dropped: Top-level keys of the state dict's mapping that held no tensor.
        other_keys: Keys of the outer containers that were not descended into.
        placeholders: ``{"argparse.Namespace": 1, ...}``: foreign objects replaced by inert
            placeholders, with how many were built.
        modules: ``{"models.yolo.Model": 1, ...}``: the classes of the pickled ``nn.Module``
            objects whose state dicts were rebuilt, each module counted once (all of the
            file's).
        mmap: Whether the tensors are views of the memory-mapped file.
    """

    format: str = ""
    layout: str = ""
    containers: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    other_keys: list[str] = field(default_factory=list)
    placeholders: dict[str, int] = field(default_factory=dict)
    modules: dict[str, int] = field(default_factory=dict)
    mmap: bool = False


class _UnsafeFileError(ValueError):
    """The weights of the file would only come out of running code that it names."""


class _ForeignGlobals(Exception):
    """torch's weights-only unpickler refused a global: placeholders stand in for them."""


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # torch names the refused global in both messages
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy torch file
_ALLOWING = threading.Lock()


def _unsafe_message(path: str, name: str | None) -> str:
    what = f" It references {name!r}." if name else ""
    return (
        f"refusing to load {path!r}: it is not a plain weights file (it needs code to be "
        f"unpickled).{what} visionblocks never runs code from a file: it reads torch files "
        "with torch.load(weights_only=True) and, failing that, with an unpickler that turns "
        "foreign objects into inert placeholders, but here the weights themselves would only "
        "come out of that code. If you trust the file, load it yourself with "
        "torch.load(weights_only=False) and pass the resulting state dict instead of the path."
    )


def _not_valid(path: str, kind: str, exc: BaseException) -> ValueError:
    detail = f"{type(exc).__name__}: {str(exc).strip() or 'file ended early'}"
    return ValueError(f"cannot read {path!r}: not a valid {kind} file ({detail})")


def _torch_load(path: str, map_location: Any, zip_format: bool) -> Any:
    # mmap needs the zip format; legacy (pre-1.6 / _use_new_zipfile_serialization=False)
    # files are read into memory, still with the restricted unpickler.
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=zip_format)
    except pickle.UnpicklingError as exc:
        # "Unsupported global: GLOBAL x.y" (a class) or "unsupported GLOBAL posix.system
        # whose module posix is blocked" (a function of a blocked module).
        if _GLOBAL.search(str(exc)):
            raise _ForeignGlobals from None
        detail = str(exc).partition("WeightsUnpickler error:")[2].split("\n\n")
        detail = " ".join(part.strip() for part in detail[:2] if part.strip())
        raise ValueError(
            f"cannot read {path!r}: not a valid torch.save file ({detail or exc})"
        ) from None
    except (EOFError, RuntimeError, KeyError) as exc:  # empty, truncated or text files (the
        # legacy reader's magic-number lookup raises KeyError), a zip of other things
        raise _not_valid(path, "torch.save", exc) from None


def _read_torch(path: str, map_location: Any, zip_format: bool) -> tuple[Any, Any, bool]:
    """The object of a torch file, its placeholders (None: none were needed) and whether
    ``map_location`` is still to be applied (`SafeUnpickler` leaves tensors on the CPU)."""
    try:
        return _torch_load(path, map_location, zip_format), None, False
    except _ForeignGlobals:
        pass
    if zip_format:
        counts: dict[str, int] = {}
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            # The allow-list is global: one file's placeholders at a time.
            with _ALLOWING, torch.serialization.safe_globals(torch_allowlist(names, counts)):
                obj = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
        except Exception:  # what torch's unpickler cannot express (see _unpickle): read below
            pass
        else:
            for name in names:  # referenced, never called
                if allowed(name) is None:
                    counts.setdefault(python3_name(name), 1)
            return obj, counts, False
    try:
        obj, placeholders = load_torch_file(path, zip_format)
    except OSError:
        raise
    except Exception as exc:  # malformed data of any kind: the reader checks, never runs it
        raise _not_valid(path, "torch.save", exc) from None
    return obj, placeholders, True


def _safetensors_load(path: str, map_location: Any) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    device = "cpu" if map_location is None else map_location
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(
            f"map_location for a .safetensors file must be a device (str or torch.device), "
            f"got {type(map_location).__name__}"
        )
    try:
        return load_file(path, device=device)
    except OSError:
        raise
    except Exception as exc:  # SafetensorError: a bad header or truncated data
        raise ValueError(
            f"cannot read {path!r}: not a valid .safetensors file ({type(exc).__name__}: {exc})"
        ) from None


def _read_object(path: str, map_location: Any) -> tuple[Any, ReadInfo, bool]:
    """The object of the file, how it was read and whether ``map_location`` is to apply."""
    lower = path.lower()
    if lower.endswith(_SAFETENSORS_SUFFIX):
        return _safetensors_load(path, map_location), ReadInfo(format="safetensors"), False
    with open(path, "rb") as file:
        zip_format = file.read(4) == b"PK\x03\x04"  # as torch.load tells them
    if lower.endswith(_PICKLE_SUFFIXES) and not zip_format:
        try:
            obj, placeholders = read_pickle(path)
        except OSError:
            raise
        except Exception as exc:  # malformed data of any kind: the reader checks, never runs it
            raise _not_valid(path, "torch or pickle", exc) from None
        if not (type(obj) is int and obj == _LEGACY_MAGIC):  # else a legacy torch file
            return obj, ReadInfo("pickle (safe unpickler)", placeholders=placeholders), True
    try:
        obj, placeholders, to_device = _read_torch(path, map_location, zip_format)
    except ValueError as exc:
        if lower.endswith((*_TORCH_SUFFIXES, *_PICKLE_SUFFIXES)):
            raise
        raise ValueError(
            f"cannot read {path!r}: unknown extension (expected .safetensors, "
            f"{', '.join(_TORCH_SUFFIXES + _PICKLE_SUFFIXES)}) and torch cannot read it either "
            f"({type(exc).__name__}: {exc})"
        ) from None
    fmt = "torch (zip, mmap" if zip_format else "torch (legacy"
    fmt += ")" if placeholders is None else ", safe unpickler)"
    return obj, ReadInfo(fmt, placeholders=placeholders or {}, mmap=zip_format), to_device


def _to_device(state: dict[str, torch.Tensor], map_location: Any) -> dict[str, torch.Tensor]:
    """Tensors of `SafeUnpickler` are on the CPU; move them where ``map_location`` says."""
    if map_location is None:
        return state
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(
            "map_location must be a device (str or torch.device) for files read by the safe "
            f"unpickler, got {type(map_location).__name__}"
        )
    device = torch.device(map_location)
    if device.type == "cpu":
        return state
    return {name: tensor.to(device) for name, tensor in state.items()}


def _rebuild_modules(obj: Any, path: str) -> tuple[Any, dict[str, int], list[tuple[Any, ...]]]:
    """`rebuild_modules`, its errors naming the file."""
    try:
        rebuilt = rebuild_modules(obj)
    except ValueError as exc:
        raise ValueError(
            f"refusing to load {path!r}: it pickles a whole model whose state dict cannot be "
            f"rebuilt without its code ({exc})"
        ) from None
    return rebuilt.obj, rebuilt.classes, rebuilt.entries


def _ask_for_key(obj: Any, entries: list[tuple[Any, ...]], path: str) -> None:
    """Without ``key``, no tensors where the state dict is looked for but entries holding
    whole models (ultralytics' ``model: None``, ``ema: <model>``): say which."""
    entries = [keys for keys in entries if keys]  # () is the object itself
    if not entries or not isinstance(obj, Mapping):
        return
    found = _descend(obj, None, ReadInfo())
    if isinstance(found, ModuleStateDict) or any(_as_tensor(v) is not None for v in found.values()):
        return
    where = ", ".join(" -> ".join(repr(k) for k in keys) for keys in entries)
    first = entries[0][0]
    raise ValueError(
        f"{path!r} holds no tensors at the top level or under {', '.join(CONTAINER_KEYS)}, "
        f"but whole models are pickled under {where}: pick one with key={first!r} "
        f"(load_partial(model, path, key={first!r}), read_state_dict(path, key={first!r}); "
        f"visionblocks inspect: --key {first})"
    )


def _refuse_code_weights(obj: Any, key: str | None, path: str, placeholders: dict) -> None:
    """Refuse a file whose weights would only come out of foreign code: the object, or an
    entry where the state dict is looked for, is a placeholder, or no tensors are there."""
    if isinstance(obj, Placeholder):  # a pickled object other than an nn.Module
        raise _UnsafeFileError(_unsafe_message(path, obj.name))
    if isinstance(obj, ModuleStateDict):  # torch.save(model)
        return
    if not isinstance(obj, Mapping) or (key is not None and not isinstance(obj.get(key), Mapping)):
        return  # unwrap_state_dict says what is wrong
    found = _descend(obj, key, ReadInfo())
    if isinstance(found, ModuleStateDict):  # a pickled model's, tensors only (maybe none)
        return
    values = list(found.values())
    slot = next((v for v in values if isinstance(v, Placeholder)), None)
    if slot is not None or not any(_as_tensor(v) is not None for v in values):
        name = slot.name if slot is not None else next(iter(placeholders), None)
        raise _UnsafeFileError(_unsafe_message(path, name))


def check_map_location(map_location: Any) -> None:
    """Refuse a ``map_location`` that names no usable device, before the file is read."""
    if map_location is None or callable(map_location):
        return
    if isinstance(map_location, Mapping):
        for value in map_location.values():
            check_map_location(value)
        return
    if isinstance(map_location, bool) or not isinstance(map_location, (str, torch.device)):
        raise TypeError(
            "map_location must be a device (str or torch.device), a dict of location names or a "
            f"callable, as for torch.load; got {type(map_location).__name__} ({map_location!r})"
        )
    try:
        device = torch.device(map_location)
    except RuntimeError:
        raise ValueError(f"map_location {map_location!r} names no torch device") from None
    problem = cuda_unusable("map_location", device)
    if problem is not None:
        raise ValueError(problem)


def read_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", key: str | None = None
) -> tuple[dict[str, torch.Tensor], ReadInfo]:
    """Read ``path`` and unwrap it to a flat ``{name: Tensor}`` dict (no prefix stripping)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint file not found: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint path is a directory, not a file: {path!r}")
    check_map_location(map_location)
    obj, read, to_device = _read_object(path, map_location)
    original, modules = obj, {}
    if read.placeholders:  # only foreign names make placeholders, modules included
        obj, modules, entries = _rebuild_modules(obj, path)
        if key is None:
            _ask_for_key(obj, entries, path)
        _refuse_code_weights(obj, key, path, read.placeholders)
    state, info = unwrap_state_dict(obj, key=key, where=repr(path))
    info.format, info.placeholders, info.mmap = read.format, read.placeholders, read.mmap
    info.modules = modules
    info.layout = detect_layout(original, info.containers, state)
    return (_to_device(state, map_location) if to_device else state), info


def source_state(source: Any, key: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict of ``load_partial``'s ``source``: a checkpoint path, a mapping or a
    module."""
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a str or None, got {type(key).__name__} ({key!r})")
    if isinstance(source, (str, os.PathLike)):
        return read_checkpoint(source, "cpu", key)[0]
    if isinstance(source, (Mapping, torch.nn.Module)):
        return unwrap_state_dict(source, key=key)[0]
    raise TypeError(
        "source must be a checkpoint path, a state dict (or a checkpoint dict) or an "
        f"nn.Module, got {type(source).__name__}"
    )


def _mapping(value: Any) -> Any:
    """A module held in memory (``{"model": module}``, as ``torch.save(model)`` would pickle
    it) as its state dict; anything else as it is."""
    return value.state_dict() if isinstance(value, torch.nn.Module) else value


def _holds_state(value: Any) -> bool:
    return isinstance(value, (Mapping, torch.nn.Module))


def _as_tensor(value: Any) -> torch.Tensor | None:
    """``value`` as a tensor: tensors as they are, numeric NumPy arrays converted; else None."""
    if isinstance(value, torch.Tensor):
        return value
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc":
        return None
    if not value.dtype.isnative:
        value = value.astype(value.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    except TypeError:  # a dtype torch lacks (float128, ...)
        return None


def _descend(obj: Mapping[Any, Any], key: str | None, info: ReadInfo) -> Mapping[Any, Any]:
    """The mapping under ``key`` and then under `CONTAINER_KEYS`, recorded in ``info``."""
    if key is not None:
        info.other_keys = [str(k) for k in obj if k != key]
        info.containers.append(key)
        obj = _mapping(obj[key])
    while True:
        found = next((k for k in CONTAINER_KEYS if _holds_state(obj.get(k))), None)
        if found is None:
            return obj
        info.other_keys.extend(str(k) for k in obj if k != found)
        info.containers.append(found)
        obj = _mapping(obj[found])


def unwrap_state_dict(
    obj: Any, *, key: str | None = None, where: str = "the source"
) -> tuple[dict[str, torch.Tensor], ReadInfo]:
    """Descend into training-checkpoint containers and keep the tensor entries (numeric
    NumPy arrays become tensors, modules their state dicts)."""
    info = ReadInfo()
    obj = _mapping(obj)
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"{where} holds a {type(obj).__name__}, not a mapping of names to tensors "
            "(a state dict)"
        )
    if key is not None and (key not in obj or not _holds_state(obj[key])):
        keys = ", ".join(repr(k) for k in list(obj)[:20])
        raise KeyError(f"{where} has no mapping under key {key!r}; its keys: {keys}")
    obj = _descend(obj, key, info)
    state: dict[str, torch.Tensor] = {}
    for name, value in obj.items():
        tensor = _as_tensor(value)
        if tensor is not None:
            state[str(name)] = tensor
        else:
            info.dropped.append(str(name))
    if not state and info.dropped:
        raise ValueError(
            f"{where} holds no tensors at the top level or under {', '.join(CONTAINER_KEYS)}; "
            f"its entries: {', '.join(repr(k) for k in info.dropped[:20])}. "
            "Select the entry that holds the weights with key=... (load_partial, "
            "read_state_dict; visionblocks inspect: --key)."
        )
    return state, info
