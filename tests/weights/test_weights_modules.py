"""Whole models saved with ``torch.save(model)`` read without their code (``_modules``).

Every model here is built from classes of a throw-away module (`SOURCE`, written to
``tmp_path`` and imported under a unique name), saved, and the module is deleted before the
file is read: nothing could import it then, and a finder on ``sys.meta_path`` records any
attempt. The state dict read must equal ``model.state_dict()`` of the original, bit for bit.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torchvision
from torch import nn

from tests.helpers import resident_file_kib
from visionblocks.weights import _modules, load_partial, read_state_dict
from visionblocks.weights._io import read_checkpoint
from visionblocks.weights._modules import is_module, module_state_dict, rebuild_modules
from visionblocks.weights._rebuild import Placeholder

SOURCE = '''
"""A training script's model classes (the module is deleted before its files are read)."""
import os

import torch
import torchvision
from torch import nn


class ResNetWithMean(torchvision.models.ResNet):
    """torchvision's ResNet-18, with a non-persistent buffer of its own."""

    def __init__(self):
        super().__init__(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2])
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]), persistent=False)


class Conv(nn.Module):  # YOLOv5's Conv
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()


class Detect(nn.Module):  # YOLOv5's Detect: a persistent anchors buffer, a plain stride
    def __init__(self, nc, ch):
        super().__init__()
        self.m = nn.ModuleList(nn.Conv2d(c, 3 * (nc + 5), 1) for c in ch)
        self.register_buffer("anchors", torch.rand(len(ch), 3, 2))
        self.stride = torch.tensor([8.0, 16.0])  # an attribute: not in the state dict


class TinyYolo(nn.Module):  # keys model.0.conv.weight ... model.3.m.1.bias, model.3.anchors
    def __init__(self, nc=3):
        super().__init__()
        self.model = nn.Sequential(
            Conv(3, 8, 3, 2), Conv(8, 16, 3, 2), Conv(16, 16), Detect(nc, (16, 16))
        )
        self.names = [f"class{i}" for i in range(nc)]
        self.yaml = {"nc": nc, "depth_multiple": 0.33}


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((2,), 3.0))
        self.fc = nn.Linear(4, 2)
        self.register_buffer("cache", torch.zeros(5), persistent=False)
        self.register_buffer("empty", None)
        self.register_parameter("unused", None)
        self.add_module("absent", None)
        self.norm = nn.BatchNorm1d(2)
        self.register_buffer("steps", torch.tensor(7))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two names
        self.shared = nn.Linear(4, 4)
        self.again = self.shared  # one module, two names


class Sneaky(nn.Module):
    """Unpickling it creates the file ``marker`` (its ``__setstate__`` runs code)."""

    def __init__(self, marker):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.marker = marker

    def __setstate__(self, state):
        open(state["marker"], "w").close()
        super().__setstate__(state)


class Evil(nn.Module):
    """Pickles as ``os.system("touch marker")``: no module at all comes out of it."""

    def __init__(self, marker):
        super().__init__()
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def state_dict_hook(module, state, prefix, local_metadata):
    state[prefix + "extra"] = torch.ones(1)
'''


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Records every import of ``name`` (or below it) tried while installed; finds nothing."""

    def __init__(self, name: str) -> None:
        self.name, self.asked = name, []

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == self.name:
            self.asked.append(fullname)
        return None


@contextlib.contextmanager
def _throwaway(tmp_path: Path) -> Iterator[ModuleType]:
    """`SOURCE` imported under a unique name; deleted (module, file, path entry) on exit."""
    name = f"vb_throwaway_{uuid.uuid4().hex}"
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / f"{name}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(folder))
        shutil.rmtree(folder)
        importlib.invalidate_caches()
    assert importlib.util.find_spec(name) is None


@contextlib.contextmanager
def _no_import_of(name: str) -> Iterator[None]:
    """Fails if anything tries to import ``name`` inside the block."""
    watch = _ImportWatch(name)
    sys.meta_path.insert(0, watch)
    try:
        yield
    finally:
        sys.meta_path.remove(watch)
    assert watch.asked == [] and name not in sys.modules


def _save(obj, path: Path, legacy: bool = False) -> None:
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _assert_same(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Names, order, dtypes and bits."""
    assert list(state) == list(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype, name
        assert state[name].shape == tensor.shape, name
        assert torch.equal(state[name], tensor), name


def _read(path: Path, name: str, **kwargs):
    with pytest.raises(ModuleNotFoundError, match=name):  # control: the file needs the code
        torch.load(path, weights_only=False)
    with _no_import_of(name):
        return read_checkpoint(path, **kwargs)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_resnet_subclass_reads_as_its_state_dict_and_loads_strictly(tmp_path, legacy):
    path = tmp_path / "resnet.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        torch.manual_seed(0)
        model = code.ResNetWithMean()
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.BatchNorm2d):  # running stats other than 0 and 1
                    module.running_mean.uniform_()
                    module.running_var.uniform_(0.5, 2.0)
                    module.num_batches_tracked += 5
        expected = _snapshot(model)
        _save(model, path, legacy)
    state, info = _read(path, name)
    _assert_same(state, expected)
    assert "mean" not in state
    assert info.layout == "whole model (torch.save(model))"
    assert info.modules[f"{name}.ResNetWithMean"] == 1
    assert info.modules["torchvision.models.resnet.BasicBlock"] == 8
    assert info.modules["torch.nn.modules.batchnorm.BatchNorm2d"] == 20
    assert info.placeholders[f"{name}.ResNetWithMean"] == 1
    assert info.mmap is not legacy
    fresh = torchvision.models.resnet18(weights=None)
    with _no_import_of(name):
        assert load_partial(fresh, path, strict=True).ok
    _assert_same(fresh.state_dict(), expected)


def test_tensors_stay_views_of_the_mapped_file(tmp_path):
    path = tmp_path / "buffers.pt"
    with _throwaway(tmp_path) as code:
        name, model = code.__name__, code.WithBuffers()
        model.fc = nn.Linear(1024, 1024)  # 4 MiB of weights
        _save(model, path)
    state, info = _read(path, name)
    assert info.mmap and info.format == "torch (zip, mmap, safe unpickler)"
    if sys.platform.startswith("linux"):  # the tensors lie in the file's mapping
        assert resident_file_kib(path) < 64
        assert state["fc.weight"].sum().isfinite()
        assert resident_file_kib(path) >= 4096


def _yolo_checkpoint(code: ModuleType) -> tuple[dict, dict, dict]:
    """YOLOv5's train.py layout, half precision; the snapshots of model and EMA."""
    torch.manual_seed(0)
    model = code.TinyYolo()
    ema = code.TinyYolo()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    checkpoint = {
        "epoch": 3,
        "best_fitness": 0.5,
        "model": model.half(),
        "ema": ema.half(),
        "updates": 30,
        "optimizer": optimizer.state_dict(),
        "opt": {"imgsz": 640},
        "date": "2024-01-01",
    }
    return checkpoint, _snapshot(model), _snapshot(ema)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_yolov5_checkpoint_gives_the_model_or_the_ema(tmp_path, legacy):
    path = tmp_path / "best.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        checkpoint, expected, expected_ema = _yolo_checkpoint(code)
        _save(checkpoint, path, legacy)
    assert not any(torch.equal(expected[k], expected_ema[k]) for k in expected if "weight" in k)
    state, info = _read(path, name)
    _assert_same(state, expected)
    assert "model.3.anchors" in state and "model.3.stride" not in state
    assert state["model.0.conv.weight"].dtype == torch.float16
    assert state["model.0.bn.num_batches_tracked"].dtype == torch.int64
    assert info.containers == ["model"] and info.layout == "YOLOv5/ultralytics checkpoint"
    assert info.modules[f"{name}.TinyYolo"] == 2 and info.modules[f"{name}.Detect"] == 2
    assert info.modules["torch.nn.modules.container.Sequential"] == 2
    state, info = _read(path, name, key="ema")
    _assert_same(state, expected_ema)
    assert info.containers == ["ema"]
    with _no_import_of(name):
        _assert_same(read_state_dict(path, key="model"), expected)


def test_an_ultralytics_final_file_names_the_entry_to_pick(tmp_path):
    path = tmp_path / "last.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        checkpoint, _, expected_ema = _yolo_checkpoint(code)
        checkpoint.update(model=None, optimizer=None, epoch=-1)  # what strip_optimizer leaves
        _save(checkpoint, path)
    with _no_import_of(name):
        with pytest.raises(
            ValueError, match=r"last\.pt.* whole models are pickled under 'ema'.*key='ema'"
        ):
            read_state_dict(path)
        with pytest.raises(KeyError, match="no mapping under key 'model'"):
            read_state_dict(path, key="model")
        _assert_same(read_state_dict(path, key="ema"), expected_ema)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_buffers_persistent_or_not_and_none_entries(tmp_path, legacy):
    path = tmp_path / "buffers.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        model = code.WithBuffers()
        expected = _snapshot(model)
        _save(model, path, legacy)
    state, _ = _read(path, name)
    _assert_same(state, expected)
    assert list(state) == [
        *("scale", "steps", "fc.weight", "fc.bias", "norm.weight", "norm.bias"),
        *("norm.running_mean", "norm.running_var", "norm.num_batches_tracked"),
    ]


def test_tied_weights_and_shared_modules_appear_under_every_name(tmp_path):
    path = tmp_path / "tied.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        model = code.Tied()
        expected = _snapshot(model)
        _save({"model": model, "epoch": 1}, path)
    state, info = _read(path, name)
    _assert_same(state, expected)
    assert list(state) == [
        *("embed.weight", "head.weight", "shared.weight", "shared.bias"),
        *("again.weight", "again.bias"),
    ]
    assert state["head.weight"].data_ptr() == state["embed.weight"].data_ptr()
    assert info.modules["torch.nn.modules.linear.Linear"] == 2  # `again` is `shared`


def test_a_data_parallel_wrapper_loses_its_module_prefix(tmp_path):
    path = tmp_path / "dp.pth"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        torch.manual_seed(1)
        model = code.ResNetWithMean()
        expected = _snapshot(model)
        _save(nn.DataParallel(model), path)
    state, info = _read(path, name)
    assert list(state) == [f"module.{k}" for k in expected]
    assert info.modules["torch.nn.parallel.data_parallel.DataParallel"] == 1
    with _no_import_of(name):
        _assert_same(read_state_dict(path), expected)
        fresh = torchvision.models.resnet18(weights=None)
        assert load_partial(fresh, path, strict=True).ok
    _assert_same(fresh.state_dict(), expected)


def test_map_location_moves_the_rebuilt_tensors(tmp_path):
    path = tmp_path / "buffers.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        _save(code.WithBuffers(), path)
    with _no_import_of(name):
        state = read_state_dict(path, map_location="meta")
    assert state and all(tensor.is_meta for tensor in state.values())


def test_setstate_of_a_module_class_never_runs(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "sneaky.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        model = nn.Sequential(code.Sneaky(str(marker)), nn.ReLU())
        expected = _snapshot(model)
        _save(model, path)
        torch.load(path, weights_only=False)  # control: an ordinary load runs __setstate__
        assert marker.exists()
        marker.unlink()
    state, info = _read(path, name)
    _assert_same(state, expected)
    assert info.modules[f"{name}.Sneaky"] == 1
    assert not marker.exists()


def test_reduce_of_a_module_class_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    child, whole = tmp_path / "child.pt", tmp_path / "whole.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        _save(nn.Sequential(nn.Linear(2, 2), code.Evil(str(marker))), child)
        _save(code.Evil(str(marker)), whole)
        torch.load(whole, weights_only=False)  # control: an ordinary load runs os.system
        assert marker.exists()
        marker.unlink()
    with _no_import_of(name):
        with pytest.raises(
            ValueError,
            match=r"refusing to load .*child\.pt.*\(child '1' is a "
            r"<placeholder object (posix|nt)\.system>, not a pickled nn\.Module",
        ):
            read_state_dict(child)
        with pytest.raises(ValueError, match=r"refusing to load .*whole\.pt.*(posix|nt)\.system"):
            read_state_dict(whole)
    assert not marker.exists()


def test_malformed_module_files_are_refused(tmp_path):
    path = tmp_path / "bad.pt"
    model = nn.Sequential(nn.Linear(2, 2))
    model[0]._parameters["weight"] = "not a tensor"
    _save(model, path)
    with pytest.raises(
        ValueError,
        match=r"refusing to load .*bad\.pt.*whole model.*module '0' "
        r"\(torch\.nn\.modules\.linear\.Linear\): parameter 'weight' is a str, not a tensor",
    ):
        read_state_dict(path)
    looped = nn.Sequential(nn.Linear(2, 2))
    looped._modules["back"] = looped
    _save({"model": looped}, path)
    with pytest.raises(ValueError, match=r"under 'model': module 'back' .* contains itself"):
        read_state_dict(path)


def test_a_model_without_weights_reads_as_an_empty_state_dict(tmp_path):
    """Its state_dict() is empty: nothing is hidden in code, so it is not refused either."""
    path = tmp_path / "relu.pt"
    _save(nn.ReLU(), path)
    state, info = read_checkpoint(path)
    assert state == {} and info.modules == {"torch.nn.modules.activation.ReLU": 1}
    _save({"model": nn.Sequential(nn.ReLU()), "epoch": 1}, path)
    state, info = read_checkpoint(path)
    assert state == {} and info.containers == ["model"]
    _save({"model": {}, "other": nn.ReLU()}, path)  # no tensors, no module where looked for
    with pytest.raises(ValueError, match=r"whole models are pickled under 'other'"):
        read_state_dict(path)


def test_a_state_dict_hook_is_refused_but_spectral_norm_reads(tmp_path):
    path = tmp_path / "hook.pt"
    with _throwaway(tmp_path) as code:
        name = code.__name__
        model = nn.Linear(2, 2)
        model._register_state_dict_hook(code.state_dict_hook)
        assert "extra" in model.state_dict()
        _save(model, path)
    hook = rf"state-dict hook .*{name}\.state_dict_hook"
    with _no_import_of(name), pytest.raises(ValueError, match=hook):
        read_state_dict(path)
    model = nn.utils.spectral_norm(nn.Linear(3, 2))
    expected = _snapshot(model)
    _save(model, path)
    _assert_same(read_state_dict(path), expected)


# ------------------------------------------------------------------ the rebuilder itself
def _module(name: str, parameters=None, buffers=None, modules=None, **extra) -> Placeholder:
    module = Placeholder(name, "object")
    module.state = {
        "_parameters": parameters or {},
        "_buffers": buffers or {},
        "_modules": modules or {},
        **extra,
    }
    return module


def test_is_module_needs_the_three_tables():
    assert is_module(_module("a.B"))
    assert is_module(Placeholder("a.B", "object")) is False
    half = Placeholder("a.B", "object")
    half.state = {"_parameters": {}, "_buffers": {}}
    assert not is_module(half)
    slots = Placeholder("a.B", "object")
    slots.state = (_module("a.B").state, {"slot": 1})  # (__dict__, slot state)
    assert is_module(slots)
    assert not is_module(Placeholder("a.B"))  # the class, not an instance


@pytest.mark.parametrize(
    ("module", "match"),
    [
        (_module("a.B", {"w": Placeholder("x.Y", "object")}),
         r"the module \(a\.B\): parameter 'w' is a <placeholder object x\.Y>, not a tensor"),
        (_module("a.B", buffers={"b": [1.0]}), r"buffer 'b' is a list, not a tensor"),
        (_module("a.B", {3: torch.ones(1)}), r"has a int name 3 in _parameters"),
        (_module("a.B", modules={"c": {"w": torch.ones(1)}}), r"child 'c' is a dict, not a"),
        (_module("a.B", modules={0: _module("a.C")}), r"has a int child name 0"),
        (_module("a.B", {"c.w": torch.ones(1)}, modules={"c": _module("a.C", {"w": torch.ones(1)})}),
         r"module 'c' \(a\.C\): the name 'c\.w' occurs twice"),
        (_module("a.B", _non_persistent_buffers_set=["b"]), r"must be a set of names, got list"),
        (_module("a.B", _state_dict_pre_hooks={1: Placeholder("x.hook")}),
         r"state-dict hook \(<placeholder global x\.hook> in _state_dict_pre_hooks\)"),
        (Placeholder("a.B", "object"), r"expected a pickled nn\.Module, got <placeholder object a\.B>"),
    ],
)  # fmt: skip
def test_malformed_state_is_refused(module, match):
    with pytest.raises(ValueError, match=match):
        module_state_dict(module)


def test_deep_nesting_needs_no_recursion_and_bombs_are_refused(monkeypatch):
    node = _module("a.Leaf", {"w": torch.ones(1)})
    for _ in range(2000):  # deeper than Python's recursion limit (1000)
        node = _module("a.Node", modules={"n": node})
    assert list(module_state_dict(node)) == [".".join(["n"] * 2000 + ["w"])]
    with pytest.raises(ValueError, match="2000 levels of nesting .*refusing the model"):
        module_state_dict(_module("a.Node", modules={"n": node}))
    bomb = _module("a.Leaf", {"w": torch.ones(1)})
    for _ in range(30):  # 2**30 paths through 31 modules
        bomb = _module("a.Node", modules={"a": bomb, "b": bomb})
    monkeypatch.setattr(_modules, "_MAX_VISITS", 10_000)  # the real cap takes seconds
    with pytest.raises(ValueError, match="more than 10000 modules to visit"):
        module_state_dict(bomb)


def test_rebuild_modules_walks_nested_mappings_once():
    net = _module("m.Net", {"w": torch.ones(2)})
    inner = {"net": net, "lr": 0.1}
    obj = {"a": inner, "b": inner, "plain": {"x": 1}, "other": Placeholder("x.Y", "object")}
    obj["self"] = obj  # a cycle in the pickle
    rebuilt = rebuild_modules(obj)
    assert rebuilt.obj["a"] is rebuilt.obj["b"] and list(rebuilt.obj["a"]["net"]) == ["w"]
    assert isinstance(rebuilt.obj["a"]["net"], _modules.ModuleStateDict)
    assert rebuilt.obj["plain"] is obj["plain"] and rebuilt.obj["other"] is obj["other"]
    assert rebuilt.classes == {"m.Net": 1} and rebuilt.entries == [("a", "net")]
    assert obj["a"]["net"] is net  # the read object is left as it was
    untouched = {"w": torch.ones(1)}
    assert rebuild_modules(untouched).obj is untouched
