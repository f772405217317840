"""Reading torch and pickle files with `SafeUnpickler` (private; see `visionblocks.weights`).

* `read_torch_zip`: the zip format of ``torch.save`` (``<root>/data.pkl`` plus one
  ``<root>/data/<key>`` record per storage). Stored records are memory-mapped, as
  ``torch.load(mmap=True)`` does: tensors are views of the file's pages (copy-on-write).
* `read_pickle`: a legacy torch file (``_use_new_zipfile_serialization=False``: a magic
  number, the pickled object, its storage keys, then each storage's bytes) or a plain
  pickle (detectron2's model-zoo ``.pkl``).

Both return the unpickled object and the placeholders made for foreign names; every size
and offset read from the file is checked against the file before a tensor is made.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import zipfile
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import torch

from visionblocks.weights._rebuild import StorageType, TorchStorage
from visionblocks.weights._unpickle import SafeUnpickler

__all__ = ["SafeRead", "read_pickle", "read_torch_zip"]

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # first pickle of a legacy torch file
PROTOCOL_VERSION = 1001
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # zip local file header: signature .. name, extra


@dataclass
class SafeRead:
    """What the safe reader got out of a file.

    Attributes:
        obj: The unpickled object (foreign objects replaced by placeholders).
        placeholders: ``{name: objects}`` replaced, in the order first met.
        format: ``"torch (zip, mmap, safe unpickler)"``, ``"torch (legacy, safe
            unpickler)"`` or ``"pickle (safe unpickler)"``.
        mmap: Whether tensors are views of a memory-mapped file.
    """

    obj: Any
    placeholders: dict[str, int] = field(default_factory=dict)
    format: str = ""
    mmap: bool = False


def _storage_of(raw: bytearray) -> torch.UntypedStorage:
    """A storage that owns ``raw`` (which it keeps alive)."""
    if not raw:
        return torch.UntypedStorage(0)
    return torch.frombuffer(raw, dtype=torch.uint8).untyped_storage()


def _storage_id(pid: Any, length: int) -> tuple[Any, ...]:
    """Validate a persistent id ``("storage", StorageType, key, location, numel[, view])``."""
    if not isinstance(pid, tuple) or len(pid) != length:
        raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
    kind, storage_type, key = (p.decode("ascii") if isinstance(p, bytes) else p for p in pid[:3])
    numel = pid[4]
    if kind != "storage" or not isinstance(storage_type, StorageType):
        raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
    if not isinstance(key, str) or type(numel) is not int or numel < 0:
        raise pickle.UnpicklingError(f"malformed storage id {pid!r:.80}")
    return (kind, storage_type, key, *pid[3:])


class _ZipStorages:
    """``persistent_load`` of a torch zip file: each storage a slice of one file mapping."""

    def __init__(
        self,
        path: str,
        handle: BinaryIO,
        records: dict[str, zipfile.ZipInfo],
        root: str,
        byteorder: bytes,
    ) -> None:
        self.path, self.handle, self.records = path, handle, records
        self.root, self.byteorder = root, byteorder
        self.size = os.path.getsize(path)
        self.mapped: torch.UntypedStorage | None = None
        self.loaded: dict[str, TorchStorage] = {}

    def _bytes(self, info: zipfile.ZipInfo, nbytes: int) -> torch.UntypedStorage:
        if info.compress_type != zipfile.ZIP_STORED:  # torch never compresses; others might
            with zipfile.ZipFile(self.path) as archive:
                return _storage_of(bytearray(archive.read(info)[:nbytes]))
        self.handle.seek(info.header_offset)
        signature, name_length, extra_length = _LOCAL_HEADER.unpack(self.handle.read(30))
        start = info.header_offset + 30 + name_length + extra_length
        if signature != b"PK\x03\x04" or start + nbytes > self.size:
            raise pickle.UnpicklingError(f"record {info.filename!r} lies outside the file")
        if self.mapped is None:
            self.mapped = torch.UntypedStorage.from_file(self.path, False, self.size)
        return self.mapped[start : start + nbytes]

    def __call__(self, pid: Any) -> TorchStorage:
        _, storage_type, key, _location, numel = _storage_id(pid, 5)
        if key in self.loaded:
            return self.loaded[key]
        info = self.records.get(f"{self.root}data/{key}")
        dtype = storage_type.dtype
        nbytes = numel * dtype.itemsize
        if info is None or nbytes > info.file_size:
            raise pickle.UnpicklingError(f"storage {key!r} is missing or shorter than {nbytes} B")
        untyped = self._bytes(info, nbytes)
        if self.byteorder != sys.byteorder.encode():
            untyped.byteswap(dtype)
        self.loaded[key] = TorchStorage(untyped, dtype)
        return self.loaded[key]


def read_torch_zip(path: str) -> SafeRead:
    """Read a ``torch.save`` zip file with the safe unpickler, memory-mapping its storages."""
    with zipfile.ZipFile(path) as archive:
        records = {info.filename: info for info in archive.infolist()}
        pickles = [name for name in records if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError("the zip archive has no <root>/data.pkl record")
        root = pickles[0][: -len("data.pkl")]
        data = archive.read(pickles[0])
        byteorder = archive.read(root + "byteorder") if root + "byteorder" in records else None
    with open(path, "rb") as handle:
        storages = _ZipStorages(path, handle, records, root, byteorder or b"little")
        unpickler = SafeUnpickler(
            io.BytesIO(data), persistent_load=storages, load_from_bytes=storage_from_bytes
        )
        obj = unpickler.load()
    return SafeRead(obj, unpickler.replaced(), "torch (zip, mmap, safe unpickler)", mmap=True)


def _read_legacy(file: BinaryIO, placeholders: dict[str, int], limit: int, nested: bool) -> Any:
    """The rest of a legacy torch file once its magic number has been read."""

    def load(**options: Any) -> Any:
        return SafeUnpickler(file, placeholders=placeholders, **options).load()

    version = load()
    if version != PROTOCOL_VERSION:
        raise ValueError(f"unsupported legacy torch protocol version {version!r}")
    system = load()
    if not isinstance(system, dict) or system.get("little_endian") is not True:
        raise ValueError("only little-endian legacy torch files are supported")
    storages: dict[str, TorchStorage] = {}

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid[:1] in (("module",), (b"module",)) and len(pid) > 1:
            return pid[1]  # torch.save(model): the class, already a placeholder
        _, storage_type, key, _location, numel, view = _storage_id(pid, 6)
        dtype = storage_type.dtype
        if key not in storages:
            if numel * dtype.itemsize > limit:
                raise pickle.UnpicklingError(f"storage {key!r} is larger than the file")
            storages[key] = TorchStorage(torch.UntypedStorage(numel * dtype.itemsize), dtype)
        root = storages[key]
        if view is None:
            return root
        _view_key, offset, size = view
        if type(offset) is not int or type(size) is not int or min(offset, size) < 0:
            raise pickle.UnpicklingError(f"malformed storage view {view!r:.80}")
        start, end = offset * dtype.itemsize, (offset + size) * dtype.itemsize
        if end > root.untyped.nbytes():
            raise pickle.UnpicklingError(f"storage view {view!r:.80} lies outside its storage")
        return TorchStorage(root.untyped[start:end], dtype)

    obj = load(
        persistent_load=persistent_load, load_from_bytes=None if nested else storage_from_bytes
    )
    keys = load()
    if not isinstance(keys, list) or any(key not in storages for key in keys):
        raise ValueError("the storage keys after the object do not match its storages")
    for key in keys:
        target = storages[key].untyped
        (count,) = struct.unpack("<q", file.read(8))
        nbytes = count * storages[key].dtype.itemsize
        if nbytes != target.nbytes():
            raise ValueError(f"storage {key!r} holds {nbytes} bytes, {target.nbytes()} expected")
        raw = bytearray(file.read(nbytes))
        if len(raw) != nbytes:
            raise EOFError("the file ends inside a storage")
        if nbytes:
            target.copy_(_storage_of(raw))
    return obj


def storage_from_bytes(data: bytes, parent: SafeUnpickler) -> TorchStorage:
    """``torch.storage._load_from_bytes``: a storage pickled with plain ``pickle``."""
    file = io.BytesIO(data)
    magic = SafeUnpickler(file, placeholders=parent.placeholders).load()
    if type(magic) is not int or magic != MAGIC_NUMBER:
        raise pickle.UnpicklingError("_load_from_bytes holds no legacy torch storage")
    storage = _read_legacy(file, parent.placeholders, len(data), nested=True)
    if not isinstance(storage, TorchStorage):
        raise pickle.UnpicklingError("_load_from_bytes holds no storage")
    return storage


def read_pickle(path: str) -> SafeRead:
    """Read a legacy torch file or a plain pickle with the safe unpickler."""
    placeholders: dict[str, int] = {}
    with open(path, "rb") as file:
        first = SafeUnpickler(
            file, placeholders=placeholders, load_from_bytes=storage_from_bytes
        ).load()
        if type(first) is int and first == MAGIC_NUMBER:
            obj = _read_legacy(file, placeholders, os.path.getsize(path), nested=False)
            fmt = "torch (legacy, safe unpickler)"
        else:
            obj, fmt = first, "pickle (safe unpickler)"
    return SafeRead(obj, {name: max(n, 1) for name, n in placeholders.items()}, fmt)
