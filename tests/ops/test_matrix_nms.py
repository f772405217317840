"""`matrix_nms` against a float64 reference of mmdetection's ``mask_matrix_nms``.

The reference re-expresses open-mmlab/mmdetection ``mmdet/models/layers/matrix_nms.py``
(SOLOv2's Matrix NMS) one pair at a time on float64 numbers: sort by score; for each ``j``,
its decay is the minimum over every ``i`` of ``f(iou_ij) / f(c_i)``, where ``iou_ij`` is the
IoU of ``i`` before ``j`` of the same label (0 otherwise) and ``c_i`` the largest IoU of ``i``
with a box before it; ``f(x) = exp(-sigma x**2)`` or ``1 - x``; keep decayed scores at or
above ``filter_thr``, sorted by decayed score.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from visionblocks.ops import box_iou, matrix_nms


def reference(iou, scores, labels=None, kernel="gaussian", sigma=2.0, threshold=None):
    n = len(scores)
    scores, iou = scores.double().tolist(), iou.double().tolist()
    labels = labels.tolist() if labels is not None else [0] * n
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    o = [[iou[a][b] if p < q and labels[a] == labels[b] else 0.0
          for q, b in enumerate(order)] for p, a in enumerate(order)]  # fmt: skip
    comp = [max([o[k][i] for k in range(n)], default=0.0) for i in range(n)]

    def f(x):
        return math.exp(-sigma * x * x) if kernel == "gaussian" else 1 - x

    out = []
    for j in range(n):
        decay = min(f(o[i][j]) / f(comp[i]) if f(comp[i]) > 0 else math.inf for i in range(n))
        out.append((scores[order[j]] * decay, j, order[j]))
    out = [t for t in out if threshold is None or t[0] >= threshold]
    out.sort(key=lambda t: (-t[0], t[1]))
    return [t[2] for t in out], [t[0] for t in out]


def masks_and_boxes(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(max(n // 8, 1), 2, generator=g) * 24 + 4
    c = centres[torch.randint(0, len(centres), (n,), generator=g)]
    c = c + torch.randn(n, 2, generator=g) * 1.5
    half = torch.rand(n, 2, generator=g) * 5 + 2
    boxes = torch.cat((c - half, c + half), 1)
    y, x = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    inside = (x >= boxes[:, 0, None, None]) & (x < boxes[:, 2, None, None])
    masks = inside & (y >= boxes[:, 1, None, None]) & (y < boxes[:, 3, None, None])
    return boxes, masks, torch.rand(n, generator=g), torch.randint(0, 3, (n,), generator=g)


def mask_iou(masks):
    flat = masks.flatten(1).double()
    inter = flat @ flat.T
    area = flat.sum(1)
    union = area[:, None] + area[None, :] - inter
    return torch.where(union > 0, inter / union.clamp_min(1e-300), 0)


def assert_matches(got, want):
    assert got[0].dtype == torch.int64 and got[0].tolist() == want[0]
    torch.testing.assert_close(
        got[1].double(), torch.tensor(want[1], dtype=torch.float64), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kernel, sigma", [("gaussian", 2.0), ("gaussian", 0.5), ("linear", 2.0)])
@pytest.mark.parametrize("threshold", [None, 0.1])
def test_equals_the_float64_reference(kernel, sigma, threshold):
    for seed, n in enumerate((1, 2, 9, 40)):
        boxes, masks, scores, labels = masks_and_boxes(n, seed)
        kw = {"kernel": kernel, "sigma": sigma, "score_threshold": threshold}
        for cats in (None, labels):
            want = reference(
                box_iou(boxes.double(), boxes.double()), scores, cats, kernel, sigma, threshold
            )
            assert_matches(matrix_nms(scores, boxes=boxes, labels=cats, **kw), want)
            want = reference(mask_iou(masks), scores, cats, kernel, sigma, threshold)
            assert_matches(matrix_nms(scores, masks=masks, labels=cats, **kw), want)
            assert_matches(matrix_nms(scores, masks=masks.to(torch.uint8), labels=cats, **kw), want)


def test_soft_masks_weigh_their_pixels():
    _, masks, scores, _ = masks_and_boxes(12, 5)
    soft = masks * torch.rand(masks.shape, generator=torch.Generator().manual_seed(5))
    assert_matches(matrix_nms(scores, masks=soft), reference(mask_iou(soft), scores))


def test_duplicates_empty_masks_and_dtypes():
    masks = torch.zeros(4, 5, 5, dtype=torch.bool)
    masks[:3, 1:4, 1:4] = True  # three identical masks, one empty
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    keep, new = matrix_nms(scores, masks=masks, kernel="linear")
    assert keep.tolist() == [0, 3, 1, 2] and new.dtype == torch.float64
    assert new.tolist() == [0.9, 0.6, 0.0, 0.0]  # finite where mmdet divides 0 by 0
    keep, new = matrix_nms(torch.zeros(0), boxes=torch.zeros(0, 4))
    assert keep.shape == new.shape == (0,) and keep.dtype == torch.int64
    boxes, _, scores, _ = masks_and_boxes(20, 3)
    want = matrix_nms(scores, boxes=boxes)
    got = matrix_nms(scores.half(), boxes=boxes.half())
    assert got[1].dtype == torch.float32
    torch.testing.assert_close(got[1], want[1], rtol=2e-2, atol=2e-3)


_BOXES = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 8], [0, 0, 10, 6], [20, 20, 30, 30]])


def test_uint8_masks_count_nonzero_pixels():
    """0/255 uint8 masks were weights (IoU 0 for identical masks): nothing was suppressed."""
    _, masks, scores, labels = masks_and_boxes(16, 11)
    want = matrix_nms(scores, masks=masks, labels=labels)
    for m in (masks.to(torch.uint8) * 255, masks.long() * 3):
        got = matrix_nms(scores, masks=m, labels=labels)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_matches(want, reference(mask_iou(masks), scores, labels))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_sigma_gives_the_limit(dtype):
    """A sigma beyond float32's range gave NaN scores (0 * -inf); the limit of the Gaussian
    decay is 1 for no overlap beyond the compensation, 0 for more."""
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=dtype)
    for sigma in (1e39, 1e300):
        keep, new = matrix_nms(scores, boxes=_BOXES.to(dtype), sigma=sigma)
        assert keep.tolist() == [0, 3, 1, 2] and new.tolist() == [
            pytest.approx(v) for v in (0.9, 0.6, 0.0, 0.0)
        ]
    keep, new = matrix_nms(scores.float(), boxes=_BOXES, sigma=1e30)  # finite: as before
    assert_matches((keep, new), reference(box_iou(_BOXES, _BOXES), scores, sigma=1e30))


def test_non_finite_scores_come_last_and_decay_nothing():
    """A NaN score was sorted first and decayed the real boxes (soft_nms ignores it)."""
    scores = torch.tensor([math.nan, 0.8, 0.7, 0.6])
    keep, new = matrix_nms(scores, boxes=_BOXES)
    want = reference(box_iou(_BOXES[1:], _BOXES[1:]), scores[1:])
    assert keep.tolist() == [i + 1 for i in want[0]] + [0]
    torch.testing.assert_close(new[:3].double(), torch.tensor(want[1], dtype=torch.float64))
    assert new[3].isnan()
    scores = torch.tensor([math.inf, 0.8, -math.inf, math.nan, 0.6])
    boxes = torch.cat((_BOXES[:1], _BOXES[1:2], _BOXES[:1], _BOXES[:1], _BOXES[3:]))
    keep, new = matrix_nms(scores, boxes=boxes, kernel="linear")
    assert keep.tolist() == [1, 4, 0, 2, 3]  # in index order after the rest
    assert new[:2].tolist() == pytest.approx([0.8, 0.6])  # not decayed by them
    # they stay non-finite: -inf under the inf box (IoU 1, linear decay 0) becomes NaN
    assert new[2] == math.inf and new[3].isnan() and new[4].isnan()
    keep, new = matrix_nms(scores, boxes=boxes, score_threshold=0.0)
    assert keep.tolist() == [1, 4]  # a threshold drops them, as soft_nms


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: matrix_nms(torch.ones(2)), ValueError, "exactly one of boxes and masks"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), masks=torch.zeros(2, 3, 3)), ValueError, "exactly one of boxes and masks"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 5)), ValueError, r"boxes must have shape \(N, 4\)"),
        (lambda: matrix_nms(torch.ones(2), masks=torch.zeros(2, 3)), ValueError, r"masks must be a real or bool \(N, H, W\) tensor"),
        (lambda: matrix_nms(torch.ones(3), boxes=torch.zeros(2, 4)), ValueError, r"scores must have shape \(N,\) = \(2,\)"),
        (lambda: matrix_nms(torch.ones(2, dtype=torch.long), boxes=torch.zeros(2, 4)), TypeError, "scores must be a floating-point"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), labels=torch.ones(2)), TypeError, "labels must be an integer tensor"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), kernel="box"), ValueError, "kernel must be one of 'gaussian', 'linear'"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), sigma=0), ValueError, r"sigma must be in \(0.0, inf\)"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), sigma=math.inf), ValueError, "sigma must be a finite number, got inf"),
        (lambda: matrix_nms(torch.ones(2), boxes=torch.zeros(2, 4), score_threshold=float("nan")), ValueError, "score_threshold must be in"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.slow
def test_compiles_fullgraph_and_equals_eager():
    boxes, masks, scores, labels = masks_and_boxes(30, 4)

    def run(s, b, m, c):
        return (
            matrix_nms(s, boxes=b, labels=c),
            matrix_nms(s, masks=m, kernel="linear"),
        )

    torch._dynamo.reset()
    got = torch.compile(run, fullgraph=True, dynamic=True, backend="aot_eager")(
        scores, boxes, masks, labels
    )
    for g, w in zip(got, run(scores, boxes, masks, labels), strict=True):
        assert torch.equal(g[0], w[0])
        torch.testing.assert_close(g[1], w[1])
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        fn = torch.compile(lambda s, b: matrix_nms(s, boxes=b, score_threshold=0.2), fullgraph=True)
        keep, _ = fn(scores, boxes)
    assert torch.equal(keep, matrix_nms(scores, boxes=boxes, score_threshold=0.2)[0])


def test_fake_cuda_tensors_read_no_values():
    from tests.package.test_fake_cuda import no_driver

    cuda = torch.device("cuda")
    with FakeTensorMode(allow_non_fake_inputs=False):
        scores, masks = torch.rand(6, device=cuda), torch.rand(6, 8, 8, device=cuda) > 0.5
        with no_driver():
            keep, _ = matrix_nms(
                scores, masks=masks, labels=torch.zeros(6, dtype=torch.long, device=cuda)
            )
    assert keep.shape == (6,) and keep.device.type == "cuda"
    with FakeTensorMode(
        allow_non_fake_inputs=False, shape_env=ShapeEnv(allow_dynamic_output_shape_ops=True)
    ):
        scores, boxes = torch.rand(6, device=cuda), torch.rand(6, 4, device=cuda)
        with no_driver():
            keep, _ = matrix_nms(scores, boxes=boxes, score_threshold=0.5)
    assert isinstance(keep.shape[0], torch.SymInt)
