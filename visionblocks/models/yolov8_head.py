"""YOLOv8's anchor-free detection head: `YOLOv8Head`, registered in ``HEADS`` as ``"yolov8"``.

Convention:
    Anchor points are the cell centres in grid units, ``(j + 0.5, i + 0.5)`` for cell ``(i,
    j)`` (`visionblocks.ops.make_anchor_points`), times the level's stride in pixels. Box
    distances ``(l, t, r, b)`` are in grid units of their level: the bins of the distance
    distributions are ``0, 1, ..., reg_max - 1`` grid cells. Boxes are XYXY in input pixels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from visionblocks._core.checks import check_finite, check_int, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import HEADS
from visionblocks.losses.bce import binary_cross_entropy_with_logits
from visionblocks.losses.distribution_focal import distribution_focal_loss
from visionblocks.losses.iou import complete_box_iou_loss
from visionblocks.models._levels import (
    check_image_sizes,
    check_levels,
    check_measured_strides,
    check_strides,
    padded_sizes,
    unpad_detections,
)
from visionblocks.models._targets import prepare_targets
from visionblocks.models.postprocess import postprocess_detections, postprocess_padded
from visionblocks.nn._limits import MAX_CHANNELS, check_channels
from visionblocks.nn.conv import ConvNormAct, DepthwiseSeparableConv2d
from visionblocks.nn.layers import ActSpec, NormSpec, make_norm
from visionblocks.ops.box_coders import decode_distances, encode_distances
from visionblocks.ops.priors import make_anchor_points
from visionblocks.ops.task_aligned import task_aligned_assign

__all__ = ["YOLOv8Head"]
__dir__ = public_dir(__name__, __all__)

Outputs = dict[str, list[Any]]


@HEADS.register(name="yolov8")
class YOLOv8Head(nn.Module):
    """YOLOv8 head: DFL box distributions and class logits, task-aligned assignment.

    Per level (separate weights, as ultralytics' ``Detect``): a box branch (two 3x3
    ``ConvNormAct``, ``max(16, in_channels // 4, 4 reg_max)`` channels, then a 1x1 conv to
    ``4 * reg_max`` logits: a distribution over ``reg_max`` bins for each side) and a class
    branch (two 3x3 ``ConvNormAct``, ``max(in_channels, min(num_classes, 100))`` channels,
    then a 1x1 conv to ``num_classes`` logits). With ``depthwise_cls=True`` the class branch
    is YOLO11's instead (ultralytics' ``Detect`` with ``legacy=False``, as YOLO11 and later
    build it): two `visionblocks.nn.DepthwiseSeparableConv2d` (a depthwise 3x3, then a
    pointwise 1x1, each normed and activated) of the same widths, then the 1x1 conv; about
    an eighth of the class branch's multiply-adds at 64 channels. A side's distance is the
    expectation of its distribution (the DFL integral). Bias init: box logits 1.0
    (ultralytics 8.4 sets 2.0), class logits ``log(5 / num_classes / (640 / stride)^2)``
    (ultralytics').

    Training (`loss`): `visionblocks.ops.task_aligned_assign` (``tal_topk``, ``tal_alpha``,
    ``tal_beta``; ``tal_min_side``: ultralytics 8.4's widening of small boxes, ``None`` for
    YOLOv8's rule) on the detached sigmoid scores and decoded boxes gives each anchor a
    target box and soft class scores. With ``S`` the sum of the target scores (at least 1):
    ``loss_cls`` is the BCE of all logits against the target scores over ``S``; ``loss_box``
    the CIoU loss of the positives weighted by their target score, over ``S``; ``loss_dfl``
    the `visionblocks.losses.distribution_focal_loss` of their distances, weighted alike,
    over ``4 S``; times ``cls_gain``, ``box_gain`` and ``dfl_gain``. These are ultralytics'
    ``v8DetectionLoss`` terms (which it multiplies by the batch size); ``S`` is per process,
    as there. No value is read on the host and the positives are not gathered: the box terms
    run over every anchor with weight 0 for the background.

    Inference (`predict`): sigmoid class scores, boxes decoded from the expected distances,
    then `visionblocks.models.postprocess.postprocess_detections` (class-wise NMS).

    Args:
        in_channels: Channels of every input level (an FPN's ``out_channels``).
        num_classes: Object classes (no background class).
        strides: Stride of each input level, finest first.
        reg_max: Bins per side distribution (``>= 2``).
        depthwise_cls: YOLO11's depthwise-separable class branch instead of YOLOv8's two
            3x3 convolutions (ultralytics' ``legacy=False``).
        norm: Norm of the branch convolutions (ultralytics: BatchNorm).
        act: Activation of the branch convolutions (ultralytics: SiLU).
        tal_topk: Anchors each object keeps in the assignment (at most the anchors).
        tal_alpha: Exponent of the score in the alignment metric.
        tal_beta: Exponent of the CIoU in the alignment metric.
        tal_min_side: Smaller box sides are widened to this (pixels) for the inside test
            of the assignment (ultralytics 8.4: the second stride); ``None``: no widening.
        box_gain: Weight of ``loss_box``.
        cls_gain: Weight of ``loss_cls``.
        dfl_gain: Weight of ``loss_dfl``.
        score_thresh: Smallest detection score kept at inference.
        nms_thresh: NMS IoU threshold.
        topk_candidates: Candidates per level before NMS.
        max_detections: Detections per image.

    Raises:
        TypeError: An option of the wrong type; at call time, features that are not a list
            of floating-point tensors.
        ValueError: An option out of range; at call time, features that do not match
            ``strides``, ``in_channels`` or the head's device, and bad targets
            (`visionblocks.models.detector.training_targets`).

    Examples:
        >>> import torch
        >>> head = YOLOv8Head(16, num_classes=3, strides=[8, 16])
        >>> out = head([torch.randn(1, 16, 8, 8), torch.randn(1, 16, 4, 4)])
        >>> [tuple(t.shape) for t in out["cls_logits"]], [tuple(t.shape) for t in out["box_logits"]]
        ([(1, 64, 3), (1, 16, 3)], [(1, 64, 4, 16), (1, 16, 4, 16)])
        >>> targets = [{"boxes": torch.tensor([[4.0, 4.0, 40.0, 30.0]]), "labels": torch.tensor([1])}]
        >>> sorted(head.loss(out, targets))
        ['loss_box', 'loss_cls', 'loss_dfl']

    References:
        Jocher et al., Ultralytics YOLOv8 (2023), ``ultralytics/nn/modules/head.py``
        (``Detect``) and ``ultralytics/utils/loss.py`` (``v8DetectionLoss``); Feng et al.,
        "TOOD: Task-aligned One-stage Object Detection", ICCV 2021; Li et al., "Generalized
        Focal Loss", NeurIPS 2020.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        strides: Sequence[int],
        *,
        reg_max: int = 16,
        depthwise_cls: bool = False,
        norm: NormSpec = "bn",
        act: ActSpec = "silu",
        tal_topk: int = 10,
        tal_alpha: float = 0.5,
        tal_beta: float = 6.0,
        tal_min_side: float | None = None,
        box_gain: float = 7.5,
        cls_gain: float = 0.5,
        dfl_gain: float = 1.5,
        score_thresh: float = 0.05,
        nms_thresh: float = 0.7,
        topk_candidates: int = 1000,
        max_detections: int = 100,
    ) -> None:
        super().__init__()
        check_channels("in_channels", in_channels)
        check_int("num_classes", num_classes, 1, MAX_CHANNELS)
        strides = check_strides(strides)
        check_int("reg_max", reg_max, 2, MAX_CHANNELS // 4)
        check_type("depthwise_cls", depthwise_cls, bool)
        make_norm(norm, in_channels)  # an unknown norm fails here, named
        check_int("tal_topk", tal_topk, 1)
        for name, value in (("tal_alpha", tal_alpha), ("tal_beta", tal_beta),
                            ("box_gain", box_gain), ("cls_gain", cls_gain), ("dfl_gain", dfl_gain)):  # fmt: skip
            check_finite(name, check_number(name, value, 0.0))
        if tal_min_side is not None:
            check_finite("tal_min_side", check_number("tal_min_side", tal_min_side, 0.0))
        check_number("score_thresh", score_thresh, 0.0, 1.0)
        check_number("nms_thresh", nms_thresh, 0.0, 1.0)
        check_int("topk_candidates", topk_candidates, 1)
        check_int("max_detections", max_detections, 1)
        self.num_classes, self.strides, self.reg_max = num_classes, strides, reg_max
        self.assign = {"topk": tal_topk, "alpha": float(tal_alpha), "beta": float(tal_beta),
                       "min_side": None if tal_min_side is None else float(tal_min_side)}  # fmt: skip
        self.gains = {"box": float(box_gain), "cls": float(cls_gain), "dfl": float(dfl_gain)}
        self.inference = {
            "score_thresh": score_thresh,
            "nms_thresh": nms_thresh,
            "topk_candidates": topk_candidates,
            "max_detections": max_detections,
        }
        box_width = max(16, in_channels // 4, 4 * reg_max)
        cls_width = max(in_channels, min(num_classes, 100))

        def branch(width: int, outputs: int, bias: float, depthwise: bool) -> nn.Sequential:
            block = DepthwiseSeparableConv2d if depthwise else ConvNormAct
            last = nn.Conv2d(width, outputs, 1)
            nn.init.constant_(last.bias, bias)
            return nn.Sequential(
                block(in_channels, width, 3, norm=norm, act=act),
                block(width, width, 3, norm=norm, act=act),
                last,
            )

        self.box_branches = nn.ModuleList(
            branch(box_width, 4 * reg_max, 1.0, depthwise=False) for _ in strides
        )
        self.cls_branches = nn.ModuleList(
            branch(
                cls_width,
                num_classes,
                math.log(5 / num_classes / (640 / s) ** 2),
                depthwise=depthwise_cls,
            )
            for s in strides
        )

    def forward(self, features: Mapping[str, Tensor] | Sequence[Tensor]) -> Outputs:
        """Raw outputs per level, flattened over locations (row-major).

        Args:
            features: A dict or list of ``Tensor[B, in_channels, H_l, W_l]``, one per
                stride, finest first, on the head's device.

        Returns:
            dict[str, list]: ``cls_logits`` ``[B, A_l, C]``, ``box_logits`` ``[B, A_l, 4,
            reg_max]`` (sides ``l, t, r, b``), ``sizes`` ``(H_l, W_l)``.

        Raises:
            TypeError, ValueError: As the class says.
        """
        first = self.box_branches[0][0].conv
        levels = check_levels("features", features, [first.in_channels] * len(self.strides), first)
        check_measured_strides(features, levels, self.strides)
        out: Outputs = {"cls_logits": [], "box_logits": [], "sizes": []}
        for x, box_branch, cls_branch in zip(levels, self.box_branches, self.cls_branches):
            box = box_branch(x).flatten(2).transpose(1, 2)
            out["box_logits"].append(box.unflatten(2, (4, self.reg_max)))
            out["cls_logits"].append(cls_branch(x).flatten(2).transpose(1, 2))
            if torch.compiler.is_exporting():  # symbolic sizes: int() would specialise them
                out["sizes"].append((x.shape[-2], x.shape[-1]))
            else:
                out["sizes"].append((int(x.shape[-2]), int(x.shape[-1])))
        return out

    def _distances(self, box_logits: Tensor) -> Tensor:
        """The DFL integral: expected distance ``(..., 4)`` of ``(..., 4, reg_max)`` logits."""
        bins = torch.arange(self.reg_max, dtype=torch.float32, device=box_logits.device)
        return box_logits.float().softmax(-1).matmul(bins)

    def loss(self, outputs: Outputs, targets: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        """The three YOLOv8 losses (see the class docstring) of a batch.

        Args:
            outputs: What `forward` returned.
            targets: One dict per image with ``boxes (Tensor[N, 4])`` XYXY in input pixels
                and ``labels (Tensor[N])`` in ``[0, num_classes)``.

        Returns:
            dict[str, Tensor]: ``loss_cls``, ``loss_box``, ``loss_dfl`` (float32 scalars).

        Raises:
            TypeError, ValueError: Targets that `visionblocks.models.detector.
                training_targets` rejects.
        """
        cls_logits = torch.cat(outputs["cls_logits"], 1).float()  # (B, A, C)
        box_logits = torch.cat(outputs["box_logits"], 1)  # (B, A, 4, reg_max)
        batch, num_anchors, device = cls_logits.shape[0], cls_logits.shape[1], cls_logits.device
        targets = prepare_targets(
            targets, batch_size=batch, num_classes=self.num_classes, device=device
        )
        points, stride = make_anchor_points(outputs["sizes"], self.strides, device=device)
        pred_boxes = decode_distances(points, self._distances(box_logits))  # grid units
        gt_boxes = pad_sequence([t["boxes"].float() for t in targets], batch_first=True)
        gt_labels = pad_sequence([t["labels"] for t in targets], batch_first=True)
        counts = torch.tensor([len(t["labels"]) for t in targets], device=device)
        gt_mask = torch.arange(gt_boxes.shape[1], device=device) < counts[:, None]
        assigned = task_aligned_assign(
            cls_logits.detach().sigmoid(), pred_boxes.detach() * stride, points * stride,
            gt_labels[..., None], gt_boxes, gt_mask[..., None],
            **{**self.assign, "topk": min(self.assign["topk"], num_anchors)},
        )  # fmt: skip
        scores = assigned.target_scores
        normalizer = scores.sum().clamp(min=1.0)  # on the device: no host read
        loss_cls = binary_cross_entropy_with_logits(cls_logits, scores, reduction="sum")
        # Every anchor, the background weighted by zero: gathering the positives would give
        # a data-dependent size (a host sync on CUDA, a graph break under compile).
        weight = torch.where(assigned.fg_mask, scores.sum(-1), 0.0)  # (B, A)
        target_boxes = assigned.target_bboxes / stride  # grid units
        ciou = complete_box_iou_loss(pred_boxes, target_boxes, reduction="none")
        loss_dfl = distribution_focal_loss(
            box_logits, encode_distances(points, target_boxes, reg_max=self.reg_max - 1),
            weight=weight[..., None], reduction="sum", normalizer=4 * normalizer,
        )  # fmt: skip
        return {
            "loss_cls": loss_cls / normalizer * self.gains["cls"],
            "loss_box": (ciou * weight).sum() / normalizer * self.gains["box"],
            "loss_dfl": loss_dfl * self.gains["dfl"],
        }

    def _level_boxes(self, outputs: Outputs, level: int) -> Tensor:
        """Decoded XYXY boxes ``[B, A_l, 4]`` (pixels) of one level."""
        box_logits = outputs["box_logits"][level]
        points, _ = make_anchor_points(
            [outputs["sizes"][level]], [self.strides[level]], device=box_logits.device
        )
        return decode_distances(points, self._distances(box_logits)) * self.strides[level]

    @torch.no_grad()
    def predict(
        self, outputs: Outputs, image_sizes: Sequence[tuple[int, int]]
    ) -> list[dict[str, Tensor]]:
        """Detections per image: ``boxes`` (XYXY, clipped to its size), ``scores``, ``labels``.

        Args:
            outputs: What `forward` returned.
            image_sizes: ``(H, W)`` of every image (before padding). Under ``torch.export``
                the detections are `predict_padded`'s, cut to ``num_detections``.

        Raises:
            TypeError, ValueError: Not one ``(H, W)`` pair of positive ints per image.
        """
        if torch.compiler.is_exporting():
            padded = self.predict_padded(outputs, image_sizes)
            return unpad_detections(padded, self.inference["max_detections"])
        image_sizes = check_image_sizes(image_sizes, outputs["cls_logits"][0].shape[0])
        scores = [torch.sigmoid(c.float()) for c in outputs["cls_logits"]]
        boxes = [self._level_boxes(outputs, level) for level in range(len(self.strides))]
        return [
            postprocess_detections(
                [s[b] for s in scores], [x[b] for x in boxes], tuple(size), **self.inference
            )
            for b, size in enumerate(image_sizes)
        ]

    @torch.no_grad()
    def predict_padded(
        self, outputs: Outputs, image_sizes: Tensor | Sequence[tuple[int, int]] | None = None
    ) -> dict[str, Tensor]:
        """Detections of the whole batch, padded (`visionblocks.models.postprocess.
        postprocess_padded`): the export form of `predict`.

        Args:
            outputs: What `forward` returned.
            image_sizes: ``(H, W)`` of every image (a ``(B, 2)`` tensor or a list of pairs);
                ``None``: the padded size of the levels.

        Returns:
            dict[str, Tensor]: ``boxes (B, K, 4)`` XYXY, ``scores (B, K)``, ``labels (B, K)``
            (``-1`` for padding) and ``num_detections (B,)``, ``K = max_detections``.
        """
        cls_logits = outputs["cls_logits"]
        batch, device = cls_logits[0].shape[0], cls_logits[0].device
        image_sizes = padded_sizes(image_sizes, outputs["sizes"][0], self.strides[0], batch, device)
        scores = [torch.sigmoid(c.float()) for c in cls_logits]
        boxes = [self._level_boxes(outputs, level) for level in range(len(self.strides))]
        return postprocess_padded(scores, boxes, image_sizes, **self.inference)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, strides={self.strides}, reg_max={self.reg_max}"
