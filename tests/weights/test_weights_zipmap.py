"""The fast reader of torch.save zip files: what torch.load gives, or a fallback to it."""

from __future__ import annotations

import argparse
import collections
import io
import os
import sys
import threading
import zipfile

import pytest
import torch
from torch import nn

from visionblocks.weights import load_partial
from visionblocks.weights._io import read_checkpoint, source_state
from visionblocks.weights._zipmap import Unsupported, _StorageType, _TensorArgs, read_mapped_zip

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs / preadv")


def _mixed_state() -> dict[str, object]:
    torch.manual_seed(0)
    shared = torch.randn(40)
    base = torch.randn(6, 5)
    return collections.OrderedDict(
        f32=torch.randn(3, 4),
        f16=torch.randn(7).half(),
        bf16=torch.randn(2, 3).bfloat16(),
        f64=torch.randn(5, dtype=torch.float64),
        i64=torch.arange(9) * 1000003,
        i8=torch.arange(-4, 4, dtype=torch.int8),
        u8=torch.arange(7, dtype=torch.uint8),
        flag=torch.tensor([True, False, True]),
        c64=torch.randn(3, dtype=torch.complex64),
        scalar=torch.tensor(9),
        empty=torch.zeros(0, 3),
        view_a=shared[:8],
        view_b=shared[10:30].view(4, 5),
        transposed=base.t(),
        grad=torch.ones(2, requires_grad=True),
    )


def _zip_with(path, data: bytes, records: dict[str, bytes] | None = None) -> None:
    """A torch-style zip whose ``data.pkl`` is ``data`` (and the given records)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", sys.byteorder)
        for name, raw in (records or {}).items():
            archive.writestr(f"archive/{name}", raw)


def test_gives_what_torch_load_gives(tmp_path):
    state = _mixed_state()
    state._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    path = tmp_path / "mixed.pth"
    torch.save(state, path)
    obj, fd, _ = read_mapped_zip(str(path), "cpu", keep_fd=False)
    assert fd is None
    expected = torch.load(path, weights_only=True, mmap=True)
    assert type(obj) is collections.OrderedDict and list(obj) == list(expected)
    assert obj._metadata == expected._metadata
    for key, value in expected.items():
        got = obj[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert got.stride() == value.stride() and got.requires_grad == value.requires_grad, key
        assert torch.equal(got, value), key
    assert obj["view_a"].untyped_storage().data_ptr() == obj["view_b"].untyped_storage().data_ptr()
    state, info = read_checkpoint(path)
    assert info.format == "torch (zip, mmap)" and info.mmap


def test_training_checkpoints_and_repeated_tensors(tmp_path):
    weight = torch.randn(4, 4)
    path = tmp_path / "train.ckpt"
    torch.save({"epoch": 3, "state_dict": {"w": weight, "tied": weight}, "hist": [weight]}, path)
    obj, _, _ = read_mapped_zip(str(path), "cpu", keep_fd=False)
    assert obj["epoch"] == 3 and torch.equal(obj["state_dict"]["w"], weight)
    assert obj["state_dict"]["w"] is obj["state_dict"]["tied"] is obj["hist"][0]


def test_files_it_does_not_handle_go_to_torch_load(tmp_path):
    path = tmp_path / "params.pth"
    torch.save(nn.Linear(2, 3).state_dict(keep_vars=True), path)  # nn.Parameter
    with pytest.raises(Unsupported, match="_rebuild_parameter"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)
    state, info = read_checkpoint(path)
    assert info.format == "torch (zip, mmap)" and set(state) == {"weight", "bias"}
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=1)}, path)
    with pytest.raises(Unsupported, match="argparse"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)
    assert read_checkpoint(path)[1].format == "torch (zip, mmap, safe unpickler)"
    for location in ({"cpu": "cpu"}, "meta", lambda s, _: s):
        with pytest.raises(Unsupported, match="map_location"):
            read_mapped_zip(str(path), location, keep_fd=False)


def test_a_short_record_or_the_other_byte_order_is_left_to_torch(tmp_path):
    path = tmp_path / "x.pt"
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        data = archive.read("archive/data.pkl")
    _zip_with(path, data, {"data/0": b"\0" * 8})  # 2 floats where 4 are needed
    with pytest.raises(Unsupported, match="short"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)
    other = "big" if sys.byteorder == "little" else "little"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", other)
        archive.writestr("archive/data/0", b"\0" * 16)
    with pytest.raises(Unsupported, match="byte order"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)


def test_a_tensor_outside_its_storage_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buffer)
    with zipfile.ZipFile(buffer) as archive:
        data = archive.read("archive/data.pkl").replace(b"K\x04\x85", b"K\x05\x85")  # size 5
    path = tmp_path / "x.pt"
    _zip_with(path, data, {"data/0": b"\0" * 16})
    with pytest.raises(Unsupported, match="outside"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)
    with pytest.raises((ValueError, RuntimeError)):
        read_checkpoint(path)  # torch.load's own error


@pytest.mark.parametrize(
    "name",
    [b"torch._utils\n_rebuild_tensor_v2", b"torch\nFloatStorage", b"collections\nOrderedDict"],
)
def test_build_cannot_change_the_allowed_objects(tmp_path, name):
    # GLOBAL name; (None, {"tag": 1}); BUILD: setattr on whatever the global gave.
    data = b"\x80\x02c" + name + b"\nN}X\x03\x00\x00\x00tagK\x01s\x86b."
    path = tmp_path / "evil.pt"
    _zip_with(path, data)
    with pytest.raises(Unsupported):
        read_mapped_zip(str(path), "cpu", keep_fd=False)
    assert not hasattr(_TensorArgs, "tag") and not hasattr(_StorageType, "tag")
    assert not hasattr(collections.OrderedDict, "tag")


def test_other_globals_are_never_imported(tmp_path):
    data = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00truea\x85R."
    path = tmp_path / "evil.pt"
    _zip_with(path, data)
    with pytest.raises(Unsupported, match="os.system"):
        read_mapped_zip(str(path), "cpu", keep_fd=False)


@linux
def test_load_partial_reads_the_file_and_closes_it(tmp_path):
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(1024, 1536), nn.Linear(1536, 1024), nn.BatchNorm1d(1024))
    path = tmp_path / "big.pth"
    torch.save(source.state_dict(), path)  # 12 MiB
    before = set(os.listdir("/proc/self/fd"))
    _, pages = source_state(path)
    assert pages is not None and pages._fd is not None
    pages.close()
    assert set(os.listdir("/proc/self/fd")) <= before
    model = nn.Sequential(nn.Linear(1024, 1536), nn.Linear(1536, 1024), nn.BatchNorm1d(1024))
    versions = {k: v._version for k, v in model.state_dict().items()}
    threads = threading.active_count()
    assert load_partial(model, path, strict=True).ok
    assert threading.active_count() == threads  # no thread pool: the reads run in this thread
    for key, value in model.state_dict().items():
        assert torch.equal(value, source.state_dict()[key]), key
        assert value._version > versions[key], key
    assert set(os.listdir("/proc/self/fd")) <= before


def test_tied_targets_load_in_order(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

    path = tmp_path / "tied.pth"
    first, second = torch.randn(4, 4), torch.randn(4, 4)
    torch.save({"a.weight": first, "b.weight": second}, path)
    model = Tied()
    load_partial(model, path, strict=True)
    assert torch.equal(model.a.weight, second)  # the later key wins, as with copy_ in turn
