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
other columns as zeros. It is compiled with the system C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``; ``-O3 -march=native``, then plain ``-O3``) into
``$VISIONBLOCKS_CACHE_DIR`` (default ``$XDG_CACHE_HOME/visionblocks`` or
``~/.cache/visionblocks``; a folder must be private), keyed by the source, flags, compiler
command and CPU, and loaded with ``ctypes`` (whose calls release the GIL);
`visionblocks._parallel.parallel_for` spreads the row blocks over threads, one fork and one
join per call.

Without a compiler, on Windows, or with ``VISIONBLOCKS_DISABLE_NATIVE=1``, `warp_zeros`
returns ``None`` and `warp_affine` uses ``grid_sample``; the results agree up to float32
rounding (the kernel computes coordinates in float64). `native_unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd import forward_ad

from visionblocks._parallel import parallel_for, workspace

__all__ = ["ENV_DISABLE", "native_unavailable_reason", "warp_zeros"]

ENV_DISABLE = "VISIONBLOCKS_DISABLE_NATIVE"
_SOURCE = Path(__file__).with_name("_warp_kernel.c")
_FLAGS = (["-O3", "-march=native"], ["-O3"])
_ROWS = 64  # output rows per part: plans are reused over a block, ~0.2 ms of work at 512 wide
_lock = threading.Lock()
_state: dict[str, object] = {}


def _reset_lock_after_fork() -> None:  # a fork during a build must not leave the lock held
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _cache_dir() -> Path:
    env = os.environ.get("VISIONBLOCKS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "visionblocks"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [
                ln for ln in f.read(1 << 16).splitlines() if ln.startswith(("model name", "flags"))
            ]
        return "\n".join(lines[:2])
    except OSError:
        return platform.processor()


def _private(folder: Path) -> bool:
    """Create ``folder`` if needed; usable only if it is ours and nobody else can write to it
    (a shared temp folder must not let another user plant the library we load)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _compile(cc: str, source: bytes) -> ctypes.CDLL:
    errors = []
    for flags in _FLAGS:
        key = hashlib.sha256(
            b"\0".join(s.encode() for s in (cc, *flags, platform.machine(), _cpu_id())) + source
        ).hexdigest()[:20]
        for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"visionblocks-{os.getuid()}"):
            target = folder / f"warp_kernel_{key}.so"
            try:
                if not _private(folder):
                    errors.append(f"{folder}: writable by others")
                    continue
                if not target.exists():
                    tmp = folder / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
                    cmd = [cc, *flags, "-shared", "-fPIC", "-o", str(tmp), str(_SOURCE), "-lm"]
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                    if proc.returncode != 0:
                        errors.append(f"{' '.join(flags)}: {proc.stderr.strip()[-300:]}")
                        break  # a compile error: try the next flags, not the next folder
                    os.replace(tmp, target)  # atomic: concurrent builders race harmlessly
                return ctypes.CDLL(str(target))
            except (OSError, subprocess.SubprocessError) as err:
                errors.append(f"{folder}: {err}")
    raise RuntimeError("; ".join(errors) or "no usable cache folder")


def _load() -> tuple[object, object] | None:
    """The two kernels (float32, float64), or None with the reason in ``_state``."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, reason = None, None
        cc = os.environ.get("CC") or next(
            (c for c in ("cc", "gcc", "clang") if shutil.which(c)), None
        )
        if os.environ.get(ENV_DISABLE, "").strip().lower() in {"1", "true", "yes", "on"}:
            reason = f"disabled by {ENV_DISABLE}=1"
        elif sys.platform == "win32":
            reason = "not built on Windows"
        elif cc is None:
            reason = "no C compiler found (set CC)"
        else:
            try:
                dll = _compile(cc, _SOURCE.read_bytes())
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                kernels = []
                for name in ("vb_warp_zeros_f32", "vb_warp_zeros_f64"):
                    fn = getattr(dll, name)
                    fn.argtypes = [ptr, ptr, i64, i64, i64, i64, i64, ptr] + [i64] * 5 + [ptr] * 3
                    fn.restype = None
                    kernels.append(fn)
                lib = tuple(kernels)
            except Exception as err:  # any failure means: use grid_sample
                reason = f"could not build the warp kernel with {cc}: {err}"
        _state["lib"], _state["reason"] = lib, reason
        return lib  # type: ignore[return-value]


def native_unavailable_reason() -> str | None:
    """Why the C kernel is not used (``None`` when it is); builds it on the first call."""
    _load()
    return _state["reason"]  # type: ignore[return-value]


def _has_data(t: Tensor) -> bool:
    try:  # a vmap/grad wrapper raises; a fake tensor (shape inference) has a null pointer
        return t.data_ptr() != 0
    except RuntimeError:
        return False


def _plain(*tensors: Tensor) -> bool:
    """Real storage, and no autograd, tracing, compiling or forward-mode dual to honour: the
    kernel writes through ``data_ptr``, which none of them would see."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False
    return all(
        _has_data(t)
        and not (t.requires_grad and torch.is_grad_enabled())
        and forward_ad.unpack_dual(t).tangent is None
        for t in tensors
    )


def warp_zeros(img: Tensor, inv: Tensor, size: tuple[int, int]) -> Tensor | None:
    """Bilinear zeros-padding warp of ``img (B, C, H, W)`` with inverse matrices ``inv``.

    ``inv`` is ``(1, 2, 3)`` (shared) or ``(B, 2, 3)``. Returns ``None`` (the caller falls
    back to ``grid_sample``) unless the kernel is available, ``img`` is a float32/float64 CPU
    tensor with storage, nothing needs a gradient or a trace (`_plain`), the matrices are finite
    and offsets fit in 32 bits.
    """
    b, c, h, w = img.shape
    ho, wo = size
    if (
        img.device.type != "cpu"
        or img.dtype not in (torch.float32, torch.float64)
        or img.numel() == 0
        or h * w + w + 1 >= 2**31
        or not _plain(img, inv)
    ):
        return None
    m = inv.detach().to(torch.float64).contiguous()
    if not bool(torch.isfinite(m).all()):
        return None
    lib = _load()
    if lib is None:
        return None
    fn = lib[0] if img.dtype == torch.float32 else lib[1]
    src = img.contiguous()
    out = torch.empty(b, c, ho, wo, dtype=img.dtype)
    nm = m.shape[0]
    blocks = -(-ho // _ROWS)
    per_image = nm > 1  # per-image matrices: one part per (image, row block)
    ptrs = (src.data_ptr(), out.data_ptr(), m.data_ptr())

    def run(start: int, stop: int) -> None:
        off = workspace("warp_off", (_ROWS * wo,), torch.int32, img.device)
        wts = workspace("warp_w", (2 * _ROWS * wo,), img.dtype, img.device)
        spans = workspace("warp_spans", (4 * _ROWS,), torch.int64, img.device)
        for part in range(start, stop):
            n0, n1 = (part // blocks, part // blocks + 1) if per_image else (0, b)
            y0 = (part % blocks) * _ROWS
            y1 = min(ho, y0 + _ROWS)
            fn(*ptrs[:2], c, h, w, ho, wo, ptrs[2], nm, n0, n1, y0, y1,
               off.data_ptr(), wts.data_ptr(), spans.data_ptr())  # fmt: skip

    parallel_for(run, blocks * (b if per_image else 1), 1)
    return out
