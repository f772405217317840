"""The fast-path report and the lazy import of triton."""

from __future__ import annotations

import os
import subprocess
import sys

from visionblocks import kernels


def run_python(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return out.stdout.strip()


def test_report_fields_and_types():
    report = kernels.available()
    assert set(report) == {"triton", "reason", "interpret", "cuda", "default_impl", "kernels"}
    assert report["kernels"] == [
        "assign", "focal", "iou", "local_attention", "local_filter", "ms_deform_attn",
        "roi_align", "rotated_iou", "rotated_roi_align"
    ]  # fmt: skip
    assert isinstance(report["interpret"], bool)
    assert report["default_impl"] == "auto"
    if report["triton"] is None:
        assert report["reason"]


def test_disable_env_in_fresh_process():
    out = run_python(
        "from visionblocks import kernels; print(kernels.available()['reason'])",
        VISIONBLOCKS_DISABLE_TRITON="1",
    )
    assert out == "disabled by VISIONBLOCKS_DISABLE_TRITON=1"


def test_importing_visionblocks_does_not_import_triton():
    out = run_python(
        "import sys, torch, visionblocks, visionblocks.registry, visionblocks.cli, "
        "visionblocks.losses, visionblocks.ops, visionblocks.kernels; "
        "from visionblocks.losses import sigmoid_focal_loss; "
        "sigmoid_focal_loss(torch.zeros(2, 3), torch.zeros(2, 3)); "
        "print('triton' in sys.modules)",
        TRITON_INTERPRET="0",
    )
    assert out == "False"
