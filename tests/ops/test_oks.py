"""keypoint_oks against pycocotools' ``COCOeval.computeOks`` (the oracle), run on small COCO
dicts built here: random poses, visibility mixes, ground truths without a labelled key point,
zero areas, empty sets; then dtypes, gradients, errors, torch.compile and fake CUDA."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval, Params
from torch._subclasses.fake_tensor import FakeTensorMode

import visionblocks
from tests.helpers import gradcheck
from visionblocks.ops.boxes import box_convert
from visionblocks.ops.oks import COCO_PERSON_SIGMAS, keypoint_oks

CUDA = torch.device("cuda")


def _pycocotools_oks(pred, gt, visibility, areas, sigmas, boxes_xywh) -> np.ndarray:
    """``COCOeval.computeOks`` of predictions ``(N, K, 2)`` against ground truths
    ``(M, K, 2)`` of one image (NumPy arrays), boxes in COCO's ``[x, y, w, h]``."""
    n, m, k = len(pred), len(gt), len(sigmas)
    annotations = [
        {
            "id": j + 1,
            "image_id": 1,
            "category_id": 1,
            "keypoints": np.column_stack([gt[j], visibility[j]]).ravel().tolist(),
            "num_keypoints": int((visibility[j] > 0).sum()),
            "bbox": [float(v) for v in boxes_xywh[j]],
            "area": float(areas[j]),
            "iscrowd": 0,
        }
        for j in range(m)
    ]
    categories = [{"id": 1, "name": "person", "keypoints": [f"p{i}" for i in range(k)]}]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = {
            "images": [{"id": 1, "height": 500, "width": 500}],
            "categories": categories,
            "annotations": annotations,
        }
        coco_gt.createIndex()
        results = [  # decreasing scores: COCOeval's sort keeps this order
            {
                "image_id": 1,
                "category_id": 1,
                "keypoints": np.column_stack([pred[i], np.ones(k)]).ravel().tolist(),
                "score": 1.0 - i / (n + 1),
            }
            for i in range(n)
        ]
        if results:
            coco_dt = coco_gt.loadRes(results)
        else:
            coco_dt = COCO()
            coco_dt.dataset = {"images": coco_gt.dataset["images"], "categories": categories,
                               "annotations": []}  # fmt: skip
            coco_dt.createIndex()
        evaluator = COCOeval(coco_gt, coco_dt, "keypoints")
        evaluator.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
        evaluator.params.imgIds = [1]
        evaluator.params.maxDets = [max(n, 1)]
        evaluator._prepare()
        ious = evaluator.computeOks(1, 1)
    return np.asarray(ious, dtype=np.float64).reshape(n, m)


def _random_case(seed: int, n: int, m: int, k: int, empty_rows: int = 2):
    """Ground truths around random centres, predictions near them (and a few far away),
    visibility a mix of 0, 1 and 2, ``empty_rows`` ground truths with no labelled point."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(50, 450, (m, 1, 2))
    size = rng.uniform(5, 120, (m, 1, 2))
    gt = centres + rng.uniform(-0.5, 0.5, (m, k, 2)) * size
    visibility = rng.choice([0, 1, 2], size=(m, k), p=[0.3, 0.2, 0.5])
    visibility[:empty_rows] = 0
    visibility[empty_rows:, 0] = np.maximum(visibility[empty_rows:, 0], 1)  # k1 >= 1 there
    boxes = np.concatenate([centres[:, 0] - size[:, 0] / 2, size[:, 0]], 1)  # [x, y, w, h]
    boxes += rng.uniform(-3, 3, (m, 4))
    boxes[:, 2:] = np.abs(boxes[:, 2:])
    areas = size[:, 0].prod(-1) * rng.uniform(0.3, 1.0, m)
    source = rng.integers(0, m, n)
    spread = rng.uniform(0.005, 0.15, (n, 1, 1)) * np.sqrt(areas[source])[:, None, None]
    pred = gt[source] + rng.normal(0, 1, (n, k, 2)) * spread
    pred[: n // 4] = rng.uniform(0, 500, (n // 4, k, 2))  # far from everything
    sigmas = COCO_PERSON_SIGMAS if k == 17 else tuple(rng.uniform(0.02, 0.12, k))
    return pred, gt, visibility, areas, sigmas, boxes


def _torch(pred, gt, visibility, areas, boxes, dtype=torch.float64):
    return (
        torch.as_tensor(pred, dtype=dtype),
        torch.as_tensor(gt, dtype=dtype),
        torch.as_tensor(visibility, dtype=torch.int64),
        torch.as_tensor(areas, dtype=dtype),
        torch.as_tensor(boxes, dtype=dtype),
    )


# ------------------------------------------------------------------------------ the oracle


def test_person_sigmas_are_pycocotools_bit_for_bit():
    assert tuple(Params(iouType="keypoints").kpt_oks_sigmas.tolist()) == COCO_PERSON_SIGMAS
    assert len(COCO_PERSON_SIGMAS) == 17


@pytest.mark.parametrize(("seed", "k"), [(0, 17), (1, 17), (2, 5), (3, 1), (4, 17)])
def test_random_pairs_equal_compute_oks(seed, k):
    pred, gt, visibility, areas, sigmas, boxes = _random_case(seed, n=14, m=12, k=k)
    expected = _pycocotools_oks(pred, gt, visibility, areas, sigmas, boxes)
    # good, middling and bad matches
    assert (expected > 0.5).sum() >= 3 and ((expected > 0.1) & (expected < 0.9)).sum() >= 3
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes)
    actual = keypoint_oks(p, g, v, a, sigmas, boxes=b, box_fmt="xywh")
    assert actual.dtype == torch.float64 and actual.shape == (14, 12)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=0, atol=1e-13)
    # float32 inputs give float32: within 2e-6 of pycocotools on the same (rounded) inputs,
    # within 1e-5 of its values for the float64 inputs (coordinates of a few hundred pixels)
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes, torch.float32)
    single = keypoint_oks(p, g, v, a, sigmas, boxes=b, box_fmt="xywh")
    assert single.dtype == torch.float32
    np.testing.assert_allclose(single.numpy(), expected, rtol=0, atol=1e-5)
    rounded = [x.numpy().astype(np.float64) for x in (p, g, a, b)]
    expected = _pycocotools_oks(rounded[0], rounded[1], visibility, rounded[2], sigmas, rounded[3])
    np.testing.assert_allclose(single.numpy(), expected, rtol=0, atol=2e-6)


def test_box_formats_agree():
    pred, gt, visibility, areas, sigmas, boxes = _random_case(5, n=10, m=8, k=17, empty_rows=4)
    expected = _pycocotools_oks(pred, gt, visibility, areas, sigmas, boxes)
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes)
    for fmt in ("xyxy", "cxcywh"):
        converted = box_convert(b, "xywh", fmt)
        actual = keypoint_oks(p, g, v, a, boxes=converted, box_fmt=fmt)
        np.testing.assert_allclose(actual.numpy(), expected, rtol=0, atol=1e-12, err_msg=fmt)


def test_ground_truths_without_labelled_points_need_the_box():
    pred, gt, visibility, areas, sigmas, boxes = _random_case(6, n=9, m=7, k=17, empty_rows=3)
    expected = _pycocotools_oks(pred, gt, visibility, areas, sigmas, boxes)
    p, g, v, a, _ = _torch(pred, gt, visibility, areas, boxes)
    without = keypoint_oks(p, g, v, a)
    assert torch.isnan(without[:, :3]).all()  # undefined, not a made-up number
    np.testing.assert_allclose(without[:, 3:].numpy(), expected[:, 3:], rtol=0, atol=1e-13)
    # the grown box's rule: inside it every distance is 0; far outside the OKS drops to 0
    box = torch.tensor([[100.0, 100.0, 20.0, 40.0]])  # grown to [80, 140] x [60, 180]
    inside = torch.tensor([[[80.0, 60.0], [140.0, 180.0]], [[110.0, 120.0], [85.0, 175.0]]])
    far = torch.tensor([[[0.0, 0.0], [400.0, 400.0]]])
    preds = torch.cat([inside, far, torch.tensor([[[139.0, 185.0], [75.0, 120.0]]])])
    args = (torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long), torch.tensor([50.0]))
    oks = keypoint_oks(preds, *args, [0.1, 0.2], boxes=box, box_fmt="xywh")
    reference = _pycocotools_oks(
        preds.numpy(), np.zeros((1, 2, 2)), np.zeros((1, 2)), [50.0], [0.1, 0.2], box.numpy()
    )
    np.testing.assert_allclose(oks.numpy(), reference, rtol=0, atol=1e-7)
    assert oks[:2].eq(1).all() and oks[2] < 1e-6 and 0 < oks[3] < 1


def test_zero_areas_count_only_exact_matches():
    pred, gt, visibility, areas, sigmas, boxes = _random_case(7, n=6, m=5, k=17, empty_rows=1)
    areas[:] = 0.0
    pred[0] = gt[1]  # an exact match of ground truth 1
    pred[1, :, 0] = gt[2, :, 0] + 0.25  # a quarter pixel off
    expected = _pycocotools_oks(pred, gt, visibility, areas, sigmas, boxes)
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes)
    actual = keypoint_oks(p, g, v, a, boxes=b, box_fmt="xywh")
    np.testing.assert_allclose(actual.numpy(), expected, rtol=0, atol=1e-13)
    assert actual[0, 1] == 1.0 and actual[1, 2] == 0.0 and torch.isfinite(actual).all()
    single = keypoint_oks(p.float(), g.float(), v, a.float(), boxes=b.float(), box_fmt="xywh")
    np.testing.assert_allclose(single.numpy(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("n", "m"), [(0, 4), (5, 0), (0, 0)])
def test_empty_sets(n, m):
    pred, gt, visibility, areas, sigmas, boxes = _random_case(8, n=max(n, 4), m=max(m, 4), k=17)
    p, g, v, a, b = _torch(pred[:n], gt[:m], visibility[:m], areas[:m], boxes[:m])
    for kwargs in ({}, {"boxes": b}):
        out = keypoint_oks(p, g, v, a, **kwargs)
        assert out.shape == (n, m) and out.dtype == torch.float64
    assert _pycocotools_oks(pred[:n], gt[:m], visibility[:m], areas[:m], sigmas, boxes).size == 0


# ------------------------------------------------------------------------------ inputs


def test_input_forms_give_the_same_values():
    pred, gt, visibility, areas, _, boxes = _random_case(9, n=6, m=5, k=17)
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes, torch.float32)
    reference = keypoint_oks(p, g, v, a, boxes=b)
    scored = torch.cat([p, torch.rand(6, 17, 1)], -1)  # (N, K, 3): the third column is ignored
    assert torch.equal(keypoint_oks(scored, g, v, a, boxes=b), reference)
    assert torch.equal(keypoint_oks(p, g, v > 0, a, boxes=b), reference)  # bool visibility
    assert torch.equal(keypoint_oks(p, g, v.to(torch.uint8), a, boxes=b), reference)
    sigmas = torch.tensor(COCO_PERSON_SIGMAS)
    assert torch.equal(keypoint_oks(p, g, v, a, sigmas, boxes=b), reference)
    assert torch.equal(keypoint_oks(p, g, v, a, list(COCO_PERSON_SIGMAS), boxes=b), reference)
    # unlabelled coordinates are not used: NaN there changes nothing
    g_nan = g.masked_fill((v == 0).unsqueeze(-1), float("nan"))
    assert torch.equal(keypoint_oks(p, g_nan, v, a, boxes=b), reference)
    # translation invariance: shift everything, including the boxes
    shift = torch.tensor([37.0, -12.0])
    moved = keypoint_oks(p + shift, g + shift, v, a, boxes=b + shift.repeat(2))
    torch.testing.assert_close(moved, reference, rtol=0, atol=1e-5)


def test_dtypes():
    pred, gt, visibility, areas, _, boxes = _random_case(10, n=4, m=3, k=17)
    p, g, v, a, b = _torch(pred.round(), gt.round(), visibility, areas, boxes, torch.float32)
    reference = keypoint_oks(p, g, v, a, boxes=b)
    as_int = keypoint_oks(p.long(), g.int(), v, a.long().float(), boxes=b.long())
    assert as_int.dtype == torch.float32
    assert keypoint_oks(p.long(), g.int(), v, a, boxes=b).dtype == torch.float32
    torch.testing.assert_close(
        keypoint_oks(p.long(), g.int(), v, a, boxes=b), reference, rtol=0, atol=0
    )
    half = keypoint_oks(p.half(), g.bfloat16(), v, a.half(), boxes=b.half())
    assert half.dtype == torch.float32
    assert keypoint_oks(p, g.double(), v, a, boxes=b).dtype == torch.float64
    assert keypoint_oks(p, g, v, a, torch.tensor(COCO_PERSON_SIGMAS).double()).dtype == (
        torch.float64
    )


def test_gradients_are_finite_and_correct():
    pred, gt, visibility, areas, sigmas, boxes = _random_case(11, n=3, m=4, k=5, empty_rows=1)
    pred = pred[:, :, :] * 0.02 + gt[:3] * 0.98  # close enough for non-vanishing gradients
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes)
    g = g.masked_fill((v == 0).unsqueeze(-1), float("nan"))  # unused, even in the backward
    leaf = p.clone().requires_grad_(True)
    keypoint_oks(leaf, g, v, a, sigmas, boxes=b).sum().backward()
    assert torch.isfinite(leaf.grad).all() and leaf.grad.abs().sum() > 0
    leaf.grad = None
    keypoint_oks(leaf, g, v, a, sigmas).nan_to_num().sum().backward()  # NaN columns: no grad
    assert torch.isfinite(leaf.grad).all()
    g = g.nan_to_num()
    assert gradcheck(lambda x, y: keypoint_oks(x, y, v, a, sigmas, boxes=b), (p, g))


# ------------------------------------------------------------------------------ errors


def _valid() -> dict:
    return {
        "pred": torch.zeros(2, 3, 2),
        "gt": torch.zeros(4, 3, 2),
        "visibility": torch.ones(4, 3, dtype=torch.long),
        "areas": torch.ones(4),
        "sigmas": [0.1, 0.1, 0.1],
    }


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"pred": [[0.0, 0.0]]}, TypeError, "pred must be a torch.Tensor, got list"),
        ({"gt": torch.zeros(4, 3, 2, dtype=torch.complex64)}, TypeError, "gt must be a real"),
        ({"visibility": torch.ones(4, 3)}, TypeError, "visibility must be a bool or integer"),
        ({"areas": None}, TypeError, "areas must be a torch.Tensor, got NoneType"),
        ({"pred": torch.zeros(2, 3, 4)}, ValueError, r"pred must have shape \(N, K, 2\) or"),
        ({"pred": torch.zeros(1, 2, 3, 2)}, ValueError, r"pred must have shape .*\(1, 2, 3, 2\)"),
        ({"gt": torch.zeros(4, 3, 3)}, ValueError, r"gt must have shape \(M, K, 2\)"),
        ({"gt": torch.zeros(4, 5, 2)}, ValueError, r"pred and gt must have the same number K"),
        (
            {"pred": torch.zeros(2, 0, 2), "gt": torch.zeros(4, 0, 2)},
            ValueError,
            "at least one key point",
        ),
        ({"visibility": torch.ones(3, 3, dtype=torch.long)}, ValueError, r"visibility .*\(4, 3\)"),
        ({"areas": torch.ones(4, 1)}, ValueError, r"areas must have shape \(M,\) = \(4,\)"),
        ({"areas": torch.tensor([1.0, -2.0, 1.0, 1.0])}, ValueError, "areas must be >= 0"),
        ({"sigmas": [0.1, 0.1]}, ValueError, "sigmas must hold K = 3 values, .* got 2"),
        ({"sigmas": COCO_PERSON_SIGMAS}, ValueError, "got 17 .*person sigmas, the default"),
        ({"sigmas": [0.1, 0.0, 0.1]}, ValueError, r"sigmas must be finite and > 0.*sigmas\[1\]"),
        ({"sigmas": [0.1, float("nan"), 0.1]}, ValueError, "sigmas must be finite and > 0"),
        ({"sigmas": [0.1, "a", 0.1]}, TypeError, r"sigmas\[1\] must be a float"),
        ({"sigmas": "abc"}, TypeError, "sigmas must be a tensor or a sequence"),
        ({"sigmas": torch.ones(3, dtype=torch.long)}, TypeError, "sigmas must be a floating"),
        ({"sigmas": torch.ones(4)}, ValueError, r"sigmas must have shape \(K,\) = \(3,\)"),
        ({"sigmas": torch.tensor([0.1, -1.0, 0.1])}, ValueError, "sigmas must be finite and > 0"),
        ({"boxes": torch.zeros(3, 4)}, ValueError, r"boxes must have shape \(M, 4\) = \(4, 4\)"),
        ({"boxes": torch.zeros(4, 4), "box_fmt": "xy"}, ValueError, "box_fmt must be one of"),
        ({"box_fmt": 3}, TypeError, "box_fmt must be str"),
        ({"areas": torch.ones(4, device="meta")}, ValueError, "must be on the same device"),
        ({"sigmas": torch.ones(3, device="meta")}, ValueError, "must be on the same device"),
    ],
)
def test_bad_inputs_raise(changes, error, match):
    with pytest.raises(error, match=match):
        keypoint_oks(**{**_valid(), **changes})


def test_value_checks_can_be_switched_off():
    with visionblocks.value_checks(False):
        out = keypoint_oks(**{**_valid(), "areas": torch.tensor([1.0, -2.0, 1.0, 1.0])})
    assert out.shape == (2, 4)


# ------------------------------------------------------------------------------ compile, CUDA


@pytest.mark.slow  # torch.compile
def test_compiles_fullgraph_and_equals_eager():
    pred, gt, visibility, areas, sigmas, boxes = _random_case(12, n=6, m=5, k=17)
    p, g, v, a, b = _torch(pred, gt, visibility, areas, boxes, torch.float32)

    def both(p, g, v, a, b):
        return keypoint_oks(p, g, v, a, boxes=b), keypoint_oks(p, g, v, a, sigmas, box_fmt="xyxy")

    compiled = torch.compile(both, fullgraph=True, dynamic=True, backend="aot_eager")
    for actual, expected in zip(compiled(p, g, v, a, b), both(p, g, v, a, b), strict=True):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    leaf = p.clone().requires_grad_(True)
    compiled(leaf, g, v, a, b)[0].sum().backward()
    reference = p.clone().requires_grad_(True)
    both(reference, g, v, a, b)[0].sum().backward()
    torch.testing.assert_close(leaf.grad, reference.grad)


def test_runs_on_fake_cuda_without_host_reads(monkeypatch):
    asserted = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: asserted.append(msg))
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        pred = torch.rand(3, 17, 3, device=CUDA)
        gt = torch.rand(4, 17, 2, device=CUDA)
        visibility = torch.randint(0, 3, (4, 17), device=CUDA)
        areas = torch.rand(4, device=CUDA)
        boxes = torch.rand(4, 4, device=CUDA)
        out = keypoint_oks(pred, gt, visibility, areas, boxes=boxes)
        sigmas = torch.rand(17, device=CUDA)
        out2 = keypoint_oks(pred, gt, visibility, areas, sigmas)
    assert out.device.type == "cuda" and out.shape == (3, 4) and out2.shape == (3, 4)
    assert asserted == [
        "keypoint_oks: areas must be >= 0",
        "keypoint_oks: areas must be >= 0",
        "keypoint_oks: sigmas must be finite and > 0",
    ]
