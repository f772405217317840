"""collate_detection and DetectionBatch: padding, pass-through targets, validation, workers."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from visionblocks.data.collate import DetectionBatch, collate_detection


def _reference(images: list[torch.Tensor], size_divisible: int, pad_value: float) -> torch.Tensor:
    """Naive: pad each image with F.pad to the rounded maximum, then stack."""
    step = max(size_divisible, 1)
    h = max(i.shape[1] for i in images)
    w = max(i.shape[2] for i in images)
    h, w = -(-h // step) * step, -(-w // step) * step
    padded = [
        F.pad(i.float(), (0, w - i.shape[2], 0, h - i.shape[1]), value=float(pad_value))
        for i in images
    ]
    return torch.stack(padded).to(images[0].dtype)


def _samples(sizes, dtype=torch.uint8, channels=3):
    gen = torch.Generator().manual_seed(0)
    out = []
    for n, (h, w) in enumerate(sizes):
        image = torch.randint(1, 200, (channels, h, w), generator=gen).to(dtype)
        out.append((image, {"image_id": n, "boxes": torch.zeros(0, 4)}))
    return out


@pytest.mark.parametrize("size_divisible", [0, 1, 7, 32])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float16, torch.int64])
def test_matches_naive_padding(size_divisible, dtype):
    samples = _samples([(20, 33), (41, 10), (5, 5)], dtype=dtype)
    batch = collate_detection(samples, size_divisible=size_divisible, pad_value=3)
    expected = _reference([s[0] for s in samples], size_divisible, 3)
    assert batch.images.dtype == dtype
    torch.testing.assert_close(batch.images, expected, rtol=0, atol=0)
    assert batch.image_sizes == [(20, 33), (41, 10), (5, 5)]
    assert all(type(h) is int and type(w) is int for h, w in batch.image_sizes)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=5),
    size_divisible=st.integers(0, 17),
    channels=st.integers(1, 4),
    pad_value=st.integers(0, 255),
)
def test_padding_property(sizes, size_divisible, channels, pad_value):
    samples = _samples(sizes, channels=channels)
    batch = collate_detection(samples, size_divisible=size_divisible, pad_value=pad_value)
    _, _, h, w = batch.images.shape
    step = max(size_divisible, 1)
    assert h % step == 0 and w % step == 0
    assert h - max(s[0] for s in sizes) < step and w - max(s[1] for s in sizes) < step
    expected = _reference([s[0] for s in samples], size_divisible, pad_value)
    assert torch.equal(batch.images, expected)


def test_matches_torchvision_batch_images():
    """torchvision's GeneralizedRCNNTransform.batch_images pads float images the same way."""
    images = [torch.rand(3, 37, 50), torch.rand(3, 64, 31), torch.rand(3, 10, 10)]
    rcnn = GeneralizedRCNNTransform(32, 64, [0.0] * 3, [1.0] * 3)
    expected = rcnn.batch_images(images, size_divisible=32)
    batch = collate_detection([(i, {}) for i in images], size_divisible=32)
    assert torch.equal(batch.images, expected)


def test_targets_pass_through_and_images_are_plain():
    samples = [
        (tv_tensors.Image(torch.ones(3, 8, 9, dtype=torch.uint8)), {"image_id": 1}),
        (tv_tensors.Image(torch.ones(3, 9, 8, dtype=torch.uint8)), {"image_id": 2}),
    ]
    batch = collate_detection(samples, size_divisible=4)
    assert isinstance(batch, DetectionBatch) and isinstance(batch, tuple)
    assert type(batch.images) is torch.Tensor
    assert batch.images.shape == (2, 3, 12, 12) and batch.images.is_contiguous()
    assert all(t is s[1] for t, s in zip(batch.targets, samples))
    images, targets, sizes = batch  # unpacks as a tuple
    assert sizes == [(8, 9), (9, 8)] and targets is batch.targets and images is batch.images


def test_inputs_are_not_modified():
    samples = _samples([(6, 7), (3, 9)])
    before = [s[0].clone() for s in samples]
    batch = collate_detection(samples)
    batch.images.fill_(0)  # the batch owns its memory
    assert all(torch.equal(s[0], b) for s, b in zip(samples, before))


def test_non_contiguous_and_single_image():
    image = torch.arange(2 * 5 * 6, dtype=torch.float32).reshape(2, 6, 5).transpose(1, 2)
    batch = collate_detection([(image, None)], size_divisible=1)
    assert torch.equal(batch.images[0], image)
    assert batch.targets == [None]


def test_bool_images_and_float_pad_value():
    samples = [
        (torch.ones(1, 2, 3, dtype=torch.bool), {}),
        (torch.ones(1, 3, 2, dtype=torch.bool), {}),
    ]
    batch = collate_detection(samples, size_divisible=0)
    assert batch.images.dtype == torch.bool and batch.images.sum() == 12
    batch = collate_detection(_samples([(2, 3)], dtype=torch.float32), 4, pad_value=-1.5)
    assert batch.images[0, :, 2:, :].eq(-1.5).all() and batch.images[0, :, :, 3:].eq(-1.5).all()


@pytest.mark.parametrize(
    ("batch", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "empty batch"),
        (
            [torch.zeros(3, 4, 4)],
            {},
            TypeError,
            r"batch\[0\] must be an .image, target. pair, got Tensor",
        ),
        ([(torch.zeros(3, 4, 4),)], {}, ValueError, r"batch\[0\] must be .* got 1 items"),
        ([(torch.zeros(4, 4), {})], {}, ValueError, r"shape \(C, H, W\), got \(4, 4\)"),
        ([(torch.zeros(1, 3, 4, 4), {})], {}, ValueError, r"got \(1, 3, 4, 4\)"),
        ([("img", {})], {}, TypeError, "image must be a torch.Tensor, got str"),
        (
            [(torch.zeros(3, 4, 4), {}), (torch.zeros(1, 4, 4), {})],
            {},
            ValueError,
            r"same number of channels: batch\[0\] has 3, batch\[1\] has 1",
        ),
        (
            [(torch.zeros(3, 4, 4), {}), (torch.zeros(3, 4, 4, dtype=torch.uint8), {})],
            {},
            ValueError,
            r"same dtype: batch\[0\] is torch.float32, batch\[1\] is torch.uint8",
        ),
    ],
)
def test_validation(batch, kwargs, error, match):
    with pytest.raises(error, match=match):
        collate_detection(batch, **kwargs)


@pytest.mark.parametrize("pad_value", [256, -1, 0.5])
def test_pad_value_must_fit_integer_dtype(pad_value):
    with pytest.raises(ValueError, match=r"integer in \[0, 255\] for torch.uint8"):
        collate_detection(_samples([(2, 2)]), pad_value=pad_value)


def test_images_on_different_devices_are_rejected():
    samples = [(torch.zeros(3, 2, 2), {}), (torch.zeros(3, 2, 2, device="meta"), {})]
    with pytest.raises(ValueError, match="same device"):
        collate_detection(samples)


class _Shapes(Dataset):
    def __init__(self, sizes):
        self.sizes = sizes

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        h, w = self.sizes[i]
        return torch.full((3, h, w), i + 1, dtype=torch.uint8), {"index": torch.tensor(i)}


def _collate_reporting_shared(batch):
    out = collate_detection(batch, size_divisible=8)
    return out, out.images.is_shared()


def test_dataloader_workers():
    dataset = _Shapes([(10, 12), (7, 30), (25, 5), (3, 3), (9, 9)])
    assert pickle.loads(pickle.dumps(collate_detection)) is collate_detection
    collate = functools.partial(collate_detection, size_divisible=8)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert [b.image_sizes for b in batches] == [[(10, 12), (7, 30)], [(25, 5), (3, 3)], [(9, 9)]]
    assert batches[0].images.shape == (2, 3, 16, 32)
    for b, start in zip(batches, (0, 2, 4)):
        for j, (h, w) in enumerate(b.image_sizes):
            assert b.images[j, :, :h, :w].eq(start + j + 1).all()
            assert b.images[j].sum() == (start + j + 1) * 3 * h * w
            assert b.targets[j]["index"].item() == start + j
    # In a worker the batch is allocated in shared memory directly (no extra copy to send it).
    loader = DataLoader(dataset, batch_size=2, num_workers=1, collate_fn=_collate_reporting_shared)
    assert all(shared for _, shared in loader)
    assert not collate_detection([dataset[0]]).images.is_shared()


def _target(h: int, w: int) -> dict:
    return {
        "boxes": tv_tensors.BoundingBoxes(
            torch.tensor([[1.0, 2.0, 3.0, 4.0]]), format="XYWH", canvas_size=(h, w)
        ),
        "masks": tv_tensors.Mask(torch.ones(1, h, w, dtype=torch.uint8)),
        "labels": torch.tensor([3]),
        "image_id": 11,
        "extra": ["text", (torch.ones(2), 1.5)],
    }


def test_to_moves_everything_and_keeps_tv_tensors(device):
    samples = [(torch.rand(3, 5, 6), _target(5, 6)), (torch.rand(3, 4, 8), _target(4, 8))]
    batch = collate_detection(samples, size_divisible=1)
    moved = batch.to(device)
    assert isinstance(moved, DetectionBatch) and moved.images.device.type == device.type
    assert torch.equal(moved.images.cpu(), batch.images)
    assert moved.image_sizes == batch.image_sizes
    for new, old in zip(moved.targets, batch.targets):
        assert type(new["boxes"]) is tv_tensors.BoundingBoxes
        assert new["boxes"].canvas_size == old["boxes"].canvas_size
        assert new["boxes"].format == old["boxes"].format
        assert type(new["masks"]) is tv_tensors.Mask
        assert new["boxes"].device.type == device.type and new["labels"].device.type == device.type
        assert torch.equal(new["boxes"].cpu(), old["boxes"])
        assert new["image_id"] == 11 and new["extra"][0] == "text"
        assert new["extra"][1][0].device.type == device.type and new["extra"][1][1] == 1.5
    assert moved.to(device) is moved  # already there: nothing rebuilt


def test_to_meta_rebuilds_containers_not_inputs():
    samples = [(torch.rand(3, 5, 6), _target(5, 6))]
    batch = collate_detection(samples)
    moved = batch.to("meta", non_blocking=True)
    assert moved.targets[0] is not samples[0][1]
    assert samples[0][1]["labels"].device.type == "cpu"  # the dataset's dict is untouched
    assert moved.targets[0]["masks"].device.type == "meta"
    assert moved.targets[0]["extra"][0] == "text"
