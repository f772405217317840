"""Conformance specs: ops (boxes, IoUs, IoU losses, warps, local ops), losses and init.

Values are tiny and, where half precision is compared, exactly representable in float16 and
bfloat16 (integers and halves), so the half-precision equivalences test the code rather than
the rounding of the inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchvision import tv_tensors

from tests.conformance.framework import Arg, Spec
from visionblocks import init, losses, ops

_HALF = ("noncontiguous", "half", "bfloat16")
_ALL = ("noncontiguous", "half", "bfloat16", "channels_last")

# A float argument whose negative values are legitimate (an offset, a bias, a mean...).
_SIGNED = frozenset({"negative"})


def _signed(name: str, *, optional: bool = False) -> Arg:
    return Arg(name, "float", optional=optional, accept=_SIGNED)


def _call(fn: Callable[..., Any], **kwargs: Any) -> Callable[[], tuple[Any, dict[str, Any]]]:
    """A ``build`` for ``fn(**kwargs)``, with tensors made fresh on every build."""

    def build() -> tuple[Any, dict[str, Any]]:
        return fn, {
            k: v() if callable(v) and not isinstance(v, type) else v for k, v in kwargs.items()
        }

    return build


def _forward(cls: type, ctor: dict[str, Any], **kwargs: Any) -> Callable[[], tuple[Any, dict]]:
    """A ``build`` for ``cls(**ctor).forward(**kwargs)``."""

    def build() -> tuple[Any, dict[str, Any]]:
        module = cls(**{k: v() if callable(v) else v for k, v in ctor.items()})
        return module.forward, {k: v() if callable(v) else v for k, v in kwargs.items()}

    return build


# ------------------------------------------------------------------------------------- boxes
def _boxes1() -> torch.Tensor:
    return torch.tensor([[0.0, 0.0, 4.0, 4.0], [1.0, 2.0, 3.0, 6.0]])


def _boxes2() -> torch.Tensor:
    return torch.tensor([[1.0, 1.0, 5.0, 3.0], [0.0, 0.0, 4.0, 4.0], [2.0, 2.0, 2.5, 8.0]])


# Box ops take any leading (batch) dims and integer boxes (as torchvision): rank_up and dtype
# are legitimate. A single tensor on the meta device gives a meta result (shape inference).
_BOXES = frozenset({"rank_up", "dtype"})


def _box_pair_spec(fn: Callable[..., Any]) -> Spec:
    return Spec(
        fn,
        _call(fn, boxes1=_boxes1, boxes2=_boxes2, aligned=False, eps=1e-7),
        args=[
            Arg("boxes1", "tensor", accept=_BOXES),
            Arg("boxes2", "tensor", accept=_BOXES),
            Arg("aligned", "bool"),
            Arg("eps", "float"),
        ],
        equivalences=_HALF,
    )


def _loss_pair() -> dict[str, Any]:
    return {"pred": _boxes1, "target": lambda: _boxes2()[:2]}


def _box_loss_spec(fn: Callable[..., Any]) -> Spec:
    return Spec(
        fn,
        _call(fn, **_loss_pair(), reduction="none", eps=1e-7, impl="auto"),
        args=[
            Arg("pred", "tensor"),
            Arg("target", "tensor"),
            Arg("reduction", "choice"),
            Arg("eps", "float"),
            Arg("impl", "choice"),
        ],
        equivalences=_HALF,
    )


def _box_loss_module_specs(cls: type) -> list[Spec]:
    return [
        Spec(
            cls,
            _call(cls, reduction="mean", eps=1e-7, impl="auto"),
            args=[Arg("reduction", "choice"), Arg("eps", "float"), Arg("impl", "choice")],
        ),
        Spec(
            cls,
            _forward(cls, {"reduction": "none"}, **_loss_pair()),
            args=[Arg("pred", "tensor"), Arg("target", "tensor")],
            forward=True,
            equivalences=_HALF,
        ),
    ]


BOX_SPECS: list[Spec] = [
    Spec(
        ops.box_area,
        _call(ops.box_area, boxes=_boxes2),
        args=[Arg("boxes", "tensor", accept=_BOXES | {"meta"})],
        equivalences=_HALF,
    ),
    Spec(
        ops.box_convert,
        _call(ops.box_convert, boxes=_boxes2, in_fmt="xyxy", out_fmt="cxcywh"),
        args=[
            Arg("boxes", "tensor", accept=_BOXES | {"meta"}),
            Arg("in_fmt", "choice"),
            Arg("out_fmt", "choice"),
        ],
        equivalences=_HALF,
    ),
    *(
        _box_pair_spec(fn)
        for fn in (
            ops.box_iou,
            ops.generalized_box_iou,
            ops.distance_box_iou,
            ops.complete_box_iou,
        )
    ),
    *(
        _box_loss_spec(fn)
        for fn in (
            losses.generalized_box_iou_loss,
            losses.distance_box_iou_loss,
            losses.complete_box_iou_loss,
        )
    ),
    *(
        spec
        for cls in (
            losses.GeneralizedBoxIoULoss,
            losses.DistanceBoxIoULoss,
            losses.CompleteBoxIoULoss,
        )
        for spec in _box_loss_module_specs(cls)
    ),
    Spec(
        ops.keypoint_oks,
        _call(
            ops.keypoint_oks,
            pred=lambda: torch.tensor(
                [[[1.0, 2.0], [3.0, 4.0], [5.0, 5.0]], [[0.0, 0.0], [2.0, 2.5], [4.0, 6.0]]]
            ),
            gt=lambda: torch.tensor(
                [
                    [[1.0, 2.0], [3.0, 3.0], [5.0, 6.0]],
                    [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]],
                    [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
                ]
            ),
            visibility=lambda: torch.tensor([[2, 1, 0], [2, 2, 2], [0, 0, 0]]),
            areas=lambda: torch.tensor([16.0, 8.0, 4.0]),
            sigmas=[0.5, 0.5, 1.0],
            boxes=lambda: torch.tensor(
                [[1.0, 2.0, 5.0, 6.0], [1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0]]
            ),
            box_fmt="xyxy",
        ),
        args=[
            Arg("pred", "tensor", accept={"dtype"}),  # integer coordinates are fine
            Arg("gt", "tensor", accept={"dtype"}),
            Arg("visibility", "int_tensor"),
            Arg("areas", "tensor", accept={"dtype"}),
            Arg("sigmas", "sequence"),
            Arg("boxes", "tensor", optional=True, accept={"dtype"}),
            Arg("box_fmt", "choice"),
        ],
        equivalences=_HALF,
    ),
]


# -------------------------------------------------------------------------------------- warp
def _matrix() -> torch.Tensor:
    return torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.5]])


def _image() -> torch.Tensor:
    return torch.arange(2 * 3 * 5 * 6, dtype=torch.float32).view(2, 3, 5, 6) / 8


# Matrices with leading batch dims are accepted by the matrix helpers ((..., 2, 3)); a single
# matrix on the meta device gives a meta result.
_MATRIX = frozenset({"rank_up", "meta"})


def _sample() -> dict[str, Any]:
    boxes = tv_tensors.BoundingBoxes(
        [[1.0, 1.0, 4.0, 3.0], [0.0, 2.0, 2.0, 5.0]], format="XYXY", canvas_size=(5, 6)
    )
    masks = tv_tensors.Mask(torch.zeros(2, 5, 6, dtype=torch.uint8))
    points = tv_tensors.KeyPoints(
        [[[1.0, 1.0], [3.0, 2.0], [2.0, 2.0]], [[0.0, 3.0], [1.0, 4.0], [0.5, 2.5]]],
        canvas_size=(5, 6),
    )
    return {
        "boxes": boxes,
        "masks": masks,
        "labels": torch.tensor([1, 2]),
        "keypoints": points,
        "keypoints_visibility": torch.tensor([[2, 2, 1], [0, 2, 2]]),
        "polygons": [[torch.tensor([[1.0, 1.0], [4.0, 2.0], [2.0, 3.0]])], []],
    }


def _keypoints() -> torch.Tensor:
    return torch.tensor([[[0.0, 0.0], [4.0, 2.0], [1.5, 3.0]]])


WARP_SPECS: list[Spec] = [
    Spec(
        ops.affine_matrix,
        _call(
            ops.affine_matrix,
            angle=30.0,
            translate=(1.0, 2.0),
            scale=2.0,
            shear=(5.0, 0.0),
            center=(2.0, 1.5),
            hflip=True,
            vflip=False,
        ),
        args=[
            _signed("angle"),
            Arg("translate", "sequence"),
            _signed("scale"),  # a negative scale is a point reflection
            Arg("shear", "sequence"),
            Arg("center", "sequence"),
            Arg("hflip", "bool"),
            Arg("vflip", "bool"),
        ],
    ),
    Spec(
        ops.compose_affine,
        _call(
            lambda first, second: ops.compose_affine(first, second),
            first=_matrix,
            second=lambda: torch.tensor([[0.0, 1.0, 2.0], [-1.0, 0.0, 3.0], [0.0, 0.0, 1.0]]),
        ),
        args=[
            # (1, 2, 3) broadcasts with the other; a (3, 3) matrix is taken too
            Arg("first", "tensor", accept={"rank_up"}, aliases=("matrices[0]",)),
            Arg("second", "tensor", accept={"rank_up"}, aliases=("matrices[1]",)),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.invert_affine,
        _call(ops.invert_affine, matrix=_matrix),
        args=[Arg("matrix", "tensor", accept=_MATRIX)],
        equivalences=_HALF,
    ),
    Spec(
        ops.matrix_to_theta,
        _call(ops.matrix_to_theta, matrix=_matrix, src_size=(5, 6), dst_size=(4, 4)),
        args=[
            Arg("matrix", "tensor", accept=_MATRIX),
            Arg("src_size", "sequence"),
            Arg("dst_size", "sequence"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.theta_to_matrix,
        _call(
            ops.theta_to_matrix,
            theta=lambda: torch.tensor([[0.5, 0.0, -0.5], [0.0, 0.5, -0.5]]),
            src_size=(4, 4),
            dst_size=(2, 2),
        ),
        args=[
            Arg("theta", "tensor", accept=_MATRIX),
            Arg("src_size", "sequence"),
            Arg("dst_size", "sequence"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.warp_affine,
        _call(
            ops.warp_affine,
            img=_image,
            matrix=_matrix,
            size=(4, 5),
            mode="bilinear",
            padding_mode="zeros",
            fill=0.0,
        ),
        args=[
            Arg("img", "tensor", accept={"dtype"}),  # integer images are warped (and rounded)
            Arg("matrix", "tensor", accept={"rank_up"}),  # (1, 2, 3): one matrix, shared
            Arg("size", "sequence", optional=True),  # None: the input's size
            Arg("mode", "choice"),
            Arg("padding_mode", "choice"),
            Arg("fill", "float"),  # only 0 is valid without padding_mode="fill"
        ],
        equivalences=_ALL,
    ),
    Spec(
        ops.warp_affine,
        _call(
            ops.warp_affine,
            img=_image,
            matrix=_matrix,
            size=None,
            mode="nearest",
            padding_mode="fill",
            fill=-1.5,
        ),
        args=[
            Arg("img", "tensor", accept={"dtype"}),
            _signed("fill"),  # any value is a fill value
        ],
        equivalences=_ALL,
        label="fill",
    ),
    Spec(
        ops.warp_points,
        _call(
            ops.warp_points,
            points=lambda: torch.tensor([[0.0, 0.0], [4.0, 2.0], [1.5, 3.0]]),
            matrix=_matrix,
        ),
        args=[
            # integer points give floats; extra leading dims broadcast with the matrix's
            Arg("points", "tensor", accept={"dtype", "rank_up"}),
            Arg("matrix", "tensor", accept={"rank_up"}),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.warp_keypoints,
        _call(
            ops.warp_keypoints,
            points=_keypoints,
            matrix=_matrix,
            size=(5, 6),
            visibility=lambda: torch.tensor([[2, 1, 0]]),
            flip_pairs=[(1, 2)],
        ),
        args=[
            # as warp_points: integer points give floats, leading dims broadcast
            Arg("points", "tensor", accept={"dtype", "rank_up"}),
            Arg("matrix", "tensor", accept={"rank_up"}),
            Arg("size", "sequence"),
            Arg("visibility", "int_tensor", optional=True),  # None: all visible
            Arg("flip_pairs", "sequence", optional=True),  # None: a mirror is refused
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.keypoint_flip_pairs,
        _call(ops.keypoint_flip_pairs, names=["nose", "left_eye", "right_eye"]),
        args=[Arg("names", "sequence")],  # "longer" repeats a name: refused
    ),
    Spec(
        ops.flip_permutation,
        _call(ops.flip_permutation, num_keypoints=3, pairs=[(1, 2)]),
        args=[
            # K sizes the result: 10**9 entries is a request to honour, not to test here
            Arg("num_keypoints", "int", skip={"huge"}),
            Arg("pairs", "sequence"),  # "longer" repeats a pair: an index in two pairs
        ],
    ),
    Spec(
        ops.warp_boxes,
        _call(ops.warp_boxes, boxes=_boxes2, matrix=_matrix, size=(6, 6)),
        args=[
            Arg("boxes", "tensor", accept={"dtype", "rank_up"}),  # as warp_points
            Arg("matrix", "tensor", accept={"rank_up"}),
            Arg("size", "sequence", optional=True),  # None: no clipping
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.warp_masks,
        _call(
            ops.warp_masks,
            masks=lambda: torch.arange(2 * 5 * 6).view(2, 5, 6) % 3 == 0,
            matrix=_matrix,
            size=(4, 4),
        ),
        args=[
            Arg("masks", "tensor", accept={"dtype", "rank_up"}),  # any dtype; (B, N, H, W)
            Arg("matrix", "tensor", accept={"rank_up"}),
            Arg("size", "sequence", optional=True),
        ],
        equivalences=("noncontiguous",),
    ),
]


# ------------------------------------------------------------------------------------- local
def _x() -> torch.Tensor:
    return torch.arange(2 * 4 * 5 * 5, dtype=torch.float32).view(2, 4, 5, 5) / 64


LOCAL_SPECS: list[Spec] = [
    Spec(
        ops.sliding_windows,
        _call(ops.sliding_windows, x=_x, kernel_size=3, dilation=1),
        args=[
            # any dtype; a single tensor on the meta device gives a meta result
            Arg("x", "tensor", accept={"dtype", "meta"}),
            Arg("kernel_size", "int"),
            Arg("dilation", "int"),
        ],
        equivalences=_ALL,
    ),
    Spec(
        ops.local_filter2d,
        _call(
            ops.local_filter2d,
            x=_x,
            kernels=lambda: (
                torch.arange(2 * 18 * 5 * 5, dtype=torch.float32).view(2, 18, 5, 5) % 7 / 8
            ),
            kernel_size=3,
            dilation=1,
            stride=1,
            impl="auto",
        ),
        args=[
            Arg("x", "tensor"),
            Arg("kernels", "tensor"),
            Arg("kernel_size", "int"),
            Arg("dilation", "int"),
            Arg("stride", "int"),
            Arg("impl", "choice"),
        ],
        equivalences=_ALL,
    ),
    Spec(
        ops.local_attention2d,
        _call(
            ops.local_attention2d,
            q=_x,
            k=lambda: _x().flip(-1),
            v=lambda: _x().flip(-2),
            kernel_size=3,
            dilation=1,
            num_heads=2,
            impl="auto",
        ),
        args=[
            Arg("q", "tensor"),
            Arg("k", "tensor"),
            Arg("v", "tensor"),
            Arg("kernel_size", "int"),
            Arg("dilation", "int"),
            Arg("num_heads", "int"),
            Arg("impl", "choice"),
        ],
        equivalences=_ALL,
        tolerance=(3e-2, 3e-2),
    ),
]


# ------------------------------------------------------------------------------------ losses
def _logits() -> torch.Tensor:
    return torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.5, 4.0]])


def _binary() -> torch.Tensor:
    return torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 1.0]])


def _seg_logits() -> torch.Tensor:
    return torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2) % 5 / 2 - 1


def _seg_target() -> torch.Tensor:
    return torch.tensor([[[0, 1], [2, 1]], [[2, 0], [0, 1]]])


_FOCAL_FORWARD = {
    "inputs": _logits,
    "targets": _binary,
    "weight": lambda: torch.tensor([[1.0], [0.5]]),  # per anchor
    "normalizer": 2.0,
}

LOSS_SPECS: list[Spec] = [
    # ---------------------------------------------------------------------- BCE
    Spec(
        losses.binary_cross_entropy_with_logits,
        _call(
            losses.binary_cross_entropy_with_logits,
            inputs=_logits,
            targets=_binary,
            weight=lambda: torch.tensor([[1.0, 0.5, 2.0], [1.0, 1.0, 0.5]]),
            size_average=None,
            reduce=None,
            pos_weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            label_smoothing=0.1,
            ignore_index=None,
            reduction="none",
        ),
        args=[
            Arg("inputs", "tensor"),
            Arg("targets", "tensor", accept={"dtype"}),  # integer (0/1) targets are converted
            # integer weights multiply, as in PyTorch
            Arg("weight", "tensor", optional=True, accept={"dtype"}),
            Arg("size_average", "bool", optional=True),  # PyTorch's deprecated arguments
            Arg("reduce", "bool", optional=True),
            # pos_weight (C,) broadcasts: as (1, C) too, or as one scalar
            Arg("pos_weight", "tensor", optional=True, accept={"rank_up", "rank_down", "dtype"}),
            Arg("label_smoothing", "float"),
            _signed("ignore_index", optional=True),  # -1 marks ignored targets
            Arg("reduction", "choice"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        losses.binary_cross_entropy_with_logits,
        _call(
            losses.binary_cross_entropy_with_logits,
            inputs=_seg_logits,
            targets=lambda: (
                (_seg_logits() > 0).to(torch.uint8).masked_fill(_seg_logits() == 0.5, 255)
            ),
            ignore_index=255,
            reduction="mean",
        ),
        args=[Arg("inputs", "tensor"), Arg("targets", "tensor", accept={"dtype"})],
        equivalences=_ALL,
        label="uint8 mask, ignore 255",
    ),
    Spec(
        losses.BCEWithLogitsLoss,
        _call(
            losses.BCEWithLogitsLoss,
            weight=lambda: torch.tensor([[1.0, 0.5, 2.0]]),
            pos_weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            label_smoothing=0.0,
            ignore_index=-1,
            reduction="mean",
        ),
        args=[
            # Buffers: their shape is checked against the inputs in forward; they may live on
            # any device (meta included: built on meta, then .to_empty()); integer weights
            # multiply, as in PyTorch.
            Arg(
                "weight", "tensor", optional=True, accept={"rank_up", "rank_down", "meta", "dtype"}
            ),
            Arg(
                "pos_weight",
                "tensor",
                optional=True,
                accept={"rank_up", "rank_down", "meta", "dtype"},
            ),
            Arg("label_smoothing", "float"),
            _signed("ignore_index", optional=True),
            Arg("reduction", "choice"),
        ],
    ),
    Spec(
        losses.BCEWithLogitsLoss,
        _forward(
            losses.BCEWithLogitsLoss,
            {"pos_weight": lambda: torch.tensor([1.0, 2.0, 0.5]), "reduction": "none"},
            inputs=_logits,
            targets=_binary,
        ),
        args=[Arg("inputs", "tensor"), Arg("targets", "tensor", accept={"dtype"})],
        forward=True,
        equivalences=_HALF,
    ),
    # -------------------------------------------------------------------- sigmoid focal
    Spec(
        losses.sigmoid_focal_loss,
        _call(
            losses.sigmoid_focal_loss,
            inputs=_logits,
            targets=_binary,
            alpha=0.25,
            gamma=2.0,
            reduction="none",
            weight=lambda: torch.tensor([1.0, 0.5, 2.0]),
            ignore_index=None,
            normalizer=2.0,
            impl="auto",
        ),
        args=[
            Arg("inputs", "tensor"),
            # integer targets are class indices (a different shape: rejected clearly)
            Arg("targets", "tensor"),
            Arg("alpha", "float", optional=True, accept=_SIGNED),  # negative disables it
            Arg("gamma", "float"),
            Arg("reduction", "choice"),
            # (C,) broadcasts: as (1, C) too, or as one scalar weight
            Arg("weight", "tensor", optional=True, accept={"rank_up", "rank_down"}),
            _signed("ignore_index", optional=True),
            Arg("normalizer", "float", optional=True),
            Arg("impl", "choice"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        losses.sigmoid_focal_loss,
        _call(
            losses.sigmoid_focal_loss,
            inputs=_logits,
            targets=lambda: torch.tensor([0, 3]),  # 3 = C: background
            reduction="sum",
            ignore_index=-1,
            normalizer=lambda: torch.tensor([2.0]),
        ),
        args=[
            Arg("inputs", "tensor"),
            Arg("targets", "int_tensor", accept={"negative"}),  # -1, C: background rows
            # One element of any dtype, any rank: a python number works as well.
            Arg(
                "normalizer",
                "tensor",
                optional=True,
                accept={"list", "dtype", "rank_up", "rank_down"},
            ),
        ],
        equivalences=_HALF,
        label="class indices, tensor normalizer",
    ),
    Spec(
        losses.SigmoidFocalLoss,
        _call(
            losses.SigmoidFocalLoss,
            alpha=0.25,
            gamma=2.0,
            reduction="mean",
            ignore_index=-1,
            impl="auto",
        ),
        args=[
            Arg("alpha", "float", optional=True, accept=_SIGNED),
            Arg("gamma", "float"),
            Arg("reduction", "choice"),
            _signed("ignore_index", optional=True),
            Arg("impl", "choice"),
        ],
    ),
    Spec(
        losses.SigmoidFocalLoss,
        _forward(losses.SigmoidFocalLoss, {"reduction": "none"}, **_FOCAL_FORWARD),
        args=[
            Arg("inputs", "tensor"),
            Arg("targets", "tensor"),
            Arg("weight", "tensor", optional=True),
            Arg("normalizer", "float", optional=True),
        ],
        forward=True,
        equivalences=_HALF,
    ),
    # -------------------------------------------------------------------- softmax focal
    Spec(
        losses.softmax_focal_loss,
        _call(
            losses.softmax_focal_loss,
            logits=_seg_logits,
            target=_seg_target,
            gamma=2.0,
            alpha=0.5,
            weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            ignore_index=-100,
            label_smoothing=0.1,
            reduction="none",
            impl="auto",
        ),
        args=[
            Arg("logits", "tensor"),
            Arg("target", "int_tensor"),
            Arg("gamma", "float"),
            Arg("alpha", "float", optional=True),
            Arg("weight", "tensor", optional=True),
            # any int may mark ignored targets (-100, 255, 10**9...); 0 ignores class 0
            Arg("ignore_index", "int", accept={"negative"}),
            Arg("label_smoothing", "float"),
            Arg("reduction", "choice"),
            Arg("impl", "choice"),
        ],
        equivalences=_ALL,
    ),
    Spec(
        losses.SoftmaxFocalLoss,
        _call(
            losses.SoftmaxFocalLoss,
            gamma=2.0,
            alpha=None,
            weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            ignore_index=255,
            label_smoothing=0.0,
            reduction="mean",
            impl="auto",
        ),
        args=[
            Arg("gamma", "float"),
            Arg("alpha", "float", optional=True),
            Arg("weight", "tensor", optional=True, accept={"meta"}),  # a buffer: any device
            Arg("ignore_index", "int", accept={"negative"}),
            Arg("label_smoothing", "float"),
            Arg("reduction", "choice"),
            Arg("impl", "choice"),
        ],
    ),
    Spec(
        losses.SoftmaxFocalLoss,
        _forward(
            losses.SoftmaxFocalLoss, {"reduction": "none"}, logits=_seg_logits, target=_seg_target
        ),
        args=[Arg("logits", "tensor"), Arg("target", "int_tensor")],
        forward=True,
        equivalences=_ALL,
    ),
    # -------------------------------------------------------------------- cross entropy
    Spec(
        losses.cross_entropy,
        _call(
            losses.cross_entropy,
            logits=_seg_logits,
            target=_seg_target,
            weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            size_average=None,
            ignore_index=-100,
            reduce=None,
            label_smoothing=0.1,
            reduction="none",
            top_k=0.5,
        ),
        args=[
            Arg("logits", "tensor"),
            Arg("target", "int_tensor"),
            Arg("weight", "tensor", optional=True),
            Arg("size_average", "bool", optional=True),  # PyTorch's deprecated arguments
            Arg("reduce", "bool", optional=True),
            Arg("ignore_index", "int", accept={"negative"}),
            Arg("label_smoothing", "float"),
            Arg("reduction", "choice"),
            Arg("top_k", "float", optional=True),
        ],
        equivalences=_ALL,
    ),
    Spec(
        losses.cross_entropy,
        _call(
            losses.cross_entropy,
            logits=_logits,
            target=lambda: torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]),
            reduction="mean",
        ),
        # float targets are probabilities; an integer tensor of that shape is rejected
        args=[Arg("logits", "tensor"), Arg("target", "tensor")],
        equivalences=_HALF,
        label="probabilities",
    ),
    Spec(
        losses.CrossEntropyLoss,
        _call(
            losses.CrossEntropyLoss,
            weight=lambda: torch.tensor([1.0, 2.0, 0.5]),
            ignore_index=255,
            label_smoothing=0.0,
            reduction="mean",
            top_k=None,
        ),
        args=[
            Arg("weight", "tensor", optional=True, accept={"meta"}),  # a buffer: any device
            Arg("ignore_index", "int", accept={"negative"}),
            Arg("label_smoothing", "float"),
            Arg("reduction", "choice"),
            Arg("top_k", "float", optional=True),
        ],
    ),
    Spec(
        losses.CrossEntropyLoss,
        _forward(
            losses.CrossEntropyLoss, {"reduction": "none"}, logits=_seg_logits, target=_seg_target
        ),
        args=[Arg("logits", "tensor"), Arg("target", "int_tensor")],
        forward=True,
        equivalences=_ALL,
    ),
]


# -------------------------------------------------------------------------------------- init
def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Conv2d(4, 6, 3, groups=2)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


_MODULE = Arg("module", "module")
_BIAS = _signed("bias", optional=True)  # None leaves the bias untouched

INIT_SPECS: list[Spec] = [
    Spec(
        init.bias_init_with_prob,
        _call(init.bias_init_with_prob, prior_prob=0.01),
        args=[Arg("prior_prob", "float")],
    ),
    Spec(init.c2_msra_fill, _call(init.c2_msra_fill, module=_conv), args=[_MODULE]),
    Spec(init.c2_xavier_fill, _call(init.c2_xavier_fill, module=_conv), args=[_MODULE]),
    Spec(init.compute_fans, _call(init.compute_fans, module=_conv), args=[_MODULE]),
    Spec(
        init.constant_init,
        _call(init.constant_init, module=_conv, val=0.5, bias=0.0),
        args=[_MODULE, _signed("val"), _BIAS],
    ),
    Spec(
        init.init_weights,
        _call(
            init.init_weights,
            model=_model,
            rules=lambda: [
                {"type": "kaiming", "layer": "Conv2d"},
                {"type": "constant", "layer": "BatchNorm2d", "val": 1.0},
            ],
        ),
        args=[
            Arg("model", "module"),
            Arg("rules", "sequence", accept={"longer"}),  # a repeated rule is a valid rule
        ],
    ),
    Spec(
        init.kaiming_init,
        _call(
            init.kaiming_init,
            module=_conv,
            a=0.0,
            mode="fan_out",
            nonlinearity="relu",
            distribution="normal",
            bias=0.0,
        ),
        args=[
            _MODULE,
            _signed("a"),  # the negative slope of a leaky ReLU: any real number
            Arg("mode", "choice"),
            Arg("nonlinearity", "choice"),
            Arg("distribution", "choice"),
            _BIAS,
        ],
    ),
    Spec(
        init.normal_init,
        _call(init.normal_init, module=_conv, mean=0.0, std=0.01, bias=0.0),
        args=[_MODULE, _signed("mean"), Arg("std", "float"), _BIAS],
    ),
    Spec(
        init.trunc_normal_init,
        _call(init.trunc_normal_init, module=_conv, mean=0.0, std=1.0, a=-2.0, b=2.0, bias=0.0),
        args=[
            _MODULE,
            _signed("mean"),
            Arg("std", "float"),
            _signed("a"),  # bounds are absolute values: -1 is a bound like any other
            _signed("b"),  # [-2, -1] still holds 14 % of N(0, 1)
            _BIAS,
        ],
    ),
    Spec(
        init.xavier_init,
        _call(init.xavier_init, module=_conv, gain=1.0, distribution="uniform", bias=0.0),
        args=[_MODULE, Arg("gain", "float"), Arg("distribution", "choice"), _BIAS],
    ),
    Spec(
        init.zero_init_last_norm,
        _call(init.zero_init_last_norm, model=_model),
        args=[Arg("model", "module")],
    ),
]


# -------------------------------------------------------------------------------- assignment
def _anchors() -> torch.Tensor:
    return torch.tensor(
        [
            [0.0, 0.0, 4.0, 4.0],
            [2.0, 0.0, 6.0, 4.0],
            [0.0, 2.0, 4.0, 6.0],
            [1.0, 1.0, 3.0, 3.0],
            [0.0, 0.0, 8.0, 8.0],
            [4.0, 4.0, 8.0, 8.0],
        ]
    )


# Integer boxes are boxes (as for box_iou): "dtype" is legitimate.
_ASSIGN_BOXES = [
    Arg("anchors", "tensor", accept={"dtype"}),
    Arg("boxes", "tensor", accept={"dtype"}),
]
_ASSIGN_OPTIONS = [
    Arg("eps", "float"),
    Arg("block_bytes", "int", optional=True),
]

ASSIGN_SPECS: list[Spec] = [
    Spec(
        ops.best_box_iou,
        _call(
            ops.best_box_iou,
            anchors=_anchors,
            boxes=_boxes2,
            eps=1e-7,
            block_bytes=None,
            impl="auto",
        ),
        args=[*_ASSIGN_BOXES, *_ASSIGN_OPTIONS, Arg("impl", "choice")],
        equivalences=_HALF,
    ),
    Spec(
        ops.match_anchors,
        _call(
            ops.match_anchors,
            anchors=_anchors,
            boxes=_boxes2,
            high_threshold=0.5,
            low_threshold=0.25,
            allow_low_quality_matches=True,
            eps=1e-7,
            block_bytes=None,
            impl="auto",
        ),
        args=[
            *_ASSIGN_BOXES,
            Arg("high_threshold", "float"),
            Arg("low_threshold", "float"),
            Arg("allow_low_quality_matches", "bool"),
            *_ASSIGN_OPTIONS,
            Arg("impl", "choice"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.atss_assign,
        _call(
            ops.atss_assign,
            anchors=_anchors,
            boxes=_boxes2,
            num_anchors_per_level=[4, 2],
            topk=3,
            eps=1e-7,
            block_bytes=None,
        ),
        args=[
            *_ASSIGN_BOXES,
            Arg("num_anchors_per_level", "sequence"),
            Arg("topk", "int"),
            *_ASSIGN_OPTIONS,
        ],
        equivalences=_HALF,
    ),
]


def _assign_exemptions() -> dict[object, str]:
    from visionblocks.kernels import assign

    entry = (
        "a Triton kernel entry point, reached through the op's impl= dispatch, which validates "
        "every argument first (the op is spec'd); the launch guards are tested in tests/kernels"
    )
    return {
        ops.BestIoU: "a NamedTuple of best_box_iou's results; best_box_iou is spec'd",
        assign.best_box_iou_triton: entry,
        assign.box_iou_reaches_triton: entry,
    }


EXEMPT: dict[object, str] = {}
EXEMPT.update(_assign_exemptions())


# ----------------------------------------------------------------------------- rotated boxes
def _rboxes1() -> torch.Tensor:
    return torch.tensor([[2.0, 2.0, 4.0, 2.0, 30.0], [1.0, 3.0, 2.0, 2.0, 0.0]])


def _rboxes2() -> torch.Tensor:
    return torch.tensor(
        [[2.0, 2.5, 3.0, 2.0, -15.0], [2.0, 2.0, 4.0, 2.0, 30.0], [5.0, 5.0, 1.0, 3.0, 90.0]]
    )


def _nms_boxes() -> torch.Tensor:
    return torch.tensor(
        [[0.0, 0.0, 4.0, 2.0, 0.0], [0.5, 0.0, 4.0, 2.0, 10.0], [9.0, 9.0, 2.0, 2.0, 45.0],
         [0.0, 0.5, 2.0, 4.0, 90.0]]
    )  # fmt: skip


def _nms_scores() -> torch.Tensor:
    return torch.tensor([0.5, 0.75, 0.25, 0.125])


def _rotated_pair() -> dict[str, Any]:
    return {"pred": _rboxes1, "target": lambda: _rboxes2()[:2]}


ROTATED_SPECS: list[Spec] = [
    Spec(
        ops.rotated_box_iou,
        _call(
            ops.rotated_box_iou,
            boxes1=_rboxes1,
            boxes2=_rboxes2,
            fmt="cxcywhr",
            aligned=False,
            eps=1e-7,
            impl="auto",
        ),
        args=[
            Arg("boxes1", "tensor", accept=_BOXES),  # batch dims and integer boxes, as box_iou
            Arg("boxes2", "tensor", accept=_BOXES),
            Arg("fmt", "choice"),
            Arg("aligned", "bool"),
            Arg("eps", "float"),
            Arg("impl", "choice"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        ops.rotated_box_iou_loss,
        _call(
            ops.rotated_box_iou_loss, **_rotated_pair(), reduction="none", eps=1e-7, fmt="cxcywhr"
        ),
        args=[
            Arg("pred", "tensor"),
            Arg("target", "tensor"),
            Arg("reduction", "choice"),
            Arg("eps", "float"),
            Arg("fmt", "choice"),
        ],
        equivalences=_HALF,
    ),
    Spec(
        losses.RotatedBoxIoULoss,
        _call(losses.RotatedBoxIoULoss, reduction="mean", eps=1e-7, fmt="cxcywhr"),
        args=[Arg("reduction", "choice"), Arg("eps", "float"), Arg("fmt", "choice")],
    ),
    Spec(
        losses.RotatedBoxIoULoss,
        _forward(losses.RotatedBoxIoULoss, {"reduction": "none"}, **_rotated_pair()),
        args=[Arg("pred", "tensor"), Arg("target", "tensor")],
        forward=True,
        equivalences=_HALF,
    ),
    Spec(
        ops.nms_rotated,
        _call(
            ops.nms_rotated,
            boxes=_nms_boxes,
            scores=_nms_scores,
            iou_threshold=0.3,
            fmt="cxcywhr",
        ),
        args=[
            Arg("boxes", "tensor", accept={"dtype"}),  # integer boxes are boxes
            Arg("scores", "tensor"),
            Arg("iou_threshold", "float"),
            Arg("fmt", "choice"),
        ],
        equivalences=("noncontiguous",),
    ),
    Spec(
        ops.batched_nms_rotated,
        _call(
            ops.batched_nms_rotated,
            boxes=_nms_boxes,
            scores=_nms_scores,
            idxs=lambda: torch.tensor([0, 1, 0, 1]),
            iou_threshold=0.3,
            fmt="cxcywhr",
        ),
        args=[
            Arg("boxes", "tensor", accept={"dtype"}),
            Arg("scores", "tensor"),
            Arg("idxs", "int_tensor"),
            Arg("iou_threshold", "float"),
            Arg("fmt", "choice"),
        ],
        equivalences=("noncontiguous",),
    ),
]


def _rotated_exemptions() -> dict[object, str]:
    from visionblocks.kernels import rotated_iou

    return {
        rotated_iou.rotated_box_iou_triton: (
            "a Triton kernel entry point, reached through rotated_box_iou's impl= dispatch, "
            "which validates every argument first; tested in tests/kernels"
        )
    }


EXEMPT.update(_rotated_exemptions())

SPECS: list[Spec] = [
    *BOX_SPECS, *WARP_SPECS, *LOCAL_SPECS, *LOSS_SPECS, *INIT_SPECS, *ASSIGN_SPECS,
    *ROTATED_SPECS,
]  # fmt: skip
