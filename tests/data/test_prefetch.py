"""prefetch_to_device and move_to_device: pass-through on CPU, side-stream copies on CUDA."""

from __future__ import annotations

import collections
from typing import NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import tv_tensors

from visionblocks.data.collate import DetectionBatch, collate_detection
from visionblocks.data.prefetch import DevicePrefetcher, move_to_device, prefetch_to_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


class Pair(NamedTuple):
    left: torch.Tensor
    right: list


def _nested(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "image": tv_tensors.Image(torch.randint(0, 255, (3, 4, 5), generator=gen)),
        "boxes": tv_tensors.BoundingBoxes(
            torch.rand(2, 4, generator=gen), format="CXCYWH", canvas_size=(4, 5)
        ),
        "pair": Pair(torch.rand(3, generator=gen), [torch.arange(seed + 1), "name", 3]),
        "ordered": collections.OrderedDict(a=torch.ones(2), b=None),
        "tuple": (torch.zeros(1), 2.5, b"raw"),
        "id": seed,
    }


def _assert_moved(moved, original, device):
    """Same structure and values; every tensor on ``device``; tv_tensors and metadata kept."""
    if isinstance(original, torch.Tensor):
        assert type(moved) is type(original)
        assert moved.device.type == device.type
        if device.type != "meta":
            assert torch.equal(
                moved.as_subclass(torch.Tensor).cpu(), original.as_subclass(torch.Tensor)
            )
        if isinstance(original, tv_tensors.BoundingBoxes):
            assert moved.canvas_size == original.canvas_size and moved.format == original.format
    elif isinstance(original, dict):
        assert type(moved) is type(original) and list(moved) == list(original)
        for key in original:
            _assert_moved(moved[key], original[key], device)
    elif isinstance(original, (list, tuple)):
        assert type(moved) is type(original) and len(moved) == len(original)
        for a, b in zip(moved, original):
            _assert_moved(a, b, device)
    else:
        assert moved == original


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_move_to_device_nested(device):
    batch = _nested()
    moved = move_to_device(batch, device)
    _assert_moved(moved, batch, torch.device(device))
    assert batch["pair"].left.device.type == "cpu"  # the input is untouched
    assert moved["pair"].right[1] == "name" and moved["ordered"]["b"] is None


def test_move_to_device_keeps_what_did_not_move():
    cpu = torch.ones(2)
    batch = {"a": [cpu, "x"], "b": (torch.ones(1, device="meta"), 1)}
    moved = move_to_device(batch, "meta")
    assert moved["b"] is batch["b"] and moved["b"][0] is batch["b"][0]  # already on meta
    assert moved["a"] is not batch["a"] and moved["a"][1] == "x"
    assert move_to_device(batch["a"], "cpu") is batch["a"]
    assert move_to_device(cpu, "cpu") is cpu
    assert move_to_device("text", "meta") == "text"


def test_cpu_pass_through_is_identity():
    batches = [_nested(i) for i in range(4)]
    prefetcher = prefetch_to_device(batches, "cpu")
    assert isinstance(prefetcher, DevicePrefetcher) and len(prefetcher) == 4
    for _ in range(2):  # re-iterable: each pass iterates the loader again
        out = list(prefetcher)
        assert len(out) == 4 and all(a is b for a, b in zip(out, batches))


def test_pass_through_with_dataloader_and_detection_batches():
    samples = [(torch.rand(3, 6 + i, 9 - i), {"boxes": torch.rand(i, 4)}) for i in range(5)]
    loader = DataLoader(samples, batch_size=2, collate_fn=collate_detection)
    prefetcher = prefetch_to_device(loader, torch.device("cpu"))
    assert len(prefetcher) == len(loader) == 3
    out = list(prefetcher)
    assert all(isinstance(b, DetectionBatch) for b in out)
    assert [b.image_sizes for b in out] == [[(6, 9), (7, 8)], [(8, 7), (9, 6)], [(10, 5)]]


def test_non_cuda_device_moves_synchronously():
    batches = [(torch.ones(2), {"x": torch.zeros(1)})]
    out = list(prefetch_to_device(batches, "meta"))
    assert out[0][0].device.type == "meta" and out[0][1]["x"].device.type == "meta"


def test_len_needs_a_sized_loader():
    prefetcher = prefetch_to_device((torch.ones(1) for _ in range(3)), "cpu")
    with pytest.raises(TypeError, match="the wrapped generator has no len"):
        len(prefetcher)
    assert len(list(prefetcher)) == 3  # list() does not need len()


def test_loader_errors_surface_in_order():
    def batches():
        yield torch.ones(1)
        raise OSError("corrupt image")

    iterator = iter(prefetch_to_device(batches(), "cpu"))
    assert torch.equal(next(iterator), torch.ones(1))
    with pytest.raises(OSError, match="corrupt image"):
        next(iterator)


def test_cuda_unavailable_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        RuntimeError, match="device='cuda:0' asks for CUDA, but CUDA is not available"
    ):
        prefetch_to_device([], "cuda:0")
    with pytest.raises(RuntimeError, match="device='cuda' asks for CUDA"):
        prefetch_to_device([], torch.device("cuda"))


@needs_cuda
def test_cuda_index_out_of_range():
    with pytest.raises(RuntimeError, match="CUDA device.s. are visible"):
        prefetch_to_device([], f"cuda:{torch.cuda.device_count()}")


def test_values_arrive_in_order(device):
    batches = [_nested(i) for i in range(6)]
    out = list(prefetch_to_device(batches, device))
    assert len(out) == 6
    for moved, original in zip(out, batches):
        _assert_moved(moved, original, device)
        assert moved["id"] == original["id"]


@needs_cuda
@pytest.mark.parametrize("pin_memory", [False, True])
@pytest.mark.parametrize("non_blocking", [True, False])
def test_cuda_copies_under_load(pin_memory, non_blocking):
    """Many batches, slow kernels on the consumer stream, memory freed at once: the values
    must still be right (a missing wait_stream or record_stream shows up as wrong sums)."""
    data = [torch.full((256, 1024), float(i)) + torch.rand(256, 1024) for i in range(24)]
    loader = DataLoader(data, batch_size=2, pin_memory=pin_memory)
    expected = [b.double().sum().item() for b in DataLoader(data, batch_size=2)]
    weight = torch.randn(1024, 1024, device="cuda") / 32
    sums = []
    for batch in prefetch_to_device(loader, "cuda", non_blocking=non_blocking):
        assert batch.is_cuda
        x = batch
        for _ in range(20):  # keep the stream busy while the next copy is in flight
            x = x @ weight
        sums.append(batch.double().sum())
        del batch, x
    got = [s.item() for s in sums]
    assert got == pytest.approx(expected, rel=1e-6)


@needs_cuda
def test_cuda_on_a_non_default_consumer_stream():
    data = [torch.arange(1000.0) + i for i in range(10)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = [b.sum().item() for b in prefetch_to_device(data, "cuda")]
    assert out == [sum(range(1000)) + 1000.0 * i for i in range(10)]


@needs_cuda
def test_cuda_keeps_batches_already_on_the_device():
    batches = [{"x": torch.ones(3, device="cuda")}, (torch.zeros(2, device="cuda"),)]
    out = list(prefetch_to_device(batches, "cuda"))
    assert all(a is b for a, b in zip(out, batches))


@needs_cuda
def test_cuda_detection_batches_and_loader_errors():
    samples = [
        (
            torch.rand(3, 6 + i, 9 - i),
            {
                "boxes": tv_tensors.BoundingBoxes(
                    torch.rand(i, 4), format="XYXY", canvas_size=(6 + i, 9 - i)
                )
            },
        )
        for i in range(5)
    ]
    loader = DataLoader(samples, batch_size=2, collate_fn=collate_detection)
    out = list(prefetch_to_device(loader, "cuda"))
    assert all(b.images.is_cuda and isinstance(b, DetectionBatch) for b in out)
    assert out[2].targets[0]["boxes"].canvas_size == (10, 5)
    assert type(out[2].targets[0]["boxes"]) is tv_tensors.BoundingBoxes

    def failing():
        yield torch.ones(1)
        yield torch.ones(2)
        raise OSError("corrupt image")

    iterator = iter(prefetch_to_device(failing(), "cuda"))
    assert next(iterator).shape == (1,)  # fetching batch 2 ahead did not fail yet
    assert next(iterator).shape == (2,)  # the error comes after batch 2 was delivered
    with pytest.raises(OSError, match="corrupt image"):
        next(iterator)
