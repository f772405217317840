"""How the torch paths of the local ops cut their work into parts (shared by both ops).

Both `visionblocks.ops._local_filter_torch` and `visionblocks.ops._local_attention_torch`
work on *planes*: a ``(batch item, group)`` or ``(batch item, head)`` pair, whose channels
are one contiguous ``(Cp, H, W)`` block of the input viewed as ``(planes, Cp, H, W)``. A
*segment* (a part, in the ops' words) is a slice of planes and a range of rows; each step of
an op is one torch op, per tap or per channel, on strided views of a segment. `Grid` cuts the ``(planes, rows)`` grid into segments of about
``target`` elements of work:

- a plane larger than ``target`` is cut into blocks of rows (at least ``min_rows`` each),
  one segment per ``(plane, block)``;
- smaller planes are grouped, consecutive planes forming one segment (one op covers them).

`Grid.run` hands the segments to `visionblocks._core.parallel.parallel_for`: one fork and one
join per call, each part's ops run serially with one intra-op thread, so a busy machine
delays only the part a descheduled thread holds (see `visionblocks._core.parallel`). The
segments depend only on the shapes, never on the thread count, so results are bitwise
reproducible. On CUDA the segments run one after the other (their ops are kernels queued
on one stream; there is nothing to spread over threads).
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

from visionblocks._core.parallel import parallel_for, parts, workspace

__all__ = ["Grid", "new_output", "planar", "scratch", "windows"]

# Outputs this large get transparent huge pages (see `new_output`). glibc maps every
# allocation above 32 MiB afresh (its largest mmap threshold), so the advice never touches
# memory that other allocations share.
_HUGE_OUTPUT_BYTES = 64 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
# Elements per block of `planar`'s channels-last conversion: a block and its transpose
# stay in L2, where torch's strided copy runs several times faster than on the whole tensor.
_PLANAR_BLOCK = 1 << 16

Work = Callable[[slice, int, int], None]


def scratch(name: str, shape: Sequence[int], capacity: int, like: Tensor) -> Tensor:
    """A contiguous ``shape`` tensor (contents undefined) of ``like``'s dtype and device.

    On CPU it is the front of the calling thread's reusable buffer ``name`` of ``capacity``
    elements (`visionblocks._core.parallel.workspace`; ``capacity`` is the largest ``shape`` of
    the call, so the last, shorter part of a call does not reallocate); elsewhere a new
    tensor.

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

    The planes of the local ops need NCHW memory. A channels-last ``x`` (channel stride 1,
    as a ``channels_last`` conv's output or a channel slice of one) is transposed on CPU in
    L2-sized blocks of rows spread over the threads (`parallel_for`), several times faster
    than ``x.contiguous()``, whose strided copy of a large tensor is memory bound; the cast
    to ``dtype`` happens in the same pass. Other layouts, and CUDA tensors, use ``.to`` and
    ``.contiguous()``.

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

    A fresh result is written through one page fault per 4 KiB page, and for a result of
    ~100 MB (``local_filter2d``'s ``grad_kernels``) the faults cost more than the arithmetic.
    For results of at least 64 MiB on Linux, ``madvise(MADV_HUGEPAGE)`` before the first
    write lets the kernel back them with 2 MiB pages (where transparent huge pages are
    enabled for ``madvise``, the common default): 512 times fewer faults. The advice only
    concerns this allocation, which glibc maps afresh and unmaps when the tensor is freed.
    Set ``VISIONBLOCKS_HUGE_PAGES=0`` to turn it off.

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

    ``windows(xp, k, d, s, rows, cols)[..., i, j, r, c] = xp[..., r*s + i*d, c*s + j*d]``,
    shape ``(..., k, k, rows, cols)``: the unfolded tensor of ``F.unfold``, as strides.

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

    Args:
        planes: Number of planes.
        rows: Rows per plane.
        row_cost: Work per row of one plane (e.g. output elements, or logits).
        target: Work per segment.
        min_rows: Smallest row block (a block must be at least this tall).
        device: On a non-CPU device `run` calls the segments one after the other.

    A plane costing more than ``target`` is cut into blocks of at least
    ``max(min_rows, target // row_cost)`` rows (as equal as possible); otherwise whole planes
    are grouped, ``group = target // plane cost`` of them per segment.

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

        ``parity`` (0 or 1) restricts the run to the even or odd row blocks: two neighbouring
        blocks' segments may then write to each other's rows (up to ``min_rows // 2`` rows
        past their own) without racing.
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
