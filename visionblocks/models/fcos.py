"""FCOS-style anchor-free detection head: `FCOSHead`, registered in ``HEADS`` as ``"fcos"``.

Convention:
    Locations are the centres of the feature-map cells in input pixels: cell ``(i, j)`` of a
    level with stride ``s`` is at ``(x, y) = (j s + s // 2, i s + s // 2)``, as in FCOS.
    Boxes are XYXY in input pixels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checkpointing import set_grad_checkpointing
from visionblocks._core.checks import check_int, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import HEADS
from visionblocks.distributed import reduce_mean
from visionblocks.init import bias_init_with_prob, normal_init
from visionblocks.losses.focal import sigmoid_focal_loss
from visionblocks.losses.iou import generalized_box_iou_loss
from visionblocks.models._fcos_targets import centerness_target, grid_locations, match_batch
from visionblocks.models._levels import (
    check_image_sizes,
    check_levels,
    check_measured_strides,
    check_strides,
    padded_sizes,
    unpad_detections,
)
from visionblocks.models._targets import prepare_targets
from visionblocks.models.postprocess import (
    decode_ltrb,
    postprocess_detections,
    postprocess_padded,
)
from visionblocks.nn._limits import MAX_CHANNELS, MAX_REPEATS, check_channels
from visionblocks.nn.conv import ConvNormAct
from visionblocks.nn.layers import NormSpec, make_norm

__all__ = ["FCOSHead"]
__dir__ = public_dir(__name__, __all__)

Outputs = dict[str, list[Any]]


def _check_ranges(size_ranges: Any, levels: int) -> list[tuple[float, float]]:
    pairs = list(size_ranges) if isinstance(size_ranges, Sequence) else None
    ok = pairs is not None and len(pairs) == levels and all(
        isinstance(p, Sequence) and len(p) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
        and 0 <= p[0] < p[1]
        for p in pairs
    )  # fmt: skip
    if not ok:
        raise ValueError(
            f"size_ranges must hold one (low, high) pair with 0 <= low < high per level "
            f"({levels}), got {size_ranges!r}"
        )
    return [(float(lo), float(hi)) for lo, hi in pairs]


@HEADS.register(name="fcos")
class FCOSHead(nn.Module):
    """FCOS head: shared GroupNorm towers, per-location classes, box sides and centerness.

    Two towers (``num_convs`` 3x3 ``ConvNormAct`` each) shared by every level: class logits
    (``num_classes``, no background class) from the first, the box distances ``(l, t, r,
    b)`` (``relu(scale_level * x) * stride``, pixels) and the centerness logit from the
    second. The class bias starts at ``bias_init_with_prob(prior_prob)``.

    Training (`loss`): each location takes the smallest ground-truth box that contains it
    within ``center_sampling_radius`` strides of the box centre and whose largest side
    distance falls in the level's ``size_ranges`` (default ``(8 s_(i-1), 8 s_i]``, the first
    from 0, the last open: FCOS's 64, 128, 256, 512 for strides 8 to 128). ``loss_cls`` is
    the sigmoid focal loss over all locations, ``loss_box`` the GIoU loss of the positives
    weighted by their centerness targets, ``loss_centerness`` the BCE of their centerness
    logits; each is divided by its count (positives, or the sum of the weights) **averaged
    over ranks** (`visionblocks.distributed.reduce_mean`).

    Inference (`predict`): score ``sqrt(sigmoid(class) * sigmoid(centerness))``, then
    `visionblocks.models.postprocess.postprocess_detections`.

    Args:
        in_channels: Channels of every input level (an FPN's ``out_channels``).
        num_classes: Object classes (no background class).
        strides: Stride of each input level, finest first.
        num_convs: 3x3 convolutions per tower.
        norm: Norm of the tower convolutions (``"gn"``: GroupNorm).
        prior_prob: Initial foreground probability of the class logits.
        center_sampling_radius: Positives lie within this many strides of a box centre
            (``0``: anywhere in the box).
        size_ranges: ``(low, high)`` per level on ``max(l, t, r, b)``; ``None``: see above.
        focal_alpha: Focal loss alpha.
        focal_gamma: Focal loss gamma.
        score_thresh: Smallest detection score kept at inference.
        nms_thresh: NMS IoU threshold.
        topk_candidates: Candidates per level before NMS.
        max_detections: Detections per image.
        grad_checkpointing: Checkpoint the two towers (recomputed in the backward).

    Raises:
        TypeError: An option of the wrong type (``score_thresh=None`` names it); at call
            time, features that are not a list of floating-point tensors.
        ValueError: An option out of range (``in_channels``, ``num_classes`` or strides
            above 65,536, ``num_convs`` above 64, strides not increasing); at call time,
            features that do not match ``strides``, ``in_channels`` or the head's device,
            and bad targets (`visionblocks.models.detector.training_targets`).

    Examples:
        >>> import torch
        >>> head = FCOSHead(16, num_classes=3, strides=[8, 16], num_convs=1)
        >>> feats = [torch.randn(1, 16, 8, 8), torch.randn(1, 16, 4, 4)]
        >>> out = head(feats)
        >>> [tuple(t.shape) for t in out["cls_logits"]], [tuple(t.shape) for t in out["boxes"]]
        ([(1, 64, 3), (1, 16, 3)], [(1, 64, 4), (1, 16, 4)])
        >>> targets = [{"boxes": torch.tensor([[4.0, 4.0, 40.0, 30.0]]), "labels": torch.tensor([1])}]
        >>> sorted(head.loss(out, targets))
        ['loss_box', 'loss_centerness', 'loss_cls']

    References:
        Tian et al., "FCOS: Fully Convolutional One-Stage Object Detection", ICCV 2019.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        strides: Sequence[int],
        *,
        num_convs: int = 4,
        norm: NormSpec = "gn",
        prior_prob: float = 0.01,
        center_sampling_radius: float = 1.5,
        size_ranges: Sequence[tuple[float, float]] | None = None,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        score_thresh: float = 0.05,
        nms_thresh: float = 0.6,
        topk_candidates: int = 1000,
        max_detections: int = 100,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        check_channels("in_channels", in_channels)
        check_int("num_classes", num_classes, 1, MAX_CHANNELS)
        check_int("num_convs", num_convs, 0, MAX_REPEATS)
        strides = check_strides(strides)
        make_norm(norm, in_channels)  # an unknown norm fails even with num_convs=0
        check_number("prior_prob", prior_prob, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        check_number("center_sampling_radius", center_sampling_radius, 0.0)
        if size_ranges is None:  # FCOS: 64, 128, 256, 512 for strides 8 ... 128
            bounds = [0.0, *(8.0 * s for s in strides[:-1]), math.inf]
            size_ranges = list(itertools.pairwise(bounds))
        size_ranges = _check_ranges(size_ranges, len(strides))
        check_number("focal_alpha", focal_alpha, 0.0, 1.0)
        check_number("focal_gamma", focal_gamma, 0.0, math.inf, high_inclusive=False)
        check_number("score_thresh", score_thresh, 0.0, 1.0)
        check_number("nms_thresh", nms_thresh, 0.0, 1.0)
        check_int("topk_candidates", topk_candidates, 1)
        check_int("max_detections", max_detections, 1)
        check_type("grad_checkpointing", grad_checkpointing, bool)
        self.num_classes, self.strides = num_classes, strides
        self.center_sampling_radius = float(center_sampling_radius)
        self.register_buffer(
            "size_ranges", torch.tensor(size_ranges, dtype=torch.float32), persistent=False
        )
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        self.inference = {
            "score_thresh": score_thresh,
            "nms_thresh": nms_thresh,
            "topk_candidates": topk_candidates,
            "max_detections": max_detections,
        }

        def tower() -> nn.Sequential:
            return nn.Sequential(
                *(ConvNormAct(in_channels, in_channels, 3, norm=norm) for _ in range(num_convs))
            )

        self.cls_tower, self.box_tower = tower(), tower()
        if grad_checkpointing and num_convs:
            set_grad_checkpointing(self, ["cls_tower", "box_tower"])
        self.cls_logits = nn.Conv2d(in_channels, num_classes, 3, padding=1)
        self.box_pred = nn.Conv2d(in_channels, 4, 3, padding=1)
        self.centerness = nn.Conv2d(in_channels, 1, 3, padding=1)
        self.scales = nn.Parameter(torch.ones(len(strides)))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                normal_init(module, std=0.01, bias=0.0)
        normal_init(self.cls_logits, std=0.01, bias=bias_init_with_prob(prior_prob))

    def forward(self, features: Mapping[str, Tensor] | Sequence[Tensor]) -> Outputs:
        """Raw outputs per level, flattened over locations (row-major).

        Args:
            features: A dict or list of ``Tensor[B, in_channels, H_l, W_l]``, one per
                stride, finest first, on the head's device.

        Returns:
            dict[str, list[Tensor]]: ``cls_logits`` ``[B, A_l, C]``, ``boxes`` ``[B, A_l, 4]``
            (``l, t, r, b``), ``centerness`` ``[B, A_l]``, ``sizes`` ``(H_l, W_l)``.

        Raises:
            TypeError, ValueError: As the class says.
        """
        channels = self.cls_logits.in_channels
        levels = check_levels("features", features, [channels] * len(self.strides), self.cls_logits)
        check_measured_strides(features, levels, self.strides)
        out: Outputs = {"cls_logits": [], "boxes": [], "centerness": [], "sizes": []}
        # box_pred and centerness read the same tensor: one convolution, split afterwards.
        weight = torch.cat([self.box_pred.weight, self.centerness.weight])
        bias = torch.cat([self.box_pred.bias, self.centerness.bias])
        for i, x in enumerate(levels):
            cls = self.cls_tower(x)
            box = self.box_tower(x)
            out["cls_logits"].append(self.cls_logits(cls).flatten(2).transpose(1, 2))
            regression = F.conv2d(box, weight, bias, padding=self.box_pred.padding)
            distances = F.relu(self.scales[i] * regression[:, :4]) * self.strides[i]
            out["boxes"].append(distances.flatten(2).transpose(1, 2))
            out["centerness"].append(regression[:, 4].flatten(1))
            if torch.compiler.is_exporting():  # symbolic sizes: int() would specialise them
                out["sizes"].append((x.shape[-2], x.shape[-1]))
            else:
                out["sizes"].append((int(x.shape[-2]), int(x.shape[-1])))
        return out

    def _locations(self, outputs: Outputs, device: torch.device) -> tuple[Tensor, Tensor]:
        return grid_locations(outputs["sizes"], self.strides, device)

    def loss(self, outputs: Outputs, targets: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        """The three FCOS losses (see the class docstring) of a batch.

        Args:
            outputs: What `forward` returned.
            targets: One dict per image with ``boxes (Tensor[N, 4])`` XYXY in input pixels
                and ``labels (Tensor[N])`` in ``[0, num_classes)``.

        Returns:
            dict[str, Tensor]: ``loss_cls``, ``loss_box``, ``loss_centerness`` (scalars).

        Raises:
            TypeError, ValueError: Targets that `visionblocks.models.detector.
                training_targets` rejects.
        """
        cls_logits = torch.cat(outputs["cls_logits"], dim=1)
        distances = torch.cat(outputs["boxes"], dim=1)
        centerness = torch.cat(outputs["centerness"], dim=1)
        targets = prepare_targets(
            targets,
            batch_size=cls_logits.shape[0],
            num_classes=self.num_classes,
            device=cls_logits.device,
        )
        points, levels = self._locations(outputs, cls_logits.device)
        point_strides = torch.tensor(self.strides, device=points.device)[levels]
        point_ranges = self.size_ranges.to(points.device)[levels]
        classes_t, matched_t = match_batch(
            points, point_strides, point_ranges, [t["boxes"] for t in targets],
            [t["labels"] for t in targets], self.num_classes, self.center_sampling_radius,
        )  # fmt: skip
        positive = classes_t < self.num_classes
        num_pos = reduce_mean(positive.sum().float()).clamp(min=1.0)
        loss_cls = sigmoid_focal_loss(
            cls_logits.reshape(-1, self.num_classes),
            classes_t.reshape(-1),
            alpha=self.focal_alpha,
            gamma=self.focal_gamma,
            reduction="sum",
            normalizer=num_pos,
        )
        # Every location, with the negatives' terms weighted by zero: boolean indexing would
        # give a data-dependent size (a host sync on CUDA, a graph break under compile).
        # Negatives get a unit box around their point as target, so every term is finite.
        pos = positive.flatten()
        all_points = points.expand(len(targets), -1, -1).reshape(-1, 2)
        pred_boxes = decode_ltrb(all_points, distances.reshape(-1, 4).float())
        unit = all_points.repeat(1, 2) + all_points.new_tensor([-1.0, -1.0, 1.0, 1.0])
        target_boxes = torch.where(pos[:, None], matched_t.reshape(-1, 4), unit)
        weights = centerness_target(all_points, target_boxes) * pos
        weight_sum = reduce_mean(weights.sum()).clamp(min=1e-6)
        giou = generalized_box_iou_loss(pred_boxes, target_boxes, reduction="none")
        loss_box = (giou * weights).sum() / weight_sum
        bce = F.binary_cross_entropy_with_logits(
            centerness.flatten().float(), weights, reduction="none"
        )
        loss_ctr = (bce * pos).sum() / num_pos
        return {"loss_cls": loss_cls, "loss_box": loss_box, "loss_centerness": loss_ctr}

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
        points, levels = self._locations(outputs, outputs["cls_logits"][0].device)
        per_level = [points[levels == i] for i in range(len(self.strides))]
        results = []
        for b, size in enumerate(image_sizes):
            scores, boxes = [], []
            for level, level_points in enumerate(per_level):
                cls = torch.sigmoid(outputs["cls_logits"][level][b].float())
                ctr = torch.sigmoid(outputs["centerness"][level][b].float())
                scores.append(torch.sqrt(cls * ctr[:, None]))
                boxes.append(decode_ltrb(level_points, outputs["boxes"][level][b].float()))
            results.append(postprocess_detections(scores, boxes, tuple(size), **self.inference))
        return results

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
        scores, boxes = [], []
        for level, (size, stride) in enumerate(zip(outputs["sizes"], self.strides)):
            points, _ = grid_locations([size], [stride], device)
            cls = torch.sigmoid(cls_logits[level].float())
            ctr = torch.sigmoid(outputs["centerness"][level].float())
            scores.append(torch.sqrt(cls * ctr[..., None]))
            distances = outputs["boxes"][level].float()
            boxes.append(decode_ltrb(points.expand(distances.shape[0], -1, -1), distances))
        return postprocess_padded(scores, boxes, image_sizes, **self.inference)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, strides={self.strides}"
