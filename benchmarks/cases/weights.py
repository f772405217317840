"""Benchmark cases: loading a ResNet-50 checkpoint file into a model (CPU, 2 threads).

The file is torchvision's ``resnet50(weights=None)`` state dict (97.8 MiB, 320 tensors) saved
with ``torch.save`` (zip format) into ``<tempdir>/visionblocks-bench/resnet50.pth`` the first
time a case is set up and reused afterwards. ``setup`` builds the model; each call reads the
file (from the page cache after the first) and copies every tensor into the model.

- ``load_resnet50_vs_torch``: ``load_partial(model, path)`` against
  ``model.load_state_dict(torch.load(path))``.
- ``load_resnet50_vs_timm``: against ``timm.models.load_checkpoint(model, path)``.

Targets: 1.5x ``torch.load`` + ``load_state_dict`` (not slower than timm), and a peak
extra memory of at most 1.2x the file size (``max_memory_mib``; `FILE_MIB` is the size of the
file, checked by a test). The output check loads the file into two fresh copies of the
model, one per side, and compares their state dicts exactly. The peers read
the whole file into memory (``torch.load``: about 1.0x the file size, timm about 1.3x).
Ours maps the file to read its metadata and reads each tensor from the file straight into
the model (``os.preadv``), so it needs almost no extra memory.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["FILE_MIB", "LOAD_RESNET50_VS_TIMM", "LOAD_RESNET50_VS_TORCH"]

_FILE = "resnet50.pth"
FILE_MIB = 97.8
"""Size of the checkpoint file (torchvision resnet50's state dict, ``torch.save``) in MiB."""


def _checkpoint_path() -> str:
    """Save resnet50's state dict once (atomically, so concurrent runs never see half a file)."""
    folder = os.path.join(tempfile.gettempdir(), "visionblocks-bench")
    path = os.path.join(folder, _FILE)
    if not os.path.exists(path):
        import torchvision

        os.makedirs(folder, exist_ok=True)
        torch.manual_seed(0)
        state = torchvision.models.resnet50(weights=None).state_dict()
        partial = f"{path}.{os.getpid()}.tmp"
        torch.save(state, partial)
        os.replace(partial, path)
    return path


def _setup() -> dict[str, Any]:
    import torchvision

    path = _checkpoint_path()
    return {"model": torchvision.models.resnet50(weights=None), "path": path}


def _ours(state: dict[str, Any]) -> Any:
    from visionblocks.weights import load_partial

    return load_partial(state["model"], state["path"], strict=True)


def _torch(state: dict[str, Any]) -> Any:
    return state["model"].load_state_dict(torch.load(state["path"]))


def _timm(state: dict[str, Any]) -> Any:
    from timm.models import load_checkpoint

    return load_checkpoint(state["model"], state["path"])


def _loaded(peer: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], tuple]:
    """An ``outputs`` hook: each side loads into its own copy of the model; the state dicts."""

    def outputs(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        loaded = []
        for load in (_ours, peer):
            model = copy.deepcopy(state["model"])
            load({**state, "model": model})
            loaded.append(model.state_dict())
        return loaded[0], loaded[1]

    return outputs


_DESCRIPTION = (
    f"load a torchvision resnet50 checkpoint ({FILE_MIB} MiB, 320 tensors, zip format, "
    "page-cached) "
    "into the model, strict; target: peak extra memory <= 1.2x the file size"
)

LOAD_RESNET50_VS_TORCH = register_case(
    BenchCase(
        name="load_resnet50_vs_torch",
        setup=_setup,
        ours=_ours,
        peer=_torch,
        peer_name="torch.load + load_state_dict",
        description=_DESCRIPTION,
        min_speedup=1.5,
        max_memory_mib=1.2 * FILE_MIB,
        check=same_outputs(rtol=0.0, atol=0.0),
        outputs=_loaded(_torch),
    )
)

LOAD_RESNET50_VS_TIMM = register_case(
    BenchCase(
        name="load_resnet50_vs_timm",
        setup=_setup,
        ours=_ours,
        peer=_timm,
        peer_name="timm load_checkpoint",
        description=_DESCRIPTION,
        min_speedup=1.0,
        max_memory_mib=1.2 * FILE_MIB,
        check=same_outputs(rtol=0.0, atol=0.0),
        outputs=_loaded(_timm),
    )
)
