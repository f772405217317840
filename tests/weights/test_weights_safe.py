"""The safe unpickler: foreign objects become placeholders, nothing from a file ever runs."""

from __future__ import annotations

import argparse
import builtins
import io
import os
import pickle
import sys
import time
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import resident_file_kib
from tests.weights.fixtures.malicious import PAYLOADS, Call, main_class_with_setstate, raw_pickles
from visionblocks.weights import _rebuild, load_partial, read_state_dict
from visionblocks.weights._io import _read_object, read_checkpoint
from visionblocks.weights._rebuild import Placeholder
from visionblocks.weights._unpickle import SafeUnpickler, load_torch_file

# The placeholder each payload must leave (os.system is posix.system on Linux).
EXPECTED = {
    "os.system": os.system.__module__ + ".system",
    "builtins.eval": "builtins.eval",
    "builtins.exec": "builtins.exec",
    "getattr(__import__('os'), 'system')": "builtins.getattr()",
    "subprocess.Popen": "subprocess.Popen",
    "operator.attrgetter": "operator.attrgetter()()",
    "functools.partial": "functools.partial()",
    "copyreg._reconstructor": "subprocess.Popen",
}


def _appeared(path, wait: float = 0.0) -> bool:
    """Whether ``path`` exists now or within ``wait`` seconds (a Popen runs in the background)."""
    deadline = time.monotonic() + wait
    while True:
        if path.exists():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _save(obj, path) -> None:
    if path.suffix == ".pkl":
        path.write_bytes(pickle.dumps(obj, protocol=2))
    elif path.name.endswith(".legacy.pt"):
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    else:
        torch.save(obj, path)


FILES = ["ckpt.pt", "ckpt.legacy.pt", "ckpt.pkl"]


@pytest.mark.parametrize("name", PAYLOADS)
def test_the_payloads_are_real(tmp_path, name):
    """An ordinary unpickler runs each payload: the tests below could fail."""
    sentinel = tmp_path / "sentinel"
    result = pickle.loads(pickle.dumps({"x": PAYLOADS[name](sentinel)}))
    assert _appeared(sentinel, wait=5.0), result
    if hasattr(result["x"], "wait"):  # a Popen
        result["x"].wait()


@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("name", PAYLOADS)
def test_a_payload_beside_the_weights_becomes_a_placeholder(tmp_path, name, file):
    sentinel = tmp_path / "sentinel"
    weights = {"conv.weight": torch.randn(4, 3), "conv.bias": torch.randn(4)}
    path = tmp_path / file
    _save({"state_dict": weights, "epoch": 3, "payload": PAYLOADS[name](sentinel)}, path)
    state, info = read_checkpoint(path)
    assert state.keys() == weights.keys()
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    assert EXPECTED[name] in info.placeholders
    assert "safe unpickler" in info.format
    model = nn.Linear(3, 4)
    assert load_partial(model, path, rename=[(r"^conv\.", "")], strict=True).ok
    assert not _appeared(sentinel, wait=0.2)


@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("name", PAYLOADS)
def test_a_payload_among_the_weights_is_refused(tmp_path, name, file):
    sentinel = tmp_path / "sentinel"
    path = tmp_path / file
    _save({"weight": torch.ones(2), "bias": PAYLOADS[name](sentinel)}, path)
    with pytest.raises(ValueError, match=r"refusing to load .*ckpt.*needs code.*weights_only"):
        read_state_dict(path)
    _save({"only": PAYLOADS[name](sentinel)}, path)  # no tensors at all
    with pytest.raises(ValueError, match=rf"refusing to load .*It references '{EXPECTED[name]}"):
        read_state_dict(path)
    assert not _appeared(sentinel, wait=0.2)


@pytest.mark.parametrize("name", list(raw_pickles(Path("x"))))
def test_hand_written_opcode_streams_never_run(tmp_path, name):
    sentinel = tmp_path / "sentinel"
    data = raw_pickles(sentinel)[name]
    result = pickle.loads(data)  # control: an ordinary unpickler runs it
    assert _appeared(sentinel, wait=5.0), result
    if hasattr(result, "wait"):  # a Popen
        result.wait()
    sentinel.unlink()
    found = SafeUnpickler(io.BytesIO(data)).load()
    assert isinstance(found, Placeholder) and found.kind == "object"
    assert found.name in {"posix.system", "os.path.os.system", "os.system", "subprocess.Popen"}
    path = tmp_path / "raw.pkl"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"refusing to load .*raw\.pkl.*'{found.name}'"):
        read_state_dict(path)
    assert not _appeared(sentinel, wait=0.2)


def test_a_main_class_with_setstate_is_never_looked_up(tmp_path):
    sentinel = tmp_path / "sentinel"
    path = tmp_path / "main.pt"
    with main_class_with_setstate() as cls:
        torch.save({"state_dict": {"w": torch.ones(1)}, "obj": cls(str(sentinel))}, path)
        torch.load(path, weights_only=False)  # control: __main__.EvilState.__setstate__ runs
        assert sentinel.exists()
        sentinel.unlink()
        # The class is still importable from __main__: the reader must not even look.
        read, _, _ = _read_object(str(path), "cpu")
        assert read_checkpoint(path)[1].placeholders == {"__main__.EvilState": 1}
    obj = read["obj"]
    assert isinstance(obj, Placeholder) and obj.state == {"path": str(sentinel)}
    assert not sentinel.exists()


def test_getattr_of_a_placeholder_is_only_recorded():
    payload = Call(builtins.getattr, argparse.Namespace(x=1), "x")
    found = SafeUnpickler(io.BytesIO(pickle.dumps(payload, protocol=2))).load()
    assert found.name == "builtins.getattr" and found.args[1] == "x"
    namespace = found.args[0]
    assert namespace.name == "argparse.Namespace" and namespace.state == {"x": 1}
    assert repr(found) == "<placeholder object builtins.getattr>"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x80\x02cnumpy\nndarray\nK\x01\x85R.", "refusing to call a type"),  # a real class
        (b"\x80\x02X\x01\x00\x00\x00a)R.", "refusing to call a str"),
        (b"\x80\x02X\x01\x00\x00\x00aK\x01a.", "refusing to append to a str"),
        (b"\x80\x02X\x01\x00\x00\x00a}b.", "refusing to set the state of a str"),
        (b"\x80\x02X\x01\x00\x00\x00aK\x01K\x02s.", "refusing to set items of a str"),
        (b"\x80\x02}]K\x01aK\x01s.", "unsupported dict key type list"),
        (b"\x80\x02ctorch\nFloatStorage\n)R.", "refusing to call a StorageType"),
        (b"\x80\x02K\x01Q.", "unsupported persistent id"),
    ],
)
def test_the_unpickler_refuses_what_is_not_data(data, match):
    with pytest.raises(pickle.UnpicklingError, match=match):
        SafeUnpickler(io.BytesIO(data)).load()


class _Rebuild:
    """Pickles as a tensor rebuild with the arguments given (and a BUILD state, if any)."""

    def __init__(self, *args, state=None):
        self.args, self.state = args, state

    def __reduce__(self):
        if self.state is None:
            return (torch._utils._rebuild_tensor_v2, self.args)
        return (torch._utils._rebuild_tensor_v2, self.args, self.state)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize(
    ("size", "state", "match"),
    [
        ((1000,), None, r"size \(1000,\) at offset 0 reaches past its storage \(8 bytes\)"),
        ((2,), {"x": 1}, "refusing to set the state of a Tensor"),
    ],
)
def test_malformed_tensors_are_refused(tmp_path, size, state, match):
    storage = torch.arange(2.0).storage()
    bad = _Rebuild(storage, 0, size, (1,), False, OrderedDict(), state=state)
    path = tmp_path / "bad.pt"
    torch.save({"args": argparse.Namespace(), "w": bad}, path)  # Namespace first: safe reader
    with pytest.raises(ValueError, match=rf"bad\.pt.*not a valid torch.save file.*{match}"):
        read_checkpoint(path)


def test_numpy_values_and_arrays_are_rebuilt(tmp_path):
    weights = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False])}
    meta = {"seed": np.int64(7), "score": np.float64(0.5), "palette": np.eye(2)}
    path = tmp_path / "np.pth"
    torch.save({"model": weights, "meta": meta}, path)
    obj, read, _ = _read_object(str(path), "cpu")
    assert read.placeholders == {}
    assert obj["meta"]["seed"] == 7 and isinstance(obj["meta"]["seed"], np.int64)
    assert np.array_equal(obj["meta"]["palette"], np.eye(2))
    state, info = read_checkpoint(path)
    assert info.containers == ["model"] and info.format == "torch (zip, mmap, safe unpickler)"
    assert torch.equal(state["a"], torch.arange(6.0).reshape(2, 3))
    assert state["b"].dtype == torch.bool


def test_python2_era_pickle_with_latin1_numpy_data(tmp_path):
    """detectron2's oldest model-zoo files: py2 names, 8-bit strings, numpy.core."""
    data = np.array([1.5, -2.0], dtype="<f4").tobytes()  # holds bytes >= 0x80
    stream = (
        b"\x80\x02}U\x05model}U\x01wcnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        b"K\x00\x85U\x01b\x87R(K\x01K\x02\x85cnumpy\ndtype\nU\x02f4K\x00K\x01\x87R"
        b"(K\x03U\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89U\x08" + data + b"tbssU"
        b"\x0a__author__U\x03FAIs."
    )
    path = tmp_path / "R-50.pkl"
    path.write_bytes(stream)
    state, info = read_checkpoint(path)
    assert info.layout == "detectron2 model zoo" and info.format == "pickle (safe unpickler)"
    assert torch.equal(state["w"], torch.tensor([1.5, -2.0]))


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_legacy_file_with_foreign_objects_and_shared_storages(tmp_path):
    base = torch.arange(10.0)
    weights = {"whole": base, "view": base[3:7], "half": torch.ones(3).half()}
    path = tmp_path / "legacy.pt"
    torch.save(
        {"state_dict": weights, "args": argparse.Namespace(a=1)},
        path,
        _use_new_zipfile_serialization=False,
    )
    state, info = read_checkpoint(path)
    assert info.format == "torch (legacy, safe unpickler)" and not info.mmap
    assert info.placeholders == {"argparse.Namespace": 1}
    for k, v in weights.items():
        assert state[k].dtype == v.dtype and torch.equal(state[k], v)
    assert state["view"].untyped_storage().data_ptr() == state["whole"].untyped_storage().data_ptr()


def test_plain_pickle_of_torch_tensors(tmp_path):
    """``pickle.dump(state_dict)``: each storage is a legacy torch file inside the pickle."""
    weights = nn.Linear(3, 2).state_dict()
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"model": weights}))
    state, info = read_checkpoint(path)
    assert info.format == "pickle (safe unpickler)" and info.placeholders == {}
    assert all(torch.equal(state[k], v) for k, v in weights.items())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
@pytest.mark.parametrize("dict_subclass", [False, True])  # torch's unpickler, or SafeUnpickler
def test_files_with_placeholders_are_memory_mapped(tmp_path, dict_subclass):
    path = tmp_path / "ref.pth"
    data = torch.arange(float(1 << 20))  # 4 MiB
    extra = _AttributeDict(a=1) if dict_subclass else argparse.Namespace()
    torch.save({"model": {"w": data}, "args": extra}, path)
    state, info = read_checkpoint(path)
    assert info.mmap and info.format == "torch (zip, mmap, safe unpickler)"
    assert len(info.placeholders) == 1
    assert resident_file_kib(path) < 64  # mapped, not read yet
    assert torch.equal(state["w"], data)
    assert resident_file_kib(path) >= 4096


class _AttributeDict(dict):
    """A dict subclass (Lightning's AttributeDict): torch's unpickler cannot fill it."""


def test_map_location_of_the_safe_readers(tmp_path):
    path = tmp_path / "ref.pth"
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace()}, path)
    assert read_state_dict(path, map_location="meta")["w"].is_meta
    assert read_state_dict(path, map_location=None)["w"].device.type == "cpu"
    assert read_state_dict(path, map_location={"cpu": "cpu"})["w"].device.type == "cpu"
    torch.save({"model": {"w": torch.ones(2)}, "args": _AttributeDict(a=1)}, path)  # SafeUnpickler
    assert read_state_dict(path, map_location="meta")["w"].is_meta
    with pytest.raises(TypeError, match="map_location must be a device .* got dict"):
        read_state_dict(path, map_location={"cpu": "cpu"})


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:'torch.load' received a zip file")
def test_a_torchscript_archive_is_never_loaded(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(path))
    with pytest.raises(ValueError, match=r"scripted\.pt.*not a valid torch\.save file"):
        read_state_dict(path)
    # SafeUnpickler's torch.load gives torch.jit.load a function as map_location: refused.
    with pytest.raises(ValueError, match="map_location should be either None, string or"):
        load_torch_file(str(path), zip_format=True)


@pytest.mark.parametrize(
    "name", [b"argparse\nNamespace", b"collections\nOrderedDict", b"builtins\nlist"]
)
def test_build_cannot_change_the_allowed_objects(tmp_path, name):
    # GLOBAL name; (None, {"tag": 1}); BUILD: setattr on whatever the global gave.
    data = b"\x80\x02c" + name + b"\nN}X\x03\x00\x00\x00tagK\x01s\x86b."
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", sys.byteorder)
    with pytest.raises(ValueError):
        read_state_dict(path)
    assert not hasattr(OrderedDict, "tag") and not hasattr(Placeholder, "tag")
    assert not any(hasattr(f, "tag") for f in _rebuild._CALLS.values())


def test_key_naming_a_placeholder_is_a_key_error(tmp_path):
    path = tmp_path / "ref.pth"
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace()}, path)
    with pytest.raises(KeyError, match="no mapping under key 'args'"):
        read_state_dict(path, key="args")


def test_a_whole_module_saved_reads_as_its_state_dict(tmp_path):
    """torch.save(model): rebuilt from the pickled state (tests/weights/test_weights_modules.py)."""
    path = tmp_path / "model.pt"
    model = nn.Sequential(nn.Linear(2, 2))
    torch.save(model, path)
    state, info = read_checkpoint(path)
    assert list(state) == ["0.weight", "0.bias"]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert info.modules == {
        "torch.nn.modules.container.Sequential": 1,
        "torch.nn.modules.linear.Linear": 1,
    }


def test_missing_storage_record_is_not_valid(tmp_path):
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"w": torch.ones(2), "args": argparse.Namespace()}, good)
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/data/0"):
                dst.writestr(info, src.read(info))
    with pytest.raises(ValueError, match=r"bad\.pt.*not a valid torch.save file"):
        read_state_dict(bad)
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(pickle.dumps({"w": 1})[:-3])
    with pytest.raises(ValueError, match=r"cut\.pkl.*not a valid torch or pickle file"):
        read_state_dict(cut)


def test_placeholder_counts_and_bare_references():
    class_only = pickle.dumps({"cls": argparse.Namespace, "a": argparse.Namespace()}, protocol=2)
    unpickler = SafeUnpickler(io.BytesIO(class_only))
    obj = unpickler.load()
    assert isinstance(obj["cls"], Placeholder) and obj["cls"].kind == "global"
    assert unpickler.replaced() == {"argparse.Namespace": 1}
