"""How the torch paths of the local ops cut their work into parts (shared by both ops).

`visionblocks.ops._local_filter_torch` and `visionblocks.ops._local_attention_torch` work on
*planes* (a ``(batch item, group or head)`` pair: one contiguous ``(Cp, H, W)`` block of the
input viewed as ``(planes, Cp, H, W)``). `Grid` cuts the ``(planes, rows)`` grid into parts
of about ``target`` elements of work (blocks of rows of a large plane, or several whole
planes) and `Grid.run` hands them to `visionblocks.ops._parallel.parallel_for` (one
fork/join per call; serially on CUDA). Parts depend only on the shapes, never on the thread
count, so results are bitwise reproducible.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import math
import os
import sys
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from visionblocks.ops._parallel import parallel_for, parts, workspace

__all__ = ["Grid", "new_output", "planar", "scratch", "windows"]

# Outputs this large get transparent huge pages (`new_output`): above glibc's largest mmap
# threshold (32 MiB), so the advice never touches memory other allocations share.
_HUGE_OUTPUT_BYTES = 64 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_PLANAR_BLOCK = 1 << 16  # elements per block of `planar`'s transpose: it stays in L2

Work = Callable[[slice, int, int], None]


def scratch(name: str, shape: Sequence[int], capacity: int, like: Tensor) -> Tensor:
    """A contiguous ``shape`` tensor (contents undefined) of ``like``'s dtype and device: on
    CPU the front of the calling thread's reusable buffer ``name`` of ``capacity`` elements.

    Examples:
        >>> like = torch.zeros(1)
        >>> scratch("doc.scratch", (2, 3), 8, like).shape
        torch.Size([2, 3])
    """
    if like.device.type != "cpu":
        return like.new_empty(tuple(shape))
    numel = math.prod(shape)
    buf = workspace(name, (max(capacity, numel),), like.dtype, like.device)
    return buf[:numel].view(tuple(shape))


def planar(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x (B, C, H, W)`` as a contiguous (NCHW) tensor of ``dtype`` (``x`` itself if it is one).

    A channels-last CPU ``x`` (channel stride 1) is transposed and cast in L2-sized blocks
    of rows spread over the threads, faster than ``x.contiguous()``.

    Examples:
        >>> x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
        >>> y = planar(x, torch.float64)
        >>> y.is_contiguous(), y.dtype, torch.equal(y, x.double())
        (True, torch.float64, True)
    """
    if x.is_contiguous():
        return x.to(dtype)
    b, c, h, w = x.shape
    if x.device.type != "cpu" or x.stride(1) != 1 or x.numel() < _PLANAR_BLOCK:
        return x.to(dtype).contiguous()
    out = torch.empty((b, c, h, w), dtype=dtype, device=x.device)
    nhwc = x.permute(0, 2, 3, 1)  # (B, H, W, C), channels innermost
    rows = max(1, _PLANAR_BLOCK // max(1, w * c))
    blocks = -(-h // rows)

    def copy(start: int, stop: int) -> None:
        for i in range(start, stop):
            n, r0 = divmod(i, blocks)
            r0 *= rows
            out[n, :, r0 : r0 + rows].copy_(nhwc[n, r0 : r0 + rows].permute(2, 0, 1))

    parallel_for(copy, b * blocks, 1)
    return out


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` on Linux, else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.madvise.restype = ctypes.c_int
        return libc.madvise
    return None


def new_output(shape: Sequence[int], like: Tensor) -> Tensor:
    """``like.new_empty(shape)``; a large CPU result asks for transparent huge pages first.

    On Linux, results of at least 64 MiB get ``madvise(MADV_HUGEPAGE)`` before the first
    write (fewer page faults, which otherwise cost more than the arithmetic of
    ``local_filter2d``'s ``grad_kernels``). ``VISIONBLOCKS_HUGE_PAGES=0`` turns it off.

    Examples:
        >>> new_output((2, 3), torch.zeros(1)).shape
        torch.Size([2, 3])
    """
    out = like.new_empty(tuple(shape))
    nbytes = out.numel() * out.element_size()
    if out.device.type != "cpu" or nbytes < _HUGE_OUTPUT_BYTES:
        return out
    if os.environ.get("VISIONBLOCKS_HUGE_PAGES", "1") == "0" or (madvise := _madvise()) is None:
        return out
    start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
    end = (out.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a failure changes nothing
    return out


def windows(xp: Tensor, k: int, d: int, s: int, rows: int, cols: int) -> Tensor:
    """Every ``k x k`` window of a zero-padded ``xp (..., Hp, Wp)``, as a view (no copy).

    ``windows(xp, k, d, s, rows, cols)[..., i, j, r, c] = xp[..., r*s + i*d, c*s + j*d]``.

    Examples:
        >>> xp = torch.arange(16.0).view(4, 4)
        >>> windows(xp, 3, 1, 1, 2, 2)[:, :, 0, 1]  # the window at (0, 1)
        tensor([[ 1.,  2.,  3.],
                [ 5.,  6.,  7.],
                [ 9., 10., 11.]])
    """
    *lead, _, _ = xp.shape
    *outer, sh, sw = xp.stride()
    return xp.as_strided(
        (*lead, k, k, rows, cols),
        (*outer, d * sh, d * sw, s * sh, s * sw),
        xp.storage_offset(),
    )


class Grid:
    """The segments ``(planes slice, row start, row stop)`` of a ``(planes, rows)`` grid.

    A plane costing more than ``target`` (``rows * row_cost``) is cut into blocks of at least
    ``max(min_rows, target // row_cost)`` rows; otherwise ``target // plane cost`` whole
    planes form a segment. On a non-CPU ``device`` `run` calls the segments in order.

    Examples:
        >>> grid = Grid(planes=3, rows=10, row_cost=100, target=400)
        >>> grid.blocks, grid.group, grid.max_rows
        ([(0, 5), (5, 10)], 1, 5)
        >>> grid = Grid(planes=8, rows=4, row_cost=10, target=100)
        >>> grid.blocks, grid.group, grid.max_planes
        ([(0, 4)], 2, 2)
    """

    def __init__(
        self,
        planes: int,
        rows: int,
        row_cost: int,
        target: int,
        min_rows: int = 1,
        device: torch.device | None = None,
    ) -> None:
        self.planes, self.rows = planes, rows
        self.serial = device is not None and device.type != "cpu"
        min_rows = max(1, min_rows)
        plane_cost = max(rows, 1) * max(row_cost, 1)
        if plane_cost > target and rows >= 2 * min_rows:
            block = max(min_rows, target // max(row_cost, 1))
            count = max(1, rows // block)  # every block at least `block` rows
            self.blocks = parts(rows, -(-rows // count))
            self.group = 1
        else:
            self.blocks = [(0, rows)] if rows else []
            self.group = max(1, target // plane_cost)
        self.max_planes = min(self.group, max(planes, 1))
        self.max_rows = max((b - a for a, b in self.blocks), default=0)

    def run(self, work: Work, parity: int | None = None) -> None:
        """Call ``work(planes, r0, r1)`` on every segment, in parallel on CPU.

        ``parity`` (0 or 1) runs only the even or odd row blocks, so that neighbouring
        blocks may write up to ``min_rows // 2`` rows into each other's without racing.
        """
        blocks = [b for i, b in enumerate(self.blocks) if parity is None or i % 2 == parity]
        if not blocks or not self.planes:
            return
        if len(self.blocks) == 1:  # whole planes, consecutive ones grouped into one segment
            r0, r1 = blocks[0]
            count, grain = self.planes, self.group

            def segment(start: int, stop: int) -> None:
                work(slice(start, stop), r0, r1)

        else:
            count, grain = self.planes * len(blocks), 1

            def segment(start: int, stop: int) -> None:
                for i in range(start, stop):
                    plane, block = divmod(i, len(blocks))
                    work(slice(plane, plane + 1), *blocks[block])

        if self.serial:
            for start, stop in parts(count, grain):
                segment(start, stop)
        else:
            parallel_for(segment, count, grain)
