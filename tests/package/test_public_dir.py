"""Every public module's ``dir()`` is its API: ``__all__`` and its public submodules."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import visionblocks


def _public_modules() -> list[str]:
    names = ["visionblocks"]
    for info in pkgutil.walk_packages(visionblocks.__path__, "visionblocks."):
        parts = info.name.split(".")[1:]
        if any(p.startswith("_") for p in parts) or info.name == "visionblocks.demo":
            continue
        names.append(info.name)
    return names


PUBLIC = _public_modules()


def test_the_walk_finds_the_packages():
    assert {"visionblocks.losses", "visionblocks.ops.boxes", "visionblocks.cli.demo"} <= set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_dir_is_the_public_api(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    listed = dir(module)
    assert listed == sorted(set(listed))
    extra = set(listed) - set(module.__all__)
    for attr in extra:
        value = getattr(module, attr)
        assert isinstance(value, ModuleType) and value.__name__ == f"{name}.{attr}", (
            f"dir({name}) shows {attr!r}, which is neither in __all__ nor a public submodule"
        )
    for leak in ("annotations", "Any", "importlib", "torch", "Tensor", "nn", "F"):
        if leak in listed and leak not in module.__all__:
            value = getattr(module, leak)
            assert getattr(value, "__name__", "") == f"{name}.{leak}", f"dir({name}) leaks {leak!r}"
    missing = [attr for attr in module.__all__ if attr not in listed]
    assert not missing, f"dir({name}) misses names of __all__: {missing}"


def test_every_name_in_all_exists():
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which does not exist"


def test_every_public_submodule_is_an_attribute_of_a_fresh_import():
    # A fresh interpreter: here, other tests' imports have set the attributes already.
    top = sorted({name.split(".")[1] for name in PUBLIC[1:]})
    assert {"training", "losses", "cli"} <= set(top)
    code = (
        "import sys, types, visionblocks\n"
        f"for name in {top!r}:\n"
        "    assert name in dir(visionblocks), name\n"
        "    module = getattr(visionblocks, name)\n"
        "    assert isinstance(module, types.ModuleType), name\n"
        "    assert module is sys.modules['visionblocks.' + name], name\n"
        "assert 'demo' not in dir(visionblocks)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
