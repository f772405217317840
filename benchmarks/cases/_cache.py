"""Where the cases keep the inputs they write once (a synthetic COCO set, checkpoint files).

``$VISIONBLOCKS_BENCH_CACHE`` when set (the tests point it into their ``tmp_path``), else
``visionblocks/bench`` in the user cache folder: ``$XDG_CACHE_HOME`` (default ``~/.cache``),
``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows. Never the system temp folder:
the files (about 100 MiB, 1.2 GiB with ``vit_l_16``) are worth keeping between runs.
"""

from __future__ import annotations

import os
import sys

ENV_VAR = "VISIONBLOCKS_BENCH_CACHE"


def cache_dir(*parts: str) -> str:
    """The folder ``parts`` under the benchmark cache (not created)."""
    root = os.environ.get(ENV_VAR)
    if not root:
        if sys.platform == "win32":
            user = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
        elif sys.platform == "darwin":
            user = os.path.expanduser("~/Library/Caches")
        else:
            user = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = os.path.join(user, "visionblocks", "bench")
    return os.path.join(root, *parts)
