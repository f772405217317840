"""Box coders: `encode_distances` / `decode_distances` and `encode_deltas` / `decode_deltas`.

References: ultralytics' ``bbox2dist`` / ``dist2bbox`` (ultralytics/utils/tal.py) and
torchvision's ``BoxCoder.encode_single`` / ``decode_single``
(torchvision/models/detection/_utils.py), run on the same inputs. float32 and float64 results
are compared exactly (``torch.equal``): the same operations in the same order.
"""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.models.detection._utils import BoxCoder

from visionblocks.ops import decode_deltas, decode_distances, encode_deltas, encode_distances


def random_boxes(shape, seed, dtype=torch.float32, size=60.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(*shape, 2, generator=g, dtype=torch.float64) * 500
    wh = torch.rand(*shape, 2, generator=g, dtype=torch.float64) * size + 0.5
    return torch.cat((xy, xy + wh), -1).to(dtype)


def points_in(boxes, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*boxes.shape[:-1], 2, generator=g, dtype=boxes.dtype) * 1.4 - 0.2
    return boxes[..., :2] + t * (boxes[..., 2:] - boxes[..., :2])  # some outside the box


DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reg_max", [None, 15, 7])
def test_encode_distances_equals_ultralytics(dtype, reg_max):
    tal = pytest.importorskip("ultralytics.utils.tal")
    boxes = random_boxes((4, 300), 0, dtype, size=200.0) / 8  # grid units, as in its loss
    points = points_in(boxes, 1)
    got = encode_distances(points, boxes, reg_max)
    assert got.dtype == dtype and torch.equal(got, tal.bbox2dist(points, boxes, reg_max))
    if reg_max is not None:
        assert got.min() == 0 and got.max() == torch.tensor(reg_max - 0.01, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["xyxy", "cxcywh"])
def test_decode_distances_equals_ultralytics(dtype, fmt):
    tal = pytest.importorskip("ultralytics.utils.tal")
    g = torch.Generator().manual_seed(2)
    points = torch.rand(8400, 2, generator=g, dtype=dtype) * 80
    distances = torch.rand(3, 8400, 4, generator=g, dtype=dtype) * 15  # a batch, shared points
    got = decode_distances(points, distances, fmt)
    want = tal.dist2bbox(distances, points, xywh=fmt == "cxcywh")
    assert got.dtype == dtype and torch.equal(got, want)
    # ultralytics' (B, 4, A) head layout with dim=1 is ours transposed
    want = tal.dist2bbox(distances.transpose(1, 2), points.T, xywh=fmt == "cxcywh", dim=1)
    assert torch.equal(got.transpose(1, 2), want)


def test_distances_round_trip_and_broadcast():
    boxes = random_boxes((2, 50), 3, torch.float64)
    points = (boxes[..., :2] + boxes[..., 2:]) / 2
    distances = encode_distances(points, boxes)
    assert (distances > 0).all()
    assert torch.allclose(decode_distances(points, distances), boxes, rtol=0, atol=1e-12)
    cxcywh = decode_distances(points, distances, "cxcywh")
    assert torch.allclose(cxcywh[..., :2], points) and torch.allclose(
        cxcywh[..., 2:], boxes[..., 2:] - boxes[..., :2]
    )
    # one set of points against a batch of boxes
    assert encode_distances(points[0], boxes).shape == (2, 50, 4)


WEIGHTS = [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0), (2.0, 3.0, 7.0, 0.5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_encode_deltas_equals_torchvision(dtype, weights):
    anchors, boxes = random_boxes((1000,), 4, dtype), random_boxes((1000,), 5, dtype)
    got = encode_deltas(anchors, boxes=boxes, weights=weights)
    want = BoxCoder(weights).encode_single(boxes, anchors)  # torchvision: targets first
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("clip", [math.log(1000.0 / 16), 1.0, math.inf])
def test_decode_deltas_equals_torchvision(dtype, weights, clip):
    g = torch.Generator().manual_seed(6)
    anchors = random_boxes((1000,), 7, dtype)
    deltas = (torch.randn(1000, 4, generator=g, dtype=torch.float64) * 4).to(dtype)  # some clipped
    got = decode_deltas(anchors, deltas=deltas, weights=weights, bbox_xform_clip=clip)
    want = BoxCoder(weights, clip).decode_single(deltas, anchors)
    assert got.dtype == dtype and torch.equal(got, want)


def test_decode_deltas_per_class_layout_and_batch():
    """Faster R-CNN's ``(N, K * 4)`` codes are ``(N, K, 4)`` with ``anchors[:, None]``, and
    torchvision's list ``decode``'s ``(N, K, 4)``; a batch ``(B, A, 4)`` shares ``(A, 4)``."""
    g = torch.Generator().manual_seed(8)
    anchors = random_boxes((50,), 9)
    codes = torch.randn(50, 3 * 4, generator=g)
    coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
    got = decode_deltas(anchors[:, None], deltas=codes.view(50, 3, 4), weights=coder.weights)
    assert torch.equal(got.flatten(1), coder.decode_single(codes, anchors))
    assert torch.equal(got, coder.decode(codes, [anchors[:20], anchors[20:]]))
    batch = torch.randn(2, 50, 4, generator=g)
    got = decode_deltas(anchors, deltas=batch)
    assert torch.equal(got[1], BoxCoder((1.0,) * 4).decode_single(batch[1], anchors))


@pytest.mark.parametrize("weights", WEIGHTS)
def test_deltas_round_trip(weights):
    anchors, boxes = (
        random_boxes((2, 500), 10, torch.float64),
        random_boxes((2, 500), 11, torch.float64),
    )
    deltas = encode_deltas(anchors, boxes=boxes, weights=weights)
    back = decode_deltas(anchors, deltas=deltas, weights=weights, bbox_xform_clip=math.inf)
    torch.testing.assert_close(back, boxes, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    anchors = random_boxes((200,), 12) + 1000  # coordinates float16 holds only to 1 px
    deltas = torch.randn(200, 4, generator=torch.Generator().manual_seed(13)) * 0.01
    got = decode_deltas(anchors.to(dtype), deltas=deltas.to(dtype))
    want = decode_deltas(anchors.to(dtype).float(), deltas=deltas.to(dtype).float())
    assert got.dtype == torch.float32 and torch.equal(got, want)
    points = points_in(anchors, 14)
    got = encode_distances(points.to(dtype), anchors.to(dtype))
    assert got.dtype == torch.float32
    assert torch.equal(got, encode_distances(points.to(dtype).float(), anchors.to(dtype).float()))
    half = anchors.to(dtype)
    half = half[(half[:, 2:] > half[:, :2]).all(1)]  # not rounded to zero size
    assert encode_deltas(half, boxes=half).abs().max() == 0
    assert decode_distances(points.long(), got.to(dtype)).dtype == torch.float32  # integers too


def test_gradients_flow_to_half_deltas():
    anchors = random_boxes((20,), 15)
    deltas = torch.zeros(20, 4, dtype=torch.float16, requires_grad=True)
    decode_deltas(anchors, deltas=deltas).sum().backward()
    assert deltas.grad.dtype == torch.float16 and deltas.grad.isfinite().all()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: encode_distances(b[:, :3], b), ValueError, r"points must have shape \(\.\.\., 2\)"),
        (lambda b: decode_distances(b[:, :2], b[:, :3]), ValueError, "distances must have shape"),
        (lambda b: decode_distances(b, b[:, :2]), ValueError, "points must have shape"),  # dist2bbox's order
        (lambda b: encode_distances(b[:, :2], b[:3]), ValueError, "leading dims that broadcast"),
        (lambda b: decode_distances(b[:3, :2], b), ValueError, "leading dims that broadcast"),
        (lambda b: decode_distances(b[:, :2].double(), b.to("meta")), ValueError, "same device"),
        (lambda b: encode_distances(b[:, :2], b.to("meta")), ValueError, "same device"),
        (lambda b: encode_distances(b[:, :2].tolist(), b), TypeError, "points"),
        (lambda b: encode_distances(b[:, :2], b.bool()), TypeError, "boxes"),
        (lambda b: encode_distances(b[:, :2], b, reg_max=0), ValueError, "reg_max"),
        (lambda b: encode_distances(b[:, :2], b, reg_max=15.0), TypeError, "reg_max"),
        (lambda b: decode_distances(b[:, :2], b, fmt="xywh"), ValueError, "fmt"),
        (lambda b: encode_deltas(b, b), TypeError, "positional"),
        (lambda b: decode_deltas(b, b), TypeError, "positional"),
        (lambda b: encode_deltas(b, boxes=b[:, :2]), ValueError, "boxes must have shape"),
        (lambda b: encode_deltas(b, boxes=b, weights=(1.0, 1.0, 1.0)), ValueError, "weights"),
        (lambda b: encode_deltas(b, boxes=b, weights=(1.0, 1.0, 0.0, 1.0)), ValueError, "weights"),
        (lambda b: encode_deltas(b, boxes=b, weights=(1.0, 1.0, math.inf, 1.0)), ValueError, "weights"),
        (lambda b: encode_deltas(b, boxes=b, weights="abcd"), TypeError, "weights"),
        (lambda b: decode_deltas(b, deltas=b, bbox_xform_clip=-1.0), ValueError, "bbox_xform_clip"),
        (lambda b: decode_deltas(b, deltas=b, bbox_xform_clip=math.nan), ValueError, "bbox_xform_clip"),
        (lambda b: decode_deltas(b, deltas=b, bbox_xform_clip=None), TypeError, "bbox_xform_clip"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(random_boxes((5,), 16))


@pytest.mark.slow  # torch.compile
def test_coders_compile_fullgraph():
    def run(points, anchors, boxes, deltas):
        return (
            encode_distances(points, boxes, reg_max=15),
            decode_distances(points, deltas.abs(), "cxcywh"),
            encode_deltas(anchors, boxes=boxes, weights=(10.0, 10.0, 5.0, 5.0)),
            decode_deltas(anchors, deltas=deltas, weights=(10.0, 10.0, 5.0, 5.0)),
        )

    compiled = torch.compile(run, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (7, 13):
        boxes, anchors = random_boxes((2, n), 17), random_boxes((n,), 18)
        inputs = (points_in(anchors, 19), anchors, boxes, torch.randn(2, n, 4))
        for got, want in zip(compiled(*inputs), run(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
