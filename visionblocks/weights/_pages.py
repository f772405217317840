"""The pages of a memory-mapped checkpoint file (private; see `visionblocks.weights`).

`FilePages` knows where a ``torch.save`` zip file is mapped in this process
(``torch.load(mmap=True)`` and the safe reader map it whole, private, read-only in effect), so
that `load_partial` can

* read a tensor's bytes from the file straight into the model's tensor (``os.preadv``: one
  copy by the kernel from the page cache) instead of faulting the mapping in page by page and
  copying from it, which costs a page fault per 4 KiB (`FilePages.read_into`);
* hand the pages of a tensor it did copy from the mapping back to the OS
  (``madvise(MADV_DONTNEED)``, `FilePages.release`).

Both only act on byte ranges that lie inside a private mapping of the file (checked in
``/proc/self/maps``, or known from `visionblocks.weights._zipmap`, which made the mapping:
`FilePages.for_mapping`), so no other memory is ever touched; elsewhere (not Linux, no
mapping) they do nothing and the caller copies as usual. `copy_tensors` reads or copies
each tensor in turn; a read of at least 8 MiB is split in parts of at least 4 MiB, one per
intra-op thread (``torch.get_num_threads()``): one thread's kernel copy from the page cache
is slower than ``copy_`` from the mapping on two threads, and the parts made a warm ViT-L/16
load 1.6x faster on 2 cores (``benchmarks/cases/weights.py``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import functools
import mmap as _mmap
import os
import sys
import zipfile
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from visionblocks.weights._adapt import adapt_input_conv_weight

__all__ = ["FilePages", "copy_tensors"]

_MADV_DONTNEED = 4  # Linux
_PART_BYTES = 4 << 20  # a read is split in parts of at least 4 MiB, one per intra-op thread
_MAX_READERS = 8
_PLAIN = (torch.Tensor, nn.Parameter)


@functools.lru_cache(maxsize=1)
def _readers() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that read the parts of a large tensor (made on first use)."""
    return concurrent.futures.ThreadPoolExecutor(_MAX_READERS - 1, "visionblocks-read")


@functools.lru_cache(maxsize=1)
def _madvise() -> Any:
    """libc's ``madvise`` (looked up once: ``find_library`` runs ``ldconfig``), or None."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc.madvise
    return None


class FilePages:
    """The mapping of a checkpoint file in this process: read tensors from it, release them.

    Copying a memory-mapped tensor faults its pages in, and they stay resident until the
    whole mapping goes, so loading a file would still cost its full size. ``release(t)``
    tells the kernel (``madvise(MADV_DONTNEED)``) that ``t``'s pages are no longer needed:
    they leave the resident set and stay in the page cache; touching them again reads them
    back from the file, unchanged. ``read_into(target, t)`` never touches the mapping: it
    reads ``t``'s bytes from the file into ``target``. Call ``close()`` when done.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._ranges: list[tuple[int, int]] = []
        self._offsets: list[int] = []  # file offset of each range's start
        self._inodes: set[int] = set()  # of the mapped file (it may be replaced since)
        self._madvise = None
        self._path = os.path.realpath(path)
        self._fd: int | None = None
        self._readable: bool | None = None  # whether read_into may read the file
        self._mapping: torch.UntypedStorage | None = None  # kept alive by for_mapping
        if not sys.platform.startswith("linux"):
            return
        with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6 and fields[5] == self._path and fields[1].endswith("p"):
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    self._ranges.append((low, high))
                    self._offsets.append(int(fields[2], 16))
                    self._inodes.add(int(fields[4]))
        if self._ranges:
            self._madvise = _madvise()

    @classmethod
    def for_mapping(
        cls, path: str | os.PathLike[str], fd: int, mapping: torch.UntypedStorage
    ) -> FilePages:
        """The pages of ``mapping``, a private mapping of the whole file open as ``fd``, in
        this machine's byte order (`visionblocks.weights._zipmap.read_mapped_zip` made
        both). Takes ``fd`` over (`close` closes it) and keeps ``mapping`` alive."""
        pages = cls.__new__(cls)
        pages._path = os.path.realpath(path)
        low = mapping.data_ptr()
        pages._ranges, pages._offsets = [(low, low + mapping.nbytes())], [0]
        pages._inodes = {os.fstat(fd).st_ino}
        pages._fd, pages._readable, pages._mapping = fd, True, mapping
        pages._madvise = _madvise() if sys.platform.startswith("linux") else None
        return pages

    def _file_offset(self, start: int, end: int) -> int | None:
        """Where the mapped bytes ``[start, end)`` lie in the file, if they are mapped."""
        for (low, high), offset in zip(self._ranges, self._offsets):
            if low <= start and end <= high:
                return offset + start - low
        return None

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
        if self._file_offset(start, end) is not None:
            self._madvise(start, end - start, _MADV_DONTNEED)

    def _can_read(self) -> bool:
        """The file is still the one mapped (not replaced since) and its tensors are stored
        as mapped: in this machine's byte order (readers byte-swap the mapped pages of a
        file of the other order)."""
        if self._readable is None:
            self._readable = False
            if self._ranges and sys.byteorder == "little" and hasattr(os, "preadv"):
                with contextlib.suppress(OSError, zipfile.BadZipFile, ValueError, IndexError):
                    self._fd = self._open_mapped()
                    self._readable = self._fd is not None
        return self._readable

    def _open_mapped(self) -> int | None:
        """A descriptor of the mapped file, if the path still leads to it and it is in
        little-endian byte order (the ``byteorder`` record of the zip; none means little)."""
        fd, keep = os.open(self._path, os.O_RDONLY), False
        try:
            if os.fstat(fd).st_ino in self._inodes:
                with os.fdopen(os.dup(fd), "rb") as handle, zipfile.ZipFile(handle) as archive:
                    names = [n for n in archive.namelist() if n.endswith("/byteorder")]
                    order = archive.read(names[0]) if len(names) == 1 else b"little"
                keep = order == b"little"
            return fd if keep else None
        finally:
            if not keep:
                os.close(fd)

    def _plan(self, target: torch.Tensor, value: torch.Tensor) -> tuple[int, int, int] | None:
        """``(address, bytes, file offset)`` to read ``value``, a tensor of the mapped file,
        into ``target`` (see `read_into`), or None where it must be copied instead."""
        if not (
            type(target) in _PLAIN
            and type(value) is torch.Tensor
            and target.device.type == "cpu"
            and value.device.type == "cpu"
            and target.dtype == value.dtype
            and target.shape == value.shape
            and target.layout == torch.strided
            and value.layout == torch.strided
            and not target.is_quantized
            and not value.is_quantized
            and target.is_contiguous()
            and value.is_contiguous()
            and target.numel() > 0
            and not target.is_inference()
            and self._can_read()
        ):
            return None
        nbytes = value.numel() * value.element_size()
        offset = self._file_offset(value.data_ptr(), value.data_ptr() + nbytes)
        if offset is None:
            return None
        return target.data_ptr(), nbytes, offset

    def _read_exact(self, address: int, nbytes: int, offset: int) -> None:
        """Read ``nbytes`` at file ``offset`` to ``address``; a large read in parts, one per
        intra-op thread (``os.preadv`` releases the GIL: one thread copies about 5 GB/s from
        the page cache, two measured 1.6x that on a ViT-L/16 file)."""
        parts = min(torch.get_num_threads(), _MAX_READERS, nbytes // _PART_BYTES)
        if parts < 2:
            self._read_part(address, nbytes, offset)
            return
        step = -(-nbytes // parts // _mmap.PAGESIZE) * _mmap.PAGESIZE
        starts = range(0, nbytes, step)
        jobs = [
            _readers().submit(self._read_part, address + s, min(step, nbytes - s), offset + s)
            for s in starts[1:]
        ]
        try:
            self._read_part(address, min(step, nbytes), offset)
        finally:
            errors = [job.exception() for job in jobs]  # waits for every part
        for error in errors:
            if error is not None:
                raise error

    def _read_part(self, address: int, nbytes: int, offset: int) -> None:
        view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self._path!r} ended while reading a tensor from it")
            done += got

    def read_into(self, target: torch.Tensor, value: torch.Tensor) -> bool:
        """Copy ``value``, a tensor of the mapped file, into ``target`` by reading the file.

        The same bytes as ``target.copy_(value)``, without faulting the mapping's pages in
        (``value``'s pages are never touched). Only for plain, contiguous CPU tensors of the
        same dtype and shape whose bytes lie in the mapping; returns False (nothing done)
        otherwise, and the caller copies. Bumps ``target``'s version counter as ``copy_``.
        """
        job = self._plan(target, value)
        if job is None:
            return False
        self._read_exact(*job)
        torch.autograd.graph.increment_version(target)
        return True

    def close(self) -> None:
        """Close the file opened by `read_into` (the mapping belongs to the tensors)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._readable, self._mapping = False, None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def copy_tensors(
    updates: dict[str, str],
    model_state: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    adapted: set[str],
    pages: FilePages | None,
    *,
    reshaped: Collection[str] = (),
    stacked: Mapping[str, Sequence[tuple[str, int, int]]] | None = None,
) -> None:
    """Copy ``state[updates[name]]`` into each ``model_state[name]``, in order (``adapted``
    names through `adapt_input_conv_weight`; ``reshaped`` names viewed in the model tensor's
    shape first). ``stacked`` gives a model tensor's rows from several places:
    ``{name: [(checkpoint key, first row, rows), ...]}``, copied one after the other along
    dim 0 (fused projections: whole tensors; split ones: one chunk). From a mapped file
    (``pages``), a tensor (or block of rows) is read from the file straight into the
    model's where it can be (`FilePages.read_into`), and one copied from the mapping gets its
    pages given back once copied (`FilePages.release`)."""

    def put(target: torch.Tensor, value: torch.Tensor, source: torch.Tensor) -> None:
        if pages is not None and pages.read_into(target, value):
            return
        target.copy_(value)
        if pages is not None:
            pages.release(source)

    try:
        with torch.no_grad():
            for name, old in updates.items():
                target, value = model_state[name], state[old]
                if name in adapted:
                    target.copy_(adapt_input_conv_weight(value, target.shape[1]))
                    if pages is not None:
                        pages.release(value)
                elif name in reshaped:
                    put(target, value.reshape(target.shape), value)
                else:
                    put(target, value, value)
            for name, pieces in (stacked or {}).items():
                target, row = model_state[name], 0
                for old, start, rows in pieces:
                    value = state[old]
                    put(target.narrow(0, row, rows), value.narrow(0, start, rows), value)
                    row += rows
    finally:
        if pages is not None:
            pages.close()
