"""Triton availability: memoised probe, env switch, report, lazy import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from visionblocks import kernels


def run_python(code: str, **env: str) -> str:
    import os

    full_env = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, check=True
    )
    return out.stdout.strip()


def test_report_fields_and_types():
    report = kernels.available()
    assert set(report) == {"triton", "reason", "interpret", "cuda", "default_impl", "ops"}
    assert report["ops"] == sorted(kernels.KERNEL_OPS)
    assert isinstance(report["interpret"], bool)
    if report["triton"] is None:
        assert report["reason"]
    else:
        assert report["reason"] == ""


def test_probe_is_memoised(monkeypatch):
    kernels._probe_triton.cache_clear()
    first = kernels.triton_available()
    monkeypatch.setenv("VISIONBLOCKS_DISABLE_TRITON", "1")
    assert kernels.triton_available() == first  # memoised: env read once
    kernels._probe_triton.cache_clear()
    assert kernels.triton_available() is False
    assert "VISIONBLOCKS_DISABLE_TRITON" in kernels.triton_unavailable_reason()
    monkeypatch.delenv("VISIONBLOCKS_DISABLE_TRITON")
    kernels._probe_triton.cache_clear()
    assert kernels.triton_available() == first


def test_disable_env_in_fresh_process():
    out = run_python(
        "from visionblocks import kernels; r = kernels.available(); print(r['triton'], '|', r['reason'])",
        VISIONBLOCKS_DISABLE_TRITON="1",
    )
    assert out.startswith("None |") and "disabled" in out


def test_importing_visionblocks_does_not_import_triton():
    out = run_python(
        "import sys, visionblocks, visionblocks.registry, visionblocks.cli; "
        "print('triton' in sys.modules)"
    )
    assert out == "False"


def test_missing_triton_is_reported_not_raised(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("No module named 'triton'")
        return real_import(name, *args, **kwargs)

    kernels._probe_triton.cache_clear()
    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.delitem(sys.modules, "triton.language", raising=False)
    try:
        assert kernels.triton_available() is False
        assert "import failed" in kernels.triton_unavailable_reason()
    finally:
        kernels._probe_triton.cache_clear()


def test_load_kernel_errors():
    with pytest.raises(KeyError, match="has no triton kernel"):
        kernels.load_kernel("no_such_op")
    assert kernels.has_kernel("no_such_op") is False
