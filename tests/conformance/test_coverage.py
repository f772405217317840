"""Every public callable has a conformance spec (or an exemption saying why not).

Public names are the ``__all__`` of every public module of the package (no part of the
module path starts with ``_``). A class that is an ``nn.Module`` needs a spec of its
constructor and one of its ``forward``. A new public name without a spec fails here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import torch

import visionblocks
from tests.conformance.specs import all_exemptions, all_specs


def public_objects() -> dict[int, tuple[str, object]]:
    """``{id(obj): (a public name, obj)}`` of every public callable (deduplicated)."""
    found: dict[int, tuple[str, object]] = {}
    modules = ["visionblocks"]
    for info in pkgutil.walk_packages(visionblocks.__path__, "visionblocks."):
        parts = info.name.split(".")[1:]
        if any(p.startswith("_") for p in parts) or info.name == "visionblocks.demo":
            continue  # private, or the deprecated shim of visionblocks.cli.demo
        modules.append(info.name)
    for name in modules:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if callable(obj) and not isinstance(obj, torch.nn.Module):
                found.setdefault(id(obj), (f"{name}.{attr}", obj))
    return found


def test_every_public_callable_has_a_spec_or_an_exemption():
    specs = all_specs()
    covered = {id(s.obj) for s in specs if not s.forward}
    forwards = {id(s.obj) for s in specs if s.forward}
    exempt = {id(obj): why for obj, why in all_exemptions().items()}
    missing = []
    for key, (name, obj) in sorted(public_objects().items(), key=lambda kv: kv[1][0]):
        if key in exempt:
            continue
        if key not in covered:
            missing.append(name)
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and key not in forwards:
            missing.append(f"{name}.forward")
    assert not missing, f"{len(missing)} public callables without a conformance spec: {missing}"


def test_exemptions_give_a_reason():
    for obj, why in all_exemptions().items():
        assert isinstance(why, str) and len(why) > 10, obj
