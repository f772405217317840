"""Reading checkpoint files safely (private; see `visionblocks.weights.read_state_dict`).

Torch files are opened with ``torch.load(weights_only=True)``: the restricted unpickler
rebuilds tensors, containers and plain Python values only, and refuses any other global
before calling it, so no code stored in a file ever runs. Zip-format files (the default of
``torch.save`` since PyTorch 1.6) are memory-mapped (``mmap=True``): tensors are views of
the file's pages and are read from disk only when copied.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap as _mmap
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CONTAINER_KEYS",
    "FilePages",
    "ReadInfo",
    "read_checkpoint",
    "unwrap_state_dict",
]

CONTAINER_KEYS = ("state_dict", "model_state_dict", "model_state", "model", "module")
"""Keys under which training checkpoints keep the model's state dict, in order of preference.

``state_dict_ema`` / ``model_ema`` are not unwrapped automatically: pass ``key=`` to pick them.
"""

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
_SAFETENSORS_SUFFIX = ".safetensors"


@dataclass
class ReadInfo:
    """What reading a checkpoint found besides its tensors (shown by ``visionblocks inspect``).

    Attributes:
        format: ``"torch (zip, mmap)"``, ``"torch (legacy)"`` or ``"safetensors"``.
        containers: Keys descended into to reach the state dict (``["state_dict"]``).
        dropped: Top-level keys of the state dict's mapping that held no tensor.
        other_keys: Keys of the outer containers that were not descended into.
    """

    format: str = ""
    containers: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    other_keys: list[str] = field(default_factory=list)


class _UnsafeFileError(ValueError):
    """The file needs globals (code) that the weights-only unpickler refuses."""


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # torch names the refused global in both messages


def _unsafe_message(path: str, exc: BaseException) -> str:
    found = _GLOBAL.search(str(exc))
    what = f" It references {found.group(1)!r}." if found else ""
    return (
        f"refusing to load {path!r}: it is not a plain weights file (it needs code to be "
        f"unpickled).{what} visionblocks loads torch files with torch.load(weights_only=True), "
        "which only rebuilds tensors and plain containers and never runs code from the file. "
        "If you trust the file, load it yourself with torch.load(weights_only=False) and pass "
        "the resulting state dict instead of the path."
    )


def _torch_load(path: str, map_location: Any) -> tuple[Any, str]:
    # mmap needs the zip format; legacy (pre-1.6 / _use_new_zipfile_serialization=False)
    # files are read into memory, still with the restricted unpickler.
    mmap = zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # "Unsupported global: GLOBAL x.y" (a class) or "unsupported GLOBAL posix.system
        # whose module posix is blocked" (a function of a blocked module): code, refused.
        if _GLOBAL.search(str(exc)):
            raise _UnsafeFileError(_unsafe_message(path, exc)) from None
        detail = str(exc).partition("WeightsUnpickler error:")[2].split("\n\n")
        detail = " ".join(part.strip() for part in detail[:2] if part.strip())
        raise ValueError(
            f"cannot read {path!r}: not a valid torch.save file ({detail or exc})"
        ) from None
    except (EOFError, RuntimeError) as exc:  # empty or truncated file, a zip of other things
        raise ValueError(
            f"cannot read {path!r}: not a valid torch.save file "
            f"({type(exc).__name__}: {str(exc).strip() or 'file ended early'})"
        ) from None
    return obj, "torch (zip, mmap)" if mmap else "torch (legacy)"


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
    lower = path.lower()
    if lower.endswith(_SAFETENSORS_SUFFIX):
        obj: Any = _safetensors_load(path, map_location)
        fmt = "safetensors"
    elif lower.endswith(_TORCH_SUFFIXES):
        obj, fmt = _torch_load(path, map_location)
    else:
        try:
            obj, fmt = _torch_load(path, map_location)
        except _UnsafeFileError:
            raise
        except Exception as exc:
            raise ValueError(
                f"cannot read {path!r}: unknown extension (expected .safetensors or one of "
                f"{', '.join(_TORCH_SUFFIXES)}) and torch cannot read it either "
                f"({type(exc).__name__}: {exc})"
            ) from None
    state, info = unwrap_state_dict(obj, key=key, where=repr(path))
    info.format = fmt
    return state, info


def unwrap_state_dict(
    obj: Any, *, key: str | None = None, where: str = "the source"
) -> tuple[dict[str, torch.Tensor], ReadInfo]:
    """Descend into training-checkpoint containers and keep the tensor entries."""
    info = ReadInfo()
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"{where} holds a {type(obj).__name__}, not a mapping of names to tensors "
            "(a state dict)"
        )
    if key is not None:
        if key not in obj or not isinstance(obj[key], Mapping):
            keys = ", ".join(repr(k) for k in list(obj)[:20])
            raise KeyError(f"{where} has no mapping under key {key!r}; its keys: {keys}")
        info.other_keys = [str(k) for k in obj if k != key]
        info.containers.append(key)
        obj = obj[key]
    while True:
        found = next((k for k in CONTAINER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if found is None:
            break
        info.other_keys.extend(str(k) for k in obj if k != found)
        info.containers.append(found)
        obj = obj[found]
    state: dict[str, torch.Tensor] = {}
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            state[str(name)] = value
        else:
            info.dropped.append(str(name))
    if not state and info.dropped:
        raise ValueError(
            f"{where} holds no tensors at the top level or under {', '.join(CONTAINER_KEYS)}; "
            f"its entries: {', '.join(repr(k) for k in info.dropped[:20])}. "
            "Select the entry that holds the weights with read_state_dict(path, key=...)."
        )
    return state, info


_MADV_DONTNEED = 4  # Linux


class FilePages:
    """Drops the pages of memory-mapped checkpoint tensors from this process once copied.

    Copying a memory-mapped tensor faults its pages in, and they stay resident until the
    whole mapping goes, so loading a file would still cost its full size. ``release(t)``
    tells the kernel (``madvise(MADV_DONTNEED)``) that ``t``'s pages are no longer needed:
    they leave the resident set and stay in the page cache; touching them again reads them
    back from the file, unchanged. Only ranges that lie inside a private mapping of
    ``path`` (checked in ``/proc/self/maps``) are released, so no other memory is ever
    touched; elsewhere (not Linux, no mapping) ``release`` does nothing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._ranges: list[tuple[int, int]] = []
        self._madvise = None
        if not sys.platform.startswith("linux"):
            return
        real = os.path.realpath(path)
        with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6 and fields[5] == real and fields[1].endswith("p"):
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    self._ranges.append((low, high))
        if self._ranges:
            with contextlib.suppress(OSError, AttributeError, TypeError):
                libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
                self._madvise = libc.madvise

    def release(self, tensor: torch.Tensor) -> None:
        """Release the whole pages under ``tensor``'s storage if they lie in the file's mapping."""
        if self._madvise is None or tensor.device.type != "cpu":
            return
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return
        page = _mmap.PAGESIZE
        start = storage.data_ptr() // page * page
        end = -(-(storage.data_ptr() + storage.nbytes()) // page) * page
        if any(low <= start and end <= high for low, high in self._ranges):
            self._madvise(start, end - start, _MADV_DONTNEED)
