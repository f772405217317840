"""A pickle reader that never imports or calls anything a file names (private).

`SafeUnpickler` is pickle's own Python unpickler (``pickle._Unpickler``, the reference
implementation of ``pickle.Unpickler``) with every opcode that imports, calls or mutates an
object replaced by a checked version:

* ``GLOBAL``, ``STACK_GLOBAL``, ``INST`` and ``EXT*`` go through `SafeUnpickler.find_class`,
  which never imports a module: a short allowlist (``visionblocks.weights._rebuild``) maps
  exact names to objects of ours (plain containers, NumPy and torch rebuilders written
  there, dtypes, storage types), and every other name becomes an inert `Placeholder`.
* ``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``, ``INST`` and ``OBJ`` call only those allowlisted
  objects (checked by identity). Calling a placeholder gives another placeholder that
  records the arguments; calling anything else is refused.
* ``BUILD`` stores the state in a placeholder, runs NumPy's own ``__setstate__`` on
  arrays and dtypes, ignores attributes set on dicts and refuses everything else.
* ``APPEND(S)``, ``SETITEM(S)`` and ``ADDITEMS`` act on built-in lists, dicts, sets and
  placeholders only.

The C ``pickle.Unpickler`` offers no hook for the last three: it would call
``__setstate__``, ``append`` or ``__setitem__`` on whatever object the stream put on its
stack (a tensor, for one), which is why the Python implementation is the base here.
"""

from __future__ import annotations

import _compat_pickle
import copyreg
import pickle
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from visionblocks.weights._rebuild import (
    CALL_BY_ID,
    CONTAINER_TYPES,
    KEY_TYPES,
    Placeholder,
    allowed,
)

__all__ = ["SafeUnpickler"]


# ------------------------------------------------------------------------- unpickler
class SafeUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """Unpickles without importing or calling anything the file names (see the module doc).

    Args:
        file: A binary file (``read``, ``readline``).
        persistent_load: Called with each persistent id (torch files' storages); ``None``
            refuses persistent ids.
        load_from_bytes: Reads the bytes of ``torch.storage._load_from_bytes`` (a storage
            pickled with plain ``pickle``) into a `TorchStorage`; ``None`` refuses them.
        placeholders: ``{name: objects built}``, shared by the unpicklers of one file.

    Examples:
        >>> import argparse, io, pickle
        >>> data = pickle.dumps({"lr": 0.1, "args": argparse.Namespace(epochs=3)})
        >>> unpickler = SafeUnpickler(io.BytesIO(data))
        >>> obj = unpickler.load()
        >>> obj["args"], obj["args"].state, unpickler.replaced()
        (<placeholder object argparse.Namespace>, {'epochs': 3}, {'argparse.Namespace': 1})
    """

    dispatch: ClassVar[dict[int, Callable[..., Any]]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(
        self,
        file: Any,
        *,
        persistent_load: Callable[[Any], Any] | None = None,
        load_from_bytes: Callable[[bytes, SafeUnpickler], Any] | None = None,
        placeholders: dict[str, int] | None = None,
    ) -> None:
        # latin1: NumPy arrays pickled by Python 2 hold their bytes in 8-bit strings.
        super().__init__(file, encoding="latin1")
        self._persistent = persistent_load
        self.load_from_bytes = load_from_bytes
        self.placeholders = {} if placeholders is None else placeholders

    def replaced(self) -> dict[str, int]:
        """``{name: number of objects}`` of every placeholder (1 for a bare reference)."""
        return {name: max(count, 1) for name, count in self.placeholders.items()}

    # -- names ----------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        found = allowed(full)
        if found is not None:
            return found
        self.placeholders.setdefault(full, 0)
        return Placeholder(full)

    def get_extension(self, code: int) -> None:
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise pickle.UnpicklingError(f"unregistered extension code {code}")
        self.append(self.find_class(*key))  # pickle's own cache is left untouched

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("unsupported persistent id in a plain pickle")
        return self._persistent(pid)

    # -- calls ----------------------------------------------------------------------
    def count(self, placeholder: Placeholder) -> str:
        """Count one object built from ``placeholder``; return the object's name."""
        name = placeholder.name if placeholder.kind == "global" else placeholder.name + "()"
        self.placeholders[name] = self.placeholders.get(name, 0) + 1
        return name

    def call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        """``func(*args, **kwargs)`` for an allowlisted ``func``; a placeholder otherwise."""
        if not isinstance(args, tuple) or not isinstance(kwargs, (dict, type(None))):
            raise pickle.UnpicklingError("malformed call: arguments must be a tuple")
        if isinstance(func, Placeholder):
            return Placeholder(self.count(func), "object", args, kwargs)
        impl = CALL_BY_ID.get(id(func))
        if impl is None or impl is not func:
            raise pickle.UnpicklingError(
                f"refusing to call a {type(func).__name__}: only placeholders and the "
                "rebuilders of tensors, NumPy arrays and containers are called"
            )
        try:
            return impl(self, *args, **(kwargs or {}))
        except pickle.UnpicklingError:
            raise
        except Exception as exc:
            raise pickle.UnpicklingError(f"malformed data: {type(exc).__name__}: {exc}") from None

    def new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        """``cls.__new__(cls, *args)`` (``NEWOBJ``) for placeholders and plain containers."""
        if isinstance(cls, Placeholder):
            return self.call(cls, tuple(args), dict(kwargs))
        if any(cls is t for t in CONTAINER_TYPES):
            return cls.__new__(cls, *args) if cls is tuple else cls()
        raise pickle.UnpicklingError(f"refusing to create a {type(cls).__name__}")

    def _instantiate(self, klass: Any, args: list[Any]) -> None:  # INST, OBJ
        self.append(self.call(klass, tuple(args)))

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self.new(cls, args, {}))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self.new(cls, args, kwargs))

    # -- state and items ------------------------------------------------------------
    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, Placeholder):
            inst.state = state
            return
        np = sys.modules.get("numpy")  # not imported: no NumPy object can be on the stack
        if np is not None and (type(inst) is np.ndarray or isinstance(inst, np.dtype)):
            inst.__setstate__(state)  # NumPy's own, data only
        elif not isinstance(inst, dict):  # attributes of a dict (e.g. _metadata): ignored
            raise pickle.UnpicklingError(f"refusing to set the state of a {type(inst).__name__}")

    def _target(self, kinds: tuple[type, ...], what: str) -> Any:
        target = self.stack[-1]
        if not isinstance(target, (Placeholder, *kinds)):
            raise pickle.UnpicklingError(f"refusing to {what} a {type(target).__name__}")
        return target

    def _load_append(self) -> None:
        value = self.stack.pop()
        target = self._target((list,), "append to")
        (target.items if isinstance(target, Placeholder) else target).append(value)

    def _load_appends(self) -> None:
        items = self.pop_mark()
        target = self._target((list,), "append to")
        (target.items if isinstance(target, Placeholder) else target).extend(items)

    def _load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._set_items([key, value])

    def _load_setitems(self) -> None:
        self._set_items(self.pop_mark())

    def _set_items(self, flat: list[Any]) -> None:
        target = self._target((dict,), "set items of")
        pairs = zip(flat[::2], flat[1::2])
        if isinstance(target, Placeholder):
            target.entries.extend(pairs)
            return
        for key, value in pairs:
            if not isinstance(key, KEY_TYPES):
                raise pickle.UnpicklingError(f"unsupported dict key type {type(key).__name__}")
            target[key] = value

    def _load_additems(self) -> None:
        items = self.pop_mark()
        target = self._target((set,), "add items to")
        (target.items.extend if isinstance(target, Placeholder) else target.update)(items)


for _opcode, _method in (
    (pickle.REDUCE, SafeUnpickler._load_reduce),
    (pickle.NEWOBJ, SafeUnpickler._load_newobj),
    (pickle.NEWOBJ_EX, SafeUnpickler._load_newobj_ex),
    (pickle.BUILD, SafeUnpickler._load_build),
    (pickle.APPEND, SafeUnpickler._load_append),
    (pickle.APPENDS, SafeUnpickler._load_appends),
    (pickle.SETITEM, SafeUnpickler._load_setitem),
    (pickle.SETITEMS, SafeUnpickler._load_setitems),
    (pickle.ADDITEMS, SafeUnpickler._load_additems),
):
    SafeUnpickler.dispatch[_opcode[0]] = _method
del _opcode, _method
