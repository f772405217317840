"""CPU fast path of `warp_affine` with constant padding: a small C kernel, built on first use.

Why: the workload is a data loader's per-sample job on one thread (a 640×640 image, 5
instance masks and their boxes, one matrix: `warp_sample`; the ``workload_augment_*`` cases of
``benchmarks/cases/workloads.py``). There the torch path converts a ``uint8`` image to float and
back around ``F.grid_sample`` and warps masks by index arithmetic and ``gather`` over whole
images: 30 ms (``uint8`` image) and 27 ms (``float32``) of CPU time, against about 7 and 10 ms
for OpenCV 5 (``cv2.warpAffine``, one call per mask). With the kernel: about 6 and 8 ms (1.14x
and 1.2-1.3x OpenCV, 4.2-4.7x and 3-3.9x torchvision transforms v2; medians of interleaved
runs on 2 busy shared cores).

How: ``_warp_kernel.c`` (next to this file) plans each block of output rows once (the columns
that can differ from the fill and, for bilinear sampling, each interior pixel's offset and
fractions; for nearest sampling each pixel's source offset), reuses the plan for every channel
and every image sharing the matrix, and writes the other columns with the fill. Bilinear
sampling takes ``uint8``, ``float32`` and ``float64`` images (``uint8`` computed in float32 and
rounded half to even, as the torch path); nearest sampling copies elements of any 1, 2, 4 or
8-byte dtype (``bool`` masks included). It is built and loaded by
`visionblocks._core.native.NativeLibrary` (the system C compiler, a private cache folder;
``ctypes`` calls release the GIL), and its row blocks run as parts on torch's own OpenMP team,
one parallel region per call (`visionblocks._core.native.NativeLibrary.run_parts`).

Without a compiler, on Windows, or with ``VISIONBLOCKS_DISABLE_NATIVE=1``, `warp_native`
returns ``None`` and `warp_affine` runs its torch path: bilinear results agree up to float32
rounding (``uint8``: within one level, at exact half levels), nearest results are equal (both
round the same float64 coordinates). `native_unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from visionblocks._core.native import ENV_DISABLE, NativeLibrary, plain

__all__ = ["ENV_DISABLE", "LIBRARY", "native_unavailable_reason", "warp_native"]

_ROWS = 64  # output rows per part: plans are reused over a block, ~0.2 ms of work at 512 wide
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_BILINEAR = ([_PTR, _PTR] + [_I64] * 5 + [_PTR] + [_I64] * 3 + [_PTR] + [_I64] * 3, _I64)
_NEAREST = ([_PTR, _PTR] + [_I64] * 6 + [_PTR] + [_I64] * 3 + [_PTR] + [_I64] * 3, _I64)
_BILINEAR_FUNCTIONS = {
    torch.uint8: "vb_warp_bilinear_parts_u8",
    torch.float32: "vb_warp_bilinear_parts_f32",
    torch.float64: "vb_warp_bilinear_parts_f64",
}
LIBRARY = NativeLibrary(
    "warp_kernel",
    Path(__file__).with_name("_warp_kernel.c"),
    {"vb_warp_nearest_parts": _NEAREST}
    | {name: _BILINEAR for name in _BILINEAR_FUNCTIONS.values()},
)


def native_unavailable_reason() -> str | None:
    """Why the C kernel is not used (``None`` when it is); builds it on the first call."""
    return LIBRARY.reason()


def warp_native(
    img: Tensor, inv: Tensor, size: tuple[int, int], mode: str, fill: Tensor | None
) -> Tensor | None:
    """Warp ``img (B, C, H, W)`` with inverse matrices ``inv`` and constant padding, in C.

    ``inv`` is ``(1, 2, 3)`` (shared) or ``(B, 2, 3)``; ``fill`` is ``None`` (zeros) or one
    value per channel, ``(C,)``, in ``img``'s dtype for ``mode="nearest"`` and in the
    computation dtype (float32, float64 for float64 images) for ``"bilinear"``. Returns
    ``None`` (the caller runs its torch path) unless the kernel is available, ``img`` is a CPU
    tensor with storage of a supported dtype (bilinear: ``uint8``, ``float32``, ``float64``;
    nearest: any with 1, 2, 4 or 8-byte elements), nothing needs a gradient or a trace
    (`visionblocks._core.native.plain`), the matrices are finite and offsets fit in 32 bits.
    """
    b, c, h, w = img.shape
    ho, wo = size
    nearest = mode == "nearest"
    supported = img.element_size() in (1, 2, 4, 8) if nearest else img.dtype in _BILINEAR_FUNCTIONS
    if (
        not supported
        or img.device.type != "cpu"
        or img.numel() == 0
        or h * w + w + 1 >= 2**31
        or wo >= 2**31
        or not plain([img, inv, fill])
    ):
        return None
    lib = LIBRARY.functions()
    if lib is None:
        return None
    m = inv.detach().to(torch.float64).contiguous()
    if not bool(torch.isfinite(m).all()):
        return None
    src = img.contiguous()
    out = torch.empty(b, c, ho, wo, dtype=img.dtype)
    nm = m.shape[0]
    parts = -(-ho // _ROWS) * (b if nm > 1 else 1)  # per-image matrices: (image, row block)
    fill = None if fill is None else fill.contiguous()  # held until the call returns
    fill_ptr = None if fill is None else fill.data_ptr()
    geometry = (c, h, w, ho, wo, m.data_ptr(), nm, b, _ROWS, fill_ptr)
    if nearest:  # elements of 1, 2, 4 or 8 bytes, copied as they are
        fn, head = lib["vb_warp_nearest_parts"], (img.element_size(),)
    else:
        fn, head = lib[_BILINEAR_FUNCTIONS[img.dtype]], ()
    LIBRARY.run_parts(fn, (src.data_ptr(), out.data_ptr(), *head, *geometry), parts)
    return out
