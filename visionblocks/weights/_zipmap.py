"""Reading a plain ``torch.save`` zip file quickly (private; see `visionblocks.weights`).

Why: ``torch.load(weights_only=True, mmap=True)`` unpickles with torch's pure-Python
restricted unpickler, and for a state dict of a few hundred tensors that is most of the cost
of a load (ResNet-50, 320 tensors: about 30 ms, against about 15 ms to read its 98 MB from
the page cache). `read_mapped_zip` reads the common case, a pickle of plain containers and
tensors, with pickle's C unpickler restricted to three names, which it maps to inert objects
of its own:

* ``collections.OrderedDict``: the C type itself (immutable; its instances are plain data);
* ``torch._utils._rebuild_tensor_v2``: `_TensorArgs`, a tuple type whose class and instances
  take no attributes; it only records its arguments, which are checked and turned into
  tensors once the pickle is read;
* ``torch.<Name>Storage``: a `_StorageType` marker (a tuple holding the dtype).

Nothing the file names is imported or called, and no object on the unpickler's stack has a
``__setstate__``, an ``append`` or a settable attribute that is not plain data. Anything
else (another global, an argument of another kind, a missing or short record, the other
byte order, fake-tensor mode, a ``map_location`` other than the CPU, shared mmap options)
raises `Unsupported`, and the caller reads the file with ``torch.load`` as before. The
result is what ``torch.load(path, map_location="cpu", weights_only=True, mmap=True)`` gives:
each storage a slice of one private (copy-on-write) mapping of the whole file.
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import functools
import io
import mmap as _mmap
import os
import pickle
import sys
from typing import Any

import torch

__all__ = ["Unsupported", "read_mapped_zip"]


class Unsupported(Exception):
    """The fast reader does not handle this file: read it with ``torch.load``."""


class _Frozen(type):
    """A metaclass whose classes refuse attribute changes (pickle's ``BUILD`` sets them)."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise AttributeError(f"{cls.__name__} is read-only")

    def __delattr__(cls, name: str) -> None:
        raise AttributeError(f"{cls.__name__} is read-only")


class _TensorArgs(tuple, metaclass=_Frozen):
    """The arguments of one ``_rebuild_tensor_v2`` call (no ``__dict__``: ``BUILD`` fails)."""

    __slots__ = ()

    def __new__(cls, *args: Any) -> _TensorArgs:
        return tuple.__new__(cls, args)


class _StorageType(tuple, metaclass=_Frozen):
    """``torch.<Name>Storage`` in a persistent id: ``(dtype,)``."""

    __slots__ = ()


class _Storage(tuple, metaclass=_Frozen):
    """A storage of the file: ``(key, dtype, numel, location)``."""

    __slots__ = ()


@functools.lru_cache(maxsize=1)
def _storage_types() -> dict[str, _StorageType]:
    quantized = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
    with contextlib.suppress(Exception):
        table = torch.storage._storage_type_to_dtype_map()
        return {n: _StorageType((d,)) for n, d in table.items() if d not in quantized}
    return {}


class _Unpickler(pickle.Unpickler):
    """pickle's C unpickler with an allowlist of three names (see the module doc)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _TensorArgs
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch":
            found = _storage_types().get(name)
            if found is not None:
                return found
        raise Unsupported(f"global {module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        if type(pid) is not tuple or len(pid) != 5:
            raise Unsupported("persistent id")
        kind, storage_type, key, location, numel = pid
        if (
            kind != "storage"
            or type(storage_type) is not _StorageType
            or type(key) is not str
            or type(location) is not str
            or type(numel) is not int
            or numel < 0
        ):
            raise Unsupported("persistent id")
        storage = _Storage((key, storage_type[0], numel, location))
        known = self.storages.setdefault(key, storage)
        if known[1:3] != storage[1:3]:
            raise Unsupported("one storage under two dtypes or sizes")
        return known


def _extensions_registered() -> bool:
    """The C unpickler serves ``EXT`` opcodes from copyreg's cache without `find_class`."""
    return bool(copyreg._extension_cache or copyreg._inverted_registry)  # type: ignore[attr-defined]


def _cpu_target(map_location: Any) -> bool | None:
    """True: every storage goes to the CPU; None: each to its saved place (``None``)."""
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        with contextlib.suppress(RuntimeError):
            if torch.device(map_location).type == "cpu":
                return True
    raise Unsupported("map_location")


def _plain_torch_state() -> None:
    """torch.load would do what `read_mapped_zip` does: a private mapping, real tensors."""
    options = getattr(torch.serialization, "get_default_mmap_options", None)
    if options is not None and options() != _mmap.MAP_PRIVATE:
        raise Unsupported("shared mmap options")
    if getattr(getattr(torch.serialization, "_serialization_tls", None), "skip_data", False):
        raise Unsupported("skip_data")
    fake_mode = getattr(getattr(torch, "_guards", None), "detect_fake_mode", None)
    if fake_mode is None or fake_mode(None) is not None:
        raise Unsupported("fake tensor mode")


class _Builder:
    """Turns `_TensorArgs` into tensors on slices of the file's mapping."""

    def __init__(
        self, reader: Any, mapped: torch.UntypedStorage, storages: dict[str, _Storage]
    ) -> None:
        self.reader, self.mapped, self.storages = reader, mapped, storages
        self.slices: dict[str, torch.UntypedStorage] = {}
        self.built: dict[int, Any] = {}

    def storage(self, storage: _Storage) -> torch.UntypedStorage:
        key, dtype, numel, _ = storage
        found = self.slices.get(key)
        if found is None:
            name = f"data/{key}"
            nbytes = numel * dtype.itemsize
            try:
                size, start = self.reader.get_record_size(name), self.reader.get_record_offset(name)
            except (RuntimeError, AttributeError):  # no such record; an older torch
                raise Unsupported(f"record {name}") from None
            if nbytes > size or start + nbytes > self.mapped.nbytes():
                raise Unsupported(f"record {name} is short")
            found = self.slices[key] = self.mapped[start : start + nbytes]
        return found

    def tensor(self, args: _TensorArgs) -> torch.Tensor:
        if len(args) == 7 and args[6] in (None, {}):
            args = _TensorArgs(*args[:6])
        if len(args) != 6:
            raise Unsupported("rebuild arguments")
        storage, offset, size, stride, requires_grad, hooks = args
        if (
            type(storage) is not _Storage
            or type(offset) is not int
            or type(size) is not tuple
            or type(stride) is not tuple
            or len(size) != len(stride)
            or type(requires_grad) is not bool
            or type(hooks) not in (collections.OrderedDict, dict)
            or hooks
            or offset < 0
            or any(type(n) is not int or n < 0 for n in size)
            or any(type(n) is not int or n < 0 for n in stride)
        ):
            raise Unsupported("rebuild arguments")
        untyped = self.storage(storage)
        dtype = storage[1]
        if all(size):  # not empty: its last element must lie in the storage
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= storage[2]:
                raise Unsupported("tensor outside its storage")
        tensor = torch.empty((0,), dtype=dtype).set_(untyped, offset, size, stride)
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def walk(self, obj: Any) -> Any:
        """``obj`` with every `_TensorArgs` replaced by its tensor (containers in place)."""
        kind = type(obj)
        if kind is _TensorArgs:
            found = self.built.get(id(obj))
            if found is None:
                found = self.built[id(obj)] = (obj, self.tensor(obj))
            return found[1]
        if kind is dict or kind is collections.OrderedDict:
            if id(obj) not in self.built:
                self.built[id(obj)] = (obj, obj)
                for key, value in obj.items():
                    if type(value) not in _LEAVES:
                        obj[key] = self.walk(value)
                if kind is collections.OrderedDict and obj.__dict__:
                    self.walk(obj.__dict__)
            return obj
        if kind is list:
            if id(obj) not in self.built:
                self.built[id(obj)] = (obj, obj)
                for i, value in enumerate(obj):
                    if type(value) not in _LEAVES:
                        obj[i] = self.walk(value)
            return obj
        if kind is tuple:
            found = self.built.get(id(obj))
            if found is None:
                new = tuple(v if type(v) in _LEAVES else self.walk(v) for v in obj)
                found = self.built[id(obj)] = (obj, new)
            return found[1]
        if kind in _LEAVES or kind is _Storage or kind is _StorageType:
            return obj
        if kind in (set, frozenset, bytearray, complex):
            return obj
        raise Unsupported(f"object of type {kind.__name__}")


_LEAVES = frozenset({str, int, float, bool, type(None), bytes})


def read_mapped_zip(
    path: str, map_location: Any, keep_fd: bool
) -> tuple[Any, int | None, torch.UntypedStorage]:
    """Read the ``torch.save`` zip file at ``path``: ``(object, fd, mapping)``.

    Tensors are views of ``mapping``, a private mapping of the whole file, as with
    ``torch.load(mmap=True)``. ``fd`` (with ``keep_fd``, on Linux; else None) is an open
    descriptor of the very file mapped, for
    `visionblocks.weights._pages.FilePages.for_mapping`; the caller closes it.

    Raises:
        Unsupported: The file needs ``torch.load`` (see the module doc).
    """
    to_cpu = _cpu_target(map_location)
    _plain_torch_state()
    if _extensions_registered():
        raise Unsupported("copyreg extensions")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    keep = False
    try:
        # Read the central directory and map the file through the descriptor, so that both
        # are of the one file even when the path is replaced meanwhile.
        name = f"/proc/self/fd/{fd}" if sys.platform.startswith("linux") else path
        if name != path and not os.path.exists(name):
            name = path
        try:
            reader = torch._C.PyTorchFileReader(name)
            data = reader.get_record("data.pkl")
            order = reader.get_record("byteorder") if reader.has_record("byteorder") else None
        except (RuntimeError, AttributeError):
            raise Unsupported("not a torch zip file") from None
        if reader.has_record("constants.pkl"):
            raise Unsupported("TorchScript archive")
        if (order or sys.byteorder.encode()) != sys.byteorder.encode():
            raise Unsupported("byte order")
        unpickler = _Unpickler(data)
        try:
            obj = unpickler.load()
        except Unsupported:
            raise
        except Exception as exc:  # malformed: torch.load gives its own error
            raise Unsupported(f"pickle: {exc!r:.80}") from None
        if to_cpu is None and any(s[3] != "cpu" for s in unpickler.storages.values()):
            raise Unsupported("storages saved on another device")
        try:
            mapped = torch.UntypedStorage.from_file(name, False, os.fstat(fd).st_size)
            obj = _Builder(reader, mapped, unpickler.storages).walk(obj)
        except (RuntimeError, RecursionError) as exc:  # torch.load gives its own error
            raise Unsupported(f"{type(exc).__name__}: {exc!s:.80}") from None
        keep = keep_fd and name != path
        return obj, fd if keep else None, mapped
    finally:
        if not keep:
            os.close(fd)
