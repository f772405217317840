"""Determinism of every public op and loss on each of its paths (issue 18).

Paths: ``"torch"`` (the PyTorch path, with OpenCV switched off), ``"native"`` (the CPU
library of a fast path, where the op has one: OpenCV's warp) and ``"triton"`` (the kernel, here in
triton's interpreter, so this checks the code path, not GPU scheduling: the GPU claim rests
on `tests/package/test_determinism_mode.py`'s scan for atomics). Every case builds its inputs from a
fixed seed and runs forward and backward twice: outputs and gradients must be bitwise equal
(`torch.equal`). Threaded CPU paths run again with 1 and 2 threads on inputs cut into several
parts, and must give the same bits. ``CASES`` must name every public op and loss (`test_every_public_op_has_a_case`).
A third run in deterministic mode (``torch.use_deterministic_algorithms(True)``) must give
the same bits as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from torch import Tensor

from benchmarks.kernel_specs import record_launches
from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from visionblocks import kernels, losses, nn, ops, transforms
from visionblocks._core.dispatch import use_impl
from visionblocks.ops import _warp_opencv

WARP = "opencv"  # the CPU library of the warps
LF, LA = "local_filter", "local_attention"  # kernel modules


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _boxes(n: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    g = _gen(seed)
    xy = torch.rand(n, 2, generator=g, dtype=dtype) * 20
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g, dtype=dtype) * 10 + 0.5], 1)


def _run(fn: Callable[..., object], *inputs: Tensor, params: tuple[Tensor, ...] = ()) -> tuple:
    """Outputs of ``fn(*inputs)`` and the gradients of the floating inputs and ``params``,
    for a seeded random gradient of every output."""
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    result = fn(*leaves)
    outs = [
        o for o in (result if isinstance(result, tuple) else (result,)) if isinstance(o, Tensor)
    ]
    wrt = [x for x in (*leaves, *params) if x.requires_grad]
    diff = [o for o in outs if o.requires_grad]
    g = _gen(99)
    seeds = [torch.rand(o.shape, generator=g, dtype=o.dtype) for o in diff]
    grads = torch.autograd.grad(diff, wrt, seeds, allow_unused=True) if diff and wrt else ()
    return (*(o.detach() for o in outs), *(g for g in grads if g is not None))


def _module(build: Callable[[], torch.nn.Module], x: Tensor) -> tuple:
    torch.manual_seed(0)
    layer = build()
    return _run(layer, x, params=tuple(layer.parameters()))


@dataclass(frozen=True)
class Case:
    """One public op or loss: ``run()`` gives its outputs and gradients.

    Attributes:
        run: Builds seeded inputs, runs forward and backward.
        native: The CPU library its ``"native"`` path must use (None: no such path).
        kernel: Its kernel module in `visionblocks.kernels` (None: no ``"triton"`` path).
    """

    run: Callable[[], tuple]
    native: str | None = None
    kernel: str | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return ("torch",) + ("native",) * bool(self.native) + ("triton",) * bool(self.kernel)


def _focal(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(1)
        x = torch.randn(6, 5, generator=g) * 3
        labels, soft = torch.tensor([0, 4, 5, -1, 2, 2]), torch.rand(6, 5, generator=g)
        return (
            *_run(lambda a: fn(a, labels, reduction="sum"), x),  # class indices, summed
            *_run(lambda a: fn(a, soft, gamma=1.5, reduction="none"), x),
            *_run(lambda a, t: fn(a, t, reduction="mean"), x, soft),  # targets get grads too
        )

    return run


def _iou_loss(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        p, t = _boxes(7, 2), _boxes(7, 3)
        return (*_run(lambda a, b: fn(a, b), p, t), *_run(lambda a, b: fn(a, b, "sum"), p, t))

    return run


def _iou(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        a, b = _boxes(5, 4), _boxes(6, 5)
        return (*_run(fn, a, b), *_run(lambda x, y: fn(x, y, aligned=True), a, b[:5]))

    return run


def _local_filter() -> tuple:
    g = _gen(6)
    x, k = torch.randn(1, 4, 6, 6, generator=g), torch.randn(1, 18, 6, 6, generator=g)
    return _run(lambda a, b: ops.local_filter2d(a, b, 3), x, k)


def _local_attention() -> tuple:
    q, k, v = torch.randn(3, 1, 4, 5, 5, generator=_gen(7)).unbind(0)
    return _run(lambda a, b, c: ops.local_attention2d(a, b, c, 3, num_heads=2), q, k, v)


def _ms_deform_attn() -> tuple:
    # One batch item (the triton path runs in the interpreter, per (item, head)): 36 samples
    # a head on 27 value pixels, so pixels are shared by several samples.
    g, shapes = _gen(71), [(4, 5), (2, 3), (1, 1)]
    value = torch.randn(1, 27, 2, 4, generator=g)
    locations = torch.rand(1, 6, 2, 3, 2, 2, generator=g) * 1.2 - 0.1
    weights = torch.rand(1, 6, 2, 3, 2, generator=g)
    return (
        *_run(lambda v, x, a: ops.ms_deform_attn(v, shapes, x, a), value, locations, weights),
        *_run(
            lambda v, x, a: ops.ms_deform_attn(v, torch.tensor(shapes), x, a),
            value,
            locations,
            weights,
        ),
    )


def _ms_deform_attn_layer() -> tuple:
    torch.manual_seed(0)
    layer = nn.MultiScaleDeformableAttention(8, num_heads=2, num_levels=2, num_points=3)
    g = _gen(72)
    query, ref = torch.randn(2, 5, 8, generator=g), torch.rand(2, 5, 2, 2, generator=g)
    value = torch.randn(2, 14, 8, generator=g)
    fn = lambda q, r, v: layer(q, r, v, [(3, 4), (1, 2)])  # noqa: E731
    return _run(fn, query, ref, value, params=tuple(layer.parameters()))


def _sliding_windows() -> tuple:
    return _run(lambda x: ops.sliding_windows(x, 3, 2), torch.randn(1, 2, 5, 6, generator=_gen(17)))


def _warp() -> tuple:
    img = torch.rand(2, 3, 8, 9, generator=_gen(8))
    m = ops.affine_matrix(angle=17.0, translate=(1.5, -0.5), scale=1.1, center=(4.0, 4.0))
    plain = ops.warp_affine(img, m)  # no autograd: the C kernel where it runs
    return (
        plain,
        *_run(lambda a, b: ops.warp_affine(a, b, padding_mode="reflection"), img, m),
        *_run(lambda a, b: ops.warp_affine(a, b, size=(12, 11), mode="nearest"), img, m),
    )


def _warp_sample() -> tuple:
    from torchvision import tv_tensors

    boxes = tv_tensors.BoundingBoxes(_boxes(3, 9) / 2, format="XYXY", canvas_size=(16, 14))
    masks = tv_tensors.Mask((torch.rand(3, 16, 14, generator=_gen(9)) > 0.5).to(torch.uint8))
    image = tv_tensors.Image(torch.rand(3, 16, 14, generator=_gen(10)))
    points = tv_tensors.KeyPoints(_boxes(3, 13).view(3, 2, 2) / 2, canvas_size=(16, 14))
    # tight boxes: polygons for instances 0 and 2, the mask for instance 1
    polygons = [[_boxes(2, 11).view(4, 2) / 2], [], [_boxes(3, 12).view(6, 2) / 2]]
    m = ops.affine_matrix(angle=-9.0, translate=(2.0, 1.0), center=(7.0, 8.0))
    m = m * torch.tensor([[-1.0], [1.0]]) + torch.tensor([[0.0, 0.0, 13.0], [0.0, 0.0, 0.0]])
    target = {
        "boxes": boxes,
        "masks": masks,
        "labels": torch.arange(3),
        "keypoints": points,
        "keypoints_visibility": torch.tensor([[2, 1], [0, 2], [1, 1]]),
        "polygons": polygons,
    }
    out, target = transforms.warp_sample(image, target, m, flip_pairs=[(0, 1)])
    warped = [p for entry in target.pop("polygons") for p in entry]
    return out.as_subclass(Tensor), *(t.as_subclass(Tensor) for t in target.values()), *warped


def _random_affine() -> tuple:
    """Seeded: the same draw, the same warp (a flip with pairs, masks, boxes, key points)."""
    from torchvision import tv_tensors

    image = tv_tensors.Image((torch.rand(3, 16, 14, generator=_gen(14)) * 255).to(torch.uint8))
    target = {
        "boxes": tv_tensors.BoundingBoxes(_boxes(3, 15) / 2, format="XYXY", canvas_size=(16, 14)),
        "masks": tv_tensors.Mask((torch.rand(3, 16, 14, generator=_gen(16)) > 0.5).to(torch.uint8)),
        "keypoints": tv_tensors.KeyPoints(_boxes(3, 17).view(3, 2, 2) / 2, canvas_size=(16, 14)),
        "labels": torch.arange(3),
    }
    augment = transforms.RandomAffine(
        30.0, (0.2, 0.2), (0.7, 1.3), 10.0, hflip=1.0, flip_pairs=[(0, 1)]
    )
    torch.manual_seed(0)
    out, target = augment(image, target)
    return out.as_subclass(Tensor), *(t.as_subclass(Tensor) for t in target.values())


def _cross_entropy(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(11)
        x, t = torch.randn(4, 3, 5, 2, generator=g), torch.randint(0, 3, (4, 5, 2), generator=g)
        t[0, 0, 0] = -100
        return (*_run(lambda a: fn(a, t), x), *_run(lambda a: fn(a, t, top_k=0.4), x))

    return run


def _bce(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(12)
        x, t = torch.randn(5, 4, generator=g), (torch.rand(5, 4, generator=g) > 0.5).float()
        t[0, 0] = -1.0
        return (*_run(lambda a: fn(a, t, ignore_index=-1.0, label_smoothing=0.1), x),)

    return run


def _softmax_focal(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(13)
        x, t = torch.randn(6, 4, 3, generator=g), torch.randint(0, 4, (6, 3), generator=g)
        w = torch.tensor([1.0, 2.0, 0.5, 1.5])
        return (*_run(lambda a: fn(a, t, alpha=w, weight=w, label_smoothing=0.1), x),)

    return run


def _overlap(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    """``fn(pred, target, mode, **options)`` (or a module class): the three modes, ignored
    pixels, per image (the multiclass statistics are sums scattered into class bins)."""

    def run() -> tuple:
        g = _gen(17)
        x, t = torch.randn(3, 4, 6, 5, generator=g), torch.randint(0, 4, (3, 6, 5), generator=g)
        t[0, 0] = 255
        tl = torch.randint(0, 2, (3, 4, 6, 5), generator=g)
        call = (lambda a, b, mode, **kw: fn(mode, **kw)(a, b)) if isinstance(fn, type) else fn
        return (
            *_run(lambda a: call(a, t, "multiclass", ignore_index=255), x),
            *_run(lambda a: call(a, t, "multiclass", ignore_index=255, per_image=True), x),
            *_run(lambda a: call(a, tl, "multilabel", smooth=1.0), x),
            *_run(lambda a: call(a[:, :1], tl[:, 0], "binary", per_image=True), x),
        )

    return run


def _lovasz(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    """``fn(pred, target, mode, per_image, ignore_index)`` (or the module class): the three
    modes, ignored pixels, per image; the large multiclass call takes the CPU radix sort."""

    def run() -> tuple:
        g = _gen(18)
        x, t = torch.randn(2, 4, 64, 64, generator=g), torch.randint(0, 4, (2, 64, 64), generator=g)
        t[0, 0] = 255
        tl = torch.randint(0, 2, (2, 4, 6, 5), generator=g)
        call = (lambda a, b, *args: fn(*args)(a, b)) if isinstance(fn, type) else fn
        s = x[:, :, :6, :5]
        return (
            *_run(lambda a: call(a, t, "multiclass", False, 255), x),
            *_run(lambda a: call(a, t[:, :6, :5], "multiclass", True, 255), s),
            *_run(lambda a: call(a, tl, "multilabel", False, None), s),
            *_run(lambda a: call(a[:, :1], tl[:, 0], "binary", True, 1), s),
        )

    return run


def _dfl(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    """``fn(pred, target, weight)``: distances in bins, a per-box weight."""

    def run() -> tuple:
        g = _gen(15)
        x, t = torch.randn(6, 4, 9, generator=g), torch.rand(6, 4, generator=g) * 8
        return _run(fn, x, t, torch.rand(6, 1, generator=g))

    return run


def _soft(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    """``fn(pred, target, weight)``: IoU-aware scores (0 for negatives), a per-class weight."""

    def run() -> tuple:
        g = _gen(16)
        x, q = torch.randn(6, 4, generator=g), torch.rand(6, 4, generator=g)
        return _run(fn, x, torch.where(q > 0.6, q, 0.0), torch.rand(4, generator=g))

    return run


def _loss_module(cls: type) -> Callable[..., Tensor]:
    """The loss module ``cls`` called like its function: ``fn(*tensors, [reduction], **kw)``."""

    def fn(*args: object, reduction: str = "mean", **options: object) -> Tensor:
        if isinstance(args[-1], str):  # the box losses' positional reduction
            *args, reduction = args
        return cls(reduction=reduction, **options)(*args)

    return fn


def _affine() -> tuple:
    g = _gen(14)
    angle, shift = torch.randn(3, generator=g) * 20, torch.randn(3, 2, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    return _run(
        lambda a, t, s: ops.affine_matrix(angle=a, translate=t, scale=s), angle, shift, scale
    )


def _matrices() -> tuple:
    m = _affine()[0]
    return (
        *_run(ops.invert_affine, m),
        *_run(lambda a: ops.matrix_to_theta(a, (8, 9), (6, 7)), m),
        *_run(lambda a: ops.theta_to_matrix(a, (8, 9), (6, 7)), m),
    )


def _warp_targets() -> tuple:
    m = _affine()[0]
    mirrored = m[:2, None] * torch.tensor([[[1.0], [1.0]], [[-1.0], [1.0]]])  # (2, 1, 2, 3)
    visibility = torch.tensor([[2, 1], [0, 2]]).expand(2, 2, 2)
    masks = (torch.rand(3, 9, 8, generator=_gen(20)) > 0.5).to(torch.uint8)
    return (
        *_run(lambda b, a: ops.warp_boxes(b, a, (20, 20)), _boxes(4, 18), m[0]),
        *_run(ops.warp_points, _boxes(4, 19).view(4, 2, 2), m[:1]),
        *_run(
            lambda p, a: ops.warp_keypoints(p, a, (20, 20), visibility, [(0, 1)]),
            _boxes(4, 19).view(2, 2, 2, 2),
            mirrored,
        ),
        ops.warp_masks(masks, m[0]),
    )


def _layer(build: Callable[[], torch.nn.Module], kernel: str, *shape: int) -> Case:
    """A `visionblocks.nn` layer with a custom op (its triton op ``kernel``), on ``shape``."""
    x = torch.randn(*shape, generator=_gen(sum(shape)))
    return Case(lambda: _module(build, x), kernel=kernel)


def _oks() -> tuple:
    g = _gen(21)
    gt = torch.rand(4, 17, 2, generator=g) * 50
    pred = gt.repeat(3, 1, 1) + torch.randn(12, 17, 2, generator=g)
    visibility = torch.randint(0, 3, (4, 17), generator=g)
    visibility[0] = 0  # no labelled point: pycocotools' grown-box rule
    areas = torch.rand(4, generator=g) * 400 + 100
    return _run(
        lambda p, t, a, b: ops.keypoint_oks(p, t, visibility, a, boxes=b),
        pred,
        gt,
        areas,
        _boxes(4, 22),
    )


def _rboxes(n: int, seed: int) -> Tensor:
    """Overlapping rotated boxes ``(cx, cy, w, h, degrees)``; one equal pair, one 180 apart."""
    g = _gen(seed)
    xy, wh = torch.rand(n, 2, generator=g) * 6, torch.rand(n, 2, generator=g) * 5 + 1
    boxes = torch.cat([xy, wh, torch.rand(n, 1, generator=g) * 180 - 90], 1)
    boxes[1] = boxes[0] + torch.tensor([0.0, 0.0, 0.0, 0.0, 180.0])
    return boxes


def _rotated() -> tuple:
    a, b = _rboxes(6, 41), _rboxes(5, 42)
    b[0] = a[0]
    return (
        *_run(ops.rotated_box_iou, a, b),
        *_run(lambda x, y: ops.rotated_box_iou(x, y, "cxcywhr", aligned=True), a[:5], b),
    )


def _rotated_loss(fn: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        p, t = _rboxes(7, 43), _rboxes(7, 44)
        return (*_run(lambda a, b: fn(a, b), p, t), *_run(lambda a, b: fn(a, b, "sum"), p, t))

    return run


def _nms_rotated() -> tuple:
    boxes, scores = _rboxes(40, 45), torch.rand(40, generator=_gen(46))
    scores[3] = scores[4]  # a tie
    idxs = torch.randint(0, 3, (40,), generator=_gen(47))
    return (
        *_run(lambda b, s: ops.nms_rotated(b, s, 0.3), boxes, scores),
        *_run(lambda b, s: ops.batched_nms_rotated(b, s, idxs, 0.3), boxes, scores),
    )


def _rotated_roi_align(module: bool = False) -> Callable[[], tuple]:
    def run() -> tuple:
        x = torch.randn(2, 3, 9, 10, generator=_gen(49))
        rois = torch.cat([torch.tensor([[0.0], [1]]), _rboxes(2, 50)], 1)  # a box per image
        rois = torch.cat([rois, rois])  # each twice, overlapping: pixels shared by several
        call = (
            ops.RotatedRoIAlign(2, 1.0, 2)
            if module
            else lambda a, r: ops.rotated_roi_align(a, r, 2)
        )
        return _run(call, x, rois)

    return run


def _roi_pooling(call: Callable[..., Tensor]) -> Callable[[], tuple]:
    def run() -> tuple:
        x = torch.randn(2, 8, 9, 18, generator=_gen(62))
        rois = torch.cat([torch.tensor([[0.0], [1], [0], [1]]), _boxes(4, 63) * 1.5], 1)
        return _run(call, x, torch.cat([rois, rois]))  # overlapping RoIs share pixels

    return run


def _multiscale() -> tuple:
    pool = ops.MultiScaleRoIAlign(["a", "b"], 2, 2, canonical_scale=8)
    x = torch.randn(2, 4, 16, 16, generator=_gen(64))
    boxes = [_boxes(3, 65) * 2, _boxes(2, 66) * 3]
    return _run(lambda a, b: pool({"a": a, "b": b}, boxes, [(32, 32)] * 2), x, x[..., ::2, ::2])


def _hungarian(match: Callable[..., list]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(48)
        logits, boxes = torch.randn(2, 6, 4, generator=g), torch.rand(2, 6, 4, generator=g) / 2
        boxes_t = torch.rand(3, 4, generator=g) / 2 + 0.1
        targets = [{"labels": torch.tensor(labels).long(), "boxes": boxes_t[: len(labels)]}
                   for labels in ([1, 3, 0], [])]  # fmt: skip

        def pairs(a: Tensor, b: Tensor) -> tuple:
            matched = match({"pred_logits": a, "pred_boxes": b}, targets)
            return tuple(i for pair in matched for i in pair)

        return _run(pairs, logits, boxes)

    return run


def _nms() -> tuple:
    boxes, scores = _boxes(40, 49), torch.rand(40, generator=_gen(50))
    scores[3] = scores[4]  # a tie
    idxs = torch.randint(0, 3, (40,), generator=_gen(51))
    return (
        *_run(lambda b, s: ops.nms(b, s, 0.3), boxes, scores),
        *_run(lambda b, s: ops.batched_nms(b, s, idxs, 0.3), boxes, scores),
        *_run(lambda b, s: ops.soft_nms(b, s, method="gaussian"), boxes, scores),
        *_run(lambda b, s: ops.batched_soft_nms(b, s, idxs), boxes, scores),
        *_run(lambda b, s: ops.matrix_nms(s, boxes=b, labels=idxs), boxes, scores),
    )


def _masks() -> tuple:
    g = _gen(62)
    masks, boxes = torch.rand(6, 7, 7, generator=g), _boxes(6, 63)
    return (
        *_run(lambda m, b: ops.paste_masks(m, b, (14, 12)), masks, boxes),
        *_run(lambda m, b: ops.crop_masks(m, b), masks, boxes),
        ops.mask_iou(masks > 0.5, masks > 0.3),
        ops.masks_to_boxes(masks > 0.8),
    )


def _deform_conv() -> tuple:
    g = _gen(64)
    x, offset = torch.randn(1, 4, 6, 6, generator=g), torch.randn(1, 18, 6, 6, generator=g)
    weight, mask = torch.randn(3, 4, 3, 3, generator=g), torch.rand(1, 9, 6, 6, generator=g)
    return _run(lambda *t: ops.deform_conv2d(*t[:3], padding=1, mask=t[3]), x, offset, weight, mask)


def _deform_conv_layer() -> tuple:
    g = _gen(65)
    x, offset = torch.randn(1, 4, 6, 6, generator=g), torch.randn(1, 18, 6, 6, generator=g)
    torch.manual_seed(0)
    layer = nn.DeformConv2d(4, 3, 3, padding=1)
    return _run(layer, x, offset, params=tuple(layer.parameters()))


def _priors() -> tuple:
    levels = [torch.zeros(1, 1, 6, 5), torch.zeros(1, 1, 3, 3)]
    images = torch.zeros(2, 3, 48, 40)
    generator = ops.AnchorGenerator(((32,), (64, 80)), ((0.5, 1.0, 2.0),) * 2)
    return (
        *ops.make_anchor_points(levels, [8, 16]),
        ops.make_anchor_boxes(levels, [8, 16], (32, 64), (0.5, 1.0)),
        *_run(lambda x: generator(x, levels), images),
    )


def _coders() -> tuple:
    anchors, boxes = _boxes(30, 52), _boxes(30, 53)
    points = (anchors[:, :2] + anchors[:, 2:]) / 2
    weights = (10.0, 10.0, 5.0, 5.0)
    return (
        *_run(lambda p, b: ops.encode_distances(p, b, reg_max=15), points, boxes),
        *_run(lambda p, d: ops.decode_distances(p, d.abs(), "cxcywh"), points, anchors),
        *_run(lambda a, b: ops.encode_deltas(a, boxes=b, weights=weights), anchors, boxes),
        *_run(lambda a, d: ops.decode_deltas(a, deltas=d / 10), anchors, boxes),
    )


def _task_aligned(assign: Callable[..., tuple]) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(54)
        pred = torch.stack([_boxes(60, 55), _boxes(60, 56)])
        gt = torch.stack([_boxes(5, 57), _boxes(5, 58)])
        scores = torch.rand(2, 60, 4, generator=g)
        points = (pred[0, :, :2] + pred[0, :, 2:]) / 2
        labels = torch.randint(0, 4, (2, 5, 1), generator=g)
        mask = torch.ones(2, 5, 1, dtype=torch.bool)
        mask[1, 3:] = False  # padding
        return _run(lambda s, b, t: tuple(assign(s, b, points, labels, t, mask)), scores, pred, gt)

    return run


def _dynamic_k(assign: Callable[..., tuple], logits: bool) -> Callable[[], tuple]:
    def run() -> tuple:
        g = _gen(59)
        centres = torch.rand(60, 2, generator=g) * 30
        priors = torch.cat([centres, torch.full((60, 2), 8.0)], 1)
        pred, gt = _boxes(60, 60), _boxes(6, 61)
        scores = torch.randn(60, 4, generator=g)
        scores = scores if logits else scores.sigmoid()
        labels = torch.randint(0, 4, (6,), generator=g)
        return _run(lambda b, s, t: tuple(assign(priors, b, s, t, labels)), pred, scores, gt)

    return run


CASES: dict[str, Case] = {
    "keypoint_oks": Case(_oks),
    "nms": Case(_nms),
    "batched_nms": Case(_nms),
    "soft_nms": Case(_nms),
    "batched_soft_nms": Case(_nms),
    "matrix_nms": Case(_nms),
    "paste_masks": Case(_masks),
    "deform_conv2d": Case(_deform_conv),
    "crop_masks": Case(_masks),
    "mask_iou": Case(_masks),
    "masks_to_boxes": Case(_masks),
    "clip_boxes_to_image": Case(
        lambda: _run(lambda b: ops.clip_boxes_to_image(b, (20, 25)), _boxes(8, 17))
    ),
    "remove_small_boxes": Case(lambda: (ops.remove_small_boxes(_boxes(8, 18), 5.0),)),
    "make_anchor_points": Case(_priors),
    "make_anchor_boxes": Case(_priors),
    "AnchorGenerator": Case(_priors),
    "encode_distances": Case(_coders),
    "decode_distances": Case(_coders),
    "encode_deltas": Case(_coders),
    "decode_deltas": Case(_coders),
    "task_aligned_assign": Case(
        _task_aligned(lambda *a: ops.task_aligned_assign(*a, topk=3, block_bytes=64))
    ),
    "TaskAlignedAssigner": Case(_task_aligned(ops.TaskAlignedAssigner(topk=3))),
    "simota_assign": Case(
        _dynamic_k(lambda *a: ops.simota_assign(*a, block_bytes=64), logits=False)
    ),
    "dynamic_soft_label_assign": Case(
        _dynamic_k(lambda *a: ops.dynamic_soft_label_assign(*a, block_bytes=64), logits=True)
    ),
    "rotated_box_iou": Case(_rotated, kernel="rotated_iou"),
    "rotated_box_iou_loss": Case(_rotated_loss(ops.rotated_box_iou_loss)),
    "RotatedBoxIoULoss": Case(_rotated_loss(_loss_module(losses.RotatedBoxIoULoss))),
    "rotated_roi_align": Case(_rotated_roi_align(), kernel="rotated_roi_align"),
    "RotatedRoIAlign": Case(_rotated_roi_align(module=True), kernel="rotated_roi_align"),
    "roi_align": Case(_roi_pooling(lambda x, r: ops.roi_align(x, r, 2, 0.5)), kernel="roi_align"),
    "roi_pool": Case(_roi_pooling(lambda x, r: ops.roi_pool(x, r, 3, 0.5)), kernel="roi_align"),
    "ps_roi_align": Case(
        _roi_pooling(lambda x, r: ops.ps_roi_align(x, r, 2, 0.5, 2)), kernel="roi_align"
    ),
    "ps_roi_pool": Case(
        _roi_pooling(lambda x, r: ops.ps_roi_pool(x, r, 2, 0.5)), kernel="roi_align"
    ),
    "RoIAlign": Case(_roi_pooling(ops.RoIAlign(2, 0.5, 2, True)), kernel="roi_align"),
    "RoIPool": Case(_roi_pooling(ops.RoIPool(3, 0.5)), kernel="roi_align"),
    "PSRoIAlign": Case(_roi_pooling(ops.PSRoIAlign(2, 0.5, 2)), kernel="roi_align"),
    "PSRoIPool": Case(_roi_pooling(ops.PSRoIPool(2, 0.5)), kernel="roi_align"),
    "MultiScaleRoIAlign": Case(_multiscale),
    "nms_rotated": Case(_nms_rotated),
    "batched_nms_rotated": Case(_nms_rotated),
    "best_box_iou": Case(
        lambda: _run(
            lambda a, b: ops.best_box_iou(a, b, block_bytes=64), _boxes(40, 31), _boxes(9, 32)
        ),
        kernel="assign",
    ),
    "match_anchors": Case(
        lambda: _run(
            lambda a, b: ops.match_anchors(
                a,
                boxes=b,
                high_threshold=0.5,
                low_threshold=0.3,
                allow_low_quality_matches=True,
                block_bytes=64,
            ),
            _boxes(40, 33),
            _boxes(9, 34),
        ),
        kernel="assign",
    ),
    "atss_assign": Case(
        lambda: _run(
            lambda a, b: ops.atss_assign(a, b, [30, 10], topk=4, block_bytes=64),
            _boxes(40, 35),
            _boxes(9, 36),
        )
    ),
    "hungarian_match": Case(_hungarian(ops.hungarian_match)),
    "HungarianMatcher": Case(_hungarian(ops.HungarianMatcher(2.0, 5.0, 2.0, focal=True))),
    "affine_matrix": Case(_affine),
    "invert_affine": Case(_matrices),
    "compose_affine": Case(lambda: _run(ops.compose_affine, _affine()[0], _affine()[0].flip(0))),
    "matrix_to_theta": Case(_matrices),
    "theta_to_matrix": Case(_matrices),
    "box_area": Case(lambda: _run(ops.box_area, _boxes(5, 15))),
    "box_convert": Case(
        lambda: _run(lambda b: ops.box_convert(b, "xyxy", "cxcywh"), _boxes(5, 16))
    ),
    "sliding_windows": Case(_sliding_windows),
    "warp_affine": Case(_warp, native=WARP),
    "warp_boxes": Case(_warp_targets),
    "warp_points": Case(_warp_targets),
    "warp_keypoints": Case(_warp_targets),
    "warp_masks": Case(_warp_targets),
    "warp_sample": Case(_warp_sample, native=WARP),
    "RandomAffine": Case(_random_affine, native=WARP),
    "local_filter2d": Case(_local_filter, kernel=LF),
    "local_attention2d": Case(_local_attention, kernel=LA),
    "ms_deform_attn": Case(_ms_deform_attn, kernel="ms_deform_attn"),
    "softmax_focal_loss": Case(_softmax_focal(losses.softmax_focal_loss)),
    "dice_loss": Case(_overlap(losses.dice_loss)),
    "DiceLoss": Case(_overlap(losses.DiceLoss)),
    "jaccard_loss": Case(_overlap(losses.jaccard_loss)),
    "JaccardLoss": Case(_overlap(losses.JaccardLoss)),
    "tversky_loss": Case(_overlap(losses.tversky_loss)),
    "TverskyLoss": Case(_overlap(losses.TverskyLoss)),
    "lovasz_loss": Case(_lovasz(losses.lovasz_loss)),
    "LovaszLoss": Case(_lovasz(losses.LovaszLoss)),
    "SoftmaxFocalLoss": Case(_softmax_focal(_loss_module(losses.SoftmaxFocalLoss))),
    "cross_entropy": Case(_cross_entropy(losses.cross_entropy)),
    "CrossEntropyLoss": Case(_cross_entropy(_loss_module(losses.CrossEntropyLoss))),
    "binary_cross_entropy_with_logits": Case(_bce(losses.binary_cross_entropy_with_logits)),
    "BCEWithLogitsLoss": Case(_bce(_loss_module(losses.BCEWithLogitsLoss))),
    "distribution_focal_loss": Case(
        _dfl(lambda p, t, w: losses.distribution_focal_loss(p, t, weight=w, reduction="sum"))
    ),
    "DistributionFocalLoss": Case(_dfl(losses.DistributionFocalLoss(reduction="none"))),
    "varifocal_loss": Case(_soft(lambda p, t, w: losses.varifocal_loss(p, t, weight=w))),
    "VarifocalLoss": Case(_soft(losses.VarifocalLoss(gamma=0.5, reduction="none"))),
    "quality_focal_loss": Case(_soft(lambda p, t, w: losses.quality_focal_loss(p, t, weight=w))),
    "QualityFocalLoss": Case(_soft(losses.QualityFocalLoss(beta=0.5, reduction="sum"))),
    "sigmoid_focal_loss": Case(_focal(losses.sigmoid_focal_loss), kernel="focal"),
    "SigmoidFocalLoss": Case(_focal(_loss_module(losses.SigmoidFocalLoss)), kernel="focal"),
    # nn layers with a custom op (the others are plain torch layers: NN_PLAIN)
    "Involution2d": _layer(lambda: nn.Involution2d(8, 3, 2, groups=2), LF, 1, 8, 6, 6),
    "LocalFilter2d": _layer(lambda: nn.LocalFilter2d(4, 3, groups=2), LF, 1, 4, 5, 6),
    "LocalAttention2d": _layer(lambda: nn.LocalAttention2d(8, 3, 2), LA, 1, 8, 5, 5),
    "MultiScaleDeformableAttention": Case(_ms_deform_attn_layer, kernel="ms_deform_attn"),
    "DeformConv2d": Case(_deform_conv_layer),
}
for _name in ("box_iou", "generalized_box_iou", "distance_box_iou", "complete_box_iou"):
    CASES[_name] = Case(_iou(getattr(ops, _name)))
for _name, _cls in (
    ("generalized_box_iou_loss", losses.GeneralizedBoxIoULoss),
    ("distance_box_iou_loss", losses.DistanceBoxIoULoss),
    ("complete_box_iou_loss", losses.CompleteBoxIoULoss),
):
    CASES[_name] = Case(_iou_loss(getattr(ops, _name)), kernel="iou")
    CASES[_cls.__name__] = Case(_iou_loss(_loss_module(_cls)), kernel="iou")
NN_PLAIN = {
    "ChannelShuffle", "ConvNormAct", "ConvNormAct3d", "Permute", "DepthwiseConv2d", "DepthwiseSeparableConv2d", "LayerNorm2d",
    "DropBlock2d", "DropBlock3d", "FrozenBatchNorm2d", "MLP", "SqueezeExcitation",
    "StochasticDepth", "drop_block2d", "drop_block3d", "drop_path",
    "channel_shuffle", "find_conv_bn_pairs", "fuse_conv_bn", "fuse_modules", "make_activation",
    "make_norm",
}  # fmt: skip
"""`visionblocks.nn` names built from torch layers and ops only (no custom op, no kernel)."""
NOT_OPS = {
    "BELOW_LOW_THRESHOLD",
    "BETWEEN_THRESHOLDS",
    "BestIoU",
    "DynamicKAssignment",
    "TaskAlignedTargets",
    "BOX_FORMATS",
    "COCO_PERSON_SIGMAS",
    "keypoint_flip_pairs",
    "flip_permutation",
}  # constants; names to
# index pairs and pairs to an index (no tensor computation to repeat)


@contextmanager
def on_path(path: str) -> Iterator[dict[str, set]]:
    """Run on ``path``; yields ``{"native": libraries asked for, "kernels": launched}``."""
    seen: dict[str, set] = {"native": set(), "kernels": set()}
    with ExitStack() as stack:
        real = _warp_opencv.opencv

        def spy() -> object:
            seen["native"].add(WARP)
            return real()

        stack.enter_context(
            mock.patch.object(_warp_opencv, "opencv", spy if path == "native" else lambda: None)
        )
        stack.enter_context(use_impl("triton" if path == "triton" else "torch"))
        specs = stack.enter_context(record_launches())
        yield seen
        seen["kernels"] = {s.kernel.partition(":")[0].rpartition(".")[2] for s in specs}


def _params() -> list[object]:
    """``(name, path)`` for every case and each of its paths (triton: where it can run)."""
    out = []
    for name, case in CASES.items():
        for path in case.paths:
            marks = ()
            if path == "triton":
                marks = pytest.mark.skipif(not _TRITON_RUNNABLE, reason=_NO_TRITON)
            out.append(pytest.param(name, path, id=f"{name}-{path}", marks=marks))
    return out


def _assert_equal(first: tuple, second: tuple, what: str) -> None:
    assert len(first) == len(second) > 0
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert torch.equal(a, b), f"result {i} differs {what}"


@contextmanager
def deterministic_algorithms(mode: bool, warn_only: bool = False) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(mode, warn_only=...)`` inside the block only."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize(("name", "path"), _params())
def test_two_runs_give_the_same_bits(name: str, path: str) -> None:
    """Two runs are bitwise equal, and a third in deterministic mode too: on CPU, no path
    calls an op torch refuses there, and none reads memory it did not write (torch fills
    uninitialised memory with NaN in that mode)."""
    case = CASES[name]
    if path == "native" and _warp_opencv.opencv() is None:
        pytest.skip("OpenCV 5 is not installed")
    with on_path(path) as seen:
        first = case.run()
    with on_path(path):
        second = case.run()
    _assert_equal(first, second, "between two runs")
    with deterministic_algorithms(True), on_path(path):
        strict = case.run()
    _assert_equal(first, strict, "in deterministic mode")
    # The path really ran: its CPU library was asked for, its kernels launched (or not).
    assert seen["native"] == ({case.native} if path == "native" else set())
    assert seen["kernels"] == ({case.kernel} if path == "triton" else set())


def test_every_public_op_has_a_case() -> None:
    public = {n for n in (*ops.__all__, *losses.__all__, *transforms.__all__) if n not in NOT_OPS}
    assert public <= set(CASES), f"no determinism case for {sorted(public - set(CASES))}"
    custom = set(CASES) - public
    assert custom | NN_PLAIN == set(nn.__all__) and not custom & NN_PLAIN
    # Every kernel and the CPU library are exercised by some case.
    assert {c.kernel for c in CASES.values()} - {None} == set(kernels.available()["kernels"])
    assert {c.native for c in CASES.values()} - {None} == {WARP}
