"""Detection priors: `make_anchor_points`, `make_anchor_boxes`, `AnchorGenerator`.

References: ultralytics' ``make_anchors`` (ultralytics/utils/tal.py) and torchvision's
``AnchorGenerator`` (torchvision/models/detection/anchor_utils.py), run on the same inputs.
Every comparison is exact (``torch.equal``): the priors are integers and half-integers, which
float32 holds exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.models.detection.anchor_utils import AnchorGenerator as TorchvisionAnchors
from torchvision.models.detection.image_list import ImageList

from visionblocks.ops import AnchorGenerator, make_anchor_boxes, make_anchor_points


def feature_maps(sizes, batch=2, dtype=torch.float32):
    return [torch.zeros(batch, 3, h, w, dtype=dtype) for h, w in sizes]


# (levels' (H, W), strides): square and non-square grids, one level, a 1 x 1 level.
POINT_CONFIGS = [
    ([(80, 80), (40, 40), (20, 20)], [8, 16, 32]),
    ([(48, 84), (24, 42), (12, 21), (6, 11)], [8.0, 16.0, 32.0, 64.0]),
    ([(7, 3)], [4]),
    ([(5, 9), (1, 1)], [16, 128]),
]


@pytest.mark.parametrize(("sizes", "strides"), POINT_CONFIGS)
@pytest.mark.parametrize("offset", [0.5, 0.0, 0.25])
def test_anchor_points_equal_ultralytics(sizes, strides, offset):
    tal = pytest.importorskip("ultralytics.utils.tal")
    feats = feature_maps(sizes)
    want_points, want_strides = tal.make_anchors(feats, torch.tensor(strides), offset)
    for given in (feats, sizes):  # feature maps or their sizes
        for steps in (strides, torch.tensor(strides)):  # numbers or a model's stride tensor
            points, stride_tensor = make_anchor_points(given, steps, offset)
            assert points.dtype == stride_tensor.dtype == torch.float32
            assert torch.equal(points, want_points)
            assert torch.equal(stride_tensor, want_strides)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_anchor_points_are_float32_and_exact_for_half_features(dtype):
    tal = pytest.importorskip("ultralytics.utils.tal")
    sizes, strides = [(8, 2100), (4, 300)], [2, 4]
    points, stride_tensor = make_anchor_points(feature_maps(sizes, 1, dtype), strides)
    want, want_strides = tal.make_anchors(feature_maps(sizes, 1), torch.tensor(strides))
    assert points.dtype == torch.float32 and torch.equal(points, want)
    assert torch.equal(stride_tensor, want_strides)
    half, _ = tal.make_anchors(feature_maps(sizes, 1, dtype), torch.tensor(strides))
    if dtype != torch.float64:  # ultralytics' half points round the large ones
        assert not torch.equal(half.float(), want)


def test_anchor_points_layout():
    points, strides = make_anchor_points([(2, 3)], [8])
    # row-major cells, (x, y), centres
    assert points.tolist() == [[x + 0.5, y + 0.5] for y in range(2) for x in range(3)]
    assert strides.shape == (6, 1)
    assert make_anchor_points([], [])[0].shape == (0, 2)
    assert make_anchor_points([(0, 4)], [8])[0].shape == (0, 2)
    assert make_anchor_points([(1, 1)], [8], device="meta")[0].device.type == "meta"


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: make_anchor_points("abc", [8]), TypeError, "feature_sizes must be a list"),
        (lambda: make_anchor_points([torch.zeros(4)], [8]), ValueError, r"feature_sizes\[0\]"),
        (lambda: make_anchor_points([(2, 2.0)], [8]), TypeError, r"feature_sizes\[0\]"),
        (lambda: make_anchor_points([(2, 2, 2)], [8]), TypeError, r"feature_sizes\[0\]"),
        (lambda: make_anchor_points([(2, -1)], [8]), ValueError, r"feature_sizes\[0\]"),
        (lambda: make_anchor_points([(2, 2)], [8, 16]), ValueError, "one stride per level"),
        (lambda: make_anchor_points([(2, 2)], torch.ones(2)), ValueError, "one stride"),
        (lambda: make_anchor_points([(2, 2)], [0]), ValueError, r"strides\[0\]"),
        (lambda: make_anchor_points([(2, 2)], ["8"]), TypeError, r"strides\[0\]"),
        (lambda: make_anchor_points([(2, 2)], [8], math.inf), ValueError, "grid_cell_offset"),
        (lambda: make_anchor_points([(2, 2)], [8], None), TypeError, "grid_cell_offset"),
        (
            lambda: make_anchor_points(
                [torch.zeros(1, 2, 2), torch.zeros(1, 1, 1, device="meta")], [8, 16]
            ),
            ValueError,
            r"feature_sizes\[1\] is on meta",
        ),
    ],
)
def test_anchor_points_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# (levels' (H, W), padded image (H, W), sizes, aspect ratios): torchvision's defaults, the
# detection models' five levels, non-square images with strides that differ in x and y, a
# flat sizes tuple (one per level) and ratios shared by the levels, odd sizes and ratios.
BOX_CONFIGS = [
    ([(25, 38)], (800, 1216), ((128, 256, 512),), ((0.5, 1.0, 2.0),)),
    (
        [(100, 152), (50, 76), (25, 38), (13, 19), (7, 10)],
        (800, 1216),
        tuple((x, int(x * 2 ** (1 / 3)), int(x * 2 ** (2 / 3))) for x in (32, 64, 128, 256, 512)),
        ((0.5, 1.0, 2.0),) * 5,
    ),
    ([(60, 40), (30, 20)], (480, 336), (32, 64), (0.5, 1.0, 2.0)),
    ([(11, 7), (3, 2)], (99, 70), ((21.5, 40), (77,)), ((0.3, 1.7, 3.0), (1.0,))),
]


@pytest.mark.parametrize(("grid", "image", "sizes", "ratios"), BOX_CONFIGS)
def test_anchor_generator_equals_torchvision(grid, image, sizes, ratios):
    feats = feature_maps(grid)
    # a batch of images of different sizes, padded to `image`, as the detection models pass
    images = ImageList(torch.zeros(3, 3, *image), [image, (image[0] - 5, image[1]), (40, 30)])
    want = TorchvisionAnchors(sizes, ratios)(images, feats)
    ours = AnchorGenerator(sizes, ratios)
    got = ours(images, feats)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and torch.equal(g, w)
    assert (
        ours.num_anchors_per_location()
        == TorchvisionAnchors(sizes, ratios).num_anchors_per_location()
    )
    # the padded batch as a tensor, and the function with torchvision's strides
    assert torch.equal(ours(images.tensors, feats)[0], want[0])
    strides = [(image[0] // h, image[1] // w) for h, w in grid]
    assert torch.equal(make_anchor_boxes(grid, strides, sizes, ratios), want[0])
    assert torch.equal(make_anchor_boxes(feats, strides, sizes, ratios), want[0])


def test_anchor_generator_is_a_drop_in_for_torchvision_retinanet():
    from torchvision.models.detection import retinanet_resnet50_fpn

    def model(generator):
        torch.manual_seed(0)
        net = retinanet_resnet50_fpn(
            weights=None, weights_backbone=None, num_classes=3, min_size=128, max_size=160
        )
        if generator is not None:
            net.anchor_generator = generator
        return net.eval()

    reference = model(None)
    sizes = reference.anchor_generator.sizes
    ratios = reference.anchor_generator.aspect_ratios
    ours = model(AnchorGenerator(sizes, ratios))
    assert ours.state_dict().keys() == reference.state_dict().keys()
    images = [torch.rand(3, 120, 150, generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        want, got = reference(images), ours(images)
    for key in ("boxes", "scores", "labels"):
        assert torch.equal(got[0][key], want[0][key])


def test_half_features_give_float32_anchors():
    feats = feature_maps([(40, 70)], 1, torch.float16)
    images = ImageList(torch.zeros(1, 3, 1280, 2240, dtype=torch.float16), [(1280, 2240)])
    got = AnchorGenerator((96,), (0.5, 1.0, 2.0))(images, feats)[0]
    want = TorchvisionAnchors((96,), (0.5, 1.0, 2.0))(images, [f.float() for f in feats])[0]
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_anchor_boxes_cell_layout():
    # ratio-major, then size, per cell; cells row-major; stride (h, w) = (10, 20)
    boxes = make_anchor_boxes([(2, 2)], [(10, 20)], [(8, 16)], [(1.0, 4.0)])
    assert boxes.tolist()[:4] == [
        [-4.0, -4.0, 4.0, 4.0],
        [-8.0, -8.0, 8.0, 8.0],
        [-2.0, -8.0, 2.0, 8.0],
        [-4.0, -16.0, 4.0, 16.0],
    ]
    assert boxes[4:8].tolist() == (boxes[:4] + torch.tensor([20.0, 0, 20, 0])).tolist()
    assert boxes[8:12].tolist() == (boxes[:4] + torch.tensor([0.0, 10, 0, 10])).tolist()
    assert make_anchor_boxes([(0, 3)], [8], [8], [1.0]).shape == (0, 4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: make_anchor_boxes([(2, 2)], [8], [8, 16], [1.0]), ValueError, "one entry per level of"),
        (lambda: make_anchor_boxes([(2, 2)], [8], [[8]], [[1.0], [2.0]]), ValueError, "one entry per level"),
        (lambda: make_anchor_boxes([(2, 2)], [8], [[-8]], [1.0]), ValueError, r"sizes\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [8], [8], [math.nan]), ValueError, r"aspect_ratios\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [8], [8], [math.inf]), ValueError, r"aspect_ratios\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [8], [[]], [1.0]), TypeError, r"sizes\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [8], "8", [1.0]), TypeError, "sizes"),
        (lambda: make_anchor_boxes([(2, 2)], [8.5], [8], [1.0]), TypeError, r"strides\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [(8, 0)], [8], [1.0]), ValueError, r"strides\[0\]"),
        (lambda: make_anchor_boxes([(2, 2)], [8, 8], [8], [1.0]), ValueError, "strides"),
        (lambda: AnchorGenerator((8,), ("a",)), TypeError, "aspect_ratios"),
        (lambda: AnchorGenerator((8,))([torch.zeros(1, 3, 8, 8)], [torch.zeros(1, 1, 2, 2)]), TypeError, "image_list"),
        (lambda: AnchorGenerator((8, 16), (1.0,))(torch.zeros(1, 3, 8, 8), [torch.zeros(1, 1, 2, 2)]), ValueError, "feature_maps"),
        (lambda: AnchorGenerator((8,))(torch.zeros(1, 3, 8, 8), [torch.zeros(1, 1, 16, 2)]), ValueError, r"feature_maps\[0\]"),
    ],
)  # fmt: skip
def test_anchor_boxes_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.slow  # torch.compile
def test_priors_compile_fullgraph_with_dynamic_sizes():
    generator = AnchorGenerator(((32, 40), (64,)), ((0.5, 1.0, 2.0),) * 2)

    def run(images, a, b):
        points, strides = make_anchor_points([a, b], [8, 16])
        return points * strides, generator(images, [a, b])[0]

    compiled = torch.compile(run, fullgraph=True, dynamic=True, backend="aot_eager")
    for h, w in ((8, 12), (5, 7)):  # a second size: no recompilation needed
        inputs = (
            torch.zeros(1, 3, 8 * h, 8 * w),
            torch.zeros(1, 2, h, w),
            torch.zeros(1, 2, h // 2, w // 2),
        )
        for got, want in zip(compiled(*inputs), run(*inputs)):
            assert torch.equal(got, want)
