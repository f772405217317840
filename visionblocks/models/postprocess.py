"""Box decoding and detection post-processing for dense detectors.

Convention:
    Locations and boxes are in input pixels, boxes XYXY.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_int, check_number
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_device, check_floating
from visionblocks.models._levels import check_size

__all__ = ["decode_ltrb", "postprocess_detections", "postprocess_padded"]
__dir__ = public_dir(__name__, __all__)


def decode_ltrb(points: Tensor, distances: Tensor) -> Tensor:
    """Boxes from locations and their distances to the four sides (FCOS's parametrisation).

    Args:
        points (Tensor[..., 2]): Locations ``(x, y)`` in pixels.
        distances (Tensor[..., 4]): ``(left, top, right, bottom)`` distances, in pixels.

    Returns:
        Tensor[..., 4]: XYXY boxes ``(x - l, y - t, x + r, y + b)``.

    Raises:
        TypeError: ``points`` or ``distances`` is not a floating-point tensor.
        ValueError: If the last dims are not 2 and 4, the leading dims differ, or the two
            are on different devices.

    Examples:
        >>> decode_ltrb(torch.tensor([[10.0, 20.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
        tensor([[ 9., 18., 13., 24.]])
    """
    check_floating("points", points)
    check_floating("distances", distances)
    check_device("distances", distances, points.device, "points")
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
    ``max_detections`` highest scores. On CUDA this synchronises, as NMS does.

    **Non-finite predictions are dropped** (as detectron2's ``fast_rcnn_inference``): a
    diverging model gives fewer detections, not NaN boxes. With value checks on, scores that
    are NaN or outside ``[0, 1]`` raise instead.

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
        TypeError: ``scores`` or ``boxes`` not a list of floating-point tensors, options of
            the wrong type (``score_thresh=None``...).
        ValueError: Levels, rows or classes of ``scores`` and ``boxes`` that disagree,
            tensors on different devices, options out of range; with value checks on, scores
            outside ``[0, 1]`` (logits?) or NaN (on CUDA a device-side assert).

    Examples:
        >>> scores = [torch.tensor([[0.9, 0.1], [0.8, 0.0]])]
        >>> boxes = [torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])]
        >>> out = postprocess_detections(scores, boxes, (8, 8))
        >>> out["boxes"], out["scores"], out["labels"]
        (tensor([[0., 0., 8., 8.],
                [0., 0., 8., 8.]]), tensor([0.9000, 0.1000]), tensor([0, 1]))
    """
    from torchvision.ops import batched_nms

    _check_levels(scores, boxes)
    h, w = check_size("image_size", image_size)
    check_number("score_thresh", score_thresh, 0.0, 1.0)
    check_number("nms_thresh", nms_thresh, 0.0, 1.0)
    check_int("topk_candidates", topk_candidates, 1)
    check_int("max_detections", max_detections, 1)
    kept_boxes, kept_scores, kept_labels = [], [], []
    for level_scores, level_boxes in zip(scores, boxes):
        finite = torch.isfinite(level_boxes).all(-1, keepdim=True) & level_scores.isfinite()
        flat = ((level_scores > score_thresh) & finite).flatten()
        keep = torch.nonzero(flat).squeeze(1)
        values = level_scores.flatten()[keep]
        if values.numel() > topk_candidates:
            values, order = values.topk(topk_candidates)
            keep = keep[order]
        num_classes = level_scores.shape[1]
        kept_boxes.append(level_boxes[keep // num_classes])
        kept_scores.append(values)
        kept_labels.append(keep % num_classes)
    out_boxes = torch.cat(kept_boxes)
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


def _check_levels(scores: Any, boxes: Any, batched: bool = False) -> None:
    """Per level: ``(A_l, C)`` scores and ``(A_l, 4)`` boxes (``batched``: with a batch dim)."""
    for name, value in (("scores", scores), ("boxes", boxes)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"{name} must be a list of tensors, one per level, got {type(value).__name__}"
            )
    if len(scores) != len(boxes) or not scores:
        raise ValueError(
            f"scores and boxes must hold as many levels (>= 1), got {len(scores)} and {len(boxes)}"
        )
    for level, (s, b) in enumerate(zip(scores, boxes)):
        check_floating(f"scores[{level}]", s)
        check_floating(f"boxes[{level}]", b)
        dims, lead = (3, "B, A") if batched else (2, "A")
        if (
            s.dim() != dims
            or b.dim() != dims
            or b.shape[-1] != 4
            or s.shape[:-1] != b.shape[:-1]
            or s.shape[:-2] != scores[0].shape[:-2]
        ):
            raise ValueError(
                f"scores[{level}] must be ({lead}, C) and boxes[{level}] ({lead}, 4) with the "
                f"same {lead}{' (B: the batch of every level)' if batched else ''}, got "
                f"{tuple(s.shape)} and {tuple(b.shape)}"
            )
        if s.shape[-1] != scores[0].shape[-1]:
            raise ValueError(
                f"every level must score the same classes: scores[0] has "
                f"{scores[0].shape[-1]}, scores[{level}] has {s.shape[-1]}"
            )
        check_device(f"scores[{level}]", s, scores[0].device, "scores[0]")
        check_device(f"boxes[{level}]", b, scores[0].device, "scores[0]")
    on_host = reads_values(*scores)
    if on_host or asserts_on_device(*scores):
        bad = [((s < 0) | (s > 1) | torch.isnan(s)).any() for s in scores]
        if not on_host:  # CUDA: a device-side assert, no host sync
            assert_on_device(~torch.stack(bad), "scores must hold probabilities in [0, 1]")
        elif bool(torch.stack(bad).any()):
            level = next(i for i, flag in enumerate(bad) if flag)
            raise ValueError(
                f"scores[{level}] must hold probabilities in [0, 1] (sigmoid or softmax "
                f"outputs, not logits), got values in [{scores[level].min().item()}, "
                f"{scores[level].max().item()}]"
            )


_MAX_PADDED = 100_000
"""Largest ``max_detections`` of `postprocess_padded` (its outputs have that many rows)."""


def postprocess_padded(
    scores: Sequence[Tensor],
    boxes: Sequence[Tensor],
    image_sizes: Tensor,
    *,
    score_thresh: float = 0.05,
    topk_candidates: int = 1000,
    nms_thresh: float = 0.6,
    max_detections: int = 100,
) -> dict[str, Tensor]:
    """`postprocess_detections` of a whole batch at once, padded to ``max_detections``.

    The export form (no loop over images, no host synchronisation: ``torch.export`` with
    dynamic batch and image size, ``torch.onnx.export(..., dynamo=True)``): one
    ``torchvision.ops.nms`` with boxes offset per (image, class). The same detections as
    `postprocess_detections`, image by image (ties in score may order differently).

    Args:
        scores (Sequence[Tensor[B, A_l, C]]): Class scores in ``[0, 1]`` per level.
        boxes (Sequence[Tensor[B, A_l, 4]]): XYXY boxes of the locations per level.
        image_sizes (Tensor[B, 2]): ``(H, W)`` of every image, to clip to (integers).
        score_thresh: Smallest score kept, as in `postprocess_detections`.
        topk_candidates: Candidates kept per level and image before NMS.
        nms_thresh: NMS IoU threshold (per image and class).
        max_detections: Detections kept per image, the size ``K`` of the padded outputs.

    Returns:
        dict[str, Tensor]: ``boxes (Tensor[B, K, 4])``, ``scores (Tensor[B, K])``,
        ``labels (Tensor[B, K])`` int64 and ``num_detections (Tensor[B])`` int64: the first
        ``num_detections[b]`` rows of image ``b``, by decreasing score, are its detections;
        the rest is padding (0, labels -1).

    Raises:
        TypeError: As `postprocess_detections`; ``image_sizes`` not an integer tensor.
        ValueError: As `postprocess_detections`; an ``image_sizes`` that is not ``(B, 2)``
            on the scores' device; ``max_detections`` above 100,000.

    Examples:
        >>> scores = [torch.tensor([[[0.9, 0.1], [0.8, 0.0]]])]
        >>> boxes = [torch.tensor([[[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]]])]
        >>> out = postprocess_padded(scores, boxes, torch.tensor([[8, 8]]), max_detections=3)
        >>> out["scores"], out["labels"], out["num_detections"]
        (tensor([[0.9000, 0.1000, 0.0000]]), tensor([[ 0,  1, -1]]), tensor([2]))
    """
    from visionblocks.ops.nms import nms

    _check_levels(scores, boxes, batched=True)
    if not isinstance(image_sizes, Tensor):
        raise TypeError(
            f"image_sizes must be a (B, 2) tensor of (H, W), got {type(image_sizes).__name__}"
        )
    if image_sizes.dim() != 2 or image_sizes.shape != (scores[0].shape[0], 2):
        raise ValueError(
            f"image_sizes must be (B, 2) with B = {scores[0].shape[0]} (the batch of scores), "
            f"got {tuple(image_sizes.shape)}"
        )
    if (
        image_sizes.is_floating_point()
        or image_sizes.is_complex()
        or image_sizes.dtype == torch.bool
    ):
        raise TypeError(f"image_sizes must be an integer tensor, got {image_sizes.dtype}")
    check_device("image_sizes", image_sizes, scores[0].device, "scores[0]")
    check_number("score_thresh", score_thresh, 0.0, 1.0)
    check_number("nms_thresh", nms_thresh, 0.0, 1.0)
    check_int("topk_candidates", topk_candidates, 1)
    # every image gets max_detections rows: bounded so that a typo cannot allocate terabytes
    check_int("max_detections", max_detections, 1, _MAX_PADDED)
    batch, num_classes = scores[0].shape[0], scores[0].shape[-1]
    cand_scores, cand_boxes, cand_labels = [], [], []
    for level_scores, level_boxes in zip(scores, boxes):
        # Non-finite predictions score -1, below any threshold: never kept, and never ahead
        # of a finite one (topk puts NaN first).
        finite = torch.isfinite(level_boxes).all(-1, keepdim=True) & level_scores.isfinite()
        flat = torch.where(finite, level_scores, -1.0).flatten(1)
        k = torch.sym_min(topk_candidates, flat.shape[1])
        values, index = flat.topk(k, dim=1)
        cand_scores.append(values)
        cand_labels.append(index % num_classes)
        rows = (index // num_classes).unsqueeze(-1).expand(-1, -1, 4)
        cand_boxes.append(level_boxes.gather(1, rows))
    all_scores, all_labels = torch.cat(cand_scores, 1), torch.cat(cand_labels, 1)
    sizes = image_sizes.to(device=all_scores.device, dtype=torch.float32)
    bound = sizes.flip(-1).repeat(1, 2)[:, None, :]  # (W, H, W, H) per image
    all_boxes = torch.cat(cand_boxes, 1).float()
    # A non-finite box left among the candidates (never kept) must not poison the offset.
    all_boxes = torch.where(all_boxes.isfinite(), all_boxes, 0.0).clamp(min=0.0).minimum(bound)
    image, slot = torch.nonzero(all_scores > score_thresh, as_tuple=True)
    kept_scores, kept_labels = all_scores[image, slot], all_labels[image, slot]
    kept_boxes = all_boxes[image, slot]
    group = (image * num_classes + kept_labels).to(kept_boxes.dtype)
    offset = group[:, None] * (all_boxes.max() + 1.0)  # boxes of two groups never overlap
    keep = nms(kept_boxes + offset, kept_scores.float(), nms_thresh)  # by decreasing score
    image = image[keep]
    one_hot = image[:, None] == torch.arange(batch, device=image.device)[None, :]
    rank = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # rank of a detection in its image
    rank = rank.clamp(max=max_detections)  # beyond max_detections: the dropped last slot
    out_boxes = kept_boxes.new_zeros((batch, max_detections + 1, 4))
    out_scores = kept_scores.new_zeros((batch, max_detections + 1))
    out_labels = kept_labels.new_full((batch, max_detections + 1), -1)
    out_boxes = out_boxes.index_put((image, rank), kept_boxes[keep])
    out_scores = out_scores.index_put((image, rank), kept_scores[keep])
    out_labels = out_labels.index_put((image, rank), kept_labels[keep])
    return {
        "boxes": out_boxes[:, :max_detections],
        "scores": out_scores[:, :max_detections],
        "labels": out_labels[:, :max_detections],
        "num_detections": one_hot.sum(0).clamp(max=max_detections),
    }
