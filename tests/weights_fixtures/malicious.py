"""Pickles that run code when an ordinary unpickler reads them (each creates ``sentinel``).

`PAYLOADS` maps a name to a function ``sentinel -> object``; pickling the object gives a
stream that, read by ``pickle.load``, creates the file ``sentinel`` (the tests check that
once, so a payload that does nothing cannot make a test pass). `raw_pickles` gives
hand-written opcode streams for the opcodes ``pickle.dumps`` does not emit by itself.
"""

from __future__ import annotations

import builtins
import contextlib
import copyreg
import functools
import operator
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["PAYLOADS", "Call", "main_class_with_setstate", "raw_pickles"]


class Call:
    """Pickles as ``func(*args)`` (one ``REDUCE``); callable, so it can be another's ``func``."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)

    def __call__(self, *args: Any) -> Any:  # only to satisfy pickle's callable() check
        raise AssertionError("a Call is never called while pickling")


def _python_touch(sentinel: Path) -> str:
    return f"open({str(sentinel)!r}, 'w').close()"


def _import_os() -> Call:
    return Call(builtins.__import__, "os")


PAYLOADS: dict[str, Callable[[Path], Any]] = {
    "os.system": lambda s: Call(os.system, f"touch {s}"),
    "builtins.eval": lambda s: Call(builtins.eval, _python_touch(s)),
    "builtins.exec": lambda s: Call(builtins.exec, _python_touch(s)),
    "getattr(__import__('os'), 'system')": lambda s: Call(
        Call(builtins.getattr, _import_os(), "system"), f"touch {s}"
    ),
    "subprocess.Popen": lambda s: Call(subprocess.Popen, ["touch", str(s)]),
    "operator.attrgetter": lambda s: Call(
        Call(Call(operator.attrgetter, "system"), _import_os()), f"touch {s}"
    ),
    "functools.partial": lambda s: Call(Call(functools.partial, os.system, f"touch {s}")),
    "copyreg._reconstructor": lambda s: Call(
        copyreg._reconstructor, subprocess.Popen, subprocess.Popen, ["touch", str(s)]
    ),
}


class _SetState:
    """Its ``__setstate__`` creates the file it is given (the code an unpickler must not run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __getstate__(self) -> dict[str, str]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, str]) -> None:
        open(state["path"], "w").close()


@contextlib.contextmanager
def main_class_with_setstate() -> Iterator[type]:
    """`_SetState` published as ``__main__.EvilState`` while the context lasts, so pickles
    name it there and an ordinary unpickler would find it (and run its ``__setstate__``)."""
    main = sys.modules["__main__"]
    cls = type("EvilState", (_SetState,), {"__module__": "__main__"})
    main.EvilState = cls  # type: ignore[attr-defined]
    try:
        yield cls
    finally:
        del main.EvilState  # type: ignore[attr-defined]


def _text(s: str) -> bytes:
    data = s.encode()
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def raw_pickles(sentinel: Path) -> dict[str, bytes]:
    """Opcode streams whose only job is to run ``touch sentinel`` (protocols 0, 2 and 4)."""
    cmd = f"touch {sentinel}"
    return {
        # GLOBAL posix.system + REDUCE, protocol 2
        "GLOBAL posix.system": b"\x80\x02cposix\nsystem\n" + _text(cmd) + b"\x85R.",
        # STACK_GLOBAL (protocol 4) of a dotted name: getattr chains inside find_class
        "STACK_GLOBAL os.path.os.system": b"\x80\x04"
        + _text("os")
        + _text("path.os.system")
        + b"\x93"
        + _text(cmd)
        + b"\x85R.",
        # INST (protocol 0) calls the class or function it names
        "INST os.system": b"(V" + cmd.encode() + b"\nios\nsystem\n.",
        # OBJ: MARK, the callable, its arguments
        "OBJ subprocess.Popen": b"\x80\x02(csubprocess\nPopen\n"
        + b"(" + _text("touch") + _text(str(sentinel)) + b"lo.",
    }  # fmt: skip
