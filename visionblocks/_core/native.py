"""Small C kernels for the CPU fast paths, built with the system C compiler on first use.

Why: a fused CPU op written as a sequence of torch ops runs each op as its own pass over
memory and holds the GIL between ops, so threads queue for it; one C loop per element reads
its inputs once, computes in registers and releases the GIL for the whole call (``ctypes``
does). The kernels are plain C99 (no intrinsics, no fast-math): the compiler's auto-vectoriser
does the SIMD work, so results are the same on every machine up to the compiler's choices.

How: a `NativeLibrary` names a C source file next to the Python module that uses it and the
signatures of its functions. `NativeLibrary.functions` compiles the source once per process
(``$CC``, else ``cc``, ``gcc`` or ``clang``; ``-O3 -march=native``, then plain ``-O3``, both
with ``-fno-math-errno -fno-trapping-math``, which let it vectorise without changing
results, and ``-ffp-contract=off``: no fused multiply-add, so C arithmetic rounds as the same
torch ops do) into ``$VISIONBLOCKS_CACHE_DIR`` (default
``$XDG_CACHE_HOME/visionblocks`` or ``~/.cache/visionblocks``; the folder must be private,
else a private folder in the temp folder is used), keyed by the source, flags, compiler command
and CPU, and loads it with ``ctypes``.

Threads: a library runs its parts on torch's own OpenMP team
(``_native_team.h``: one ``GOMP_parallel`` region per call, parts taken from a shared counter).
torch's OpenMP threads keep spinning for milliseconds after each torch op; threads of our
own would compete with them for the cores (measured on 2 cores: the 4M-element focal sweep
took 9.8 ms right after a small torch op, 5.7 ms alone), while the team's threads simply take
the parts. The team is found without a search: ``GOMP_parallel`` of the ``libgomp.so.1`` that
torch loaded (`team_address`; ``RTLD_NOLOAD`` loads nothing new). Where torch uses another
runtime (`team_address` is ``None``), the parts go to
`visionblocks._core.parallel.parallel_for`'s Python threads.

Without a compiler, on Windows, or with ``VISIONBLOCKS_DISABLE_NATIVE=1``, ``functions``
returns ``None`` and `NativeLibrary.reason` says why; every caller then runs its torch path.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad

from visionblocks._core.recording import recording

__all__ = ["ENV_DISABLE", "NativeLibrary", "plain", "team_address"]

ENV_DISABLE = "VISIONBLOCKS_DISABLE_NATIVE"
_FLAGS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"],
    ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"],
)
_libraries: list[NativeLibrary] = []
_TEAM_HEADER = Path(__file__).with_name("_native_team.h")
_team: list[int | None] = []


def team_address() -> int | None:
    """Address of ``GOMP_parallel`` in the OpenMP runtime torch loaded (``libgomp.so.1``, which
    Linux wheels of torch ship), or ``None`` (torch built without OpenMP or with another
    runtime: the parts then run on `visionblocks._core.parallel`'s threads)."""
    if _team:
        return _team[0]
    address = None
    if "OpenMP" in torch.__config__.parallel_info():
        try:  # RTLD_NOLOAD: the library torch already loaded, or nothing
            fn = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD).GOMP_parallel
            address = ctypes.cast(fn, ctypes.c_void_p).value
        except (OSError, AttributeError):
            address = None
    _team.append(address)
    return address


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


def _compile(cc: str, name: str, source: Path) -> ctypes.CDLL:
    text = _TEAM_HEADER.read_bytes() + b"\0" + source.read_bytes()
    include = ["-include", str(_TEAM_HEADER)]
    errors = []
    for flags in _FLAGS:
        key = hashlib.sha256(
            b"\0".join(s.encode() for s in (cc, *flags, platform.machine(), _cpu_id())) + text
        ).hexdigest()[:20]
        for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"visionblocks-{os.getuid()}"):
            target = folder / f"{name}_{key}.so"
            try:
                if not _private(folder):
                    errors.append(f"{folder}: writable by others")
                    continue
                if not target.exists():
                    tmp = folder / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
                    cmd = [cc, *flags, *include, "-shared", "-fPIC", "-o", str(tmp), str(source)]
                    cmd.append("-lm")
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                    if proc.returncode != 0:
                        errors.append(f"{' '.join(flags)}: {proc.stderr.strip()[-300:]}")
                        break  # a compile error: try the next flags, not the next folder
                    os.replace(tmp, target)  # atomic: concurrent builders race harmlessly
                return ctypes.CDLL(str(target))
            except (OSError, subprocess.SubprocessError) as err:
                errors.append(f"{folder}: {err}")
    raise RuntimeError("; ".join(errors) or "no usable cache folder")


class NativeLibrary:
    """A C source file and the signatures of its functions, compiled and loaded on first use.

    The source is compiled with ``_native_team.h`` (``vb_run_parts``: parts of a kernel on
    torch's OpenMP team), and the library is handed the team at load time; entry points run
    with `run_parts` take ``start, stop, threads`` last and return the number of failed parts.

    Args:
        name: Short name (the file name of the built library and the messages).
        source: Path of the C file.
        signatures: ``{function: argtypes}`` (every function returns ``void`` or, with a
            ``(argtypes, restype)`` pair, ``restype``).

    Examples:
        >>> from pathlib import Path
        >>> lib = NativeLibrary("doc", Path("missing.c"), {"f": [ctypes.c_int64]})
        >>> lib.name
        'doc'
    """

    def __init__(self, name: str, source: Path, signatures: Mapping[str, Any]) -> None:
        self.name, self.source, self.signatures = name, source, dict(signatures)
        self.state: dict[str, Any] = {}
        self.lock = threading.Lock()
        _libraries.append(self)

    def functions(self) -> dict[str, Any] | None:
        """The loaded functions by name, or ``None`` (see `reason`); builds on the first call."""
        state = self.state
        if "functions" in state:
            return state["functions"]
        with self.lock:
            if "functions" in state:
                return state["functions"]
            functions, reason = None, None
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
                    dll = _compile(cc, self.name, self.source)
                    dll.vb_set_team.argtypes = [ctypes.c_void_p]
                    dll.vb_set_team(team_address())
                    state["set_team"] = dll.vb_set_team
                    functions = {}
                    for fname, sig in self.signatures.items():
                        argtypes, restype = sig if isinstance(sig, tuple) else (sig, None)
                        fn = getattr(dll, fname)
                        fn.argtypes, fn.restype = list(argtypes), restype
                        functions[fname] = fn
                except Exception as err:  # any failure means: use the torch path
                    functions, reason = None, f"could not build the {self.name} with {cc}: {err}"
            state["reason"] = reason
            state["functions"] = functions
            return functions

    def reason(self) -> str | None:
        """Why the C kernels are not used (``None`` when they are); builds on the first call."""
        self.functions()
        return self.state["reason"]

    def use_team(self, on: bool) -> None:
        """Run parts on torch's OpenMP team (``True``, the default where there is one) or on
        `visionblocks._core.parallel`'s Python threads (``False``; tests use it for that path)."""
        if self.functions() is not None:
            address = team_address() if on else None
            self.state["set_team"](address)
            self.state["team"] = address is not None

    def run_parts(self, fn: Any, args: Sequence[Any], parts: int) -> None:
        """Run parts ``[0, parts)`` of the entry point ``fn(*args, start, stop, threads)``.

        On torch's OpenMP team (one parallel region of ``torch.get_num_threads()`` threads)
        when the library has one, else over `visionblocks._core.parallel.parallel_for`'s threads,
        one part per call. Raises `MemoryError` if a part ran out of memory for its scratch.
        """
        from visionblocks._core.parallel import in_pool, parallel_for

        threads = 1 if in_pool() else torch.get_num_threads()
        team = self.state.get("team", True) and team_address() is not None
        if team or threads <= 1:
            failed = fn(*args, 0, parts, threads)
        else:
            failed = sum(parallel_for(lambda a, b: fn(*args, a, b, 1), parts, 1))
        if failed:
            raise MemoryError(f"{self.name}: {failed} part(s) could not allocate their scratch")


def _reset_locks_after_fork() -> None:  # a fork during a build must not leave a lock held
    for lib in _libraries:
        lib.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


def _has_data(t: Tensor) -> bool:
    try:  # a vmap/grad wrapper raises; a fake tensor (shape inference) has a null pointer
        return t.data_ptr() != 0 or t.numel() == 0
    except RuntimeError:
        return False


def plain(tensors: Sequence[Tensor | None], *, grad_ok: bool = False) -> bool:
    """Whether a C kernel may read and write these tensors through ``data_ptr``: real CPU
    storage, and no tracing, compiling or forward-mode dual to honour (none of them would see
    the kernel's work); unless ``grad_ok``, no tensor needs a gradient either."""
    if recording():
        return False
    for t in tensors:
        if t is None:
            continue
        if (
            t.device.type != "cpu"
            or not _has_data(t)
            or forward_ad.unpack_dual(t).tangent is not None
        ):
            return False
        if not grad_ok and t.requires_grad and torch.is_grad_enabled():
            return False
    return True
