"""Implementation selection: defaults, env vars, context manager, forced triton errors."""

from __future__ import annotations

import threading

import pytest
import torch

import visionblocks
from visionblocks import kernels
from visionblocks._core import dispatch as _dispatch
from visionblocks._core.dispatch import get_impl, set_impl, use_impl
from visionblocks.kernels import _dispatch as _routing
from visionblocks.kernels._dispatch import resolve_impl


@pytest.fixture
def fake_kernel(monkeypatch):
    monkeypatch.setitem(kernels.KERNEL_OPS, "fake_op", "nowhere:fn")
    return "fake_op"


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
        resolve_impl(bad, "fake_op", torch.zeros(1))


def test_non_string_impl_is_type_error():
    with pytest.raises(TypeError, match="impl must be a str"):
        set_impl(1)


def test_auto_picks_torch_for_cpu_tensors(fake_kernel):
    assert resolve_impl("auto", fake_kernel, torch.zeros(2)) == "torch"
    assert resolve_impl("torch", fake_kernel, torch.zeros(2)) == "torch"


def test_auto_follows_process_default(fake_kernel, monkeypatch):
    monkeypatch.setattr(kernels, "interpret_mode", lambda: True)
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    with use_impl("triton"):
        assert resolve_impl("auto", fake_kernel, torch.zeros(2)) == "triton"
        # An explicit impl= on the call wins over the default.
        assert resolve_impl("torch", fake_kernel, torch.zeros(2)) == "torch"


class FakeCuda:
    is_cuda = True
    device = torch.device("cuda", 0)
    dtype = torch.float32


def test_auto_picks_triton_for_cuda_tensors(fake_kernel, monkeypatch):
    from visionblocks.kernels import _fallback, _support

    monkeypatch.setattr(_support, "_capability", lambda index: (8, 0))
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    assert resolve_impl("auto", fake_kernel, FakeCuda()) == "triton"
    assert resolve_impl("auto", "op_without_kernel", FakeCuda()) == "torch"
    # An older GPU than the kernels are compiled for: auto runs torch, forcing explains.
    monkeypatch.setattr(_support, "_capability", lambda index: (7, 0))
    assert resolve_impl("auto", fake_kernel, FakeCuda()) == "torch"
    monkeypatch.setattr("visionblocks.kernels._dispatch._capability", lambda device: (7, 0))
    with pytest.raises(
        RuntimeError, match="need compute capability 7.5 or newer; this GPU has 7.0"
    ):
        resolve_impl("triton", fake_kernel, FakeCuda())
    # After a failure on that device, auto stays on torch there.
    monkeypatch.setattr(_support, "_capability", lambda index: (9, 0))
    with pytest.warns(RuntimeWarning, match="failed on cuda:0"):
        _fallback.note_failure(fake_kernel, FakeCuda.device, RuntimeError("boom"))
    try:
        assert resolve_impl("auto", fake_kernel, FakeCuda()) == "torch"
    finally:
        _fallback.reset_failures()
    assert resolve_impl("auto", fake_kernel, FakeCuda()) == "triton"
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    assert resolve_impl("auto", fake_kernel, FakeCuda()) == "torch"


def test_forced_triton_explains_why_it_cannot_run(fake_kernel, monkeypatch):
    with pytest.raises(RuntimeError, match="has no triton kernel"):
        resolve_impl("triton", "op_without_kernel", torch.zeros(1))
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    monkeypatch.setattr(kernels, "triton_unavailable_reason", lambda: "disabled by test")
    with pytest.raises(RuntimeError, match="triton is unavailable: disabled by test"):
        resolve_impl("triton", fake_kernel, torch.zeros(1))
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    monkeypatch.setattr(kernels, "interpret_mode", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_impl("triton", fake_kernel, torch.zeros(1))
    monkeypatch.setattr(kernels, "interpret_mode", lambda: True)
    assert resolve_impl("triton", fake_kernel, torch.zeros(1)) == "triton"


def test_dispatch_module_does_not_import_triton():
    import ast
    import inspect

    for module in (_dispatch, _routing, visionblocks):
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


def test_auto_for_cpu_and_meta_tensors_touches_no_driver(fake_kernel, monkeypatch):
    """Choosing an implementation never asks triton or the driver for tensors that do not
    need it (fake CUDA tensors: tests/package/test_fake_cuda.py)."""

    def refuse(*args, **kwargs):
        raise AssertionError("touched the driver or probed triton")

    for name in ("init", "current_device", "get_device_capability", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    monkeypatch.setattr(kernels, "triton_available", refuse)
    for device in ("cpu", "meta"):
        assert resolve_impl("auto", fake_kernel, torch.zeros(2, device=device)) == "torch"
