"""Compile every launched kernel specialisation for real GPUs, without a GPU.

Triton's interpreter (how the tests run kernels on CPU) accepts programs that the GPU
compiler rejects and knows nothing of registers or shared memory. Triton's own compiler
runs without a GPU, though: `compile_all` compiles each specialisation found by
`benchmarks.kernel_specs` with ``triton.compile(ASTSource(...), target=GPUTarget(...))``
for ``sm_75``, ``sm_80`` and ``sm_90`` (which also assembles a cubin with ``ptxas``), then
runs ``ptxas -v`` on the PTX for the register count, spill stores and loads and stack
frame, and takes the shared memory from triton's metadata.

Compilation runs in worker processes without ``TRITON_INTERPRET`` (triton decides at import
whether ``@triton.jit`` compiles or interprets). Results are cached by triton
(``~/.triton/cache``), so a second run takes seconds.

``python -m benchmarks.compile_kernels [--all]`` (from a clone) prints the table;
``tests/kernels/test_compile.py`` requires every row to compile with no spills.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "compile_all", "format_table", "summarize"]

TARGETS: dict[str, tuple[int, int]] = {
    "sm_75": (75, 64 * 1024),
    "sm_80": (80, 99 * 1024),
    "sm_90": (90, 227 * 1024),
}
"""Target → (compute capability, shared memory per block in bytes). ``sm_80`` stands for
Ampere and Ada, so it takes the 99 KiB of ``sm_86``/``sm_89`` rather than the A100's 163 KiB."""

_PTXAS_FIELDS = {
    "regs": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "stack": r"(\d+) bytes stack frame",
}


def _ptxas(cc: int) -> str:
    """The ``ptxas`` triton itself assembles ``sm_<cc>`` with: triton 3.9 takes its newer
    ``ptxas-blackwell`` from ``sm_90`` on (its PTX is too new for the other), 3.3 and 3.5
    to 3.8 from ``sm_100`` on, the others one ``ptxas`` (``TRITON_PTXAS_PATH`` or the
    wheel's)."""
    import triton.backends.nvidia as nvidia

    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:  # triton 3.0 to 3.2
        get_ptxas = None
    if get_ptxas is not None:
        try:
            tool = get_ptxas(cc)
        except TypeError:  # triton 3.4: one ptxas for every target
            tool = get_ptxas()
        return tool.path if hasattr(tool, "path") else tool[0]  # 3.3: (path, version)
    path = os.environ.get("TRITON_PTXAS_PATH") or os.path.join(
        os.path.dirname(nvidia.__file__), "bin", "ptxas"
    )
    if not os.path.exists(path):
        raise FileNotFoundError(f"ptxas not found at {path} (set TRITON_PTXAS_PATH)")
    return path


def _decode(value: Any) -> Any:
    import triton.language as tl

    if isinstance(value, str) and value.startswith("tl."):
        return getattr(tl, value[3:])
    return value


def _ast_source(ast_source: type, fn: Any, spec: dict) -> Any:
    """``ASTSource`` of one specialisation, every pointer 16-byte aligned (what the launcher
    guarantees), in the API of the triton that is imported: 3.3 and newer take the whole
    signature and ``{(index,): value}`` constexprs; 3.0 to 3.2 take the non-constexpr
    arguments only and an ``AttrsDescriptor`` (keyed by index up to 3.1, by name in 3.2)."""
    import inspect

    signature = dict(map(tuple, spec["signature"]))
    names = list(signature)
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    constexprs = {k: _decode(v) for k, v in spec["constexprs"]}
    if "constexprs" in inspect.signature(ast_source.__init__).parameters:  # triton >= 3.3
        return ast_source(
            fn,
            signature,
            {(names.index(k),): v for k, v in constexprs.items()},
            {(i,): [["tt.divisibility", 16]] for i in pointers},
        )
    arguments = {k: t for k, t in signature.items() if t != "constexpr"}
    try:  # triton 3.2
        from triton.backends.compiler import AttrsDescriptor

        attrs = AttrsDescriptor.from_hints({i: 16 for i in pointers})
        return ast_source(fn, arguments, constexprs, attrs)
    except ImportError:  # triton 3.0 and 3.1
        from triton.compiler.compiler import AttrsDescriptor

        index = names.index
        return ast_source(
            fn,
            {index(k): t for k, t in arguments.items()},
            {index(k): v for k, v in constexprs.items()},
            AttrsDescriptor(divisible_by_16=set(pointers)),
        )


def _first_error(message: str) -> str:
    """The line of a compiler message that says what is wrong: ptxas's first ``error :``
    (without its temporary file name), else the last line.

    Examples:
        >>> _first_error("ptxas /tmp/k.ptx, line 8; error   : Feature '.bf16' requires .target"
        ...              " sm_80 or higher\\nptxas fatal   : Ptx assembly aborted due to errors")
        "ptxas: Feature '.bf16' requires .target sm_80 or higher"
    """
    lines = message.strip().splitlines()
    for line in lines:
        found = re.search(r"\berror\s*:\s*(.*)", line)
        if line.startswith("ptxas") and found:
            return f"ptxas: {found.group(1).strip()}"
    return lines[-1] if lines else ""


def _compile_one(spec: dict, target: str) -> dict:
    """Compile one specialisation for one target; the result row."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row = {"kernel": spec["kernel"], "spec": spec, "target": target, "ok": False, "error": ""}
    start = time.perf_counter()
    try:
        module, _, name = spec["kernel"].partition(":")
        fn = getattr(importlib.import_module(module), name)
        src = _ast_source(ASTSource, fn, spec)
        cc, shared_limit = TARGETS[target]
        compiled = triton.compile(
            src, target=GPUTarget("cuda", cc, 32), options={"num_warps": spec["num_warps"]}
        )
        if not compiled.asm.get("cubin"):
            raise RuntimeError("no cubin produced")
        ptx = compiled.asm["ptx"]
        arch = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            out = subprocess.run(
                [_ptxas(cc), "-v", f"--gpu-name={arch}", path, "-o", os.path.join(tmp, "k.cubin")],
                capture_output=True,
                text=True,
                check=True,
            ).stderr
        for field, pattern in _PTXAS_FIELDS.items():
            match = re.search(pattern, out)
            row[field] = int(match.group(1)) if match else 0
        row["shared"] = int(compiled.metadata.shared)
        row["shared_limit"] = shared_limit
        row["ok"] = row["spill_stores"] == 0 and row["shared"] <= shared_limit
        if not row["ok"]:
            row["error"] = f"{row['spill_stores']} bytes spilled, {row['shared']} bytes shared"
    except Exception as exc:  # a compile error is a result here, not a crash
        row["error"] = f"{type(exc).__name__}: {_first_error(str(exc))}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _worker() -> None:
    """Compile the ``[spec, target]`` jobs read as JSON from stdin; JSON rows to stdout."""
    jobs = json.load(sys.stdin)
    json.dump([_compile_one(spec, target) for spec, target in jobs], sys.stdout)


def compile_all(
    specs: list[dict],
    targets: tuple[str, ...] = tuple(TARGETS),
    jobs: int | None = None,
    python: str | None = None,
) -> list[dict]:
    """Compile specialisations for targets in ``jobs`` worker processes.

    Args:
        specs: Rows of `benchmarks.kernel_specs.launched_specializations` (the
            specialisations the launchers reach).
        targets: Keys of `TARGETS`.
        jobs: Worker processes (default: the CPU count).
        python: The interpreter for the workers (default: this one).

    Returns:
        list[dict]: One row per (specialisation, target): ``kernel``, ``spec``, ``target``,
        ``ok``, ``error``, ``regs``, ``spill_stores``, ``spill_loads``, ``stack``,
        ``shared``, ``shared_limit``, ``seconds``.

    Raises:
        ValueError: For an unknown target.
        RuntimeError: If a worker process crashes.
    """
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown targets {unknown}; known: {sorted(TARGETS)}")
    work = [(spec, target) for spec in specs for target in targets]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work) or 1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from benchmarks.compile_kernels import _worker; _worker()"
    procs = []
    for i in range(jobs):
        proc = subprocess.Popen(
            [python or sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        )
        procs.append((proc, json.dumps(work[i::jobs])))
    rows: list[dict] = []
    for proc, payload in procs:
        out, err = proc.communicate(payload)
        if proc.returncode:
            raise RuntimeError(f"a compile worker failed:\n{err[-4000:]}")
        rows.extend(json.loads(out))
    order = {(json.dumps(s, sort_keys=True), t): i for i, (s, t) in enumerate(work)}
    rows.sort(key=lambda r: order[(json.dumps(r["spec"], sort_keys=True), r["target"])])
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (kernel, target): specialisations compiled/total and the worst figures.

    Examples:
        >>> summarize([{"kernel": "m:k", "target": "sm_90", "ok": True, "regs": 40,
        ...             "spill_stores": 0, "shared": 0}])
        [{'kernel': 'k', 'target': 'sm_90', 'specs': 1, 'ok': 1, 'max_regs': 40, 'spills': 0, 'max_shared': 0}]
    """
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["kernel"].rpartition(":")[2], row["target"])].append(row)
    return [
        {
            "kernel": kernel,
            "target": target,
            "specs": len(group),
            "ok": sum(r["ok"] for r in group),
            "max_regs": max((r.get("regs", 0) for r in group), default=0),
            "spills": sum(r.get("spill_stores", 0) for r in group),
            "max_shared": max((r.get("shared", 0) for r in group), default=0),
        }
        for (kernel, target), group in groups.items()
    ]


def format_table(summary: list[dict]) -> str:
    """The summary as a Markdown table (what `main` prints)."""
    lines = [
        "| kernel | target | specialisations | compiled, no spills | max registers | spill stores | max shared (B) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['kernel']} | {r['target']} | {r['specs']} | {r['ok']} | {r['max_regs']} | "
        f"{r['spills']} | {r['max_shared']} |"
        for r in summary
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Compile every launched specialisation and print the table (``--all``: every row)."""
    import argparse

    from benchmarks.kernel_specs import Spec, launched_specializations

    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_kernels")
    parser.add_argument("--all", action="store_true", help="one row per specialisation too")
    args = parser.parse_args(argv)
    print("compiling every launched specialisation (cached by triton after the first run)...")
    rows = compile_all(launched_specializations())
    print(format_table(summarize(rows)))
    if args.all:
        print("\n| specialisation | target | ok | registers | spill stores | shared (B) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            s = r["spec"]
            spec = Spec(
                s["kernel"],
                tuple(map(tuple, s["signature"])),
                tuple(map(tuple, s["constexprs"])),
                s["num_warps"],
            )
            print(
                f"| {spec.describe()} | {r['target']} | {'yes' if r['ok'] else 'NO'} | "
                f"{r.get('regs', '-')} | {r.get('spill_stores', '-')} | {r.get('shared', '-')} |"
            )
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        print(f"FAILED {r['target']} {r['kernel']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
