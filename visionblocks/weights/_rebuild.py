"""What the weights-only unpicklers build for the names a file references (private).

torch's weights-only unpickler (its allow-list extended with `torch_allowlist`) and
`visionblocks.weights._unpickle.SafeUnpickler` (with `allowed` and `call`) build the same
objects: every name not in `allowed` becomes an inert `Placeholder`, never imported; the names
in it map to functions written here, never to the originals (containers that refuse
placeholders, NumPy rebuilders that take data only, tensor rebuilders that check sizes and
offsets against the storage).
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["Placeholder", "allowed", "call", "python3_name", "torch_allowlist"]


class Placeholder:
    """Stands in for a class or function the file names, which was never imported: calling
    it builds an object placeholder that stores the arguments, and ``BUILD``, items and
    entries are stored too.

    Attributes:
        name: The dotted name the file references, e.g. ``"argparse.Namespace"``; a call of
            an object placeholder is named after it with ``"()"`` appended.
        kind: ``"global"`` or ``"object"``.
        args: Positional arguments of the call (objects only).
        kwargs: Keyword arguments of the call (objects only).
        state: What ``BUILD`` passed (``None`` if nothing).
        items: Items appended (``APPEND``/``APPENDS``/``ADDITEMS``).
        entries: ``(key, value)`` pairs set (``SETITEM``/``SETITEMS``).
        counts: ``{name: objects built}``, shared by the placeholders of one file.

    Examples:
        >>> namespace = Placeholder("argparse.Namespace")
        >>> args = namespace(epochs=3)
        >>> args, args.kwargs, namespace.counts
        (<placeholder object argparse.Namespace>, {'epochs': 3}, {'argparse.Namespace': 1})
    """

    __slots__ = ("args", "counts", "entries", "items", "kind", "kwargs", "name", "state")

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        # torch's NEWOBJ runs ``cls.__new__(cls, *args)`` on a global placeholder: a call.
        if isinstance(cls, Placeholder):
            return cls(*args, **kwargs)
        return object.__new__(cls)

    def __init__(
        self,
        name: str,
        kind: str = "global",
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        counts: dict[str, int] | None = None,
    ) -> None:
        self.name, self.kind, self.args, self.kwargs = name, kind, args, kwargs or {}
        self.state: Any = None
        self.items: list[Any] = []
        self.entries: list[tuple[Any, Any]] = []
        self.counts = {} if counts is None else counts

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        name = self.name if self.kind == "global" else self.name + "()"
        self.counts[name] = self.counts.get(name, 0) + 1
        return Placeholder(name, "object", args, kwargs, self.counts)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<placeholder {self.kind} {self.name}>"


class _NDArray:
    """``numpy.ndarray`` as a pickle names it: only ``_reconstruct``'s first argument."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> _NDArray:
        raise TypeError("numpy.ndarray is only read as the argument of _reconstruct")


_TENSOR_TYPES = {"torch._tensor.Tensor": torch.Tensor, "torch.Tensor": torch.Tensor,
                 "torch.nn.parameter.Parameter": torch.nn.Parameter}  # fmt: skip


# ------------------------------------------------------------------------- rebuilders
def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        raise TypeError(f"{name} must be a tuple of non-negative ints, got {value!r}")
    return tuple(value)


def _tensor(storage: Any, dtype: Any, offset: Any, size: Any, stride: Any) -> Any:
    if isinstance(storage, Placeholder):
        return storage
    if not isinstance(storage, torch.storage.TypedStorage):
        raise TypeError(f"a tensor's storage must come from the file, got {type(storage).__name__}")
    untyped = storage._untyped_storage
    dtype = storage.dtype if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if type(offset) is not int or offset < 0:
        raise TypeError(f"storage offset must be a non-negative int, got {offset!r}")
    size, stride = _int_tuple("size", size), _int_tuple("stride", stride)
    if len(size) != len(stride):
        raise ValueError(f"size {size} and stride {stride} differ in length")
    # torch's set_ grows a resizable storage to fit the view instead of refusing it.
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if all(size) and (last + 1) * dtype.itemsize > untyped.nbytes():
        raise ValueError(
            f"a tensor of size {size} at offset {offset} reaches past its storage "
            f"({untyped.nbytes()} bytes)"
        )
    return torch.empty(0, dtype=dtype, device=untyped.device).set_(untyped, offset, size, stride)


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_unused: Any) -> Any:
    return _tensor(storage, None, offset, size, stride)


def _rebuild_tensor_v3(storage, offset, size, stride, grad, hooks, dtype, metadata=None) -> Any:
    return _tensor(storage, dtype, offset, size, stride)


def _rebuild_parameter(data: Any, *_unused: Any) -> Any:
    # A state dict needs the data, not the Parameter (its requires_grad, hooks, attributes).
    if not isinstance(data, (torch.Tensor, Placeholder)):
        raise TypeError(f"a Parameter's data must be a tensor, got {type(data).__name__}")
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    result = call(func, args)
    if isinstance(new_type, Placeholder):  # a foreign tensor subclass: keep the plain tensor
        new_type.counts[new_type.name] = new_type.counts.get(new_type.name, 0) + 1
    elif new_type is not torch.Tensor and new_type is not torch.nn.Parameter:
        raise TypeError(f"unsupported tensor type {type(new_type).__name__}")
    return result


def _load_from_bytes(data: Any) -> Any:
    """A storage pickled with plain ``pickle``, read by torch's weights-only unpickler."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"_load_from_bytes needs bytes, got {type(data).__name__}")
    storage = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(storage, torch.storage.TypedStorage):
        raise TypeError(f"_load_from_bytes holds a {type(storage).__name__}, not a storage")
    return storage


def _device(kind: Any, index: Any = None) -> torch.device:
    if not isinstance(kind, str) or not (index is None or type(index) is int):
        raise TypeError(f"torch.device({kind!r}, {index!r}) is not a device")
    return torch.device(kind) if index is None else torch.device(kind, index)


def _size(sizes: Any = ()) -> torch.Size:
    return torch.Size(_int_tuple("torch.Size", sizes))


def _np_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if isinstance(spec, bytes):
        spec = spec.decode("ascii")
    if not isinstance(spec, str):
        raise TypeError(f"numpy.dtype needs a type string, got {type(spec).__name__}")
    return np.dtype(spec, align=bool(align), copy=bool(copy))


def _np_reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    if isinstance(subtype, Placeholder):  # a foreign ndarray subclass
        return subtype(shape, dtype)
    if subtype is not _NDArray:
        raise TypeError(f"_reconstruct of {type(subtype).__name__}")
    return np.ndarray((0,), dtype=np.int8)  # what NumPy's pickles ask for; BUILD sets the rest


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype):
        raise TypeError(f"numpy scalar needs a dtype, got {type(dtype).__name__}")
    if dtype.hasobject:
        return data
    if isinstance(data, str):  # Python 2 pickles read with encoding="latin1"
        data = data.encode("latin1")
    if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
        raise ValueError(f"numpy scalar of {dtype} needs {dtype.itemsize} bytes")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _np_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> Any:
    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise TypeError(f"numpy buffer must be bytes, got {type(buf).__name__}")
    if not isinstance(dtype, np.dtype) or dtype.hasobject or order not in ("C", "F"):
        raise TypeError(f"unsupported numpy buffer layout {dtype!r}, order {order!r}")
    return np.frombuffer(buf, dtype=dtype).reshape(_int_tuple("shape", shape), order=order)


def _codecs_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "ascii"):
        raise TypeError(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode(encoding)


def _bytes_like(kind: type) -> Callable[..., Any]:
    def build(data: Any = b"", encoding: Any = None) -> Any:
        if isinstance(data, str) and encoding in ("latin1", "latin-1"):
            data = data.encode("latin1")
        if not isinstance(data, (bytes, bytearray)):  # bytes(10**12) would allocate
            raise TypeError(f"{kind.__name__} needs bytes, got {type(data).__name__}")
        return kind(data)

    return build


def _container(kind: type) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        if any(isinstance(a, Placeholder) for a in args):
            raise TypeError(f"{kind.__name__} of a placeholder")
        return kind(*args)

    return build


def _defaultdict(*args: Any) -> dict[Any, Any]:
    return {}  # the default factory is never needed (nor called) to read a checkpoint


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    return call(cls, () if state is None else (state,))


def _newobj(cls: Any, *args: Any) -> Any:
    return call(cls, args)


def _newobj_ex(cls: Any, args: Any, kwargs: Any) -> Any:
    return call(cls, tuple(args), dict(kwargs))


def _number(kind: type) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        if not all(isinstance(a, (int, float)) or a is None for a in args):
            raise TypeError(f"{kind.__name__} of {[type(a).__name__ for a in args]}")
        return kind(*args)

    return build


# ------------------------------------------------------------------------- allowlist
_CONTAINERS = (dict, list, tuple, set, frozenset)
_CALLS: dict[str, Callable[..., Any]] = {
    **{f"builtins.{t.__name__}": _container(t) for t in _CONTAINERS},
    "collections.OrderedDict": _container(OrderedDict),
    "collections.defaultdict": _defaultdict,
    "builtins.bytes": _bytes_like(bytes),
    "builtins.bytearray": _bytes_like(bytearray),
    "builtins.complex": _number(complex),
    "builtins.slice": _number(slice),
    "_codecs.encode": _codecs_encode,
    "copyreg._reconstructor": _reconstructor,
    "copyreg.__newobj__": _newobj,
    "copyreg.__newobj_ex__": _newobj_ex,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.storage._load_from_bytes": _load_from_bytes,
    "torch.device": _device,
    "torch.Size": _size,
    "numpy.dtype": _np_dtype,
    **{
        f"numpy.{core}.{name}": impl
        for core in ("core.multiarray", "_core.multiarray")
        for name, impl in (("_reconstruct", _np_reconstruct), ("scalar", _np_scalar))
    },
    "numpy.core.numeric._frombuffer": _np_frombuffer,
    "numpy._core.numeric._frombuffer": _np_frombuffer,
}
"""Names that may be called, mapped to our implementation (never the original)."""
_CALL_BY_ID = {id(impl): impl for impl in _CALLS.values()}
_DTYPES = {
    f"torch.{name}": getattr(torch, name)
    for name in (
        *("float64", "float32", "float16", "bfloat16", "complex32", "complex64", "complex128"),
        *("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool"),
        *("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
        *("double", "float", "half", "long", "int", "short", "cfloat", "cdouble"),
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def python3_name(full: str) -> str:
    """``full`` (``module.name``) as Python 3 calls it (protocols 0 to 2 store Python 2's).

    Examples:
        >>> python3_name("__builtin__.unicode"), python3_name("argparse.Namespace")
        ('builtins.str', 'argparse.Namespace')
    """
    module, _, name = full.rpartition(".")
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def allowed(full: str) -> Any:
    """The object of ours that stands for ``full``, or None (then it becomes a placeholder).

    Examples:
        >>> allowed("collections.OrderedDict")([("a", 1)])["a"]
        1
        >>> allowed("torch.float16"), allowed("os.system")
        (torch.float16, None)
    """
    if full == "numpy.ndarray":
        return _NDArray
    for table in (_CALLS, _TENSOR_TYPES, _DTYPES):
        if full in table:
            return table[full]
    return None


def call(func: Any, args: Any, kwargs: Any = None) -> Any:
    """``func(*args, **kwargs)`` for a placeholder or a function of `allowed`; refused otherwise.

    Raises:
        pickle.UnpicklingError: If ``func`` is anything else, or the arguments are no tuple.
    """
    if not isinstance(args, tuple) or not isinstance(kwargs, (dict, type(None))):
        raise pickle.UnpicklingError("malformed call: arguments must be a tuple")
    if not isinstance(func, Placeholder) and _CALL_BY_ID.get(id(func)) is not func:
        raise pickle.UnpicklingError(
            f"refusing to call a {type(func).__name__}: only placeholders and the "
            "rebuilders of tensors, NumPy arrays and containers are called"
        )
    return func(*args, **(kwargs or {}))


def torch_allowlist(names: list[str], counts: dict[str, int]) -> list[tuple[Any, str]]:
    """Entries for ``torch.serialization.safe_globals`` that make torch's unpickler build, for
    the ``names`` it refuses, what `allowed` and `Placeholder` give. The types ``BUILD`` may
    act on (placeholders, NumPy arrays and dtypes) go under names holding a newline, which
    no ``GLOBAL`` can name.

    Args:
        names: Dotted names, as ``torch.serialization.get_unsafe_globals_in_checkpoint``
            lists them.
        counts: Where the placeholders count the objects built.

    Returns:
        list[tuple[Any, str]]: ``(object, name)`` pairs.

    Examples:
        >>> [str(obj) for obj, _ in torch_allowlist(["argparse.Namespace"], {})]
        ['<placeholder global argparse.Namespace>', "<class '...Placeholder'>"]
    """
    entries = [
        (allowed(name) or Placeholder(python3_name(name), counts=counts), name) for name in names
    ]
    types: list[type] = [Placeholder]
    if any(name.startswith("numpy.") for name in names):
        types += [np.ndarray, *{type(np.dtype(code)) for code in np.typecodes["All"]}]
    return entries + [(kind, f"\n{kind.__module__}.{kind.__qualname__}") for kind in types]
