"""Turning model outputs into COCO result dicts for `visionblocks.data.coco_evaluate`
(private): box, mask and key-point outputs per image, label mapping, validation of result
dicts."""

from __future__ import annotations

import numbers
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from visionblocks._core.tensor_checks import check_real, check_tensor

__all__ = ["RESULT_KEYS", "as_int", "ids_text", "to_results"]

# Any of them: a COCO result dict ("score": every result has one, per-image outputs "scores";
# a key-point result's "keypoints" is no sign, per-image key-point outputs have that key too).
RESULT_KEYS = {"category_id", "bbox", "segmentation", "score"}


def ids_text(ids: Iterable[Any], limit: int = 8) -> str:
    ids = sorted(set(ids))
    return ", ".join(map(str, ids[:limit])) + (
        f", ... ({len(ids)} in all)" if len(ids) > limit else ""
    )


def as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool ({value!r})")
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} ({value!r})"
        ) from None


def _check_box_output(where: str, output: Any) -> tuple[Tensor, Tensor, Tensor]:
    if not isinstance(output, Mapping):
        raise TypeError(f"{where} must be a dict of tensors, got {type(output).__name__}")
    missing = [k for k in ("boxes", "scores", "labels") if k not in output]
    if missing:
        raise ValueError(f"{where} has no {missing}; got keys {sorted(map(str, output))}")
    boxes = check_tensor(f"{where}['boxes']", output["boxes"]).detach()
    scores = check_tensor(f"{where}['scores']", output["scores"]).detach()
    labels = check_tensor(f"{where}['labels']", output["labels"]).detach()
    n = boxes.shape[0] if boxes.dim() == 2 else -1
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{where}['boxes'] must have shape (N, 4), got {tuple(boxes.shape)}")
    for name, t in (("scores", scores), ("labels", labels)):
        if t.shape != (n,):
            raise ValueError(f"{where}['{name}'] must have shape ({n},), got {tuple(t.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{where}['labels'] must be an integer tensor, got dtype {labels.dtype}")
    boxes = boxes.to("cpu", torch.float64)
    scores = scores.to("cpu", torch.float64)
    if not (bool(torch.isfinite(boxes).all()) and bool(torch.isfinite(scores).all())):
        raise ValueError(f"{where}: boxes and scores must be finite (found NaN or inf)")
    return boxes, scores, labels.cpu()


def _encode_masks(where: str, masks: Any, n: int, size: tuple[int, int], threshold: float) -> list:
    from pycocotools import mask as mask_utils

    masks = check_tensor(f"{where}['masks']", masks).detach()
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3 or masks.shape[0] != n:
        raise ValueError(
            f"{where}['masks'] must have shape ({n}, H, W) or ({n}, 1, H, W), "
            f"got {tuple(masks.shape)}"
        )
    if tuple(masks.shape[1:]) != size:
        raise ValueError(
            f"{where}['masks'] must have the image's size {size} (H, W) from coco_gt, got "
            f"{tuple(masks.shape[1:])}; paste masks back to the original image first"
        )
    binary = masks > threshold if masks.is_floating_point() else masks != 0
    array = np.asfortranarray(binary.to("cpu", torch.uint8).permute(1, 2, 0).numpy())
    rles = mask_utils.encode(array)
    return [{"size": list(r["size"]), "counts": r["counts"].decode("ascii")} for r in rles]


def _check_keypoint_output(where: str, output: Any, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(keypoints (N, K, 3) float64 with COCO's third value, scores, labels)`` on the CPU."""
    if not isinstance(output, Mapping):
        raise TypeError(f"{where} must be a dict of tensors, got {type(output).__name__}")
    missing = [key for key in ("keypoints", "scores", "labels") if key not in output]
    if missing:
        raise ValueError(
            f"{where} has no {missing} (iou_type='keypoints'); got keys {sorted(map(str, output))}"
        )
    points = check_real(f"{where}['keypoints']", output["keypoints"]).detach()
    scores = check_real(f"{where}['scores']", output["scores"]).detach()
    labels = check_tensor(f"{where}['labels']", output["labels"]).detach()
    if points.dim() != 3 or points.shape[1] != k or points.shape[2] not in (2, 3):
        raise ValueError(
            f"{where}['keypoints'] must have shape (N, {k}, 2) or (N, {k}, 3), K = {k} key "
            f"points as in coco_gt, got {tuple(points.shape)}"
        )
    n = points.shape[0]
    for name, t in (("scores", scores), ("labels", labels)):
        if t.shape != (n,):
            raise ValueError(f"{where}['{name}'] must have shape ({n},), got {tuple(t.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{where}['labels'] must be an integer tensor, got dtype {labels.dtype}")
    third = points[..., 2] if points.shape[2] == 3 else torch.ones(points.shape[:2])
    if output.get("keypoints_scores") is not None:
        third = check_real(f"{where}['keypoints_scores']", output["keypoints_scores"]).detach()
        if third.shape != (n, k):
            raise ValueError(
                f"{where}['keypoints_scores'] must have shape ({n}, {k}), got {tuple(third.shape)}"
            )
    points = torch.cat(
        [points[..., :2].to("cpu", torch.float64), third.to("cpu", torch.float64)[..., None]], -1
    )
    scores = scores.to("cpu", torch.float64)
    if not (bool(torch.isfinite(points).all()) and bool(torch.isfinite(scores).all())):
        raise ValueError(
            f"{where}: keypoints, keypoints_scores and scores must be finite (found NaN or inf)"
        )
    return points, scores, labels.cpu()


def _outputs_to_results(
    image_id: int, output: Any, where: str, ctx: dict[str, Any]
) -> list[dict[str, Any]]:
    if ctx["iou_type"] == "keypoints":
        points, scores, labels = _check_keypoint_output(where, output, ctx["num_keypoints"])
    else:
        boxes, scores, labels = _check_box_output(where, output)
    label_map = ctx["label_map"]
    labels_list = labels.tolist()
    if label_map is None:
        category_ids = labels_list
        unknown = set(category_ids) - ctx["category_ids"]
        what = "labels that are not category ids of coco_gt (pass label_to_category_id?)"
    else:
        unknown = set(labels_list) - set(label_map)
        category_ids = [label_map.get(label) for label in labels_list]
        what = "labels missing from label_to_category_id"
    if unknown:
        raise ValueError(f"{where} has {what}: {ids_text(unknown)}")
    common = [
        {"image_id": image_id, "category_id": int(c), "score": float(s)}
        for c, s in zip(category_ids, scores.tolist())
    ]
    if ctx["iou_type"] == "keypoints":  # [x1, y1, v1, x2, ...], COCO's keypoint results
        flat = points.flatten(1).tolist()
        return [{**r, "keypoints": p} for r, p in zip(common, flat)]
    if ctx["iou_type"] == "bbox":
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        return [{**r, "bbox": b} for r, b in zip(common, xywh)]
    if not common:
        return []
    if output.get("masks") is None:
        raise ValueError(f"{where} has no 'masks', which iou_type='segm' needs")
    rles = _encode_masks(where, output["masks"], len(common), ctx["sizes"][image_id], ctx["thr"])
    return [{**r, "segmentation": m} for r, m in zip(common, rles)]


def _plain(value: Any) -> Any:
    """Tensors and NumPy arrays/scalars as Python numbers or lists (result dicts may hold them)."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _check_result(result: Any, where: str, ctx: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(result, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(result).__name__}")
    key = {"bbox": "bbox", "segm": "segmentation"}.get(ctx["iou_type"], "keypoints")
    missing = [k for k in ("image_id", "category_id", "score", key) if k not in result]
    if missing:
        raise ValueError(f"{where} has no {missing} (iou_type={ctx['iou_type']!r})")
    image_id = as_int(f"{where}['image_id']", result["image_id"])
    category_id = as_int(f"{where}['category_id']", result["category_id"])
    if category_id not in ctx["category_ids"]:
        raise ValueError(f"{where} has category_id {category_id}, not a category of coco_gt")
    score = _plain(result["score"])
    if not isinstance(score, numbers.Real) or not np.isfinite(score):
        raise ValueError(f"{where}['score'] must be a finite number, got {score!r}")
    out = {"image_id": image_id, "category_id": category_id, "score": float(score)}
    value = _plain(result[key]) if key != "segmentation" else result[key]
    if key == "keypoints":
        k = ctx["num_keypoints"]
        ok = isinstance(value, Sequence) and not isinstance(value, (str, bytes))
        if not ok or len(value) != 3 * k:
            got = f"{len(value)} values" if ok else repr(value)
            raise ValueError(
                f"{where}['keypoints'] must be a flat list of 3 * K = {3 * k} numbers "
                f"[x1, y1, v1, ..., xK, yK, vK] (K = {k} key points as in coco_gt), got {got}"
            )
        if not all(isinstance(v, numbers.Real) and np.isfinite(v) for v in value):
            raise ValueError(
                f"{where}['keypoints'] must hold finite numbers, got {str(value)[:120]}"
            )
        out["keypoints"] = [float(v) for v in value]
        return out
    if key == "bbox":
        ok = isinstance(value, Sequence) and len(value) == 4
        if not ok or not all(isinstance(v, numbers.Real) and np.isfinite(v) for v in value):
            raise ValueError(
                f"{where}['bbox'] must be 4 finite numbers [x, y, w, h], got {value!r}"
            )
        out["bbox"] = [float(v) for v in value]
        return out
    counts = value.get("counts") if isinstance(value, Mapping) else None
    if not isinstance(counts, (str, bytes)):
        raise ValueError(
            f"{where}['segmentation'] must be a compressed RLE {{'size': [H, W], 'counts': str}}"
        )
    size = ctx["sizes"].get(image_id)
    if size is not None and tuple(value.get("size", ())) != size:
        raise ValueError(
            f"{where}['segmentation'] has size {value.get('size')}, image {image_id} is {size}"
        )
    counts = counts.decode("ascii") if isinstance(counts, bytes) else counts
    out["segmentation"] = {"size": list(value["size"]), "counts": counts}
    return out


def to_results(predictions: Any, ctx: dict[str, Any]) -> tuple[list[int], list[dict[str, Any]]]:
    """``(image ids covered, COCO result dicts)`` of one rank's predictions."""
    if isinstance(predictions, Mapping):
        items = [(k, v, f"predictions[{k!r}]") for k, v in predictions.items()]
    elif isinstance(predictions, Sequence) and not isinstance(predictions, (str, bytes)):
        items = [(None, v, f"predictions[{i}]") for i, v in enumerate(predictions)]
    else:
        raise TypeError(
            "predictions must be a dict {image_id: output}, a list of outputs or a list of "
            f"COCO result dicts, got {type(predictions).__name__}"
        )
    first = items[0][1] if items else None
    as_outputs = isinstance(predictions, Mapping) or (
        isinstance(first, Mapping) and not RESULT_KEYS & set(first)
    )
    covered: list[int] = []
    results: list[dict[str, Any]] = []
    for key, value, where in items:
        is_result = isinstance(value, Mapping) and bool(RESULT_KEYS & set(value))
        if isinstance(value, Mapping) and is_result == as_outputs and key is None:
            raise ValueError(f"{where}: predictions mix per-image outputs and COCO result dicts")
        if not as_outputs:
            results.append(_check_result(value, where, ctx))
            continue
        if key is not None:
            image_id = as_int(f"key {key!r} of predictions", key)
            if isinstance(value, Mapping) and "image_id" in value:
                inner = as_int(f"{where}['image_id']", value["image_id"])
                if inner != image_id:
                    raise ValueError(f"{where} has image_id {inner}, but its key is {image_id}")
        elif isinstance(value, Mapping) and "image_id" in value:
            image_id = as_int(f"{where}['image_id']", value["image_id"])
        else:
            raise ValueError(f"{where} has no 'image_id' (needed in a list of per-image outputs)")
        if image_id in ctx["gt_ids"]:
            results.extend(_outputs_to_results(image_id, value, where, ctx))
        covered.append(image_id)
    if not as_outputs:
        covered = list(dict.fromkeys(r["image_id"] for r in results))
    unknown = set(covered) - ctx["gt_ids"]
    in_file = unknown & ctx.get("file_ids", set())
    if in_file:
        raise ValueError(
            f"predictions for images {ids_text(in_file)}, which are in the annotation file but "
            "not among the images evaluated (a dataset built with remove_empty=True, a Subset): "
            "evaluate against dataset.coco to count every image of the file, or drop those "
            "predictions"
        )
    if unknown:
        raise ValueError(f"predictions for images that are not in coco_gt: {ids_text(unknown)}")
    if len(set(covered)) != len(covered) and as_outputs:
        dup = {i for i, count in Counter(covered).items() if count > 1}
        raise ValueError(f"predictions hold several outputs for images {ids_text(dup)}")
    return covered, results
