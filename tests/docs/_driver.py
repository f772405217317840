"""Run one page's steps in this process, in page order; write what each printed as JSON.

Usage: ``python _driver.py PAGE RESULTS_JSON``, in the working directory the page should use;
with ``VISIONBLOCKS_QUICK=1`` the blocks' quick settings apply (`pages.steps`).
Python steps share one namespace; console steps run in a shell. It stops at the first step
that fails, so later output is never compared against a half-run page.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
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


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
