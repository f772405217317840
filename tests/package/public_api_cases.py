"""One small call of every public op, loss and layer, for the whole-API tests.

`CASES` maps each name of ``visionblocks.ops.__all__``, ``visionblocks.losses.__all__``,
``visionblocks.nn.__all__``, ``visionblocks.transforms.__all__`` and ``visionblocks.metrics.__all__`` to a builder: ``build(device)`` returns ``(fn, inputs)``, where
``fn(*inputs)`` is one typical call (a module is built, on ``device``, inside the builder)
and returns a tensor or a tuple of tensors. `NOT_TENSOR_OPS` holds the names that take no
tensors, with the reason. `test_fake_cuda.py` runs every case on fake CUDA tensors and
`test_compile_fullgraph.py` under ``torch.compile(fullgraph=True)``; both check that every
public name has a case, so a new name without one fails. Builders run with ``device`` as the
default device (``with device:``), so modules are built on it; they draw random values on the
CPU and move them (the same values on every device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import visionblocks.losses as L
import visionblocks.metrics as M
import visionblocks.nn as vnn
import visionblocks.ops as O
import visionblocks.transforms as T

Case = Callable[[torch.device], tuple[Callable[..., Any], tuple[Tensor, ...]]]

NOT_TENSOR_OPS = {
    "ops.TaskAlignedTargets": "a NamedTuple of task_aligned_assign's results (it has a case)",
    "ops.DynamicKAssignment": "a NamedTuple of simota_assign's and dynamic_soft_label_assign's "
    "results (both have cases)",
    "ops.BOX_FORMATS": "a tuple of format names",
    "ops.COCO_PERSON_SIGMAS": "a tuple of 17 floats (COCO's person OKS sigmas)",
    "ops.keypoint_flip_pairs": "key point names (str) to index pairs: no tensors",
    "ops.flip_permutation": "ints and index pairs in, a constant index out: no tensor inputs",
    "ops.BELOW_LOW_THRESHOLD": "an int constant (match_anchors' negatives)",
    "ops.BETWEEN_THRESHOLDS": "an int constant (match_anchors' ignored anchors)",
    "ops.BestIoU": "a NamedTuple of best_box_iou's results (best_box_iou has a case)",
    "ops.hungarian_match": "solves on the host (scipy's linear_sum_assignment): one .cpu() of "
    "all images' costs by design; tests/ops/test_hungarian.py checks on fake CUDA that nothing "
    "before it reads the device",
    "ops.HungarianMatcher": "hungarian_match's module (the same host solve)",
    "transforms.RandomAffine": "a random transform: draws its parameters on the host with "
    ".item(), as v2.RandomAffine does; its warp is transforms.warp_sample's case",
    "metrics.format_metrics": "formats results as text: reads every value on the host by design",
}

# Names whose output size depends on the input values (like torchvision's nms), with the reason:
# fake tensors need a ShapeEnv and torch.compile capture_dynamic_output_shape_ops for them;
# tests/ops/test_rotated.py covers both.
DATA_DEPENDENT_OPS = {
    "ops.nms_rotated": "the number of kept boxes depends on the values (a custom op)",
    "ops.batched_nms_rotated": "the number of kept boxes depends on the values (a custom op)",
    "ops.nms": "the number of kept boxes depends on the values (torchvision's op); "
    "tests/ops/test_nms.py",
    "ops.batched_nms": "the number of kept boxes depends on the values (torchvision's op); "
    "tests/ops/test_nms.py",
    "ops.remove_small_boxes": "the number of kept boxes depends on the values (torch.where); "
    "tests/ops/test_clip_remove_boxes.py",
    "ops.soft_nms": "a host loop, one device read per kept box (the algorithm is sequential): "
    "not traceable; tests/ops/test_soft_nms.py",
    "ops.batched_soft_nms": "soft_nms per category (the same host loop)",
    "metrics.panoptic_quality": "the number of segments depends on the values (nonzero, "
    "torch.unique): an evaluation metric that reads the device; tests/metrics/test_panoptic.py",
}

# Names whose case is the losses' backward as well as their forward.
LOSS_NAMES = {f"losses.{name}" for name in L.__all__}

# Model transforms, run once on real weights (``FakeTensorMode`` cannot copy or re-create
# modules); their case returns the transformed module, whose forward is what runs on a GPU.
MODEL_TRANSFORMS = {"nn.find_conv_bn_pairs", "nn.fuse_conv_bn", "nn.fuse_modules"}


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _randn(device: torch.device, *shape: int, g: torch.Generator | None = None) -> Tensor:
    # Drawn on CPU (same values on every device), then moved: fake CUDA tensors get no data.
    return torch.randn(*shape, generator=g or _gen(), device="cpu").to(device)


def _tal_inputs(d: torch.device, scores: Tensor, boxes: Tensor, gt: Tensor) -> tuple:
    """`task_aligned_assign`'s six inputs around its three floating ones (one image)."""
    points = (boxes[0, :, :2] + boxes[0, :, 2:]).detach() / 2  # anchors inside their boxes
    labels = torch.tensor([[[0], [2]]], device=d)
    return scores, boxes, points, labels, gt, torch.ones(1, 2, 1, dtype=torch.bool, device=d)


def _boxes(device: torch.device, n: int, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, device="cpu") * 10
    wh = torch.rand(n, 2, generator=g, device="cpu") * 10 + 1
    return torch.cat((xy, xy + wh), -1).to(device)


def _matrix(device: torch.device, batch: int | None = None) -> Tensor:
    m = O.affine_matrix(angle=15.0, translate=(1.0, -2.0), scale=1.2, center=(4.0, 3.0))
    if batch is not None:
        m = m.expand(batch, 2, 3).clone()
    return m.to(device)


def _module(device: torch.device, module: nn.Module, *inputs: Tensor):
    return module.eval(), inputs  # built on `device`, the default device


def _iou(fn):
    return lambda d: (fn, (_boxes(d, 5, 0), _boxes(d, 3, 1)))


def _iou_loss(fn):
    return lambda d: (
        lambda p, t: fn(p, t, reduction="mean"),
        (_boxes(d, 6, 0), _boxes(d, 6, 1)),
    )


def _rboxes(device: torch.device, n: int, seed: int = 0) -> Tensor:
    """``(n, 5)`` rotated boxes ``(cx, cy, w, h, angle in degrees)`` that overlap."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, device="cpu") * 4
    wh = torch.rand(n, 2, generator=g, device="cpu") * 4 + 2
    angle = torch.rand(n, 1, generator=g, device="cpu") * 180 - 90
    return torch.cat((xy, wh, angle), -1).to(device)


def _iou_loss_module(cls):
    return lambda d: _module(d, cls(), _boxes(d, 6, 0), _boxes(d, 6, 1))


def _focal_inputs(d: torch.device) -> tuple[Tensor, Tensor]:
    g = _gen()
    return _randn(d, 4, 3, g=g), (torch.rand(4, 3, generator=g, device="cpu") > 0.5).float().to(d)


def _dfl_inputs(d: torch.device) -> tuple[Tensor, Tensor]:
    """``(3, 4, 9)`` bin logits and ``(3, 4)`` distances in ``[0, 8]`` (both ends included)."""
    g = _gen()
    target = torch.rand(3, 4, generator=g, device="cpu") * 8
    target[0, :2] = torch.tensor([0.0, 8.0])
    return _randn(d, 3, 4, 9, g=g), target.to(d)


def _soft_inputs(d: torch.device) -> tuple[Tensor, Tensor]:
    """``(4, 3)`` logits and IoU-aware scores (0 for negatives)."""
    g = _gen()
    x, q = _randn(d, 4, 3, g=g), torch.rand(4, 3, generator=g, device="cpu")
    return x, torch.where(q > 0.6, q, 0.0).to(d)


def _ce_inputs(d: torch.device) -> tuple[Tensor, Tensor]:
    g = _gen()
    target = torch.randint(0, 3, (2, 4, 4), generator=g, device="cpu")
    target[0, 0, 0] = -100  # ignored
    return _randn(d, 2, 3, 4, 4, g=g), target.to(d)


def _rrois(device: torch.device) -> Tensor:
    """``(5, 6)`` rotated RoIs ``(batch index, cx, cy, w, h, angle)`` over two images."""
    batch = torch.tensor([[0.0], [1.0], [1.0], [0.0], [1.0]], device=device)
    return torch.cat((batch, _rboxes(device, 5, 2)), 1)


def _image(d: torch.device, c: int = 4, h: int = 6, w: int = 7) -> Tensor:
    return _randn(d, 2, c, h, w)


def _rois(d: torch.device) -> Tensor:
    """Five ``(batch index, x1, y1, x2, y2)`` RoIs on two images, in 0.5-scale coordinates."""
    index = torch.tensor([[0.0], [1.0], [0.0], [1.0], [1.0]], device="cpu")
    return torch.cat([index, _boxes(torch.device("cpu"), 5, 2)], 1).to(d)


def _conv_bn(d: torch.device) -> nn.Module:
    model = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.copy_(torch.linspace(-1, 1, 6))
        model[1].running_var.copy_(torch.linspace(0.5, 2, 6))
    return model.eval()


def _found(model: nn.Module) -> nn.Module:
    assert vnn.find_conv_bn_pairs(model) == [("0", "1")]
    return model


def _segmentation_metrics(d: torch.device) -> tuple:
    """A fresh stream (reset) of two updates, logits and indices, then compute."""
    metric = M.SegmentationMetrics(4, ignore_index=255)  # built on `d`

    def run(logits: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        metric.reset()
        metric.update(logits, target)
        metric.update(logits.argmax(1), target)
        return tuple(metric.compute().values())

    target = torch.randint(0, 4, (2, 6, 5), generator=_gen(), device="cpu")
    target[0, 0] = 255
    return run, (_randn(d, 2, 4, 6, 5), target.to(d))


CASES: dict[str, Case] = {
    # ------------------------------------------------------------------------------ ops
    "ops.affine_matrix": lambda d: (
        lambda angle, t, s: O.affine_matrix(
            angle=angle, translate=t, scale=s, center=(4.0, 3.0), hflip=angle > 0
        ),
        (_randn(d, 3) * 30, _randn(d, 3, 2), _randn(d, 3).abs() + 0.5),
    ),
    # A (3, 3) matrix: its last row checked by a device-side assert, nothing read.
    "ops.compose_affine": lambda d: (
        O.compose_affine,
        (_matrix(d, 2), torch.cat((_matrix(d), torch.tensor([[0.0, 0.0, 1.0]], device=d)))),
    ),
    "ops.box_area": lambda d: (O.box_area, (_boxes(d, 5),)),
    # Priors and box coders (visionblocks.ops.priors, visionblocks.ops.box_coders).
    "ops.make_anchor_points": lambda d: (
        lambda a, b: O.make_anchor_points([a, b], [8, 16]),
        (_image(d), _image(d, h=3, w=4)),
    ),
    "ops.make_anchor_boxes": lambda d: (
        lambda a, b: O.make_anchor_boxes([a, b], [8, (16, 12)], (32, 64), (0.5, 1.0, 2.0)),
        (_image(d), _image(d, h=3, w=4)),
    ),
    "ops.AnchorGenerator": lambda d: (
        lambda x, a, b: O.AnchorGenerator(((32, 40), (64,)), ((0.5, 1.0),) * 2)(x, [a, b]),
        (_image(d, 3, 48, 56), _image(d), _image(d, h=3, w=4)),
    ),
    "ops.encode_distances": lambda d: (
        lambda p, b: O.encode_distances(p, b, reg_max=15),
        (_randn(d, 5, 2).abs() * 8, _boxes(d, 5)),
    ),
    "ops.decode_distances": lambda d: (
        lambda p, x: O.decode_distances(p, x, "cxcywh"),
        (_randn(d, 2, 5, 2) * 8, _randn(d, 2, 5, 4).abs()),
    ),
    "ops.encode_deltas": lambda d: (
        lambda a, b: O.encode_deltas(a, boxes=b, weights=(10.0, 10.0, 5.0, 5.0)),
        (_boxes(d, 5, 0), _boxes(d, 5, 1)),
    ),
    "ops.decode_deltas": lambda d: (
        lambda a, x: O.decode_deltas(a, deltas=x, weights=(10.0, 10.0, 5.0, 5.0)),
        (_boxes(d, 5, 0), _randn(d, 2, 5, 4)),
    ),
    "ops.box_convert": lambda d: (lambda b: O.box_convert(b, "xyxy", "cxcywh"), (_boxes(d, 5),)),
    "ops.box_iou": _iou(O.box_iou),
    "ops.rotated_box_iou": lambda d: (O.rotated_box_iou, (_rboxes(d, 5, 0), _rboxes(d, 3, 1))),
    "ops.rotated_box_iou_loss": lambda d: (
        lambda p, t: O.rotated_box_iou_loss(p, t, reduction="mean"),
        (_rboxes(d, 6, 0), _rboxes(d, 6, 1)),
    ),
    "ops.rotated_roi_align": lambda d: (
        lambda x, r: O.rotated_roi_align(x, r, 3),  # adaptive sampling
        (_image(d), _rrois(d)),
    ),
    "ops.RotatedRoIAlign": lambda d: (
        lambda x, r: O.RotatedRoIAlign((2, 3), 0.5, 2)(x, r),
        (_image(d), _rrois(d)),
    ),
    "ops.roi_align": lambda d: (
        lambda x, r: O.roi_align(x, r, 2, 0.5, -1, True),
        (_image(d), _rois(d)),
    ),
    "ops.roi_pool": lambda d: (lambda x, r: O.roi_pool(x, r, (2, 3), 0.5), (_image(d), _rois(d))),
    "ops.ps_roi_align": lambda d: (
        lambda x, r: O.ps_roi_align(x, r, 2, 0.5, 2),
        (_image(d, 8), _rois(d)),
    ),
    "ops.ps_roi_pool": lambda d: (
        lambda x, r: O.ps_roi_pool(x, r, 2, 0.5),
        (_image(d, 8), _rois(d)),
    ),
    "ops.RoIAlign": lambda d: (
        lambda x, r: O.RoIAlign((2, 3), 0.5, 2, True)(x, r),
        (_image(d), _rois(d)),
    ),
    "ops.RoIPool": lambda d: (lambda x, r: O.RoIPool(2, 0.5)(x, r), (_image(d), _rois(d))),
    "ops.PSRoIAlign": lambda d: (
        lambda x, r: O.PSRoIAlign(2, 0.5, 2)(x, r),
        (_image(d, 8), _rois(d)),
    ),
    "ops.PSRoIPool": lambda d: (lambda x, r: O.PSRoIPool(2, 0.5)(x, r), (_image(d, 8), _rois(d))),
    # Two levels: the sync-free merge on CUDA, torchvision's indexing on CPU.
    "ops.MultiScaleRoIAlign": lambda d: (
        lambda a, b, r: O.MultiScaleRoIAlign(["a", "b"], 2, 2, canonical_scale=8)(
            {"a": a, "b": b}, [r[:3, 1:] * 2, r[3:, 1:] * 2], [(12, 14), (12, 12)]
        ),
        (_image(d), _image(d, 4, 3, 4), _rois(d)),
    ),
    # Several blocks of anchors (block_bytes=1: one anchor a block) and the kernels' dispatch.
    "ops.best_box_iou": lambda d: (
        lambda a, b: tuple(O.best_box_iou(a, b, block_bytes=1)),
        (_boxes(d, 7, 0), _boxes(d, 3, 1)),
    ),
    # Without score_threshold: every box, fixed size (the threshold's case: test_matrix_nms.py).
    # Sizes as a list (host ints: the grid_sample formula) and as a tensor on the device (the
    # gather path: read on the device only).
    "ops.ms_deform_attn": lambda d: (
        lambda v, x, a, s: (
            O.ms_deform_attn(v, [(3, 4), (1, 2)], x, a),
            O.ms_deform_attn(v, s, x, a),
        ),
        (
            _randn(d, 2, 14, 2, 3),
            _randn(d, 2, 5, 2, 2, 3, 2).sigmoid(),
            _randn(d, 2, 5, 2, 2, 3).softmax(-1),
            torch.tensor([[3, 4], [1, 2]], device=d),
        ),
    ),
    "ops.matrix_nms": lambda d: (
        lambda s, b, c: O.matrix_nms(s, boxes=b, labels=c),
        (_randn(d, 7).sigmoid(), _boxes(d, 7), torch.tensor([0, 1, 0, 0, 1, 0, 0], device=d)),
    ),
    # One block (the chunked path compiled: tests/ops/test_masks.py).
    "ops.paste_masks": lambda d: (
        lambda m, b: O.paste_masks(m, b, (13, 11)),
        (_randn(d, 5, 6, 6).sigmoid(), _boxes(d, 5)),
    ),
    "ops.crop_masks": lambda d: (O.crop_masks, (_randn(d, 5, 12, 14), _boxes(d, 5))),
    "ops.deform_conv2d": lambda d: (
        lambda x, o, w, m: O.deform_conv2d(x, o, w, padding=1, mask=m),
        (_image(d), _randn(d, 2, 18, 6, 7), _randn(d, 3, 4, 3, 3), _randn(d, 2, 9, 6, 7).sigmoid()),
    ),
    "ops.mask_iou": lambda d: (
        lambda a, b: O.mask_iou(a > 0, b > 0.5),
        (_randn(d, 4, 9, 8), _randn(d, 3, 9, 8, g=torch.Generator().manual_seed(1))),
    ),
    "ops.masks_to_boxes": lambda d: (lambda m: O.masks_to_boxes(m > 1), (_randn(d, 4, 9, 8),)),
    "ops.clip_boxes_to_image": lambda d: (
        lambda b: O.clip_boxes_to_image(b, (6, 7)),
        (_boxes(d, 5),),
    ),
    "ops.match_anchors": lambda d: (
        lambda a, b: O.match_anchors(
            a,
            boxes=b,
            high_threshold=0.5,
            low_threshold=0.2,
            allow_low_quality_matches=True,
            block_bytes=1,
        ),
        (_boxes(d, 7, 0), _boxes(d, 3, 1)),
    ),
    "ops.atss_assign": lambda d: (
        lambda a, b: O.atss_assign(a, b, [4, 3], topk=2, block_bytes=1),
        (_boxes(d, 7, 0), _boxes(d, 3, 1)),
    ),
    "ops.task_aligned_assign": lambda d: (
        lambda s, b, g: tuple(
            O.task_aligned_assign(*_tal_inputs(d, s, b, g), topk=2, block_bytes=1)
        ),
        (_randn(d, 1, 6, 3).sigmoid(), _boxes(d, 6, 0)[None], _boxes(d, 2, 1)[None]),
    ),
    "ops.TaskAlignedAssigner": lambda d: (
        lambda s, b, g: tuple(O.TaskAlignedAssigner(topk=2)(*_tal_inputs(d, s, b, g))),
        (_randn(d, 1, 6, 3).sigmoid(), _boxes(d, 6, 0)[None], _boxes(d, 2, 1)[None]),
    ),
    "ops.simota_assign": lambda d: (
        lambda p, b, s, g: tuple(
            O.simota_assign(p, b, s, g, torch.tensor([0, 1], device=d), block_bytes=1)
        ),
        (
            torch.tensor([[4.0, 4, 8, 8], [12, 4, 8, 8], [20, 4, 8, 8]], device=d),
            _boxes(d, 3, 0),
            _randn(d, 3, 2).sigmoid(),
            _boxes(d, 2, 1),
        ),
    ),
    "ops.dynamic_soft_label_assign": lambda d: (
        lambda p, b, s, g: tuple(
            O.dynamic_soft_label_assign(p, b, s, g, torch.tensor([0, 1], device=d), block_bytes=1)
        ),
        (
            torch.tensor([[4.0, 4, 8, 8], [12, 4, 8, 8], [20, 4, 8, 8]], device=d),
            _boxes(d, 3, 0),
            _randn(d, 3, 2),
            _boxes(d, 2, 1),
        ),
    ),
    "ops.complete_box_iou": _iou(O.complete_box_iou),
    "ops.distance_box_iou": _iou(O.distance_box_iou),
    "ops.generalized_box_iou": _iou(O.generalized_box_iou),
    "ops.complete_box_iou_loss": _iou_loss(O.complete_box_iou_loss),
    "ops.distance_box_iou_loss": _iou_loss(O.distance_box_iou_loss),
    "ops.generalized_box_iou_loss": _iou_loss(O.generalized_box_iou_loss),
    "ops.invert_affine": lambda d: (O.invert_affine, (_matrix(d, 2),)),
    "ops.local_attention2d": lambda d: (
        lambda q, k, v: O.local_attention2d(q, k, v, 3, num_heads=2),
        (_image(d), _image(d) * 0.5, _image(d) + 1),
    ),
    "ops.local_filter2d": lambda d: (
        lambda x, k: O.local_filter2d(x, k, 3),
        (_image(d), _randn(d, 2, 2 * 9, 6, 7)),
    ),
    "ops.matrix_to_theta": lambda d: (
        lambda m: O.matrix_to_theta(m, (6, 7), (5, 4)),
        (_matrix(d, 2),),
    ),
    "ops.theta_to_matrix": lambda d: (
        lambda t: O.theta_to_matrix(t, (6, 7), (5, 4)),
        (_matrix(d, 2) * 0.3,),
    ),
    "ops.sliding_windows": lambda d: (lambda x: O.sliding_windows(x, 3), (_image(d),)),
    "ops.warp_affine": lambda d: (
        lambda x, m: O.warp_affine(x, m, (5, 8)),
        (_image(d), _matrix(d, 2)),
    ),
    "ops.warp_boxes": lambda d: (
        lambda b, m: O.warp_boxes(b, m, (12, 14)),
        (_boxes(d, 5), _matrix(d)),
    ),
    "ops.warp_masks": lambda d: (
        lambda mk, m: O.warp_masks(mk, m, (5, 8)),
        ((_image(d, 3)[0] > 0), _matrix(d)),
    ),
    "ops.keypoint_oks": lambda d: (
        lambda p, g, v, a, b: O.keypoint_oks(p, g, v, a, boxes=b),
        (
            _randn(d, 3, 17, 2) * 10,
            _randn(d, 4, 17, 2) * 10,
            torch.randint(0, 3, (4, 17), generator=_gen()).to(d),
            _randn(d, 4).abs() * 100,
            _boxes(d, 4),
        ),
    ),
    "ops.warp_points": lambda d: (O.warp_points, (_randn(d, 2, 5, 2), _matrix(d, 2)[:, None])),
    # A mirroring matrix among two: the pairs swap by torch.where, nothing read.
    "ops.warp_keypoints": lambda d: (
        lambda p, m, v: O.warp_keypoints(p, m, (6, 8), v, [(1, 2)]),
        (
            _randn(d, 2, 3, 2) * 4,
            (_matrix(d, 2) * torch.tensor([[[1.0], [1.0]], [[-1.0], [1.0]]], device=d))[:, None],
            torch.tensor([[2, 1, 0], [2, 2, 1]], device=d),
        ),
    ),
    # target=None: with boxes and min_size set, which boxes survive is data dependent.
    "transforms.warp_sample": lambda d: (
        lambda x, m: T.warp_sample(x, None, m, (5, 8))[0],
        (_image(d)[0], _matrix(d)),
    ),
    # --------------------------------------------------------------------------- losses
    "losses.BCEWithLogitsLoss": lambda d: _module(
        d, L.BCEWithLogitsLoss(label_smoothing=0.1), *_focal_inputs(d)
    ),
    "losses.binary_cross_entropy_with_logits": lambda d: (
        lambda x, t: L.binary_cross_entropy_with_logits(x, t, ignore_index=-1.0),
        _focal_inputs(d),
    ),
    "losses.CrossEntropyLoss": lambda d: _module(d, L.CrossEntropyLoss(top_k=0.5), *_ce_inputs(d)),
    "losses.cross_entropy": lambda d: (
        lambda x, t: L.cross_entropy(x, t, label_smoothing=0.1),
        _ce_inputs(d),
    ),
    "losses.SoftmaxFocalLoss": lambda d: _module(d, L.SoftmaxFocalLoss(), *_ce_inputs(d)),
    "losses.softmax_focal_loss": lambda d: (
        lambda x, t: L.softmax_focal_loss(x, t, alpha=0.25, reduction="sum"),
        _ce_inputs(d),
    ),
    "losses.SigmoidFocalLoss": lambda d: _module(d, L.SigmoidFocalLoss(), *_focal_inputs(d)),
    "losses.sigmoid_focal_loss": lambda d: (
        lambda x, t, n: L.sigmoid_focal_loss(x, t, reduction="sum", normalizer=n),
        (*_focal_inputs(d), torch.tensor(3.0, device=d)),
    ),
    "losses.CompleteBoxIoULoss": _iou_loss_module(L.CompleteBoxIoULoss),
    "losses.DistanceBoxIoULoss": _iou_loss_module(L.DistanceBoxIoULoss),
    "losses.GeneralizedBoxIoULoss": _iou_loss_module(L.GeneralizedBoxIoULoss),
    "losses.complete_box_iou_loss": _iou_loss(L.complete_box_iou_loss),
    "losses.RotatedBoxIoULoss": lambda d: _module(
        d, L.RotatedBoxIoULoss(), _rboxes(d, 6, 0), _rboxes(d, 6, 1)
    ),
    "losses.rotated_box_iou_loss": lambda d: (
        lambda p, t: L.rotated_box_iou_loss(p, t, reduction="sum"),
        (_rboxes(d, 6, 0), _rboxes(d, 6, 1)),
    ),
    "losses.distance_box_iou_loss": _iou_loss(L.distance_box_iou_loss),
    "losses.generalized_box_iou_loss": _iou_loss(L.generalized_box_iou_loss),
    "losses.DistributionFocalLoss": lambda d: _module(
        d, L.DistributionFocalLoss(), *_dfl_inputs(d)
    ),
    "losses.distribution_focal_loss": lambda d: (
        lambda p, t, w, n: L.distribution_focal_loss(p, t, weight=w, reduction="sum", normalizer=n),
        (*_dfl_inputs(d), _randn(d, 3, 1).abs(), torch.tensor(4.0, device=d)),
    ),
    "losses.VarifocalLoss": lambda d: _module(d, L.VarifocalLoss(), *_soft_inputs(d)),
    "losses.varifocal_loss": lambda d: (
        lambda x, t, w: L.varifocal_loss(x, t, gamma=0.5, weight=w, reduction="none"),
        (*_soft_inputs(d), _randn(d, 3).abs()),
    ),
    "losses.QualityFocalLoss": lambda d: _module(d, L.QualityFocalLoss(), *_soft_inputs(d)),
    "losses.DiceLoss": lambda d: _module(
        d, L.DiceLoss("multiclass", ignore_index=-100), *_ce_inputs(d)
    ),
    "losses.dice_loss": lambda d: (
        lambda x, t: L.dice_loss(x, t, "multiclass", smooth=1.0, ignore_index=-100, per_image=True),
        _ce_inputs(d),
    ),
    "losses.JaccardLoss": lambda d: _module(
        d,
        L.JaccardLoss("multilabel", classes=[0, 2], class_weights=[1.0, 2.0, 0.5]),
        *_focal_inputs(d),
    ),
    "losses.jaccard_loss": lambda d: (
        lambda x, t: L.jaccard_loss(x, t, "multilabel", log_loss=True),
        _focal_inputs(d),
    ),
    "losses.TverskyLoss": lambda d: _module(
        d,
        L.TverskyLoss("binary", alpha=0.3, beta=0.7, gamma=0.75),
        _randn(d, 2, 1, 4, 4),
        (_randn(d, 2, 4, 4) > 0).float(),
    ),
    "losses.tversky_loss": lambda d: (
        lambda x, t, w: L.tversky_loss(
            x.softmax(1), t, "multiclass", from_logits=False, classes=[0, 1], class_weights=w
        ),
        (*_ce_inputs(d)[:1], _ce_inputs(d)[1].clamp_min(0), _randn(d, 3).abs() + 0.1),
    ),
    "losses.LovaszLoss": lambda d: _module(
        d, L.LovaszLoss("multilabel", per_image=True), *_focal_inputs(d)
    ),
    "losses.lovasz_loss": lambda d: (
        lambda x, t: L.lovasz_loss(x, t, "multiclass", ignore_index=-100),
        _ce_inputs(d),
    ),
    "losses.quality_focal_loss": lambda d: (
        lambda x, t: L.quality_focal_loss(x, t, beta=0.5, reduction="sum", normalizer=2.0),
        _soft_inputs(d),
    ),
    # ------------------------------------------------------------------------------- nn
    "nn.ChannelShuffle": lambda d: _module(d, vnn.ChannelShuffle(2), _image(d)),
    "nn.channel_shuffle": lambda d: (lambda x: vnn.channel_shuffle(x, 2), (_image(d),)),
    "nn.ConvNormAct": lambda d: _module(d, vnn.ConvNormAct(4, 6, 3), _image(d)),
    "nn.ConvNormAct3d": lambda d: _module(d, vnn.ConvNormAct3d(4, 6, 3), _image(d)[:, :, None]),
    "nn.DeformConv2d": lambda d: _module(
        d, vnn.DeformConv2d(4, 3, 3, padding=1), _image(d), _randn(d, 2, 18, 6, 7)
    ),
    "nn.Permute": lambda d: _module(d, vnn.Permute([0, 2, 3, 1]), _image(d)),
    "nn.DepthwiseConv2d": lambda d: _module(d, vnn.DepthwiseConv2d(4, 3, stride=2), _image(d)),
    "nn.DepthwiseSeparableConv2d": lambda d: _module(
        d, vnn.DepthwiseSeparableConv2d(4, 6), _image(d)
    ),
    "nn.Involution2d": lambda d: _module(
        d, vnn.Involution2d(4, kernel_size=3, groups=2, reduction=2), _image(d)
    ),
    "nn.LayerNorm2d": lambda d: _module(d, vnn.LayerNorm2d(4), _image(d)),
    "nn.LocalAttention2d": lambda d: _module(
        d, vnn.LocalAttention2d(4, kernel_size=3, num_heads=2), _image(d)
    ),
    "nn.LocalFilter2d": lambda d: _module(d, vnn.LocalFilter2d(4, kernel_size=3), _image(d)),
    # torchvision.ops' blocks: the modules in eval mode; the random functions with p=1, which
    # runs every op of the training path and gives values that do not depend on the draws.
    "nn.DropBlock2d": lambda d: _module(d, vnn.DropBlock2d(0.2, 3), _image(d)),
    "nn.DropBlock3d": lambda d: _module(d, vnn.DropBlock3d(0.2, 3), _image(d)[:, None]),
    "nn.drop_block2d": lambda d: (lambda x: vnn.drop_block2d(x, 1.0, 1), (_image(d),)),
    "nn.drop_block3d": lambda d: (lambda x: vnn.drop_block3d(x, 1.0, 1), (_image(d)[:, None],)),
    "nn.StochasticDepth": lambda d: _module(d, vnn.StochasticDepth(0.2), _image(d)),
    "nn.drop_path": lambda d: (lambda x: vnn.drop_path(x, 1.0, "batch"), (_image(d),)),
    "nn.FrozenBatchNorm2d": lambda d: _module(d, vnn.FrozenBatchNorm2d(4), _image(d)),
    "nn.SqueezeExcitation": lambda d: _module(d, vnn.SqueezeExcitation(4, 2), _image(d)),
    "nn.MLP": lambda d: _module(d, vnn.MLP(_image(d).shape[-1], [8, 3]), _image(d)),
    "nn.MultiScaleDeformableAttention": lambda d: _module(
        d,
        vnn.MultiScaleDeformableAttention(8, num_heads=2, num_levels=2, num_points=3),
        _randn(d, 2, 5, 8),
        _randn(d, 2, 5, 2, 2).sigmoid(),
        _randn(d, 2, 14, 8),
        torch.tensor([[3, 4], [1, 2]], device=d),
    ),
    "nn.make_activation": lambda d: _module(d, vnn.make_activation("silu"), _image(d)),
    "nn.make_norm": lambda d: _module(d, vnn.make_norm("gn", 4), _image(d)),
    # Fusion is arithmetic on the weights (run by the builder); then the fused forward.
    "nn.fuse_conv_bn": lambda d: _module(d, vnn.fuse_conv_bn(*_conv_bn(d)[:2]), _image(d)),
    "nn.fuse_modules": lambda d: _module(d, vnn.fuse_modules(_conv_bn(d)), _image(d)),
    "nn.find_conv_bn_pairs": lambda d: _module(d, _found(_conv_bn(d)), _image(d)),
    "metrics.SegmentationMetrics": lambda d: _segmentation_metrics(d),
}


# Other options of the losses, whose checks and paths differ (fake CUDA test only: fast).
OPTION_CASES: dict[str, Case] = {
    "cross_entropy(weight, top_k)": lambda d: (
        lambda x, t, w: L.cross_entropy(x, t, weight=w, top_k=0.3),
        (*_ce_inputs(d), _randn(d, 3).abs()),
    ),
    "cross_entropy(probabilities)": lambda d: (
        lambda x, t: L.cross_entropy(x, t.softmax(1)),
        (_randn(d, 2, 3, 4, 4), _randn(d, 2, 3, 4, 4)),
    ),
    "softmax_focal_loss(weight, alpha tensor, smoothing)": lambda d: (
        lambda x, t, w: L.softmax_focal_loss(x, t, alpha=w, weight=w, label_smoothing=0.1),
        (*_ce_inputs(d), _randn(d, 3).abs()),
    ),
    "binary_cross_entropy_with_logits(weight, pos_weight)": lambda d: (
        lambda x, t, w: L.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=w[0]),
        (*_focal_inputs(d), _randn(d, 4, 3).abs()),
    ),
    "dice_loss(binary, ignore, per image)": lambda d: (
        lambda x, t: L.dice_loss(x, t, "binary", ignore_index=-1, per_image=True),
        (
            _randn(d, 4, 1, 3),
            torch.tensor([[0, 1, -1], [1, 1, 0], [-1, -1, -1], [0, 0, 0]], device=d),
        ),
    ),
    "tversky_loss(multilabel, ignore, per image, log)": lambda d: (
        lambda x, t: L.tversky_loss(
            x, t, "multilabel", ignore_index=-1, per_image=True, log_loss=True
        ),
        (_randn(d, 4, 3), torch.tensor([[0, 1, -1], [1, 1, 0], [-1, -1, 1], [0, 1, 0]], device=d)),
    ),
    "lovasz_loss(multiclass, per image, classes)": lambda d: (
        lambda x, t: L.lovasz_loss(x, t, "multiclass", True, -100, classes=[0, 2]),
        _ce_inputs(d),
    ),
    "lovasz_loss(binary, ignore, probabilities)": lambda d: (
        lambda x, t: L.lovasz_loss(x.sigmoid(), t, "binary", True, -1, from_logits=False),
        (
            _randn(d, 4, 1, 3),
            torch.tensor([[0, 1, -1], [1, 1, 0], [-1, -1, -1], [0, 0, 0]], device=d),
        ),
    ),
    "sigmoid_focal_loss(index targets, ignore, weight, mean)": lambda d: (
        lambda x, t, w: L.sigmoid_focal_loss(x, t, weight=w, ignore_index=-1, reduction="mean"),
        (_randn(d, 4, 3), torch.tensor([0, 2, -1, 3], device=d), _randn(d, 4, 3).abs()),
    ),
}


def public_names() -> list[str]:
    """Every public name of ops, losses, nn, transforms and metrics, as ``"<package>.<name>"``."""
    return [
        f"{package.__name__.rsplit('.', 1)[-1]}.{name}"
        for package in (O, L, vnn, T, M)
        for name in package.__all__
    ]


def missing_cases() -> list[str]:
    """Public names with neither a case nor a reason in `NOT_TENSOR_OPS` or
    `DATA_DEPENDENT_OPS`."""
    return [
        n
        for n in public_names()
        if n not in CASES and n not in NOT_TENSOR_OPS and n not in DATA_DEPENDENT_OPS
    ]
