"""CPU fast path of `warp_affine` (bilinear, zeros padding): a small C kernel, built on first use.

Why: ``F.grid_sample`` spends about as long on an output pixel whose four neighbours are all
outside the image as on any other, recomputes each pixel's neighbours and weights for every
image when one matrix serves the batch, and runs as OpenMP regions that stall when another
process holds a core. On the benchmark (8×3×512×512, 2 threads) pure-torch variants (bands of
rows skipping the empty columns, cheaper grids) stayed under 1.35x kornia, which ends in the
same ``grid_sample``.

How: ``_warp_kernel.c`` (next to this file) plans each block of output rows once (the columns
that can be nonzero and, for the pixels whose four neighbours are inside, their offset and
fractions), reuses the plan for every channel and every image sharing the matrix, and writes the
other columns as zeros. It is built and loaded by `visionblocks._core.native.NativeLibrary` (the
system C compiler, a private cache folder; ``ctypes`` calls release the GIL), and its row blocks
run as parts on torch's own OpenMP team, one parallel region per call
(`visionblocks._core.native.NativeLibrary.run_parts`).

Without a compiler, on Windows, or with ``VISIONBLOCKS_DISABLE_NATIVE=1``, `warp_zeros`
returns ``None`` and `warp_affine` uses ``grid_sample``; the results agree up to float32
rounding (the kernel computes coordinates in float64). `native_unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from visionblocks._core.native import ENV_DISABLE, NativeLibrary, plain

__all__ = ["ENV_DISABLE", "LIBRARY", "native_unavailable_reason", "warp_zeros"]

_ROWS = 64  # output rows per part: plans are reused over a block, ~0.2 ms of work at 512 wide
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURE = ([_PTR, _PTR] + [_I64] * 5 + [_PTR] + [_I64] * 6, _I64)
LIBRARY = NativeLibrary(
    "warp_kernel",
    Path(__file__).with_name("_warp_kernel.c"),
    {"vb_warp_zeros_parts_f32": _SIGNATURE, "vb_warp_zeros_parts_f64": _SIGNATURE},
    parallel=True,
)


def native_unavailable_reason() -> str | None:
    """Why the C kernel is not used (``None`` when it is); builds it on the first call."""
    return LIBRARY.reason()


def warp_zeros(img: Tensor, inv: Tensor, size: tuple[int, int]) -> Tensor | None:
    """Bilinear zeros-padding warp of ``img (B, C, H, W)`` with inverse matrices ``inv``.

    ``inv`` is ``(1, 2, 3)`` (shared) or ``(B, 2, 3)``. Returns ``None`` (the caller falls
    back to ``grid_sample``) unless the kernel is available, ``img`` is a float32/float64 CPU
    tensor with storage, nothing needs a gradient or a trace (`visionblocks._core.native.plain`), the matrices are finite
    and offsets fit in 32 bits.
    """
    b, c, h, w = img.shape
    ho, wo = size
    if (
        img.device.type != "cpu"
        or img.dtype not in (torch.float32, torch.float64)
        or img.numel() == 0
        or h * w + w + 1 >= 2**31
        or wo >= 2**31
        or not plain([img, inv])
    ):
        return None
    m = inv.detach().to(torch.float64).contiguous()
    if not bool(torch.isfinite(m).all()):
        return None
    lib = LIBRARY.functions()
    if lib is None:
        return None
    fn = lib["vb_warp_zeros_parts_f32" if img.dtype == torch.float32 else "vb_warp_zeros_parts_f64"]
    src = img.contiguous()
    out = torch.empty(b, c, ho, wo, dtype=img.dtype)
    nm = m.shape[0]
    blocks = -(-ho // _ROWS)
    parts = blocks * (b if nm > 1 else 1)  # per-image matrices: one part per (image, row block)
    args = (src.data_ptr(), out.data_ptr(), c, h, w, ho, wo, m.data_ptr(), nm, b, _ROWS)
    LIBRARY.run_parts(fn, args, parts)
    return out
