"""aspect_ratio_groups and GroupedBatchSampler, single-process and with two gloo ranks."""

from __future__ import annotations

import collections
import math
import os
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from visionblocks.data.samplers import GroupedBatchSampler, aspect_ratio_groups


class Sized:
    """Images of known (H, W) with metadata; decoding them is an error unless allowed."""

    def __init__(self, sizes, decodable=False):
        self.sizes = list(sizes)
        self.decodable = decodable

    def __len__(self):
        return len(self.sizes)

    def get_height_and_width(self, index):
        return self.sizes[index]

    def __getitem__(self, index):
        if not self.decodable:
            raise AssertionError("aspect_ratio_groups decoded an image")
        h, w = self.sizes[index]
        return torch.zeros(3, h, w, dtype=torch.uint8), {"index": index}


class NoMetadata:
    def __init__(self, sizes, pil=False):
        self.sizes, self.pil = list(sizes), pil

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, index):
        h, w = self.sizes[index]
        return (Image.new("RGB", (w, h)) if self.pil else torch.zeros(1, h, w)), {}


def _reference_groups(sizes, k):
    """torchvision detection references: np.digitize over 2 ** linspace(-1, 1, 2k + 1)."""
    bins = (2 ** np.linspace(-1, 1, 2 * k + 1)).tolist() if k > 0 else [1.0]
    ratios = [w / h for h, w in sizes]
    return np.digitize(ratios, bins).tolist()


# ------------------------------------------------------------------ aspect_ratio_groups

size = st.tuples(st.integers(1, 2000), st.integers(1, 2000))


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(size, max_size=30), k=st.integers(0, 4))
def test_groups_match_torchvision_reference(sizes, k):
    groups = aspect_ratio_groups(Sized(sizes), bins_per_octave=k)
    assert groups == _reference_groups(sizes, k)
    assert all(0 <= g <= 2 * k + 1 for g in groups)


def test_group_edges():
    # ratio exactly on an edge goes to the upper bin; k=0 splits portrait / landscape-or-square
    sizes = [(10, 10), (10, 9), (10, 5), (5, 10), (10, 4), (4, 10), (1, 100)]
    assert aspect_ratio_groups(Sized(sizes)) == [1, 0, 0, 1, 0, 1, 1]
    assert aspect_ratio_groups(Sized(sizes), 1) == [2, 1, 1, 3, 0, 3, 3]


def test_subset_and_concat_are_looked_through():
    base = Sized([(10, 20), (20, 10), (10, 10), (30, 10)])
    other = Sized([(5, 50), (50, 5)])
    nested = Subset(Subset(base, [3, 1, 0, 2]), [2, 0])  # base indices 0, 3
    assert aspect_ratio_groups(nested, 1) == [3, 0]
    mixed = ConcatDataset([base, Subset(other, [1]), other])
    assert aspect_ratio_groups(mixed, 1) == [3, 1, 2, 0, 0, 3, 0]


def test_fallback_decodes_with_a_warning():
    sizes = [(10, 20), (20, 10), (7, 7)]
    with pytest.warns(UserWarning, match="decodes every image") as record:
        assert aspect_ratio_groups(NoMetadata(sizes)) == [1, 0, 1]
    assert len(record) == 1  # one warning per call, not per image
    with pytest.warns(UserWarning, match="NoMetadata has no get_height_and_width"):
        assert aspect_ratio_groups(Subset(NoMetadata(sizes, pil=True), [1, 2])) == [0, 1]


def test_real_coco_dataset(tmp_path):
    import torchvision  # here, not at the top: the spawned ranks import this module

    from tests.data.coco_fixtures import write_dataset
    from visionblocks.data.coco import CocoInstances

    ann = write_dataset(tmp_path)
    with pytest.warns(
        UserWarning, match="dropped 1 of 9 annotation"
    ):  # the fixture's degenerate box
        ours = CocoInstances(tmp_path / "images", ann)
    theirs = torchvision.datasets.CocoDetection(str(tmp_path / "images"), str(ann))
    decoded = [(img.shape[-2], img.shape[-1]) for img, _ in ours]
    expected = _reference_groups(decoded, 0)
    assert expected == [1, 1, 1, 1, 1, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # metadata only: no decoding warning
        assert aspect_ratio_groups(ours) == expected
        assert aspect_ratio_groups(theirs) == expected  # via .coco and .ids


@pytest.mark.parametrize(
    ("dataset", "k", "error", "match"),
    [
        (Sized([(4, 4), (0, 4)]), 0, ValueError, r"image 1 must have a positive \(H, W\)"),
        (iter([]), 0, TypeError, "dataset must be a map-style dataset"),
    ],
)
def test_groups_validation(dataset, k, error, match):
    with pytest.raises(error, match=match):
        aspect_ratio_groups(dataset, k)


# ------------------------------------------------------------------ GroupedBatchSampler


class Recording:
    """Wraps a sampler and records what it yields (each pass overwrites the record)."""

    def __init__(self, sampler):
        self.sampler, self.seen = sampler, []

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        self.seen = []
        for index in self.sampler:
            self.seen.append(index)
            yield index


def _sampler(kind, n, data):
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 1000), label="seed"))
    if kind == "sequential":
        return SequentialSampler(range(n))
    if kind == "random":
        return RandomSampler(range(n), generator=gen)
    if kind == "distributed":
        replicas = data.draw(st.integers(1, 3), label="replicas")
        return DistributedSampler(
            range(n),
            num_replicas=replicas,
            rank=data.draw(st.integers(0, replicas - 1), label="rank"),
            shuffle=data.draw(st.booleans(), label="shuffle"),
            drop_last=data.draw(st.booleans(), label="dist_drop_last"),
        )
    if kind == "subset":
        return SubsetRandomSampler(data.draw(st.lists(st.integers(0, n - 1)), label="subset"), gen)
    # with replacement: the multiset changes at every pass
    num_samples = data.draw(st.integers(1, 2 * n), label="num_samples")
    return WeightedRandomSampler([1.0] * n, num_samples, generator=gen)


def check_epoch(batches, seen, group_ids, batch_size, drop_last):
    """Every invariant of one epoch of GroupedBatchSampler against the sampler's own order."""
    flat = [i for b in batches for i in b]
    assert len(batches) == (
        len(seen) // batch_size if drop_last else math.ceil(len(seen) / batch_size)
    )
    assert all(len(b) == batch_size for b in batches[:-1])
    if drop_last:
        assert not batches or len(batches[-1]) == batch_size
        assert len(seen) - len(flat) < batch_size
        assert not collections.Counter(flat) - collections.Counter(seen)  # a sub-multiset
    else:
        assert collections.Counter(flat) == collections.Counter(seen)  # each exactly once
    # Full single-group batches come first, each yielded as soon as its last index arrived...
    per_group = collections.defaultdict(list)
    for i in seen:
        per_group[group_ids[i]].append(i)
    num_full = sum(len(v) // batch_size for v in per_group.values())
    full, tail = batches[:num_full], batches[num_full:]
    assert all(len({group_ids[i] for i in b}) == 1 for b in full)
    expected_full, counts = [], collections.Counter()
    for i in seen:  # the k-th batch of group g is complete when g's k * batch_size-th index comes
        g = group_ids[i]
        counts[g] += 1
        if counts[g] % batch_size == 0:
            expected_full.append(per_group[g][counts[g] - batch_size : counts[g]])
    assert full == expected_full
    # ...then the leftovers, in group-id order, cut into batch_size chunks.
    leftovers = [
        i
        for g in sorted(per_group)
        for i in per_group[g][len(per_group[g]) // batch_size * batch_size :]
    ]
    expected_tail = [leftovers[s : s + batch_size] for s in range(0, len(leftovers), batch_size)]
    if drop_last and expected_tail and len(expected_tail[-1]) < batch_size:
        expected_tail.pop()
    assert tail == expected_tail
    assert len(tail) <= len(per_group)
    assert sum(len({group_ids[i] for i in b}) > 1 for b in tail) <= max(len(per_group) - 1, 0)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 60),
    num_groups=st.integers(1, 4),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    kind=st.sampled_from(["sequential", "random", "distributed", "subset", "weighted"]),
)
def test_len_is_exact_and_batches_regroup_the_epoch(
    data, n, num_groups, batch_size, drop_last, kind
):
    group_ids = data.draw(st.lists(st.integers(0, num_groups - 1), min_size=n, max_size=n))
    sampler = Recording(_sampler(kind, n, data))
    grouped = GroupedBatchSampler(sampler, group_ids, batch_size, drop_last)
    for epoch in range(2):
        grouped.set_epoch(epoch)
        expected_len = len(grouped)
        batches = list(grouped)
        assert len(batches) == expected_len
        assert expected_len == len(BatchSampler(sampler, batch_size, drop_last))
        check_epoch(batches, sampler.seen, group_ids, batch_size, drop_last)


def test_batches_by_hand():
    group_ids = [0, 0, 1, 0, 1, 1, 1, 0, 1, 2]
    grouped = GroupedBatchSampler(range(10), group_ids, batch_size=3)
    assert list(grouped) == [[0, 1, 3], [2, 4, 5], [7, 6, 8], [9]]  # tail: groups 0, 1, 2
    grouped = GroupedBatchSampler(range(10), group_ids, batch_size=4)
    assert list(grouped) == [[2, 4, 5, 6], [0, 1, 3, 7], [8, 9]]  # [8, 9] mixes groups 1, 2
    assert len(grouped) == 3


def test_with_dataloader_and_collate():
    from visionblocks.data.collate import collate_detection

    sizes = [(20, 30), (30, 20), (25, 40), (40, 22), (10, 50), (31, 30), (12, 13)]
    dataset = Sized(sizes, decodable=True)
    groups = aspect_ratio_groups(dataset)
    grouped = GroupedBatchSampler(RandomSampler(dataset), groups, batch_size=2)
    loader = DataLoader(dataset, batch_sampler=grouped, collate_fn=collate_detection)
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    seen = sorted(t["index"] for b in batches for t in b.targets)
    assert seen == list(range(7))
    for b in batches[:3]:  # 7 images, 5 landscape and 2 portrait: three full batches
        assert len({groups[t["index"]] for t in b.targets}) == 1


def test_set_epoch_forwarding():
    inner = DistributedSampler(range(40), num_replicas=2, rank=1, shuffle=True, seed=3)
    grouped = GroupedBatchSampler(inner, [i % 3 for i in range(40)], batch_size=4)
    first = list(grouped)
    assert list(grouped) == first  # same epoch, same order
    grouped.set_epoch(1)
    assert inner.epoch == 1 and list(grouped) != first
    plain = GroupedBatchSampler(SequentialSampler(range(4)), [0] * 4, 2)
    plain.set_epoch(5)  # no set_epoch on the inner sampler: nothing happens
    assert list(plain) == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="epoch must be int"):
        grouped.set_epoch(1.0)


def test_group_ids_as_tensor():
    grouped = GroupedBatchSampler(range(4), torch.tensor([1, 0, 1, 0]), 2)
    assert list(grouped) == [[0, 2], [1, 3]] and grouped.group_ids == [1, 0, 1, 0]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((range(3), [0, 0, 0], 0), ValueError, "batch_size must be an int >= 1, got 0"),
        (
            (iter(range(3)), [0, 0, 0], 2),
            TypeError,
            "sampler must be an iterable of indices with len",
        ),
        ((range(3), [0, 1.0, 0], 2), TypeError, r"group_ids\[1\] must be an int, got float"),
        ((range(3), torch.zeros(3), 2), ValueError, "1-D integer tensor, got torch.float32"),
        (
            (RandomSampler(range(5)), [0, 0, 0], 2),
            ValueError,
            "sampler's dataset has 5 items, group_ids has 3",
        ),
        (
            (DistributedSampler(range(5), 2, 0), [0] * 6, 2),
            ValueError,
            "sampler's dataset has 5 items, group_ids has 6",
        ),
    ],
)
def test_sampler_validation(args, error, match):
    with pytest.raises(error, match=match):
        GroupedBatchSampler(*args)


def test_index_outside_group_ids():
    grouped = GroupedBatchSampler([0, 1, 5], [0, 0, 0], 2)
    with pytest.raises(ValueError, match="yielded index 5, outside group_ids .length 3."):
        list(grouped)


# ------------------------------------------------------------------ two gloo ranks

N, BATCH, SEED = 45, 4, 17
SIZES = [((10, 30) if i % 3 == 0 else (30, 10) if i % 3 == 1 else (20, 20)) for i in range(N)]


def _rank_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        dataset = Sized(SIZES)
        sampler = DistributedSampler(dataset, shuffle=True, seed=SEED)  # rank/world from gloo
        grouped = GroupedBatchSampler(sampler, aspect_ratio_groups(dataset, 1), BATCH)
        epochs = {}
        for epoch in (0, 1):
            grouped.set_epoch(epoch)
            batches = list(grouped)
            # as DDP would: every rank must agree on the number of steps
            count = torch.tensor([len(batches)])
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            epochs[epoch] = {"batches": batches, "len": len(grouped), "max": int(count)}
        torch.save(epochs, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks(tmp_path):
    mp.spawn(_rank_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    groups = aspect_ratio_groups(Sized(SIZES), 1)
    assert sorted(set(groups)) == [0, 2, 3]
    for epoch in (0, 1):
        per_rank = [results[r][epoch]["batches"] for r in range(2)]
        flat = [[i for b in batches for i in b] for batches in per_rank]
        # the oracle: DistributedSampler's own split (23 indices each, one index padded)
        expected = []
        for r in range(2):
            oracle = DistributedSampler(range(N), num_replicas=2, rank=r, shuffle=True, seed=SEED)
            oracle.set_epoch(epoch)
            expected.append(list(oracle))
            assert collections.Counter(flat[r]) == collections.Counter(expected[r])
            check_epoch(per_rank[r], expected[r], groups, BATCH, drop_last=False)
        assert set(flat[0]) | set(flat[1]) == set(range(N))
        assert len(flat[0]) + len(flat[1]) == N + 1  # DistributedSampler pads 45 to 46
        assert len(set(flat[0]) & set(flat[1])) == 1
        # same number of batches on both ranks, equal to len(), as DDP needs
        assert [len(b) for b in per_rank] == [results[r][epoch]["len"] for r in range(2)] == [6, 6]
        assert results[0][epoch]["max"] == 6
        for batches in per_rank:
            mixed = [b for b in batches if len({groups[i] for i in b}) > 1]
            assert len(mixed) <= 2 and all(b in batches[-3:] for b in mixed)
    assert results[0][0]["batches"] != results[0][1]["batches"]  # set_epoch reshuffled
