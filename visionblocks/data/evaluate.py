"""COCO box, mask and keypoint evaluation (AP/AR) of model outputs, single-process or
distributed: `coco_evaluate`."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.data._coco_results import as_int, ids_text, to_results
from visionblocks.distributed import all_gather_object, get_rank, get_world_size
from visionblocks.ops.oks import COCO_PERSON_SIGMAS

__all__ = ["COCO_KEYPOINT_STAT_NAMES", "COCO_STAT_NAMES", "coco_evaluate"]
__dir__ = public_dir(__name__, __all__)

COCO_STAT_NAMES: tuple[str, ...] = (
    *("AP", "AP50", "AP75", "APs", "APm", "APl"),
    *("AR1", "AR10", "AR100", "ARs", "ARm", "ARl"),
)
"""The keys of `coco_evaluate`'s result for ``"bbox"`` and ``"segm"``, in COCOeval's ``stats``
order."""
COCO_KEYPOINT_STAT_NAMES: tuple[str, ...] = (
    *("AP", "AP50", "AP75", "APm", "APl"),
    *("AR", "AR50", "AR75", "ARm", "ARl"),
)
"""The keys of `coco_evaluate`'s result for ``"keypoints"``, in COCOeval's ``stats`` order (OKS
thresholds, up to 20 detections per image, no small objects)."""
_IOU_TYPES = ("bbox", "segm", "keypoints")
_BACKENDS = ("pycocotools", "faster_coco_eval")
_ACCEPTED_GT = "a COCO object, a path to an annotation JSON, a COCO-format dict or a dataset"


# ------------------------------------------------------------------------------ ground truth


def _is_coco(obj: Any) -> bool:  # pycocotools.coco.COCO, faster_coco_eval.COCO and look-alikes
    return all(hasattr(obj, a) for a in ("dataset", "imgs", "cats", "loadRes"))


def _load_coco(source: Any, backend: str) -> Any:
    """A COCO object of ``backend``'s own class from a path, a dict or another COCO object."""
    if backend == "faster_coco_eval":
        try:
            from faster_coco_eval import COCO
        except ImportError as err:
            raise ImportError(
                "backend='faster_coco_eval' needs the faster-coco-eval package: "
                "pip install faster-coco-eval"
            ) from err
    else:
        from pycocotools.coco import COCO
    if isinstance(source, COCO):
        return source
    data = source.dataset if _is_coco(source) else source
    with contextlib.redirect_stdout(io.StringIO()):
        if isinstance(data, (str, os.PathLike)):
            return COCO(os.fspath(data))
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    return coco


def _resolve_ground_truth(coco_gt: Any, backend: str) -> tuple[Any, list[int], Any]:
    """``(coco, image ids of coco_gt, label map of the dataset or None)``."""
    if isinstance(coco_gt, torch.utils.data.Subset):
        indices = list(range(len(coco_gt)))
        dataset: Any = coco_gt
        while isinstance(dataset, torch.utils.data.Subset):
            indices = [int(dataset.indices[i]) for i in indices]
            dataset = dataset.dataset
        if not (hasattr(dataset, "coco") and hasattr(dataset, "ids")):
            raise TypeError(
                "coco_gt is a Subset of a dataset without .coco and .ids; "
                f"got a Subset of {type(dataset).__name__}"
            )
        all_ids = list(dataset.ids)
        coco, _, label_map = _resolve_ground_truth(dataset, backend)
        return coco, [all_ids[i] for i in indices], label_map
    if _is_coco(coco_gt) or isinstance(coco_gt, (str, os.PathLike, Mapping)):
        if isinstance(coco_gt, (str, os.PathLike)) and not os.path.isfile(coco_gt):
            raise FileNotFoundError(f"coco_gt: no annotation file at {os.fspath(coco_gt)!r}")
        coco = _load_coco(coco_gt, backend)
        return coco, sorted(coco.imgs), None
    if hasattr(coco_gt, "coco") and _is_coco(coco_gt.coco):
        coco = _load_coco(coco_gt.coco, backend)
        ids = list(coco_gt.ids) if hasattr(coco_gt, "ids") else sorted(coco.imgs)
        return coco, ids, getattr(coco_gt, "label_to_category_id", None)
    raise TypeError(f"coco_gt must be {_ACCEPTED_GT}, got {type(coco_gt).__name__}")


def _read_results(path: str | os.PathLike[str]) -> list[Any]:
    """The list of COCO result dicts in a results JSON file (as ``COCO.loadRes`` reads)."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise FileNotFoundError(f"predictions: no results file at {name!r}")
    try:
        with open(name, "rb") as f:
            results = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"predictions: results file {name!r} is not valid JSON: {exc}") from None
    if not isinstance(results, list):
        raise ValueError(
            f"predictions: results file {name!r} holds a {type(results).__name__}; a COCO "
            'results file is a list of {"image_id", "category_id", "score", "bbox"/'
            '"segmentation"} dicts'
        )
    return results


# ------------------------------------------------------------------------------ evaluation


def _complete_ground_truth(coco: Any, iou_type: str, image_ids: set[int]) -> None:
    """Default ``iscrowd`` (0) and ``area`` (the box's) of the ground truth, in place; for
    ``"segm"``, every annotation of the evaluated images needs a segmentation."""
    missing_segm = []
    for ann in coco.dataset.get("annotations", []):
        ann.setdefault("iscrowd", 0)
        if "area" not in ann:
            ann["area"] = float(ann["bbox"][2] * ann["bbox"][3])
        if iou_type == "segm" and not ann.get("segmentation") and ann["image_id"] in image_ids:
            missing_segm.append(ann["id"])
    if missing_segm:
        raise ValueError(
            f"iou_type='segm' needs ground-truth segmentations, but annotations "
            f"{ids_text(missing_segm)} have none"
        )


def _complete_keypoints(coco: Any) -> int:
    """K of a keypoint ground truth (annotations and category names must agree); missing
    ``keypoints`` (none labelled) and ``num_keypoints`` filled in for COCOeval."""
    annotations = coco.dataset.get("annotations", [])
    found: dict[int, list[int]] = {}
    malformed = []
    for ann in annotations:
        points = ann.get("keypoints")
        if points is None:
            continue
        if not isinstance(points, list) or not points or len(points) % 3:
            malformed.append(ann["id"])
        else:
            found.setdefault(len(points) // 3, []).append(ann["id"])
    if malformed:
        raise ValueError(
            f"iou_type='keypoints': ground-truth annotations {ids_text(malformed)} have keypoints "
            "that are not a flat list [x1, y1, v1, ..., xK, yK, vK]"
        )
    where = {k: [f"annotations {ids_text(ids)}"] for k, ids in found.items()}
    for cat in coco.cats.values():
        names = cat.get("keypoints")
        if isinstance(names, list) and names:
            where.setdefault(len(names), []).append(f"category {cat['id']}")
    if not where:
        raise ValueError(
            "iou_type='keypoints' needs a keypoint ground truth (as person_keypoints_*.json), "
            "but no annotation of coco_gt has 'keypoints' and no category names key points"
        )
    if len(where) > 1:
        several = "; ".join(f"K={k} in {', '.join(parts)}" for k, parts in where.items())
        raise ValueError(
            "iou_type='keypoints' evaluates one set of K key points (one sigma each), but the "
            f"ground truth has several: {several}"
        )
    k = next(iter(where))
    contradicting = []
    for ann in annotations:
        if "keypoints" not in ann:
            if ann.get("num_keypoints", 0):
                contradicting.append(ann["id"])
            ann["keypoints"] = [0] * (3 * k)
        ann.setdefault("num_keypoints", sum(1 for v in ann["keypoints"][2::3] if v > 0))
    if contradicting:
        raise ValueError(
            f"ground-truth annotations {ids_text(contradicting)} have num_keypoints > 0 but no "
            "keypoints"
        )
    return k


def _keypoint_sigmas(coco: Any, k: int, sigmas: Any) -> np.ndarray:
    """The K OKS sigmas, float64 (see `coco_evaluate`'s ``sigmas``)."""
    source = "sigmas"
    if sigmas is None:
        given = {
            tuple(_sigma_values(cat["sigmas"], f"the sigmas of category {cat['id']}"))
            for cat in coco.cats.values()
            if cat.get("keypoints") and cat.get("sigmas") is not None
        }
        if len(given) > 1:
            raise ValueError(
                "sigmas: the keypoint categories of coco_gt give different sigmas, but COCOeval "
                "uses one set: pass sigmas="
            )
        if given:
            sigmas, source = list(given.pop()), "the categories' sigmas"
    if sigmas is None:
        if k != len(COCO_PERSON_SIGMAS):
            raise ValueError(
                f"sigmas: the ground truth has K={k} key points and its categories give no "
                f"sigmas; the default ones are COCO's {len(COCO_PERSON_SIGMAS)} person sigmas: "
                "pass sigmas=, one per key point"
            )
        sigmas = COCO_PERSON_SIGMAS
    values = _sigma_values(sigmas, source)
    if len(values) != k:
        raise ValueError(
            f"{source} must hold one value per key point of the ground truth (K={k}), got "
            f"{len(values)}"
        )
    return np.asarray(values, dtype=np.float64)


def _sigma_values(sigmas: Any, source: str = "sigmas") -> list[float]:
    """``sigmas`` (a sequence, array or 1-D tensor) as a list of finite positive floats."""
    if isinstance(sigmas, torch.Tensor):
        if sigmas.dim() != 1 or sigmas.is_complex() or sigmas.dtype == torch.bool:
            raise ValueError(
                f"{source} must be a 1-D real tensor, got shape {tuple(sigmas.shape)} "
                f"and dtype {sigmas.dtype}"
            )
        sigmas = sigmas.detach().cpu().tolist()
    elif isinstance(sigmas, np.ndarray):
        sigmas = sigmas.tolist()
    if isinstance(sigmas, (str, bytes)) or not isinstance(sigmas, Sequence):
        raise TypeError(
            f"{source} must be a sequence of floats (or an array or a tensor), got "
            f"{type(sigmas).__name__} ({sigmas!r})"
        )
    for i, s in enumerate(sigmas):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise TypeError(f"{source}[{i}] must be a float, got {type(s).__name__} ({s!r})")
        if not 0 < s < float("inf"):  # also False for NaN
            raise ValueError(f"{source} must be finite and > 0, got {source}[{i}] = {s!r}")
    return [float(s) for s in sigmas]


def _run_cocoeval(
    coco: Any,
    results: list[dict[str, Any]],
    image_ids: list[int],
    iou_type: str,
    backend: str,
    verbose: bool,
    sigmas: np.ndarray | None = None,
) -> list[float]:
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        if backend == "faster_coco_eval":
            from faster_coco_eval import COCOeval_faster

            coco_dt = coco.loadRes(results)  # accepts an empty list
            evaluator = COCOeval_faster(
                coco, coco_dt, iou_type, print_function=print if verbose else lambda *a, **k: None
            )
        else:
            from pycocotools.coco import COCO
            from pycocotools.cocoeval import COCOeval

            if results:
                coco_dt = coco.loadRes(results)
            else:  # loadRes fails on []: an empty result set with the same images and categories
                coco_dt = COCO()
                coco_dt.dataset = {
                    "images": list(coco.dataset["images"]),
                    "categories": list(coco.dataset.get("categories", [])),
                    "annotations": [],
                }
                coco_dt.createIndex()
            evaluator = COCOeval(coco, coco_dt, iou_type)
        evaluator.params.imgIds = sorted(image_ids)
        if iou_type == "keypoints":
            evaluator.params.kpt_oks_sigmas = sigmas
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    names = COCO_KEYPOINT_STAT_NAMES if iou_type == "keypoints" else COCO_STAT_NAMES
    return [float(s) for s in evaluator.stats[: len(names)]]


def _gather(payload: tuple) -> list[tuple]:
    """Every rank's payload; a failure on any rank is raised on every rank (no rank hangs)."""
    gathered = all_gather_object(payload) if get_world_size() > 1 else [payload]
    for rank, item in enumerate(gathered):
        if item[0] == "error":
            error_type = {"ValueError": ValueError, "TypeError": TypeError}.get(
                item[1], RuntimeError
            )
            raise error_type(f"coco_evaluate failed on rank {rank}: {item[2]}")
    return gathered


def _guarded(fn: Any, *args: Any) -> tuple:
    try:
        return ("ok", fn(*args))
    except Exception as err:
        if get_world_size() == 1:
            raise
        return ("error", type(err).__name__, str(err))  # re-raised on every rank by _gather


def _merge(per_rank: list[tuple[list[int], list[dict]]], eval_ids: set[int]) -> list[dict]:
    """All ranks' results on the evaluated images; an image on several ranks counts once."""
    seen: set[int] = set()
    merged: list[dict[str, Any]] = []
    for covered, results in per_rank:
        new = set(covered) - seen
        merged.extend(r for r in results if r["image_id"] in new and r["image_id"] in eval_ids)
        seen |= new
    return merged


def coco_evaluate(
    predictions: Mapping[int, Mapping[str, Any]]
    | Sequence[Mapping[str, Any]]
    | str
    | os.PathLike[str],
    coco_gt: Any,
    iou_type: Literal["bbox", "segm", "keypoints"] = "bbox",
    backend: Literal["pycocotools", "faster_coco_eval"] = "pycocotools",
    *,
    label_to_category_id: Mapping[int, int] | Sequence[int] | None = None,
    image_ids: Iterable[int] | None = None,
    mask_threshold: float = 0.5,
    sigmas: Sequence[float] | np.ndarray | torch.Tensor | None = None,
    verbose: bool = False,
) -> dict[str, float]:
    """COCO AP/AR of detections, instance masks or poses: the numbers of ``COCOeval.summarize``.

    Standard COCO protocol and defaults: IoU thresholds 0.50:0.05:0.95, 101 recall points,
    ``maxDets`` (1, 10, 100), area ranges small < 32² ≤ medium < 96² ≤ large, crowds matched
    but ignored, every category of ``coco_gt`` evaluated. ``iou_type="keypoints"`` is
    COCO's keypoint protocol: OKS (`visionblocks.ops.oks.keypoint_oks`) in place of IoU,
    ``maxDets`` 20, medium and large areas only; ground truths without a labelled key point
    are ignored.

    Distributed: with ``torch.distributed`` initialised, **call it on every rank** (a
    collective, the same ``coco_gt`` and options everywhere): rank 0 evaluates every rank's
    predictions (an image predicted twice counts once) and every rank returns the same dict;
    an error on any rank is raised on every rank.

    Args:
        predictions: Per-image model outputs, ``{image_id: output}`` or a list of outputs
            each with an ``"image_id"``: ``boxes (Tensor[N, 4])`` XYXY in pixels of the
            original image, ``scores (Tensor[N])``, integer ``labels (Tensor[N])`` and, for
            ``"segm"``, ``masks (Tensor[N, H, W] or Tensor[N, 1, H, W])`` at the image's
            size (non-zero, or ``> mask_threshold`` for floats, is foreground); for
            ``"keypoints"``, ``keypoints (Tensor[N, K, 2 or 3])`` in the ground truth's
            pixel coordinates, ``scores``, ``labels`` and optional ``keypoints_scores
            (Tensor[N, K])`` (boxes not needed). Any device and floating dtype; other keys
            are ignored; N may be 0. Or a list of COCO result dicts (validated and copied),
            or the path of a results JSON file holding one. Empty is allowed.
        coco_gt: The ground truth: a ``pycocotools.coco.COCO`` (or ``faster_coco_eval.COCO``),
            a path to a COCO annotation JSON, a COCO-format dict, or a dataset with ``.coco``
            and ``.label_to_category_id`` such as `visionblocks.data.CocoInstances` (its
            ``.ids`` are the images evaluated) or a ``Subset`` of one. For ``"keypoints"``,
            a keypoint ground truth of one K.
        iou_type: ``"bbox"`` (boxes), ``"segm"`` (masks) or ``"keypoints"`` (poses, by OKS).
        backend: ``"pycocotools"`` or ``"faster_coco_eval"`` (C++, same numbers).
        label_to_category_id: Maps ``labels`` of per-image outputs to COCO category ids
            (dict, or list indexed by label). Default: the dataset's map when ``coco_gt`` is a
            dataset or Subset, else labels are category ids. Result dicts are never mapped.
        image_ids: Evaluate only these images of ``coco_gt`` (predictions for others are
            dropped). Default: every image of ``coco_gt``, so images without predictions
            count as misses.
        mask_threshold: Threshold for float ``masks``, in [0, 1].
        sigmas: ``"keypoints"`` only: the K OKS sigmas (finite, > 0; a sequence, array or
            1-D tensor). Default: the keypoint categories' ``sigmas`` (the field
            `visionblocks.data.CocoKeypoints` reads), else COCO's 17 person sigmas
            (`visionblocks.ops.oks.COCO_PERSON_SIGMAS`), which need K = 17.
        verbose: Print the evaluator's log and summary table (rank 0 only).

    Returns:
        dict[str, float]: `COCO_STAT_NAMES` for ``"bbox"`` and ``"segm"``,
        `COCO_KEYPOINT_STAT_NAMES` for ``"keypoints"``, in that order: floats in [0, 1], or
        ``-1.0`` where that number has no ground truth, as ``COCOeval`` reports it. No
        predictions at all gives 0.0 wherever there is ground truth.

    Raises:
        ValueError: Unknown ``iou_type``/``backend``, image or category ids ``coco_gt`` does
            not know (named), wrong shapes or sizes, NaN/inf values, an image with two
            outputs, empty ``image_ids``, a ground truth without key points or of several K,
            bad ``sigmas``.
        TypeError: Inputs of the wrong type (non-tensor boxes, float labels, ...).
        FileNotFoundError: ``coco_gt`` or a ``predictions`` path names no file.
        ImportError: ``backend="faster_coco_eval"`` without the package.

    Examples:
        >>> import torch
        >>> gt = {
        ...     "images": [{"id": 1, "height": 100, "width": 100}],
        ...     "categories": [{"id": 3, "name": "dog"}],
        ...     "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "iscrowd": 0,
        ...                      "bbox": [10, 10, 40, 30], "area": 1200.0}],
        ... }
        >>> outputs = {1: {"boxes": torch.tensor([[10.0, 10.0, 50.0, 40.0]]),
        ...                "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}}
        >>> stats = coco_evaluate(outputs, gt, label_to_category_id={0: 3})
        >>> round(stats["AP"], 6), round(stats["APm"], 6), stats["APl"]
        (1.0, 1.0, -1.0)
        >>> coco_evaluate([], gt)["AP"]
        0.0
    """
    check_choice("iou_type", iou_type, _IOU_TYPES)
    check_choice("backend", backend, _BACKENDS)
    if isinstance(predictions, (str, os.PathLike)):
        predictions = _read_results(predictions)
    check_type("mask_threshold", mask_threshold, (int, float))
    check_range("mask_threshold", float(mask_threshold), 0.0, 1.0)
    if sigmas is not None and iou_type != "keypoints":
        raise ValueError(f"sigmas applies to iou_type='keypoints' only, got iou_type={iou_type!r}")
    coco, gt_image_ids, dataset_map = _resolve_ground_truth(coco_gt, backend)
    gt_ids = set(gt_image_ids)
    if image_ids is None:
        eval_ids = gt_ids
    else:
        eval_ids = {as_int("image_ids[...]", i) for i in image_ids}
        if eval_ids - gt_ids:
            raise ValueError(f"image_ids not in coco_gt: {ids_text(eval_ids - gt_ids)}")
    if not eval_ids:
        raise ValueError("no images to evaluate: image_ids (or coco_gt) is empty")

    category_ids = set(coco.cats)
    label_map = dataset_map if label_to_category_id is None else label_to_category_id
    if label_map is not None:
        if not isinstance(label_map, Mapping):
            label_map = dict(enumerate(label_map))
        label_map = {as_int("label", k): as_int("category id", v) for k, v in label_map.items()}
        if set(label_map.values()) - category_ids:
            bad = set(label_map.values()) - category_ids
            raise ValueError(f"label_to_category_id maps to unknown category ids {ids_text(bad)}")
    sizes = {i: (int(coco.imgs[i]["height"]), int(coco.imgs[i]["width"])) for i in gt_ids}
    ctx = {
        "iou_type": iou_type, "label_map": label_map, "category_ids": category_ids,
        "gt_ids": gt_ids, "sizes": sizes, "thr": float(mask_threshold),
        "file_ids": set(coco.imgs),
    }  # fmt: skip
    _complete_ground_truth(coco, iou_type, eval_ids)
    sigma_array = None
    if iou_type == "keypoints":
        ctx["num_keypoints"] = _complete_keypoints(coco)
        sigma_array = _keypoint_sigmas(coco, ctx["num_keypoints"], sigmas)

    gathered = _gather(_guarded(to_results, predictions, ctx))
    stats: tuple = ("ok", None)
    if get_rank() == 0:
        results = _merge([payload[1] for payload in gathered], eval_ids)
        stats = _guarded(
            _run_cocoeval, coco, results, sorted(eval_ids), iou_type, backend, verbose, sigma_array
        )
    del gathered
    names = COCO_KEYPOINT_STAT_NAMES if iou_type == "keypoints" else COCO_STAT_NAMES
    return dict(zip(names, _gather(stats)[0][1]))
