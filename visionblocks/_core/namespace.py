"""A public module's ``dir()``: its API, not the names it imported to build it.

``dir(module)`` lists every global: ``torch``, ``Tensor``, ``annotations``, the check helpers.
A public module sets ``__dir__ = public_dir(__name__, __all__)`` after its ``__all__``
(PEP 562), so ``dir()`` and tab completion show ``__all__`` plus its public submodules.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = ["public_dir"]


def public_dir(module: str, names: Sequence[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` for ``module``: ``names`` (its ``__all__``) plus its public
    submodules."""
    api = tuple(names)

    def __dir__() -> list[str]:
        namespace = vars(sys.modules[module])
        submodules = {
            name
            for name, value in namespace.items()
            if isinstance(value, ModuleType)
            and value.__name__ == f"{module}.{name}"
            and not name.startswith("_")
        }
        return sorted({*api, *submodules})

    return __dir__
