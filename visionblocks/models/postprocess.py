"""Box decoding and detection post-processing for dense detectors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._check import check_range, check_tensor

__all__ = ["decode_ltrb", "postprocess_detections"]


def decode_ltrb(points: Tensor, distances: Tensor) -> Tensor:
    """Boxes from locations and their distances to the four sides (FCOS's parametrisation).

    Args:
        points (Tensor[..., 2]): Locations ``(x, y)`` in pixels.
        distances (Tensor[..., 4]): ``(left, top, right, bottom)`` distances, in pixels.

    Returns:
        Tensor[..., 4]: XYXY boxes ``(x - l, y - t, x + r, y + b)``.

    Raises:
        ValueError: If the last dims are not 2 and 4, or the leading dims differ.

    Convention:
        Locations and boxes in input pixels, boxes XYXY; FCOS places the location of feature
        cell ``(i, j)`` at ``(j s + s // 2, i s + s // 2)`` for stride ``s``.

    Examples:
        >>> decode_ltrb(torch.tensor([[10.0, 20.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        tensor([[ 9., 18., 13., 24.]])
    """
    check_tensor("points", points)
    check_tensor("distances", distances)
    if (
        points.shape[-1] != 2
        or distances.shape[-1] != 4
        or points.shape[:-1] != distances.shape[:-1]
    ):
        raise ValueError(
            f"points must be (..., 2) and distances (..., 4) with the same leading dims, got "
            f"{tuple(points.shape)} and {tuple(distances.shape)}"
        )
    return torch.cat([points - distances[..., :2], points + distances[..., 2:]], dim=-1)


def postprocess_detections(
    scores: Sequence[Tensor],
    boxes: Sequence[Tensor],
    image_size: tuple[int, int],
    *,
    score_thresh: float = 0.05,
    topk_candidates: int = 1000,
    nms_thresh: float = 0.6,
    max_detections: int = 100,
) -> dict[str, Tensor]:
    """Threshold, keep the top candidates per level, clip, class-wise NMS, keep the best.

    Per level: the (location, class) pairs scoring above ``score_thresh``, at most
    ``topk_candidates`` of them. Then over all levels: boxes clipped to the image,
    ``torchvision.ops.batched_nms`` per class at ``nms_thresh``, and the
    ``max_detections`` highest scores.

    Args:
        scores (Sequence[Tensor[A_l, C]]): Class scores in ``[0, 1]`` per level.
        boxes (Sequence[Tensor[A_l, 4]]): XYXY boxes of the locations per level.
        image_size: ``(H, W)`` to clip to.
        score_thresh: Smallest score kept.
        topk_candidates: Candidates kept per level before NMS.
        nms_thresh: IoU above which a lower-scoring box of the same class is removed.
        max_detections: Detections kept in the end.

    Returns:
        dict[str, Tensor]: ``boxes (Tensor[K, 4])``, ``scores (Tensor[K])``,
        ``labels (Tensor[K])`` int64, sorted by decreasing score.

    Raises:
        ValueError: Different numbers of score and box levels, or options out of range.

    Examples:
        >>> scores = [torch.tensor([[0.9, 0.1], [0.8, 0.0]])]
        >>> boxes = [torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])]
        >>> out = postprocess_detections(scores, boxes, (8, 8))
        >>> out["boxes"], out["scores"], out["labels"]
        (tensor([[0., 0., 8., 8.],
                [0., 0., 8., 8.]]), tensor([0.9000, 0.1000]), tensor([0, 1]))
    """
    from torchvision.ops import batched_nms

    if len(scores) != len(boxes) or not scores:
        raise ValueError(
            f"need as many score as box levels (>= 1), got {len(scores)}, {len(boxes)}"
        )
    check_range("score_thresh", score_thresh, 0.0, 1.0)
    check_range("nms_thresh", nms_thresh, 0.0, 1.0)
    check_range("topk_candidates", topk_candidates, 1)
    check_range("max_detections", max_detections, 1)
    kept_boxes, kept_scores, kept_labels = [], [], []
    for level_scores, level_boxes in zip(scores, boxes):
        flat = level_scores.flatten()
        keep = torch.nonzero(flat > score_thresh).squeeze(1)
        values = flat[keep]
        if values.numel() > topk_candidates:
            values, order = values.topk(topk_candidates)
            keep = keep[order]
        num_classes = level_scores.shape[1]
        kept_boxes.append(level_boxes[keep // num_classes])
        kept_scores.append(values)
        kept_labels.append(keep % num_classes)
    out_boxes = torch.cat(kept_boxes)
    h, w = image_size
    out_boxes = torch.stack(
        [
            out_boxes[:, 0].clamp(0, w),
            out_boxes[:, 1].clamp(0, h),
            out_boxes[:, 2].clamp(0, w),
            out_boxes[:, 3].clamp(0, h),
        ],
        dim=1,
    )
    out_scores, out_labels = torch.cat(kept_scores), torch.cat(kept_labels)
    keep = batched_nms(out_boxes.float(), out_scores.float(), out_labels, nms_thresh)
    keep = keep[:max_detections]
    return {"boxes": out_boxes[keep], "scores": out_scores[keep], "labels": out_labels[keep]}
