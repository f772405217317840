"""FilePages.read_into: load_partial reads tensors from the file straight into the model."""

from __future__ import annotations

import itertools
import os
import sys
import zipfile

import pytest
import torch
from torch import nn

from tests.helpers import resident_file_kib
from visionblocks.weights import load_partial, read_state_dict
from visionblocks.weights._pages import FilePages

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs / preadv")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fp16 = nn.Parameter(torch.zeros(5, 7, dtype=torch.float16))
        self.brain = nn.Parameter(torch.zeros(3, 4, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.zeros(6, dtype=torch.int64))
        self.register_buffer("empty", torch.zeros(0))


def _checkpoint() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in _Net().state_dict().items()}
    state["steps"] = torch.arange(6) * 1000003
    state["bn.num_batches_tracked"] = torch.tensor(9)
    return state


def test_loading_a_file_gives_the_bytes_of_the_file_for_every_dtype(tmp_path):
    state = _checkpoint()
    path = tmp_path / "net.pth"
    torch.save(state, path)
    model = _Net()
    versions = {k: v._version for k, v in model.state_dict().items()}
    report = load_partial(model, path, strict=True)
    assert report.ok
    for key, value in model.state_dict().items():
        assert value.dtype == state[key].dtype and torch.equal(value, state[key]), key
        if value.numel():
            assert value._version > versions[key], key  # as copy_ would


def test_views_non_contiguous_and_converted_tensors_load_as_with_copy(tmp_path):
    torch.manual_seed(1)
    base = torch.randn(8, 3, 3, 3)
    state = dict(_Net().state_dict())
    state["conv.weight"] = base.transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous
    shared = torch.randn(20)
    state["bn.weight"], state["bn.bias"] = shared[:8], shared[10:18]  # views of one storage
    state["fp16"] = torch.randn(5, 7, dtype=torch.float64)  # converted on copy
    path = tmp_path / "views.pth"
    torch.save(state, path)
    model = _Net()
    load_partial(model, path, strict=True)
    expected = _Net()
    expected.load_state_dict(torch.load(path))
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected.state_dict()[key]), key


@linux
def test_read_tensors_never_fault_the_mapping_in(tmp_path):
    model = nn.Linear(1024, 1024)  # 4 MiB of weights
    path = tmp_path / "big.pt"
    torch.save(nn.Linear(1024, 1024).state_dict(), path)
    state = read_state_dict(path)
    pages = FilePages(path)
    try:
        with torch.no_grad():
            assert pages.read_into(model.weight, state["weight"])
        assert resident_file_kib(path) < 64
        assert torch.equal(model.weight, torch.load(path)["weight"])
        assert not pages.read_into(model.weight, state["weight"].double())  # not in the file
        assert not pages.read_into(model.bias, state["weight"][:2])  # another shape
    finally:
        pages.close()


@linux
def test_a_file_of_the_other_byte_order_is_not_read_raw(tmp_path):
    path = tmp_path / "big_endian.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/byteorder", "big")
        archive.writestr("archive/data/0", b"\0" * 4096)
    mapped = torch.UntypedStorage.from_file(str(path), False, os.path.getsize(path))
    value = torch.empty(0).set_(mapped, 64, (4,), (1,))
    pages = FilePages(path)
    try:
        assert not pages.read_into(torch.empty(4, dtype=torch.uint8), value)
    finally:
        pages.close()


def test_inference_tensors_still_refuse_the_load(tmp_path):
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "lin.pt")
    with torch.inference_mode():
        model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="[Ii]nference"):
        load_partial(model, tmp_path / "lin.pt")


@linux
def test_a_file_replaced_after_reading_is_not_read_again(tmp_path):
    path = tmp_path / "swap.pt"
    torch.save(nn.Linear(64, 64).state_dict(), path)
    original = torch.load(path)
    state = read_state_dict(path)  # mapped
    replacement = tmp_path / "new.pt"
    torch.save(nn.Linear(64, 64).state_dict(), replacement)
    os.replace(replacement, path)  # another file under the name: the mapping keeps the old
    pages = FilePages(path)
    model = nn.Linear(64, 64)
    try:
        assert not pages.read_into(model.weight, state["weight"])
    finally:
        pages.close()
    with torch.no_grad():
        model.weight.copy_(state["weight"])
    assert torch.equal(model.weight, original["weight"])


@linux
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_large_tensor_is_read_in_parts_by_the_intra_op_threads(tmp_path, monkeypatch, threads):
    from visionblocks.weights import _pages

    model = nn.Linear(2048, 1541)  # 12.0 MiB of weights, not a whole number of pages
    path = tmp_path / "large.pt"
    torch.manual_seed(0)
    torch.save(nn.Linear(2048, 1541).state_dict(), path)
    parts: list[tuple[int, int]] = []
    read_part = _pages.FilePages._read_part

    def record(self, address, nbytes, offset):
        parts.append((offset, nbytes))
        read_part(self, address, nbytes, offset)

    monkeypatch.setattr(_pages.FilePages, "_read_part", record)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        load_partial(model, path, strict=True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(model.weight, torch.load(path)["weight"])
    big = sorted(p for p in parts if p[1] > 8192)  # the weight's parts, not the bias
    nbytes = model.weight.numel() * 4
    assert len(big) == threads and sum(n for _, n in big) == nbytes
    assert all(b[0] == a[0] + a[1] for a, b in itertools.pairwise(big))  # contiguous, in order


@linux
@pytest.mark.parametrize("failing", ["first", "second"])  # the caller's part, a reader's part
def test_a_failed_part_fails_the_load(tmp_path, monkeypatch, failing):
    from visionblocks.weights import _pages

    path = tmp_path / "large.pt"
    torch.save(nn.Linear(2048, 1024).state_dict(), path)  # 8 MiB: two parts on 2 threads
    read_part = _pages.FilePages._read_part

    def fail_one(self, address, nbytes, offset):
        if nbytes > 8192 and (offset > 1 << 20) == (failing == "second"):
            raise OSError("disk gone")
        read_part(self, address, nbytes, offset)

    monkeypatch.setattr(_pages.FilePages, "_read_part", fail_one)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(OSError, match="disk gone"):
            load_partial(nn.Linear(2048, 1024), path, strict=True)
    finally:
        torch.set_num_threads(before)
