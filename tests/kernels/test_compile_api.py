"""The compile check speaks every supported triton's ``ASTSource`` API (3.0 to the newest).

``visionblocks list kernels --compile`` under another triton on ``sys.path`` (how the
releases from 3.0 on were checked) must hand each release what it expects. The installed
triton takes the newest API; the older two are stood in for here.
"""

from __future__ import annotations

import sys
import types

import pytest

from visionblocks import kernels

if not kernels.triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)

from visionblocks.kernels._compile import _ast_source

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
