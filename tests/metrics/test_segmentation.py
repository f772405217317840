"""`SegmentationMetrics` against torchmetrics 1.9, streaming, errors, compile and DDP."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._subclasses.fake_tensor import FakeTensorMode

import visionblocks
from visionblocks.metrics import SegmentationMetrics

tm = pytest.importorskip("torchmetrics")
from torchmetrics.classification import (  # noqa: E402
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassJaccardIndex,
)


def _batches(k: int, n: int = 3, seed: int = 0, ignore: int | None = None, absent: int = 0):
    """``n`` batches of logits and targets; the last ``absent`` classes occur nowhere and,
    with ``ignore``, a fifth of the target pixels are ``ignore``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        logits = torch.randn(2, k, 9, 7, generator=g)
        logits[:, k - absent :] = -100.0
        target = torch.randint(0, k - absent, (2, 9, 7), generator=g)
        if ignore is not None:
            target[torch.rand(2, 9, 7, generator=g) < 0.2] = ignore
        out.append((logits, target))
    return out


def _torchmetrics(k: int, ignore: int | None, batches) -> dict[str, torch.Tensor]:
    kw = {"num_classes": k, "ignore_index": ignore}
    metrics = {
        "iou": MulticlassJaccardIndex(average=None, **kw),
        "miou": MulticlassJaccardIndex(average="macro", **kw),
        "f1": MulticlassF1Score(average=None, **kw),
        "mean_f1": MulticlassF1Score(average="macro", **kw),
        "accuracy": MulticlassAccuracy(average="micro", **kw),
        "confusion": MulticlassConfusionMatrix(**kw),
    }
    for logits, target in batches:
        for m in metrics.values():
            m.update(logits, target)
    return {name: m.compute() for name, m in metrics.items()}


@pytest.mark.parametrize("ignore", [None, 255, -1, 2])
@pytest.mark.parametrize("absent", [0, 2])
@pytest.mark.parametrize("logits", [True, False])
def test_equals_torchmetrics(ignore, absent, logits):
    k = 6
    batches = _batches(k, ignore=ignore, absent=absent)
    ours = SegmentationMetrics(k, ignore_index=ignore)
    for scores, target in batches:
        ours.update(scores if logits else scores.argmax(1), target)
    got, want = ours.compute(), _torchmetrics(k, ignore, batches)
    assert got.keys() == want.keys()
    for name in ("iou", "miou", "f1", "accuracy", "confusion"):
        torch.testing.assert_close(got[name], want[name], msg=name)
    if ignore != 2:  # see test_in_range_ignore_index_is_left_out_of_mean_f1
        torch.testing.assert_close(got["mean_f1"], want["mean_f1"])
    assert got["confusion"].dtype == torch.int64 and got["iou"].dtype == torch.float32


def test_in_range_ignore_index_is_left_out_of_mean_f1():
    """torchmetrics' macro F1 counts a predicted in-range ignore_index class as an F1 of 0
    (its macro Jaccard leaves it out); ours leaves it out of both means."""
    k, ignore = 4, 0
    target = torch.tensor([[0, 1, 1, 2, 3, 3]])
    preds = torch.tensor([[1, 1, 0, 2, 3, 2]])  # class 0 predicted on a counted pixel
    ours = SegmentationMetrics(k, ignore_index=ignore)
    ours.update(preds, target)
    got = ours.compute()
    f1 = torch.tensor([0.0, 2 / 3, 2 / 3, 2 / 3])
    torch.testing.assert_close(got["f1"], f1)
    torch.testing.assert_close(got["mean_f1"], f1[1:].mean())
    theirs = MulticlassF1Score(k, average="macro", ignore_index=ignore)(preds, target)
    torch.testing.assert_close(theirs, f1.mean())  # the ignored class counted, as 0
    jaccard = MulticlassJaccardIndex(k, average="macro", ignore_index=ignore)(preds, target)
    torch.testing.assert_close(got["miou"], jaccard)


def test_absent_classes_and_empty_state():
    metric = SegmentationMetrics(4)
    out = metric.compute()
    assert out["miou"].isnan() and out["mean_f1"].isnan() and out["accuracy"].isnan()
    assert out["confusion"].equal(torch.zeros(4, 4, dtype=torch.int64))
    metric.update(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]))
    out = metric.compute()
    torch.testing.assert_close(out["iou"], torch.tensor([0.5, 0.5, 0.0, 0.0]))
    torch.testing.assert_close(out["miou"], torch.tensor(0.5))  # classes 2, 3 left out
    torch.testing.assert_close(out["f1"], torch.tensor([2 / 3, 2 / 3, 0.0, 0.0]))
    torch.testing.assert_close(out["accuracy"], torch.tensor(2 / 3))


def test_streaming_equals_one_batch_and_reset():
    batches = _batches(5, n=4, ignore=255)
    streamed, whole = SegmentationMetrics(5, 255), SegmentationMetrics(5, 255)
    for logits, target in batches:
        streamed.update(logits, target)
    whole.update(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))
    assert streamed.confusion.equal(whole.confusion)
    assert int(streamed.confusion.sum()) == int(sum((b[1] != 255).sum() for b in batches))
    first = streamed.compute()
    assert streamed.compute()["confusion"].equal(first["confusion"])  # compute changes nothing
    streamed.reset()
    assert streamed.confusion.sum() == 0
    streamed.update(*batches[0])
    assert streamed.confusion.sum() > 0


def test_uint8_targets_other_layouts_and_empty_batches():
    target = torch.tensor([[0, 1, 255], [2, 2, 1]], dtype=torch.uint8)
    preds = torch.tensor([[0, 2, 1], [2, 1, 1]], dtype=torch.int32)
    metric = SegmentationMetrics(3, ignore_index=255)
    metric.update(preds, target)
    metric.update(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, dtype=torch.uint8))
    want = torch.tensor([[1, 0, 0], [0, 1, 1], [0, 1, 1]])
    assert metric.confusion.equal(want)
    scores = torch.nn.functional.one_hot(preds.long(), 3).permute(0, 2, 1).double()  # (B, K, N)
    metric.reset()
    metric.update(scores, target)
    assert metric.confusion.equal(want)
    many = SegmentationMetrics(150, ignore_index=255)  # target * K overflows uint8: not here
    many.update(torch.tensor([3, 100, 7]), torch.tensor([149, 100, 255], dtype=torch.uint8))
    assert many.confusion[149, 3] == 1 and many.confusion[100, 100] == 1
    assert many.confusion.sum() == 2


def test_bad_input_is_refused_with_a_clear_error():
    metric = SegmentationMetrics(3, ignore_index=255)
    target = torch.tensor([[0, 1, 2]])
    with pytest.raises(
        ValueError, match=r"preds must hold class indices in \[0, 2\], got .*\[0, 3\]"
    ):
        metric.update(torch.tensor([[0, 3, 1]]), target)
    with pytest.raises(ValueError, match=r"target must .*ignore_index=255\), got .*\[-1, 2\]"):
        metric.update(target, torch.tensor([[0, -1, 2]]))
    with pytest.raises(ValueError, match="shape"):
        metric.update(torch.randn(1, 4, 3), target)  # K = 4 scores for 3 classes
    with pytest.raises(TypeError, match="target must be an integer tensor"):
        metric.update(target, target.float())
    with pytest.raises(ValueError, match="num_classes"):
        SegmentationMetrics(0)
    with pytest.raises(TypeError, match="ignore_index"):
        SegmentationMetrics(3, ignore_index=2.0)
    assert metric.confusion.sum() == 0  # nothing was counted


def test_update_compiles_fullgraph_and_compute_follows():
    metric, eager = SegmentationMetrics(5, ignore_index=255), SegmentationMetrics(5, 255)

    @torch.compile(fullgraph=True, dynamic=True, backend="aot_eager")
    def step(logits, target):
        metric.update(logits, target)
        return metric.compute()

    torch._dynamo.reset()
    for logits, target in _batches(5, ignore=255):
        got = step(logits, target)
        eager.update(logits, target)
    want = eager.compute()
    for name in want:
        torch.testing.assert_close(got[name], want[name], equal_nan=True)


def test_runs_on_fake_cuda_without_host_reads(monkeypatch):
    asserted = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: asserted.append(msg))
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        cuda = torch.device("cuda")
        metric = SegmentationMetrics(4, ignore_index=255)  # state on the CPU, moved
        metric.update(
            torch.randn(2, 4, 8, 8, device=cuda), torch.zeros(2, 8, 8, device=cuda).long()
        )
        metric.update(
            torch.zeros(2, 8, 8, device=cuda).long(), torch.zeros(2, 8, 8, device=cuda).long()
        )
        out = metric.compute()
    assert all(v.device.type == "cuda" for v in out.values())
    assert asserted == [
        "target must hold class indices in [0, 3] (or ignore_index=255)",
        "preds must hold class indices in [0, 3]",
        "target must hold class indices in [0, 3] (or ignore_index=255)",
    ]


# --------------------------------------------------------------------------- distributed
def _worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        metric = SegmentationMetrics(6, ignore_index=255)
        for i, (logits, target) in enumerate(_batches(6, n=4, ignore=255, absent=1)):
            if i % world_size == rank:
                metric.update(logits, target)
        local = metric.confusion.clone()
        torch.save({"out": metric.compute(), "local": local}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_compute_reduces_over_two_gloo_processes(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"{rank}.pt") for rank in range(2)]
    single = SegmentationMetrics(6, ignore_index=255)
    for logits, target in _batches(6, n=4, ignore=255, absent=1):
        single.update(logits, target)
    want = single.compute()
    assert not results[0]["local"].equal(want["confusion"])  # each rank saw half the batches
    assert results[0]["local"].add(results[1]["local"]).equal(want["confusion"])
    for res in results:
        for name in want:
            torch.testing.assert_close(res["out"][name], want[name], equal_nan=True)
