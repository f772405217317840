"""Run one page's steps in this process, in page order; write what each printed as JSON.

Usage: ``python _driver.py PAGE RESULTS_JSON``, in the working directory the page should use;
with ``VISIONBLOCKS_QUICK=1`` the blocks' quick settings apply (`pages.steps`).
Python steps share one namespace; console steps run in a shell. It stops at the first step
that fails, so later output is never compared against a half-run page.

``python _driver.py --serve`` is the same driver as a fork server: it imports what most pages
import (torch, torchvision, visionblocks) once, then forks one fresh process per page it is
sent (`serve`), so each page does not pay those imports again (seconds of CPU each).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pages import steps


def main(page: str, results_path: str) -> int:
    # The page's code runs as the __main__ module, as `python page.py` would, so pickle finds
    # the classes it defines (sys.modules["__main__"]).
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    sys.path.insert(0, os.getcwd())  # the reader's project files (file steps) import from here
    results = []
    for step in steps(Path(page), quick=os.environ.get("VISIONBLOCKS_QUICK") == "1"):
        if step.skip:
            results.append({"line": step.line, "skipped": step.skip})
            continue
        output, error = io.StringIO(), None
        if step.kind == "file":
            target = Path(step.extra["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.code)
            results.append({"line": step.line, "output": "", "error": None})
            continue
        if step.kind == "python":
            try:
                with contextlib.redirect_stdout(output):
                    exec(compile(step.code, f"{page}:{step.line}", "exec"), namespace)
            except BaseException:  # report SystemExit and KeyboardInterrupt as failures too
                error = traceback.format_exc()
            printed = output.getvalue()
        else:
            done = subprocess.run(
                step.code, shell=True, capture_output=True, text=True, env=os.environ
            )
            printed = done.stdout + done.stderr
            if done.returncode != 0 and step.expected is not None and not step.expected.strip():
                error = f"exit status {done.returncode}\n{printed}"
        results.append({"line": step.line, "output": printed, "error": error})
        if error:
            break
    Path(results_path).write_text(json.dumps(results))
    return 0


PRELOAD = (
    "numpy", "torch", "torchvision", "visionblocks", "visionblocks.backbones", "visionblocks.cli",
    "visionblocks.data", "visionblocks.losses", "visionblocks.metrics", "visionblocks.models",
    "visionblocks.nn", "visionblocks.ops", "visionblocks.training", "visionblocks.transforms",
    "visionblocks.weights",
)  # fmt: skip
"""What the fork server imports before it forks: what most pages import. The server starts
with the pages' environment but ``TMPDIR`` (each child sets it, and `tempfile` reads it
again), so what these modules read from the environment when imported is what a page's own
process would read (``TRITON_INTERPRET``, for one, is left out of both)."""


def serve(requests: int, replies: int) -> int:
    """Fork a child per request line (JSON: page, results, cwd, env, log) read from the file
    descriptor ``requests``; reply ``{"pid": ...}`` at the fork and ``{"status": ...}`` (the
    child's exit code) when it ends, one JSON line each on the descriptor ``replies``.

    The child is the page's process as ``python _driver.py PAGE RESULTS`` would be, but for
    the modules already imported: it takes the request's working directory and environment
    (``tempfile`` reads ``TMPDIR`` again), reads no stdin, writes its stdout and stderr to the
    ``log`` file, and runs the exit handlers before it exits.
    """
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    with os.fdopen(requests) as lines:
        for line in lines:
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(requests)
                os.close(replies)
                os._exit(_child(request))
            os.write(replies, (json.dumps({"pid": pid}) + "\n").encode())
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            os.write(replies, (json.dumps({"status": code}) + "\n").encode())
    return 0


def _child(request: dict) -> int:
    """Run one page in a forked child of `serve`; its exit code."""
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        sys.argv = [__file__, request["page"], request["results"]]
        code = main(request["page"], request["results"])
    except BaseException:
        traceback.print_exc()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()  # as the interpreter does at exit
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main(*sys.argv[1:]))
