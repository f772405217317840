"""The public ops of `visionblocks.ops` (losses aside) under ``torch.autocast``.

The rule the docstrings state: every op computes in float32 (float64 for float64 inputs)
whatever the autocast state, because none of them runs an op that autocast lowers (no
``matmul``/``conv``: `warp_points` and the warp grids use element-wise products for that
reason). So, on CPU with ``torch.autocast("cpu", dtype=torch.bfloat16)``:

- float32 inputs give bitwise the float32 results and gradients of a call outside autocast;
- bfloat16 inputs (inside or outside autocast) follow each op's dtype policy (``HALF``):
  ``"float32"`` returns float32 (the IoU family, `box_area`), ``"rounded"`` returns the
  input dtype holding the float32 result rounded once (geometry, warps, local ops),
  ``"native"`` computes in the input dtype as torchvision does (`box_convert`).

On CUDA (skipped without it) the same checks run under float16 and bfloat16 autocast with
tolerances, the local ops through the Triton kernels as well as the torch path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

import visionblocks.ops as ops
from tests.helpers import cuda_autocast_dtypes
from visionblocks import kernels, transforms
from visionblocks.transforms import warp_sample

CUDA_AUTOCASTS = cuda_autocast_dtypes(
    "CUDA not available: the CUDA autocast (and Triton kernel) checks need a GPU"
)

NOT_APPLICABLE = {
    "BELOW_LOW_THRESHOLD": "an int constant: no computation",
    "BETWEEN_THRESHOLDS": "an int constant: no computation",
    "BestIoU": "a NamedTuple type: no computation (best_box_iou has cases)",
    "BOX_FORMATS": "a tuple of format names: no computation",
    "keypoint_flip_pairs": "names to index pairs: no tensors",
    "flip_permutation": "index pairs to an int64 index: no floating computation",
    "remove_small_boxes": "int64 indices from a subtraction and comparisons in the boxes' dtype "
    "(no op autocast lowers); bfloat16 boxes in tests/ops/test_clip_remove_boxes.py",
    "COCO_PERSON_SIGMAS": "a tuple of 17 floats: no computation",
    "RandomAffine": "a random transform: its warp is warp_sample's (which has a case)",
    "TaskAlignedTargets": "a NamedTuple type: no computation (task_aligned_assign has cases)",
    "DynamicKAssignment": "a NamedTuple type: no computation (simota_assign has cases)",
}
LOSSES = {
    name: "a loss: its autocast behaviour is tested with the losses"
    for name in ops.__all__
    if name.endswith("_loss")
}


@dataclass
class Case:
    op: str  # the public name
    build: Callable[[torch.device], tuple[Callable[..., Any], list[Tensor]]]
    half: str  # "float32" | "rounded" | "native": what bfloat16 inputs give
    grad: bool = True


def _boxes(n: int, device: torch.device, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 600
    return torch.cat((xy, xy + 4 + torch.rand(n, 2, generator=gen) * 200), -1).to(device)


def _rboxes(n: int, device: torch.device, seed: int) -> Tensor:
    """Rotated boxes ``(cx, cy, w, h, degrees)``, overlapping, exact in bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 300
    wh = 4 + torch.rand(n, 2, generator=gen) * 100
    boxes = torch.cat((xy, wh, torch.rand(n, 1, generator=gen) * 180 - 90), -1)
    return boxes.bfloat16().float().to(device)


def _rrois(device: torch.device) -> Tensor:
    """``(6, 6)`` rotated RoIs (batch index, then a rotated box) on two images of 20 x 18."""
    batch = torch.tensor([[0.0], [1], [1], [0], [0], [1]])
    return torch.cat((batch, _rboxes(6, torch.device("cpu"), 7) / 15), 1).to(device)


def _rois(device: torch.device) -> Tensor:
    """``(6, 5)`` RoIs (batch index, then an ``"xyxy"`` box) on two images of 20 x 18."""
    batch = torch.tensor([[0.0], [1], [1], [0], [0], [1]])
    return torch.cat((batch, _boxes(6, torch.device("cpu"), 8) / 40), 1).to(device)


def _matrices(device: torch.device, batch: int = 2) -> Tensor:
    gen = torch.Generator().manual_seed(3)
    return ops.affine_matrix(
        angle=torch.rand(batch, generator=gen) * 60 - 30,
        translate=torch.rand(batch, 2, generator=gen) * 40 - 20,
        scale=torch.rand(batch, generator=gen) + 0.5,
        center=torch.tensor([320.0, 240.0]),
    ).to(device)


def _img_matrices(device: torch.device, batch: int = 2) -> Tensor:
    """Rotations, scales and shifts that keep a ~24 x 30 image mostly in view."""
    gen = torch.Generator().manual_seed(4)
    return ops.affine_matrix(
        angle=torch.rand(batch, generator=gen) * 60 - 30,
        translate=torch.rand(batch, 2, generator=gen) * 4 - 2,
        scale=torch.rand(batch, generator=gen) * 0.5 + 0.8,
        center=torch.tensor([14.5, 11.5]),
    ).to(device)


def _randn(device: torch.device | str, *shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _iou_cases() -> list[Case]:
    cases = []
    for name in ("box_iou", "generalized_box_iou", "distance_box_iou", "complete_box_iou"):
        for aligned in (False, True):
            fn = getattr(ops, name)
            cases.append(
                Case(
                    name,
                    lambda d, fn=fn, al=aligned: (
                        lambda a, b: fn(a, b, aligned=al),
                        [_boxes(24, d, 1), _boxes(24 if al else 17, d, 2)],
                    ),
                    "float32",
                )
            )
    return cases


def _warp_affine(padding: str, mode: str = "bilinear", grad: bool = True) -> Case:
    """Without gradients, bilinear zeros padding runs the C kernel on CPU; else grid_sample."""

    def build(d: torch.device) -> tuple[Callable[..., Any], list[Tensor]]:
        def fn(img: Tensor, matrix: Tensor) -> Tensor:
            fill = 0.25 if padding == "fill" else 0.0
            return ops.warp_affine(img, matrix, (20, 26), mode, padding, fill)  # type: ignore[arg-type]

        return fn, [_randn(d, 2, 3, 24, 30), _img_matrices(d)]

    return Case("warp_affine", build, "rounded", grad)


def _local(impl: str) -> list[Case]:
    """The local ops with ``impl`` ("torch" on CPU; "triton" too on CUDA)."""
    x, k = (2, 8, 12, 11), (2, 18, 12, 11)
    return [
        Case(
            "local_filter2d",
            lambda d: (
                lambda x, k: ops.local_filter2d(x, k, 3, impl=impl),
                [_randn(d, *x), _randn(d, *k, seed=1)],
            ),
            "rounded",
        ),
        Case(
            "local_filter2d",
            lambda d: (
                lambda x, k: ops.local_filter2d(x, k, 5, 2, stride=2, impl=impl),
                [_randn(d, *x), _randn(d, 2, 50, 6, 6, seed=1)],
            ),
            "rounded",
        ),
        Case(
            "local_attention2d",
            lambda d: (
                lambda q, k, v: ops.local_attention2d(q, k, v, 5, num_heads=2, impl=impl),
                [_randn(d, 2, 8, 10, 9, seed=s) for s in range(3)],
            ),
            "rounded",
        ),
        Case(
            "ms_deform_attn",
            lambda d: (
                lambda v, x, a: ops.ms_deform_attn(v, [(5, 6), (2, 3)], x, a, impl=impl),
                [
                    _randn(d, 2, 36, 2, 4),
                    _randn(d, 2, 7, 2, 2, 3, 2, seed=1).sigmoid(),
                    _randn(d, 2, 7, 2, 2, 3, seed=2).softmax(-1),
                ],
            ),
            "rounded",
        ),
        Case(
            "rotated_roi_align",
            lambda d: (
                lambda x, r: ops.rotated_roi_align(x, r, 3, 0.5, impl=impl),
                [_randn(d, 2, 4, 10, 9), _rrois(d)],
            ),
            "rounded",
        ),
        Case(
            "RotatedRoIAlign",
            lambda d: (
                lambda x, r: ops.RotatedRoIAlign(2, 0.5, 2)(x, r),
                [_randn(d, 2, 4, 10, 9), _rrois(d)],
            ),
            "rounded",
        ),
        *(
            Case(
                name,
                lambda d, call=call: (call, [_randn(d, 2, 8, 10, 9), _rois(d)]),
                "rounded",
            )
            for name, call in (
                ("roi_align", lambda x, r: ops.roi_align(x, r, 3, 0.5, 2, True, impl=impl)),
                ("roi_pool", lambda x, r: ops.roi_pool(x, r, 2, 0.5, impl=impl)),
                ("ps_roi_align", lambda x, r: ops.ps_roi_align(x, r, 2, 0.5, impl=impl)),
                ("ps_roi_pool", lambda x, r: ops.ps_roi_pool(x, r, 2, 0.5, impl=impl)),
                ("RoIAlign", lambda x, r: ops.RoIAlign(3, 0.5, 2, True)(x, r)),
                ("RoIPool", lambda x, r: ops.RoIPool(2, 0.5)(x, r)),
                ("PSRoIAlign", lambda x, r: ops.PSRoIAlign(2, 0.5, 2)(x, r)),
                ("PSRoIPool", lambda x, r: ops.PSRoIPool(2, 0.5)(x, r)),
                (
                    "MultiScaleRoIAlign",
                    lambda x, r: ops.MultiScaleRoIAlign(["a", "b"], 2, 2, canonical_scale=16)(
                        {"a": x, "b": x[..., ::2, ::2]}, [r[:3, 1:], r[3:, 1:]], [(20, 18)] * 2
                    ),
                ),
            )
        ),
    ]


def _warp_sample(d: torch.device) -> tuple[Callable[..., Any], list[Tensor]]:
    from torchvision import tv_tensors

    def fn(image: Tensor, boxes: Tensor, matrix: Tensor) -> tuple[Tensor, Tensor]:
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(40, 48))}
        out, moved = warp_sample(image, target, matrix, (36, 44), min_size=None)
        return out, moved["boxes"].as_subclass(Tensor)  # type: ignore[index]

    return fn, [_randn(d, 3, 40, 48), _boxes(5, d, 4) / 16, ops.affine_matrix(angle=10.0).to(d)]


def _floats(out: Any) -> tuple[Tensor, ...]:
    """Every tensor of a result (nested tuples and lists too), integer ones as float32."""
    if isinstance(out, Tensor):
        return (out if out.is_floating_point() else out.float(),)
    return tuple(t for part in out for t in _floats(part))


def _detection_cases() -> list[Case]:
    """Issue 41's blocks: assignment, priors, coders, matching and the NMS family; integer
    and boolean outputs (indices, masks) compared as float32."""

    def case(op: str, build: Callable[..., Any], inputs: Callable[..., list], grad: bool = False):
        return Case(op, lambda d: (lambda *x: _floats(build(d, *x)), inputs(d)), "float32", grad)

    def tal(d: torch.device, s: Tensor, b: Tensor, g: Tensor, module: bool) -> Any:
        points = ((b[0, :, :2] + b[0, :, 2:]) / 2).float()
        labels = torch.tensor([[[0], [2], [1]]], device=d)
        mask = torch.ones(1, 3, 1, dtype=torch.bool, device=d)
        assign = ops.TaskAlignedAssigner(topk=3) if module else ops.task_aligned_assign
        out = assign(s, b, points, labels, g, mask, **({} if module else {"topk": 3}))
        # target_bboxes are gathered from gt_boxes, in their dtype: exact, compared as float32
        return out._replace(target_bboxes=out.target_bboxes.float())

    def priors(d: torch.device) -> Tensor:
        x = torch.arange(12.0, device=d) * 8 + 4
        return torch.stack([x, x % 40, x * 0 + 8, x * 0 + 8], 1)

    def matcher(d: torch.device, logits: Tensor, boxes: Tensor, gt: Tensor, module: bool) -> Any:
        targets = [{"labels": torch.tensor([1, 0], device=d), "boxes": gt}]
        match = ops.HungarianMatcher(1.0, 5.0, 2.0) if module else ops.hungarian_match
        return match({"pred_logits": logits, "pred_boxes": boxes}, targets)

    scored = lambda d: [_boxes(30, d, 31), _randn(d, 30, seed=32).sigmoid()]  # noqa: E731
    idxs = lambda d: torch.arange(30, device=d) % 3  # noqa: E731
    levels = lambda d: [_randn(d, 1, 2, 6, 5), _randn(d, 1, 2, 3, 3)]  # noqa: E731
    tal_in = lambda d: [_randn(d, 1, 12, 4).sigmoid(), _boxes(12, d, 33)[None],  # noqa: E731
                        _boxes(3, d, 34)[None]]  # fmt: skip
    dyn_in = lambda d: [_boxes(12, d, 35) / 10, _randn(d, 12, 3), _boxes(2, d, 36) / 10]  # noqa: E731
    detr_in = lambda d: [_randn(d, 1, 5, 3), _randn(d, 1, 5, 4).sigmoid() / 2 + 0.25,  # noqa: E731
                         _randn(d, 2, 4).sigmoid() / 2 + 0.25]  # fmt: skip
    labels = lambda d: torch.tensor([0, 2], device=d)  # noqa: E731
    return [
        case("nms", lambda d, b, s: ops.nms(b, s, 0.3), scored),
        case("batched_nms", lambda d, b, s: ops.batched_nms(b, s, idxs(d), 0.3), scored),
        case("soft_nms", lambda d, b, s: ops.soft_nms(b, s, method="gaussian"), scored),
        case("batched_soft_nms", lambda d, b, s: ops.batched_soft_nms(b, s, idxs(d)), scored),
        case("matrix_nms", lambda d, b, s: ops.matrix_nms(s, boxes=b, labels=idxs(d)), scored),
        case("make_anchor_points", lambda d, a, b: ops.make_anchor_points([a, b], [8, 16]), levels),
        case(
            "make_anchor_boxes",
            lambda d, a, b: ops.make_anchor_boxes([a, b], [8, 16], (32, 64), (0.5, 1.0)),
            levels,
        ),
        case(
            "AnchorGenerator",
            lambda d, a, b: ops.AnchorGenerator(((32,), (64,)), ((0.5, 1.0),) * 2)(
                torch.zeros(2, 3, 48, 40, device=d), [a, b]
            ),
            levels,
        ),
        case(
            "encode_distances",
            lambda d, p, b: ops.encode_distances(p, b, reg_max=15),
            lambda d: [_boxes(20, d, 37)[:, :2] + 2, _boxes(20, d, 37) / 8],
            grad=True,
        ),
        case(
            "decode_distances",
            lambda d, p, x: ops.decode_distances(p, x, "cxcywh"),
            lambda d: [_boxes(20, d, 38)[:, :2], _randn(d, 20, 4).abs() * 8],
            grad=True,
        ),
        case(
            "encode_deltas",
            lambda d, a, b: ops.encode_deltas(a, boxes=b, weights=(10.0, 10.0, 5.0, 5.0)),
            lambda d: [_boxes(20, d, 39), _boxes(20, d, 40)],
            grad=True,
        ),
        case(
            "decode_deltas",
            lambda d, a, x: ops.decode_deltas(a, deltas=x),
            lambda d: [_boxes(20, d, 41), _randn(d, 20, 4) / 4],
            grad=True,
        ),
        case("task_aligned_assign", lambda d, *x: tal(d, *x, False), tal_in),
        case("TaskAlignedAssigner", lambda d, *x: tal(d, *x, True), tal_in),
        case(
            "simota_assign",
            lambda d, b, s, g: ops.simota_assign(priors(d), b, s.sigmoid(), g, labels(d)),
            dyn_in,
        ),
        case(
            "dynamic_soft_label_assign",
            lambda d, b, s, g: ops.dynamic_soft_label_assign(priors(d), b, s, g, labels(d)),
            dyn_in,
        ),
        case("hungarian_match", lambda d, *x: matcher(d, *x, False), detr_in),
        case("HungarianMatcher", lambda d, *x: matcher(d, *x, True), detr_in),
    ]


CASES = [
    *_iou_cases(),
    *_detection_cases(),
    Case("box_area", lambda d: (ops.box_area, [_boxes(30, d, 5)]), "float32"),
    # A clamp in the boxes' dtype (no op autocast lowers).
    Case(
        "clip_boxes_to_image",
        lambda d: (lambda b: ops.clip_boxes_to_image(b, (20, 30)), [_boxes(30, d, 5)]),
        "native",
    ),
    # torchvision's kernel in float32 (its autocast wrapper); half inputs computed in float32.
    # Forward only: a gradient taken inside an autocast region runs torchvision's backward,
    # whose inner matrix products autocast lowers (outside the region, as torch advises, the
    # backward is float32).
    Case(
        "deform_conv2d",
        lambda d: (
            lambda x, o, w: ops.deform_conv2d(x, o, w, padding=1),
            [_randn(d, 1, 4, 6, 6), _randn(d, 1, 18, 6, 6, seed=1), _randn(d, 3, 4, 3, 3, seed=2)],
        ),
        "rounded",
        grad=False,
    ),
    # Mask ops: products in float32 under autocast; pasted and cropped masks keep their dtype.
    Case(
        "paste_masks",
        lambda d: (
            lambda m, b: ops.paste_masks(m, b, (48, 40)),
            [_randn(d, 6, 7, 7).sigmoid(), _boxes(6, d, 8) / 20],
        ),
        "rounded",
    ),
    Case(
        "crop_masks",
        lambda d: (ops.crop_masks, [_randn(d, 6, 9, 8), _boxes(6, d, 9) / 80]),
        "rounded",
    ),
    Case(
        "mask_iou",
        lambda d: (
            ops.mask_iou,
            [_randn(d, 5, 9, 8).sigmoid(), _randn(d, 4, 9, 8, seed=1).sigmoid()],
        ),
        "float32",
    ),
    Case(
        "masks_to_boxes",
        lambda d: (ops.masks_to_boxes, [_randn(d, 5, 9, 8) > 1]),
        "float32",
        grad=False,
    ),
    # Rotated boxes: IoUs in float32 (float64), as box_iou; NMS's int64 indices as float32.
    *(
        Case(
            "rotated_box_iou",
            lambda d, al=aligned: (
                lambda a, b: ops.rotated_box_iou(a, b, aligned=al),
                [_rboxes(24, d, 21), _rboxes(24 if al else 17, d, 22)],
            ),
            "float32",
        )
        for aligned in (False, True)
    ),
    Case(
        "nms_rotated",
        lambda d: (
            lambda b, s: ops.nms_rotated(b, s, 0.3).float(),
            [_rboxes(40, d, 23), _randn(d, 40)],
        ),
        "float32",
        grad=False,
    ),
    Case(
        "batched_nms_rotated",
        lambda d: (
            lambda b, s: ops.batched_nms_rotated(b, s, torch.arange(40, device=d) % 3, 0.3).float(),
            [_rboxes(40, d, 24), _randn(d, 40, seed=5)],
        ),
        "float32",
        grad=False,
    ),
    Case(
        "box_convert",
        lambda d: (lambda b: ops.box_convert(b, "xyxy", "cxcywh"), [_boxes(30, d, 6)]),
        "native",
    ),
    Case(
        "box_convert",
        lambda d: (lambda b: ops.box_convert(b, "xywh", "cxcywh"), [_boxes(30, d, 7)]),
        "native",
    ),
    Case(
        "affine_matrix",
        lambda d: (
            lambda a, t, s, c: ops.affine_matrix(a, t, s, (5.0, -3.0), c),
            [_randn(d, 4) * 40, _randn(d, 4, 2) * 9, _randn(d, 4) + 2, _randn(d, 2) * 300],
        ),
        "rounded",
    ),
    Case("invert_affine", lambda d: (ops.invert_affine, [_matrices(d, 3)]), "rounded"),
    Case(
        "compose_affine",
        lambda d: (ops.compose_affine, [_matrices(d, 3), _matrices(d, 3) * 0.5]),
        "rounded",
    ),
    Case(
        "matrix_to_theta",
        lambda d: (lambda m: ops.matrix_to_theta(m, (480, 640), (320, 320)), [_matrices(d)]),
        "rounded",
    ),
    Case(
        "theta_to_matrix",
        lambda d: (
            lambda t: ops.theta_to_matrix(t, (480, 640), (320, 320)),
            [torch.eye(2, 3, device=d) * 0.8 + _randn(d, 2, 2, 3) * 0.1],
        ),
        "rounded",
    ),
    Case(
        "warp_points",
        lambda d: (ops.warp_points, [_randn(d, 2, 50, 2).abs() * 300, _matrices(d)]),
        "rounded",
    ),
    Case(
        "warp_keypoints",
        lambda d: (
            # the points (the visibility is integer: autocast has nothing to change there)
            lambda p, m: ops.warp_keypoints(p, m, (480, 640), None, [(0, 1), (2, 3)])[0],
            [_randn(d, 2, 3, 5, 2).abs() * 300, _matrices(d)[:, None]],
        ),
        "rounded",
    ),
    # The assignment ops: IoUs in float32 (float64), as box_iou; several blocks of anchors.
    # Their int64 indices are compared as float32 (the policy's dtypes are floating ones).
    Case(
        "best_box_iou",
        lambda d: (
            lambda a, b: tuple(r.float() for r in ops.best_box_iou(a, b, block_bytes=256)),
            [_boxes(40, d, 11), _boxes(7, d, 12)],
        ),
        "float32",
        grad=False,
    ),
    Case(
        "match_anchors",
        lambda d: (
            lambda a, b: ops.match_anchors(
                a,
                boxes=b,
                high_threshold=0.5,
                low_threshold=0.3,
                allow_low_quality_matches=True,
                block_bytes=256,
            ).float(),
            [_boxes(40, d, 13), _boxes(7, d, 14)],
        ),
        "float32",
        grad=False,
    ),
    Case(
        "atss_assign",
        lambda d: (
            lambda a, b: ops.atss_assign(a, b, [30, 10], topk=4, block_bytes=256).float(),
            [_boxes(40, d, 15), _boxes(7, d, 16)],
        ),
        "float32",
        grad=False,
    ),
    Case(
        "keypoint_oks",
        lambda d: (
            lambda p, g, a: ops.keypoint_oks(
                p, g, torch.full((4, 17), 2, device=d), a, boxes=_boxes(4, d, 9)
            ),
            [
                _randn(d, 3, 17, 2) * 20 + 50,
                _randn(d, 4, 17, 2, seed=1) * 20 + 50,
                _randn(d, 4, seed=2).abs() * 500 + 100,
            ],
        ),
        "float32",
    ),
    Case(
        "warp_boxes",
        lambda d: (
            lambda b, m: ops.warp_boxes(b, m, (480, 640)),
            [_boxes(40, d, 8), _matrices(d)[:1]],
        ),
        "rounded",
    ),
    *(_warp_affine(p) for p in ("zeros", "border", "reflection", "fill")),
    _warp_affine("zeros", grad=False),
    _warp_affine("border", "nearest"),
    Case(
        "warp_masks",
        lambda d: (ops.warp_masks, [(_randn(d, 3, 24, 30) > 0).float(), _img_matrices(d)[0]]),
        "rounded",
        grad=False,
    ),
    Case("warp_sample", _warp_sample, "rounded"),
    Case(
        "sliding_windows",
        lambda d: (lambda x: ops.sliding_windows(x, 3, 2), [_randn(d, 2, 4, 9, 7)]),
        "rounded",
    ),
    *_local("torch"),
]
IDS = [f"{c.op}-{i}" for i, c in enumerate(CASES)]


def test_every_public_op_is_covered():
    covered = {c.op for c in CASES}
    public = set(ops.__all__) | set(transforms.__all__)
    in_scope = public - set(LOSSES)
    missing = in_scope - covered - set(NOT_APPLICABLE)
    assert not missing, f"ops without an autocast case (add one, or to NOT_APPLICABLE): {missing}"
    assert covered <= public, f"cases for names no longer public: {covered - in_scope}"
    assert not covered & set(NOT_APPLICABLE)


def _flat(out: Any) -> list[Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(case: Case, fn: Callable[..., Any], inputs: list[Tensor], seed: int = 9):
    """Outputs and the gradients of the floating inputs for a fixed random output gradient."""
    inputs = [x.detach().requires_grad_(case.grad and x.is_floating_point()) for x in inputs]
    outs = _flat(fn(*inputs))
    if not case.grad:
        return outs, []
    gen = torch.Generator().manual_seed(seed)  # values exact in bfloat16 and float16 alike
    grad_outs = [torch.randn(o.shape, generator=gen).bfloat16().to(o) for o in outs]
    wrt = [x for x in inputs if x.requires_grad]
    return outs, list(torch.autograd.grad(outs, wrt, grad_outs, allow_unused=True))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float32_inputs_are_bitwise_unchanged_by_cpu_autocast(case):
    fn, inputs = case.build(torch.device("cpu"))
    ref, ref_grads = _run(case, fn, inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads = _run(case, fn, inputs)
    for a, b in zip(out + grads, ref + ref_grads, strict=True):
        if a is None or b is None:  # no gradient (warp_affine "nearest" to its matrix)
            assert a is b
            continue
        assert a.dtype == b.dtype
        assert torch.equal(a, b), f"{case.op}: autocast changed a result by {(a - b).abs().max()}"


def _rel(a: Tensor, b: Tensor) -> float:
    scale = b.detach().double().abs().max().clamp_min(1e-30)
    return float((a.detach().double() - b.detach().double()).abs().max() / scale)


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bfloat16_inputs_follow_the_dtype_policy(case, autocast):
    fn, inputs = case.build(torch.device("cpu"))
    half = [x.bfloat16() if x.is_floating_point() else x for x in inputs]
    ref, ref_grads = _run(case, fn, [x.float() if x.is_floating_point() else x for x in half])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, grads = _run(case, fn, half)
    for a, b in zip(out, ref, strict=True):
        if case.half == "float32":
            assert a.dtype == torch.float32 and torch.equal(a, b)
        elif case.half == "rounded":  # computed in float32, rounded once
            assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())
        else:  # computed in bfloat16: within an ulp of the float32 result
            assert a.dtype == torch.bfloat16 and _rel(a, b) <= 2**-7
    floating = [x for x in half if x.is_floating_point()] if case.grad else []
    for g, g_ref, x in zip(grads, ref_grads, floating, strict=True):
        if g is None:
            assert g_ref is None
            continue
        assert g.dtype == x.dtype and torch.isfinite(g).all()
        assert _rel(g, g_ref) <= 2**-6, f"{case.op}: bfloat16 gradient off by {_rel(g, g_ref)}"


def test_autocast_keeps_coordinates_to_float32_precision():
    # Regression: a matmul in warp_points (and in the warp grids) ran in bfloat16 under
    # autocast, moving points of ~600 px by up to 3 px and warped pixels by ~10%.
    points, matrix = _randn("cpu", 200, 2).abs() * 600, _matrices(torch.device("cpu"))[0]
    exact = ops.warp_points(points.double(), matrix.double())
    img = torch.rand(1, 3, 32, 40).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        moved = ops.warp_points(points, matrix)
        warped = ops.warp_affine(img, ops.affine_matrix(angle=13.0), padding_mode="border")
    assert (moved.double() - exact).abs().max() < 1e-3
    ref = ops.warp_affine(
        img.double(), ops.affine_matrix(angle=13.0).double(), padding_mode="border"
    )
    assert (warped.double() - ref).abs().max() < 1e-5


# ---------------------------------------------------------------------------- CUDA

TRITON_CASES = _local("triton")


def _cuda_check(case: Case, dtype: torch.dtype) -> None:
    fn, fn_inputs = case.build(torch.device("cuda"))
    ref, ref_grads = _run(case, fn, fn_inputs)
    with torch.autocast("cuda", dtype=dtype):
        out, grads = _run(case, fn, fn_inputs)
    for a, b in zip(out + grads, ref + ref_grads, strict=True):
        assert (a is None) == (b is None)
        assert a is None or (a.dtype == b.dtype and _rel(a, b) <= 1e-5), f"{case.op}"
    half = [x.to(dtype) if x.is_floating_point() else x for x in fn_inputs]
    with torch.autocast("cuda", dtype=dtype):
        out, grads = _run(case, fn, half)
    ref, _ = _run(case, fn, [x.float() if x.is_floating_point() else x for x in half])
    want = torch.float32 if case.half == "float32" else dtype
    for a, b in zip(out, ref, strict=True):
        assert a.dtype == want and _rel(a, b) <= 2 * torch.finfo(dtype).eps
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads if g is not None)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", CUDA_AUTOCASTS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_autocast(case, dtype):
    _cuda_check(case, dtype)


@pytest.mark.cuda
@pytest.mark.skipif(bool(kernels.available()["reason"]), reason="triton not installed")
@pytest.mark.parametrize("dtype", CUDA_AUTOCASTS)
@pytest.mark.parametrize(
    "case", TRITON_CASES, ids=[f"{c.op}-{i}" for i, c in enumerate(TRITON_CASES)]
)
def test_cuda_autocast_triton_kernels(case, dtype):
    _cuda_check(case, dtype)
