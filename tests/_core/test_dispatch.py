"""The one decision (`use_triton`): defaults, env vars, context manager, forced triton errors,
capabilities, failures; and the value-check switches."""

from __future__ import annotations

import threading

import pytest
import torch

import visionblocks
from visionblocks._core import dispatch as _dispatch
from visionblocks._core.dispatch import (
    capability_reason,
    get_impl,
    note_failure,
    set_impl,
    use_impl,
    use_triton,
)

OP = "some_op"


@pytest.fixture
def triton_here(monkeypatch):
    """triton installed, whatever this machine has."""
    monkeypatch.setattr(_dispatch, "_triton_missing", lambda: "")


@pytest.fixture
def no_failures():
    yield
    _dispatch._failures.clear()


def test_default_is_auto(monkeypatch):
    monkeypatch.delenv("VISIONBLOCKS_IMPL", raising=False)
    assert get_impl() == "auto"


def test_env_var_sets_default(monkeypatch):
    monkeypatch.setenv("VISIONBLOCKS_IMPL", "torch")
    assert get_impl() == "torch"
    monkeypatch.setenv("VISIONBLOCKS_IMPL", "cuda")
    with pytest.raises(
        ValueError, match="VISIONBLOCKS_IMPL must be one of 'auto', 'torch', 'triton'; got 'cuda'"
    ):
        get_impl()


def test_set_impl_overrides_env_and_resets(monkeypatch):
    monkeypatch.setenv("VISIONBLOCKS_IMPL", "torch")
    set_impl("triton")
    assert get_impl() == "triton"
    set_impl(None)
    assert get_impl() == "torch"


def test_public_aliases():
    assert visionblocks.set_impl is set_impl
    assert visionblocks.use_impl is use_impl
    assert visionblocks.get_impl is get_impl


def test_use_impl_restores_previous_even_on_error(monkeypatch):
    monkeypatch.delenv("VISIONBLOCKS_IMPL", raising=False)
    set_impl("torch")
    with use_impl("triton"):
        assert get_impl() == "triton"
        with use_impl("auto"):
            assert get_impl() == "auto"
        assert get_impl() == "triton"
    assert get_impl() == "torch"
    with pytest.raises(RuntimeError, match="inner"), use_impl("triton"):
        raise RuntimeError("inner")
    assert get_impl() == "torch"


def test_use_impl_is_thread_local(monkeypatch):
    monkeypatch.delenv("VISIONBLOCKS_IMPL", raising=False)
    seen = []
    with use_impl("triton"):
        t = threading.Thread(target=lambda: seen.append(get_impl()))
        t.start()
        t.join()
    assert seen == ["auto"]


@pytest.mark.parametrize("bad", ["cuda", "Torch", ""])
def test_unknown_impl_names_list_valid_ones(bad):
    with pytest.raises(ValueError, match="one of 'auto', 'torch', 'triton'"):
        set_impl(bad)
    with pytest.raises(ValueError, match="one of 'auto', 'torch', 'triton'"), use_impl(bad):
        pass
    with pytest.raises(ValueError, match="one of 'auto', 'torch', 'triton'"):
        use_triton(OP, bad, torch.zeros(1))


def test_non_string_impl_is_type_error():
    with pytest.raises(TypeError, match="impl must be a str"):
        set_impl(1)


def test_auto_picks_torch_for_cpu_tensors():
    assert not use_triton(OP, "auto", torch.zeros(2))
    assert not use_triton(OP, "torch", torch.zeros(2))


def test_auto_follows_process_default(triton_here, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with use_impl("triton"):
        assert use_triton(OP, "auto", torch.zeros(2))
        # An explicit impl= on the call wins over the default.
        assert not use_triton(OP, "torch", torch.zeros(2))


class FakeCuda:
    is_cuda = True
    device = torch.device("cuda", 0)
    dtype = torch.float32


def test_auto_picks_triton_for_cuda_tensors(triton_here, no_failures, monkeypatch):
    monkeypatch.setattr(_dispatch, "has_values", lambda t: True)
    monkeypatch.setattr(_dispatch, "_capability", lambda index: (8, 0))
    assert use_triton(OP, "auto", FakeCuda())
    assert not use_triton(OP, "auto", FakeCuda(), auto=False)  # kernels not yet verified
    assert not use_triton(OP, "auto", FakeCuda(), torch.zeros(1))  # a CPU tensor among them
    # An older GPU than the kernels are compiled for: auto runs torch, forcing explains.
    monkeypatch.setattr(_dispatch, "_capability", lambda index: (7, 0))
    assert not use_triton(OP, "auto", FakeCuda())
    with pytest.raises(
        RuntimeError, match="need compute capability 7.5 or newer; this GPU has 7.0"
    ):
        use_triton(OP, "triton", FakeCuda())
    # After a failure on that device, auto stays on torch there, and forcing says why.
    monkeypatch.setattr(_dispatch, "_capability", lambda index: (9, 0))
    with pytest.warns(RuntimeWarning, match="failed on cuda:0"):
        note_failure(OP, FakeCuda.device, RuntimeError("boom"))
    assert not use_triton(OP, "auto", FakeCuda())
    assert use_triton("other_op", "auto", FakeCuda())
    with pytest.raises(RuntimeError, match="failed earlier on cuda:0 .RuntimeError: boom."):
        use_triton(OP, "triton", FakeCuda())
    _dispatch._failures.clear()
    assert use_triton(OP, "auto", FakeCuda())
    monkeypatch.setattr(_dispatch, "_triton_missing", lambda: "not installed")
    assert not use_triton(OP, "auto", FakeCuda())


def test_a_failure_warns_once_per_op_and_device(no_failures):
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(3):
            note_failure(OP, torch.device("cuda", 1), RuntimeError("boom"))
    assert len(record) == 1


def test_forced_triton_explains_why_it_cannot_run(monkeypatch):
    monkeypatch.setattr(_dispatch, "_triton_missing", lambda: "disabled by test")
    with pytest.raises(RuntimeError, match="triton is unavailable: disabled by test"):
        use_triton(OP, "triton", torch.zeros(1))
    monkeypatch.setattr(_dispatch, "_triton_missing", lambda: "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(OP, "triton", torch.zeros(1))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(OP, "triton", torch.zeros(1))


def test_disable_env_and_missing_triton_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    code = (
        "import torch; from visionblocks._core.dispatch import use_triton\n"
        "try:\n    use_triton('op', 'triton', torch.zeros(1))\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    env = {"VISIONBLOCKS_DISABLE_TRITON": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert "disabled by VISIONBLOCKS_DISABLE_TRITON=1" in out.stdout, out.stderr


def test_auto_is_the_formula_while_recording(triton_here, monkeypatch):
    monkeypatch.setattr(_dispatch, "has_values", lambda t: True)
    monkeypatch.setattr(_dispatch, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(_dispatch, "recording", lambda: True)
    with use_impl("triton"):  # the default does not apply while torch records
        assert not use_triton(OP, "auto", FakeCuda())
    assert use_triton(OP, "triton", FakeCuda())


def test_capability_table():
    assert capability_reason((9, 0), [torch.bfloat16, torch.float16]) == ""
    assert "7.5 or newer" in capability_reason((6, 1), [torch.float32])
    # triton before 3.3 cannot compile bfloat16 for Turing (ptxas refuses cvt.f32.bf16).
    assert capability_reason((7, 5), [torch.bfloat16], triton=(3, 3)) == ""
    assert capability_reason((8, 0), [torch.bfloat16], triton=(3, 0)) == ""
    assert capability_reason((7, 5), [torch.float32], triton=(3, 1)) == ""
    assert "8.0 or newer with triton 3.1" in capability_reason(
        (7, 5), [torch.bfloat16], triton=(3, 1)
    )


def test_triton_version_reads_the_imported_module_then_the_metadata(monkeypatch):
    import importlib.metadata
    import sys
    import types

    fake = types.ModuleType("triton")
    fake.__version__ = "3.2.0"
    monkeypatch.setitem(sys.modules, "triton", fake)
    assert _dispatch.triton_version() == (3, 2)
    monkeypatch.delitem(sys.modules, "triton")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.0.1")
    assert _dispatch.triton_version() == (4, 0)

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert _dispatch.triton_version() is None


def test_dispatch_module_does_not_import_triton():
    import ast
    import inspect

    for module in (_dispatch, visionblocks):
        tree = ast.parse(inspect.getsource(module))
        names = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in getattr(node, "names", [])
        }
        names |= {
            node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert "triton" not in names


def test_auto_for_cpu_and_meta_tensors_touches_no_driver(monkeypatch):
    """Choosing an implementation never asks triton or the driver for tensors that do not
    need it (fake CUDA tensors: tests/package/test_fake_cuda.py)."""

    def refuse(*args, **kwargs):
        raise AssertionError("touched the driver or probed triton")

    for name in ("init", "current_device", "get_device_capability", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    monkeypatch.setattr(_dispatch, "_triton_missing", refuse)
    for device in ("cpu", "meta"):
        assert not use_triton(OP, "auto", torch.zeros(2, device=device))
