"""What the safe unpickler builds, and the allowlist of names it may call (private).

Every name a pickle may *call* maps to a function written here (never to the original):
tensor rebuilders that check each size and offset against the file's storage before making
a view (``torch``'s own ``set_`` does not), NumPy rebuilders that accept only numeric data,
and plain containers that refuse placeholders as input. `allowed` answers for a dotted
name; `CALL_BY_ID` lets `SafeUnpickler.call` check by identity that an object on the stack
is one of these functions. Each function takes the unpickler first (``u``), to call or
count placeholders.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from visionblocks.weights._unpickle import SafeUnpickler

__all__ = [
    "CALL_BY_ID",
    "CONTAINER_TYPES",
    "KEY_TYPES",
    "Placeholder",
    "StorageType",
    "TorchStorage",
    "allowed",
    "numpy_module",
]


class Placeholder:
    """Stands in for a class or function the file names, which was never imported.

    ``kind`` is ``"global"`` for the name itself and ``"object"`` for what calling it would
    have built. Nothing of the original runs: the arguments of the call, the state given by
    ``BUILD`` (``__setstate__``) and the items or entries the pickle adds are only stored.
    A placeholder has no behaviour of its own (no ``__call__``, ``__getattr__`` or
    ``__iter__``), so code that receives one cannot be tricked into running anything.

    Attributes:
        name: The dotted name the file references, e.g. ``"argparse.Namespace"``; a call of
            an object placeholder is named after it with ``"()"`` appended.
        kind: ``"global"`` or ``"object"``.
        args: Positional arguments of the call (objects only).
        kwargs: Keyword arguments of the call (objects only).
        state: What ``BUILD`` passed (``None`` if nothing).
        items: Items appended (``APPEND``/``APPENDS``/``ADDITEMS``).
        entries: ``(key, value)`` pairs set (``SETITEM``/``SETITEMS``).
    """

    __slots__ = ("args", "entries", "items", "kind", "kwargs", "name", "state")

    def __init__(
        self,
        name: str,
        kind: str = "global",
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.args = args
        self.kwargs = kwargs or {}
        self.state: Any = None
        self.items: list[Any] = []
        self.entries: list[tuple[Any, Any]] = []

    def __repr__(self) -> str:
        return f"<placeholder {self.kind} {self.name}>"


class StorageType:
    """What a pickled storage class (``torch.FloatStorage``) stands for here: its dtype."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class TorchStorage:
    """A storage of a torch file: its bytes and the dtype its tensors were saved with."""

    __slots__ = ("dtype", "untyped")

    def __init__(self, untyped: torch.UntypedStorage, dtype: torch.dtype) -> None:
        self.untyped = untyped
        self.dtype = dtype


# ------------------------------------------------------------------------- rebuilders
def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        raise TypeError(f"{name} must be a tuple of non-negative ints, got {value!r}")
    return tuple(value)


def _tensor(
    storage: Any, dtype: Any, offset: Any, size: Any, stride: Any
) -> torch.Tensor | Placeholder:
    if isinstance(storage, Placeholder):
        return storage
    if not isinstance(storage, TorchStorage):
        raise TypeError(f"a tensor's storage must come from the file, got {type(storage).__name__}")
    dtype = storage.dtype if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if type(offset) is not int or offset < 0:
        raise TypeError(f"storage offset must be a non-negative int, got {offset!r}")
    size, stride = _int_tuple("size", size), _int_tuple("stride", stride)
    if len(size) != len(stride):
        raise ValueError(f"size {size} and stride {stride} differ in length")
    if all(size):  # torch's set_ does not check that the view stays inside the storage
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if (last + 1) * dtype.itemsize > storage.untyped.nbytes():
            raise ValueError(
                f"a tensor of size {size} at offset {offset} reaches past its storage "
                f"({storage.untyped.nbytes()} bytes)"
            )
    tensor = torch.empty(0, dtype=dtype, device=storage.untyped.device)
    return tensor.set_(storage.untyped, offset, size, stride)


def _rebuild_tensor(u: SafeUnpickler, storage, offset, size, stride, *_unused) -> Any:
    return _tensor(storage, None, offset, size, stride)


def _rebuild_tensor_v3(
    u: SafeUnpickler, storage, offset, size, stride, grad, hooks, dtype, metadata=None
) -> Any:
    return _tensor(storage, dtype, offset, size, stride)


def _rebuild_parameter(u: SafeUnpickler, data: Any, *_unused: Any) -> Any:
    # A state dict needs the data, not the Parameter (its requires_grad, hooks, attributes).
    if not isinstance(data, (torch.Tensor, Placeholder)):
        raise TypeError(f"a Parameter's data must be a tensor, got {type(data).__name__}")
    return data


def _rebuild_from_type_v2(u: SafeUnpickler, func: Any, new_type: Any, args: Any, state: Any):
    result = u.call(func, args)
    if isinstance(new_type, Placeholder):  # a foreign tensor subclass: keep the plain tensor
        u.count(new_type)
    elif new_type is not torch.Tensor and new_type is not torch.nn.Parameter:
        raise TypeError(f"unsupported tensor type {type(new_type).__name__}")
    return result


def _load_from_bytes(u: SafeUnpickler, data: Any) -> Any:
    if u.load_from_bytes is None:
        raise pickle.UnpicklingError("nested torch.storage._load_from_bytes is not supported")
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"_load_from_bytes needs bytes, got {type(data).__name__}")
    return u.load_from_bytes(bytes(data), u)


def _device(u: SafeUnpickler, kind: Any, index: Any = None) -> torch.device:
    if not isinstance(kind, str) or not (index is None or type(index) is int):
        raise TypeError(f"torch.device({kind!r}, {index!r}) is not a device")
    return torch.device(kind) if index is None else torch.device(kind, index)


def _size(u: SafeUnpickler, sizes: Any = ()) -> torch.Size:
    return torch.Size(_int_tuple("torch.Size", sizes))


def numpy_module() -> Any:
    import numpy

    return numpy


def _np_dtype(u: SafeUnpickler, spec: Any, align: Any = False, copy: Any = False) -> Any:
    if isinstance(spec, bytes):
        spec = spec.decode("ascii")
    if not isinstance(spec, str):
        raise TypeError(f"numpy.dtype needs a type string, got {type(spec).__name__}")
    return numpy_module().dtype(spec, align=bool(align), copy=bool(copy))


def _np_reconstruct(u: SafeUnpickler, subtype: Any, shape: Any, dtype: Any) -> Any:
    np = numpy_module()
    if isinstance(subtype, Placeholder):  # a foreign ndarray subclass
        return u.call(subtype, (shape, dtype))
    if subtype is not np.ndarray:
        raise TypeError(f"_reconstruct of {type(subtype).__name__}")
    return np.ndarray(shape=_int_tuple("shape", shape), dtype=_np_dtype(u, dtype))


def _np_scalar(u: SafeUnpickler, dtype: Any, data: Any = None) -> Any:
    np = numpy_module()
    if not isinstance(dtype, np.dtype):
        raise TypeError(f"numpy scalar needs a dtype, got {type(dtype).__name__}")
    if dtype.hasobject:
        return data
    if isinstance(data, str):  # Python 2 pickles read with encoding="latin1"
        data = data.encode("latin1")
    if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
        raise ValueError(f"numpy scalar of {dtype} needs {dtype.itemsize} bytes")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _np_frombuffer(u: SafeUnpickler, buf: Any, dtype: Any, shape: Any, order: Any) -> Any:
    np = numpy_module()
    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise TypeError(f"numpy buffer must be bytes, got {type(buf).__name__}")
    if not isinstance(dtype, np.dtype) or dtype.hasobject or order not in ("C", "F"):
        raise TypeError(f"unsupported numpy buffer layout {dtype!r}, order {order!r}")
    return np.frombuffer(buf, dtype=dtype).reshape(_int_tuple("shape", shape), order=order)


def _codecs_encode(u: SafeUnpickler, text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "ascii"):
        raise TypeError(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode(encoding)


def _bytes_like(kind: type) -> Callable[..., Any]:
    def build(u: SafeUnpickler, data: Any = b"", encoding: Any = None) -> Any:
        if isinstance(data, str) and encoding in ("latin1", "latin-1"):
            data = data.encode("latin1")
        if not isinstance(data, (bytes, bytearray)):  # bytes(10**12) would allocate
            raise TypeError(f"{kind.__name__} needs bytes, got {type(data).__name__}")
        return kind(data)

    return build


def _container(kind: type) -> Callable[..., Any]:
    def build(u: SafeUnpickler, *args: Any) -> Any:
        if any(isinstance(a, Placeholder) for a in args):
            raise TypeError(f"{kind.__name__} of a placeholder")
        return kind(*args)

    return build


def _defaultdict(u: SafeUnpickler, *args: Any) -> dict[Any, Any]:
    return {}  # the default factory is never needed (nor called) to read a checkpoint


def _reconstructor(u: SafeUnpickler, cls: Any, base: Any, state: Any) -> Any:
    return u.call(cls, () if state is None else (state,))


def _newobj(u: SafeUnpickler, cls: Any, *args: Any) -> Any:
    return u.new(cls, args, {})


def _newobj_ex(u: SafeUnpickler, cls: Any, args: Any, kwargs: Any) -> Any:
    return u.new(cls, tuple(args), dict(kwargs))


def _number(kind: type) -> Callable[..., Any]:
    def build(u: SafeUnpickler, *args: Any) -> Any:
        if not all(isinstance(a, (int, float)) or a is None for a in args):
            raise TypeError(f"{kind.__name__} of {[type(a).__name__ for a in args]}")
        return kind(*args)

    return build


# ------------------------------------------------------------------------- allowlist
CONTAINER_TYPES = (dict, list, tuple, set, frozenset, OrderedDict)
KEY_TYPES = (str, bytes, int, float, complex, tuple, frozenset, type(None))
_CALLS: dict[str, Callable[..., Any]] = {
    **{f"builtins.{t.__name__}": _container(t) for t in CONTAINER_TYPES[:5]},
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

# The objects find_class hands out for these names are the implementations themselves
# (wrapped so that each is a distinct, hashable key); `call` looks them up by identity.
CALL_BY_ID: dict[int, Callable[..., Any]] = {id(impl): impl for impl in _CALLS.values()}

_TYPE_MARKERS = {"torch._tensor.Tensor": torch.Tensor, "torch.Tensor": torch.Tensor,
                 "torch.nn.parameter.Parameter": torch.nn.Parameter}  # fmt: skip

_STORAGE_DTYPES = {
    "Double": torch.float64, "Float": torch.float32, "Half": torch.float16,
    "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32,
    "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool,
    "ComplexDouble": torch.complex128, "ComplexFloat": torch.complex64, "Untyped": torch.uint8,
}  # fmt: skip
_STORAGES = {
    f"{module}.{kind}Storage": StorageType(dtype)
    for module in ("torch", "torch.cuda", "torch.storage")
    for kind, dtype in _STORAGE_DTYPES.items()
}
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


def allowed(full: str) -> Any:
    """The object of ours that stands for ``full``, or None (then it becomes a placeholder)."""
    if full in _CALLS:
        return _CALLS[full]
    if full == "numpy.ndarray":
        return numpy_module().ndarray
    for table in (_TYPE_MARKERS, _STORAGES, _DTYPES):
        if full in table:
            return table[full]
    return None
