"""Collects the specs of every ``specs_*.py`` module in this folder (each defines ``SPECS``)
and the exemptions (public names that take no input worth mutating, with the reason)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from tests.conformance.framework import Spec

__all__ = ["all_exemptions", "all_specs"]


def _modules() -> list[Any]:
    folder = Path(__file__).parent
    names = sorted(
        m.name for m in pkgutil.iter_modules([str(folder)]) if m.name.startswith("specs_")
    )
    return [importlib.import_module(f"tests.conformance.{name}") for name in names]


def all_specs() -> list[Spec]:
    """Every spec, in module order."""
    return [spec for module in _modules() for spec in module.SPECS]


def all_exemptions() -> dict[Any, str]:
    """``{public object: why it has no spec}`` from every spec module's ``EXEMPT``."""
    out: dict[Any, str] = {}
    for module in _modules():
        out.update(getattr(module, "EXEMPT", {}))
    return out
