"""The pickle reader for what torch's weights-only unpickler cannot read (private).

``torch.load(weights_only=True)`` with `visionblocks.weights._rebuild.torch_allowlist` reads
most checkpoints (`visionblocks.weights._io`). Its unpickler cannot express these cases,
which `SafeUnpickler` reads instead (the tests that cover each follow it):

* plain pickles (detectron2's ``.pkl``): torch reads ``torch.save`` files only, and its
  unpickler lacks the opcodes of pickle protocols 3 to 5:
  ``test_detectron2_pickles_of_any_protocol``, ``test_plain_pickle_of_torch_tensors``,
  ``test_python2_era_pickle_with_latin1_numpy_data``,
  ``test_hand_written_opcode_streams_never_run``, the ``ckpt.pkl`` payload cases;
* a name of a module that torch blocks (``os``, ``posix``, ``nt``, ``sys``) even when it is
  allow-listed: ``test_a_payload_beside_the_weights_becomes_a_placeholder[os.system-ckpt.pt]``,
  ``test_reduce_of_a_module_class_is_refused_and_never_runs``;
* calling what a call built (torch calls allowed globals only):
  ``test_a_payload_beside_the_weights_becomes_a_placeholder`` with ``functools.partial``,
  ``operator.attrgetter`` and ``getattr(__import__('os'), 'system')`` in ``ckpt.pt``;
* setting items of a foreign ``dict`` subclass (torch fills ``dict``, ``OrderedDict`` and
  ``Counter`` only), as Lightning's ``AttributeDict``:
  ``test_each_layout_reads_with_its_report[lightning]``,
  ``test_files_with_placeholders_are_memory_mapped[True]``;
* legacy files (``_use_new_zipfile_serialization=False``) that name a foreign global:
  ``get_unsafe_globals_in_checkpoint`` reads zip files only, and torch refuses the
  persistent ids of pickled module classes: the ``legacy`` cases of
  ``tests/weights/test_weights_modules.py``,
  ``test_legacy_file_with_foreign_objects_and_shared_storages``, the ``ckpt.legacy.pt``
  payload cases.

`SafeUnpickler` is pickle's Python unpickler (the C one has no hook for ``BUILD`` and the
item opcodes) with every opcode that imports, calls or mutates replaced: names never import
(`_rebuild.allowed` objects, else a `Placeholder`), calls reach only those
(`_rebuild.call`), ``BUILD`` fills placeholders, NumPy arrays and dtypes only (ignored on
dicts), and items go to built-in lists, dicts, sets and placeholders only. `load_torch_file` hands it to
``torch.load`` as its pickle module, so torch still reads the file's format.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import types
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from visionblocks.weights._rebuild import Placeholder, allowed, call, python3_name

__all__ = ["SafeUnpickler", "load_torch_file", "read_pickle"]

_KEY_TYPES = (str, bytes, int, float, complex, tuple, frozenset, type(None))


class SafeUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """Unpickles without importing or calling anything the file names (see the module doc).

    Args:
        file: A binary file (``read``, ``readline``).
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

    def __init__(self, file: Any, *, placeholders: dict[str, int] | None = None) -> None:
        # latin1: NumPy arrays pickled by Python 2 hold their bytes in 8-bit strings.
        super().__init__(file, encoding="latin1")
        self.placeholders = {} if placeholders is None else placeholders
        self._storages: Callable[[Any], Any] | None = None

    def replaced(self) -> dict[str, int]:
        """``{name: number of objects}`` of every placeholder (1 for a bare reference)."""
        return {name: max(count, 1) for name, count in self.placeholders.items()}

    # -- names ----------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if self.proto < 3:
            full = python3_name(full)
        if "Storage" in name:  # torch.FloatStorage...: a dtype marker, as torch.load maps them
            with contextlib.suppress(KeyError):
                return torch.serialization.StorageType(name)
        found = allowed(full)
        if found is not None:
            return found
        self.placeholders.setdefault(full, 0)
        return Placeholder(full, counts=self.placeholders)

    def get_extension(self, code: int) -> None:
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise pickle.UnpicklingError(f"unregistered extension code {code}")
        self.append(self.find_class(*key))  # pickle's own cache is left untouched

    # torch.load sets ``persistent_load`` to its reader of the file's storages.
    @property
    def persistent_load(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self._persistent_id

    @persistent_load.setter
    def persistent_load(self, storages: Callable[[Any], Any]) -> None:
        self._storages = storages

    def _persistent_id(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) > 1 and pid[0] in ("module", b"module"):
            return pid[1]  # a legacy torch.save(model): the class, already a placeholder
        if self._storages is None:
            raise pickle.UnpicklingError("unsupported persistent id in a plain pickle")
        return self._storages(pid)

    # -- calls ----------------------------------------------------------------------
    def call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        """`visionblocks.weights._rebuild.call`, any error an ``UnpicklingError``."""
        try:
            return call(func, args, kwargs)
        except pickle.UnpicklingError:
            raise
        except Exception as exc:
            raise pickle.UnpicklingError(f"malformed data: {type(exc).__name__}: {exc}") from None

    def _instantiate(self, klass: Any, args: list[Any]) -> None:  # INST, OBJ
        self.append(self.call(klass, tuple(args)))

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self.call(cls, tuple(args)))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self.call(cls, tuple(args), dict(kwargs)))

    # -- state and items ------------------------------------------------------------
    def _load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, Placeholder):
            inst.state = state
        elif type(inst) is np.ndarray or isinstance(inst, np.dtype):
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
            if not isinstance(key, _KEY_TYPES):
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


def read_pickle(path: str) -> tuple[Any, dict[str, int]]:
    """A plain pickle file, read by `SafeUnpickler`, and its placeholders (`replaced`)."""
    with open(path, "rb") as file:
        unpickler = SafeUnpickler(file)
        return unpickler.load(), unpickler.replaced()


class _NoFileno(io.FileIO):
    """No ``fileno``: torch's legacy reader then reads storages through ``read`` instead of
    extracting a ``.tar`` file's members to a folder."""

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


def _keep(storage: Any, location: str) -> Any:
    return storage


def load_torch_file(path: str, zip_format: bool) -> tuple[Any, dict[str, int]]:
    """``torch.load`` of a torch file (a zip file memory-mapped) with `SafeUnpickler` as its
    pickle module: the object, on the CPU, and ``{name: objects built}`` of its placeholders.
    The function ``map_location`` makes ``torch.jit.load`` refuse TorchScript archives."""
    placeholders: dict[str, int] = {}

    class Unpickler(SafeUnpickler):
        def __init__(self, file: Any, **_torch_options: Any) -> None:  # torch's encoding=
            super().__init__(file, placeholders=placeholders)

    module = types.ModuleType("visionblocks.weights._unpickle")  # torch reads its __name__
    module.Unpickler = Unpickler  # type: ignore[attr-defined]
    module.load = lambda file, **_: Unpickler(file).load()  # type: ignore[attr-defined]
    if zip_format:
        obj = torch.load(path, _keep, module, weights_only=False, mmap=True)
    else:
        with io.BufferedReader(_NoFileno(os.fspath(path))) as file:
            obj = torch.load(file, _keep, module, weights_only=False)
    return obj, {name: max(count, 1) for name, count in placeholders.items()}
