"""seed_everything, seed_worker, loader_generator: runs repeat, workers and ranks differ."""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from visionblocks.training import loader_generator, seed_everything, seed_worker


@pytest.fixture
def restore_determinism(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:]


def _draw() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_every_generator_repeats(restore_determinism):
    assert seed_everything(123) == 123
    first = _draw()
    seed_everything(123)
    second = _draw()
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])
    seed_everything(124)
    third = _draw()
    assert third[0] != first[0] and third[1] != first[1] and not torch.equal(third[2], first[2])


def test_pythonhashseed_is_set_for_children_and_kept(restore_determinism, monkeypatch):
    seed_everything(5)
    assert os.environ["PYTHONHASHSEED"] == "5"
    monkeypatch.setenv("PYTHONHASHSEED", "77")
    seed_everything(6)
    assert os.environ["PYTHONHASHSEED"] == "77"


def test_deterministic_sets_the_flags(restore_determinism):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    seed_everything(0)  # deterministic=False leaves the flags alone
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    seed_everything(0, deterministic=True, warn_only=True)
    assert torch.is_deterministic_algorithms_warn_only_enabled()


def test_deterministic_keeps_a_cublas_setting_and_warns_when_too_late(
    restore_determinism, monkeypatch
):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seed_everything(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.warns(RuntimeWarning, match="after CUDA started"):
        seed_everything(0, deterministic=True)


def test_a_seed_beyond_32_bits_is_refused(restore_determinism):
    with pytest.raises(ValueError, match="seed"):
        seed_everything(2**32)


class _Augmented(Dataset):
    """Each item draws from the three generators, as augmentations do."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        return torch.tensor(
            [index, info.id, random.random(), float(np.random.rand()), float(torch.rand(()))],
            dtype=torch.float64,
        )


def _epochs(seed: int, epochs: int = 2) -> list[torch.Tensor]:
    loader = DataLoader(
        _Augmented(), batch_size=2, shuffle=True, num_workers=2, worker_init_fn=seed_worker,
        generator=loader_generator(seed), persistent_workers=False,
    )  # fmt: skip
    return [torch.cat(list(loader)) for _ in range(epochs)]


def test_loader_runs_repeat_and_workers_differ():
    a, b = _epochs(0), _epochs(0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    first = a[0]
    assert not torch.equal(first[:, 0], torch.arange(8.0))  # shuffled
    by_worker = [first[first[:, 1] == w][:, 2:] for w in (0, 1)]
    for column in range(3):  # random, numpy, torch: each differs between the workers
        assert not torch.equal(by_worker[0][:, column], by_worker[1][:, column])
    assert not torch.equal(a[0][:, 2:], a[1][:, 2:])  # and between epochs
    other = _epochs(1, epochs=1)[0]
    assert not torch.equal(other[:, 2:], first[:, 2:])


def test_seed_worker_derives_from_the_torch_seed():
    torch.manual_seed(99)
    seed_worker(0)
    a = random.random(), float(np.random.rand())
    torch.manual_seed(99)
    seed_worker(1)  # the worker id is already in the torch seed
    assert (random.random(), float(np.random.rand())) == a


def test_loader_generator_ranks(monkeypatch):
    draw = lambda g: torch.randperm(100, generator=g)  # noqa: E731
    assert torch.equal(draw(loader_generator(4)), draw(loader_generator(4, rank=0)))
    assert not torch.equal(draw(loader_generator(4, rank=0)), draw(loader_generator(4, rank=1)))
    assert torch.equal(draw(loader_generator(4, rank=1)), draw(loader_generator(4, rank=1)))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    assert torch.equal(draw(loader_generator(4)), draw(loader_generator(4, rank=1)))
