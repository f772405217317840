"""The compile check speaks every supported triton's ``ASTSource`` API (3.0 to the newest).

``python -m benchmarks.compile_kernels`` under another triton on ``sys.path`` (how the
releases from 3.0 on were checked) must hand each release what it expects. The installed
triton takes the newest API; the older two are stood in for here.
"""

from __future__ import annotations

import sys
import types

import pytest

from tests.conftest import _REASON

if _REASON:
    pytest.skip("triton is not installed", allow_module_level=True)

from benchmarks.compile_kernels import _ast_source

SPEC = {
    "kernel": "m:k",
    "signature": [["x_ptr", "*fp32"], ["n", "i32"], ["out_ptr", "*bf16"], ["BLOCK", "constexpr"]],
    "constexprs": [["BLOCK", 128]],
    "num_warps": 4,
}


class _Recorder:
    def __init__(self, fn, signature, constants=None, attrs=None):
        self.args = (fn, signature, constants, attrs)


class _NewRecorder:
    def __init__(self, fn, signature, constexprs=None, attrs=None):
        self.args = (fn, signature, constexprs, attrs)


class _Attrs:
    def __init__(self, divisible_by_16=None):
        self.divisible_by_16 = divisible_by_16

    @classmethod
    def from_hints(cls, hints):
        return cls({i for i, v in hints.items() if v == 16})


def test_triton_3_3_and_newer_get_the_whole_signature():
    _, signature, constexprs, attrs = _ast_source(_NewRecorder, "fn", SPEC).args
    assert signature == {"x_ptr": "*fp32", "n": "i32", "out_ptr": "*bf16", "BLOCK": "constexpr"}
    assert constexprs == {(3,): 128}
    assert attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}


def test_triton_3_2_gets_names_and_a_descriptor_from_hints(monkeypatch):
    module = types.ModuleType("triton.backends.compiler")
    module.AttrsDescriptor = _Attrs
    monkeypatch.setitem(sys.modules, "triton.backends.compiler", module)
    _, signature, constants, attrs = _ast_source(_Recorder, "fn", SPEC).args
    assert signature == {"x_ptr": "*fp32", "n": "i32", "out_ptr": "*bf16"}
    assert constants == {"BLOCK": 128}
    assert attrs.divisible_by_16 == {0, 2}


def test_triton_3_0_and_3_1_get_indices_and_a_dataclass_descriptor(monkeypatch):
    backends = types.ModuleType("triton.backends.compiler")  # no AttrsDescriptor there
    compiler = types.ModuleType("triton.compiler.compiler")
    compiler.AttrsDescriptor = _Attrs
    monkeypatch.setitem(sys.modules, "triton.backends.compiler", backends)
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", compiler)
    _, signature, constants, attrs = _ast_source(_Recorder, "fn", SPEC).args
    assert signature == {0: "*fp32", 1: "i32", 2: "*bf16"}
    assert constants == {3: 128}
    assert attrs.divisible_by_16 == {0, 2}


def _row(kernel, target, ok, regs=40, spills=0):
    spec = {
        "kernel": f"m:{kernel}",
        "signature": [["x_ptr", "*fp32"], ["BLOCK", "constexpr"]],
        "constexprs": [["BLOCK", 128]],
        "num_warps": 4,
    }
    return {
        "kernel": f"m:{kernel}", "spec": spec, "target": target, "ok": ok,
        "error": "" if ok else "8 bytes spilled, 0 bytes shared",
        "regs": regs, "spill_stores": spills, "shared": 0,
    }  # fmt: skip


@pytest.mark.parametrize("ok", [True, False])
def test_the_compile_table_prints_and_fails_on_a_bad_row(ok, capsys, monkeypatch):
    from benchmarks import compile_kernels, kernel_specs

    rows = [_row("k1", "sm_75", True), _row("k1", "sm_90", ok, 255, 0 if ok else 8)]
    monkeypatch.setattr(compile_kernels, "compile_all", lambda specs: rows)
    monkeypatch.setattr(kernel_specs, "launched_specializations", lambda: [])
    assert compile_kernels.main(["--all"]) == (0 if ok else 1)
    out, err = capsys.readouterr()
    assert "| k1 | sm_90 | 1 | " + ("1 | 255 | 0 | 0 |" if ok else "0 | 255 | 8 | 0 |") in out
    assert "| k1[fp32|BLOCK=128|w4] | sm_75 | yes | 40 | 0 | 0 |" in out
    assert ("FAILED sm_90 m:k1: 8 bytes spilled" in err) is not ok
