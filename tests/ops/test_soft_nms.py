"""`soft_nms` and `batched_soft_nms` against a float64 reference of the original algorithm.

The reference re-expresses ``cpu_soft_nms`` of the authors' code (bharatsingh430/soft-nms,
``lib/nms/cpu_nms.pyx``) as plain Python on float64 numbers: pick the box of highest current
score, weigh every other remaining box by its IoU with it (linear ``1 - o`` above ``Nt``,
Gaussian ``exp(-o**2 / sigma)``), drop those below the threshold. Changes, as documented in
`visionblocks.ops.soft_nms`: continuous coordinates (no ``+ 1``), ties to the earlier box in
(score, index) order, the first box also dropped when below the threshold.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from visionblocks.ops import batched_soft_nms, soft_nms

S = importlib.import_module("visionblocks.ops.soft_nms")  # the name is the function's


def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def reference(boxes, scores, idxs=None, nt=0.3, sigma=0.5, threshold=0.001, method="linear"):
    """The original greedy loop in float64: kept indices and their scores, best first."""
    boxes, scores = boxes.double().tolist(), scores.double().tolist()
    cats = idxs.tolist() if idxs is not None else [0] * len(scores)
    rank = sorted(range(len(scores)), key=lambda i: (-scores[i], i))  # tie order
    place = {i: r for r, i in enumerate(rank)}
    live = {i: scores[i] for i in rank if scores[i] >= threshold and math.isfinite(scores[i])}
    keep, kept = [], []
    while live:
        best = min(live, key=lambda i: (-live[i], place[i]))
        keep.append(best)
        kept.append(live.pop(best))
        for i in list(live):
            if cats[i] != cats[best]:
                continue
            o = _iou(boxes[best], boxes[i])
            live[i] *= (
                (1 - o if o > nt else 1.0) if method == "linear" else math.exp(-o * o / sigma)
            )
            if live[i] < threshold:
                del live[i]
    return keep, kept


def clustered(n: int, seed: int, objects: int = 6):
    """``n`` detections around a few objects: chains of overlaps, as a detector gives."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(objects, 2, generator=g) * 100
    sizes = torch.rand(objects, 2, generator=g) * 30 + 10
    which = torch.randint(0, objects, (n,), generator=g)
    c = centres[which] + torch.randn(n, 2, generator=g) * sizes[which] * 0.15
    wh = sizes[which] * (1 + 0.2 * torch.randn(n, 2, generator=g)).clamp(0.5, 1.5)
    boxes = torch.cat((c - wh / 2, c + wh / 2), 1)
    return boxes, torch.rand(n, generator=g), torch.randint(0, 3, (n,), generator=g)


def assert_matches(got, want):
    keep, scores = got
    assert keep.dtype == torch.int64 and keep.tolist() == want[0]
    torch.testing.assert_close(
        scores.double(), torch.tensor(want[1], dtype=torch.float64), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("method", ["linear", "gaussian"])
@pytest.mark.parametrize(
    "params",
    [{}, {"iou_threshold": 0.5, "sigma": 0.3, "score_threshold": 0.05}, {"iou_threshold": 0.0, "sigma": 2.0, "score_threshold": 1e-6}],
)  # fmt: skip
def test_equals_the_float64_reference(method, params):
    ref = {"nt": params.get("iou_threshold", 0.3), "sigma": params.get("sigma", 0.5)}
    ref["threshold"] = params.get("score_threshold", 0.001)
    for seed, (n, objects) in enumerate(((0, 1), (1, 1), (5, 1), (60, 1), (150, 4), (400, 12))):
        boxes, scores, idxs = clustered(n, seed, objects)
        want = reference(boxes, scores, method=method, **ref)
        assert_matches(soft_nms(boxes, scores, method=method, **params), want)
        want = reference(boxes, scores, idxs, method=method, **ref)
        assert_matches(batched_soft_nms(boxes, scores, idxs, method=method, **params), want)


def test_float64_inputs_and_ties():
    boxes, scores, _ = clustered(200, 7, 3)
    scores = (scores * 4).round() / 4  # many equal scores
    for method in ("linear", "gaussian"):
        keep, new = soft_nms(boxes.double(), scores.double(), method=method)
        assert new.dtype == torch.float64
        assert_matches((keep, new), reference(boxes, scores, method=method))


@pytest.mark.parametrize("method", ["linear", "gaussian"])
def test_rows_in_small_blocks_and_the_tensor_loop(monkeypatch, method):
    """Every block size, with the host arrays compacted as boxes drop (many in a cluster,
    linear), gives the same result, bit for bit; so does the loop over tensors (the CUDA
    path), up to ``exp``'s last bit."""
    boxes, scores, idxs = clustered(300, 8, 5)
    want = reference(boxes, scores, idxs, method=method)
    got = []
    for block in ((1, 1), (1, 3), (2, 1000)):
        monkeypatch.setattr(S, "BLOCK", block)
        got.append(batched_soft_nms(boxes, scores, idxs, method=method))
        assert_matches(got[-1], want)
        assert torch.equal(got[-1][0], got[0][0]) and torch.equal(got[-1][1], got[0][1])
    monkeypatch.setattr(S, "_on_host", lambda t: False)
    keep, new = batched_soft_nms(boxes, scores, idxs, method=method)
    assert torch.equal(keep, got[0][0])
    torch.testing.assert_close(new, got[0][1], rtol=1e-6, atol=0)


def test_edges():
    box = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    boxes = torch.cat((box, box, box + 10, torch.zeros(1, 4)))
    # A duplicate decays to 0 (linear) and is dropped; a zero-area box overlaps nothing.
    keep, new = soft_nms(boxes, torch.tensor([0.9, 0.8, 0.0005, 0.7]))
    assert keep.tolist() == [0, 3] and new.tolist() == pytest.approx([0.9, 0.7])
    # NaN and infinite scores never count; none left: empty int64 and float results.
    keep, new = soft_nms(boxes, torch.tensor([float("nan"), float("inf"), 0.5, -1.0]))
    assert keep.tolist() == [2] and new.tolist() == [0.5]
    keep, new = soft_nms(boxes[:0], torch.zeros(0))
    assert keep.shape == new.shape == (0,) and keep.dtype == torch.int64
    assert new.dtype == torch.float32
    keep, new = soft_nms(boxes.half(), torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.bfloat16))
    assert new.dtype == torch.float32 and keep[0] == 0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: soft_nms(torch.zeros(2, 3), torch.ones(2)), ValueError, r"boxes must have shape \(N, 4\)"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2, dtype=torch.long)), TypeError, "scores must be a floating-point"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(3)), ValueError, r"scores must have shape \(N,\)"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2), iou_threshold=-0.1), ValueError, r"iou_threshold must be a number in \[0, 1\]"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2), sigma=0.0), ValueError, r"sigma must be in \(0.0, inf\), got 0.0"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2), sigma="1"), TypeError, "sigma must be int or float"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2), score_threshold=0), ValueError, r"score_threshold must be in \(0.0, inf\), got 0"),
        (lambda: soft_nms(torch.zeros(2, 4), torch.ones(2), method="hard"), ValueError, "method must be one of 'linear', 'gaussian'; got 'hard'"),
        (lambda: batched_soft_nms(torch.zeros(2, 4), torch.ones(2), torch.ones(2)), TypeError, "idxs must be an integer tensor"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_matches_cpu():
    boxes, scores, idxs = clustered(2000, 9, 40)
    for method in ("linear", "gaussian"):
        keep, new = batched_soft_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), method=method)
        want = batched_soft_nms(boxes, scores, idxs, method=method)
        assert torch.equal(keep.cpu(), want[0])
        torch.testing.assert_close(new.cpu(), want[1])
