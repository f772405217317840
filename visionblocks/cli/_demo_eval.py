"""The demo's evaluation (private; see `visionblocks.cli.demo`): per-class AP, the score
threshold it deploys, and how the objects of the drawn images were found.

Matching: a detection is a hit when it overlaps an object of its own class, not yet taken by
a higher-scoring detection, at IoU >= 0.5 (COCO's greedy matching at AP50; the object of
highest IoU is taken).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

IOU_THRESH = 0.5


def hits(prediction: Mapping[str, Tensor], target: Mapping[str, Tensor]) -> Tensor:
    """Which of one image's detections are hits (bool, in the detections' order)."""
    from torchvision.ops import box_iou

    scores = prediction["scores"]
    hit = torch.zeros(len(scores), dtype=torch.bool)
    if not len(scores) or not len(target["boxes"]):
        return hit
    iou = box_iou(prediction["boxes"].float(), target["boxes"].float())
    iou[prediction["labels"][:, None] != target["labels"][None, :]] = -1.0
    taken = torch.zeros(iou.shape[1], dtype=torch.bool)
    for i in scores.argsort(descending=True, stable=True).tolist():
        row = iou[i].masked_fill(taken, -1.0)
        best = int(row.argmax())
        if row[best] >= IOU_THRESH:
            hit[i] = taken[best] = True
    return hit


def score_threshold(scores: Tensor, hit: Tensor, num_objects: int) -> float | None:
    """The score threshold of highest F1 at IoU 0.5: midway between the lowest kept score and
    the highest dropped one (``None`` when no threshold finds an object).

    Args:
        scores (Tensor[N]): Every detection's score, over a set of images.
        hit (Tensor[N]): Whether each detection is a hit (`hits`).
        num_objects: The objects in those images.
    """
    if not bool(hit.any()):
        return None
    order = scores.argsort(descending=True, stable=True)
    ranked, found = scores[order].double(), hit[order].double().cumsum(0)
    # F1 = 2 TP / (2 TP + FP + FN) = 2 TP / (kept + objects), when the cut is after rank i
    f1 = 2 * found / (torch.arange(1, len(ranked) + 1) + num_objects)
    dropped = torch.cat([ranked[1:], ranked.new_zeros(1)])
    f1[ranked == dropped] = -1.0  # no cut between equal scores
    best = int(f1.argmax())
    return float((ranked[best] + dropped[best]) / 2)


def above(prediction: Mapping[str, Tensor], threshold: float) -> dict[str, Tensor]:
    """One image's detections scoring at least ``threshold``."""
    keep = prediction["scores"] >= threshold
    return {k: v[keep] for k, v in prediction.items()}


def found_once(
    predictions: Sequence[Mapping[str, Tensor]], targets: Sequence[Mapping[str, Tensor]]
) -> dict[str, int]:
    """``images``, ``objects``, ``boxes`` and ``found`` (objects with a box of their class):
    every object has exactly one box, of its class, when all but ``images`` are equal."""
    counts = {"images": len(targets), "objects": 0, "boxes": 0, "found": 0}
    for prediction, target in zip(predictions, targets):
        counts["objects"] += len(target["boxes"])
        counts["boxes"] += len(prediction["boxes"])
        counts["found"] += int(hits(prediction, target).sum())
    return counts


def per_class_ap(
    predictions: Mapping[int, Mapping[str, Tensor]], dataset: Any
) -> dict[str, dict[str, float]]:
    """``{class name: {"AP": ..., "AP50": ...}}``: `visionblocks.data.coco_evaluate` with one
    category at a time (a collective under DDP, as ``coco_evaluate``)."""
    from visionblocks.data import coco_evaluate

    gt = dataset.coco.dataset
    result = {}
    for label, name in enumerate(dataset.classes):
        category = dataset.label_to_category_id[label]
        one = {
            **gt,
            "categories": [c for c in gt["categories"] if c["id"] == category],
            "annotations": [a for a in gt["annotations"] if a["category_id"] == category],
        }
        mine = {i: above_label(p, label) for i, p in predictions.items()}
        stats = coco_evaluate(mine, one, label_to_category_id={label: category},
                              image_ids=dataset.ids)  # fmt: skip
        result[name] = {"AP": stats["AP"], "AP50": stats["AP50"]}
    return result


def above_label(prediction: Mapping[str, Tensor], label: int) -> dict[str, Tensor]:
    """One image's detections of class ``label``."""
    keep = prediction["labels"] == label
    return {k: v[keep] for k, v in prediction.items()}
