"""coco_evaluate against pycocotools' COCOeval run directly (the oracle) and faster_coco_eval."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from visionblocks.data.evaluate import coco_evaluate

NAMES = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"]
CATEGORY_IDS = [1, 3, 7, 9]  # non-contiguous; 9 has no annotations
LABEL_MAP = dict(enumerate(CATEGORY_IDS))
SIZES = {1: (120, 160), 2: (100, 100), 3: (64, 96), 4: (200, 240)}  # (H, W); image 3 is empty
OBJECTS = [  # (image_id, category_id, [x, y, w, h]): small < 32², medium < 96², large
    (1, 1, [10, 10, 20, 20]),
    (4, 1, [30, 40, 120, 100]),
    (1, 3, [50, 30, 60, 50]),
    (2, 3, [5, 5, 15, 12]),
    (2, 3, [40, 40, 50, 50]),
    (4, 3, [150, 20, 80, 150]),
    (2, 7, [60, 10, 30, 30]),
    (4, 7, [10, 150, 100, 40]),
]
CROWD = (1, 3, [100, 60, 50, 50])
GROUPS = {1: 2, 3: 4, 7: 2}  # non-crowd objects per category


def _rect_mask(size: tuple[int, int], box: list[float]) -> np.ndarray:
    mask = np.zeros(size, dtype=np.uint8)
    x, y, w, h = (round(v) for v in box)
    mask[max(y, 0) : y + h, max(x, 0) : x + w] = 1
    return mask


def _uncompressed_rle(mask: np.ndarray) -> dict:
    flat = mask.flatten(order="F")
    change = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], change, [flat.size]])).tolist()
    counts = runs if flat[0] == 0 else [0, *runs]
    return {"size": list(mask.shape), "counts": counts}


def _ground_truth() -> dict:
    annotations = []
    for i, (image_id, category_id, (x, y, w, h)) in enumerate(OBJECTS, start=1):
        annotations.append(
            {
                "id": i,
                "image_id": image_id,
                "category_id": category_id,
                "bbox": [x, y, w, h],
                "area": float(w * h),
                "iscrowd": 0,
                "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],
            }
        )
    image_id, category_id, box = CROWD
    rle = _uncompressed_rle(_rect_mask(SIZES[image_id], box))
    annotations.append(
        {
            "id": 100,
            "image_id": image_id,
            "category_id": category_id,
            "bbox": box,
            "area": float(box[2] * box[3]),
            "iscrowd": 1,
            "segmentation": rle,
        }
    )
    return {
        "images": [
            {"id": i, "height": h, "width": w, "file_name": f"{i}.jpg"}
            for i, (h, w) in SIZES.items()
        ],
        "categories": [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS],
        "annotations": annotations,
    }


@pytest.fixture(scope="module")
def gt_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("coco") / "annotations.json"
    path.write_text(json.dumps(_ground_truth()))
    return str(path)


def _coco(path: str) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(path)


class FakeDataset:
    """The dataset contract (``coco``, ``ids``, ``label_to_category_id``) without images."""

    def __init__(self, path: str):
        self.coco = _coco(path)
        self.ids = sorted(self.coco.imgs)
        self.label_to_category_id = dict(LABEL_MAP)

    def __len__(self) -> int:
        return len(self.ids)


def _oracle(path: str, results: list[dict], iou_type: str = "bbox", img_ids=None) -> dict:
    """pycocotools run by hand on COCO result dicts."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(path)
        evaluator = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iou_type)
        if img_ids is not None:
            evaluator.params.imgIds = sorted(img_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return dict(zip(NAMES, map(float, evaluator.stats)))


def _perfect_outputs(with_masks: bool = False, keep=lambda index: True) -> dict:
    outputs = {i: {"boxes": [], "scores": [], "labels": [], "masks": []} for i in SIZES}
    for index, (image_id, category_id, (x, y, w, h)) in enumerate(OBJECTS):
        if keep(index):
            out = outputs[image_id]
            out["boxes"].append([x, y, x + w, y + h])
            out["scores"].append(1.0 - 0.01 * index)
            out["labels"].append(CATEGORY_IDS.index(category_id))
            out["masks"].append(_rect_mask(SIZES[image_id], [x, y, w, h]))
    return {i: _tensors(out, SIZES[i], with_masks) for i, out in outputs.items()}


def _random_outputs(with_masks: bool = False, seed: int = 0) -> dict:
    """Jittered, missed, mislabelled and false detections."""
    rng = np.random.default_rng(seed)
    outputs = {i: {"boxes": [], "scores": [], "labels": [], "masks": []} for i in SIZES}
    for image_id, category_id, (x, y, w, h) in OBJECTS:
        for _ in range(int(rng.integers(0, 3))):
            j = rng.uniform(-0.25, 0.25, 4) * [w, h, w, h]
            box = [x + j[0], y + j[1], x + w + j[2], y + h + j[3]]
            label = CATEGORY_IDS.index(category_id) if rng.random() < 0.8 else int(rng.integers(4))
            out = outputs[image_id]
            out["boxes"].append(box)
            out["scores"].append(float(rng.random()))
            out["labels"].append(label)
            out["masks"].append(
                _rect_mask(SIZES[image_id], [*box[:2], box[2] - box[0], box[3] - box[1]])
            )
    for image_id, (height, width) in SIZES.items():
        for _ in range(2):
            x, y = rng.uniform(0, width - 20), rng.uniform(0, height - 20)
            box = [x, y, x + rng.uniform(4, 20), y + rng.uniform(4, 20)]
            out = outputs[image_id]
            out["boxes"].append(box)
            out["scores"].append(float(rng.random()))
            out["labels"].append(int(rng.integers(4)))
            out["masks"].append(_rect_mask((height, width), [x, y, box[2] - x, box[3] - y]))
    return {i: _tensors(out, SIZES[i], with_masks) for i, out in outputs.items()}


def _tensors(out: dict, size: tuple[int, int], with_masks: bool) -> dict:
    result = {
        "boxes": torch.tensor(out["boxes"], dtype=torch.float32).reshape(-1, 4),
        "scores": torch.tensor(out["scores"], dtype=torch.float32),
        "labels": torch.tensor(out["labels"], dtype=torch.int64),
    }
    if with_masks:
        result["masks"] = torch.from_numpy(
            np.stack(out["masks"]) if out["masks"] else np.zeros((0, *size), np.uint8)
        ).bool()
    return result


def _as_results(outputs: dict, iou_type: str = "bbox") -> list[dict]:
    """COCO result dicts written independently of the code under test."""
    results = []
    for image_id, out in outputs.items():
        for k, (x1, y1, x2, y2) in enumerate(out["boxes"].tolist()):
            result = {
                "image_id": image_id,
                "category_id": CATEGORY_IDS[int(out["labels"][k])],
                "score": float(out["scores"][k]),
            }
            if iou_type == "bbox":
                result["bbox"] = [x1, y1, x2 - x1, y2 - y1]
            else:
                rle = mask_utils.encode(np.asfortranarray(out["masks"][k].numpy().astype(np.uint8)))
                result["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
            results.append(result)
    return results


# ------------------------------------------------------------------------------ correctness


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_perfect_predictions_give_ap_one(gt_path, iou_type):
    outputs = _perfect_outputs(with_masks=iou_type == "segm")
    stats = coco_evaluate(outputs, gt_path, iou_type, label_to_category_id=LABEL_MAP)
    assert list(stats) == NAMES and all(type(v) is float for v in stats.values())
    for name in ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100", "ARs", "ARm", "ARl"):
        assert stats[name] == pytest.approx(1.0, abs=1e-12), name
    assert stats == _oracle(gt_path, _as_results(outputs, iou_type), iou_type)


def test_half_of_the_objects_found_matches_hand_computation(gt_path):
    seen: dict[int, int] = {}

    def keep(index: int) -> bool:  # the first half of every category's objects
        category_id = OBJECTS[index][1]
        seen[category_id] = seen.get(category_id, 0) + 1
        return seen[category_id] <= GROUPS[category_id] // 2

    outputs = _perfect_outputs(keep=keep)
    stats = coco_evaluate(outputs, gt_path, label_to_category_id=LABEL_MAP)
    # Per category: precision 1 up to recall 0.5, then nothing: 51 of 101 recall points.
    assert stats["AP"] == pytest.approx(51 / 101, abs=1e-12)
    assert stats["AP50"] == pytest.approx(51 / 101, abs=1e-12)
    assert stats["AR100"] == pytest.approx(0.5, abs=1e-12)
    assert stats == _oracle(gt_path, _as_results(outputs))


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_and_result_dicts_match_pycocotools(gt_path, iou_type, seed):
    outputs = _random_outputs(with_masks=iou_type == "segm", seed=seed)
    results = _as_results(outputs, iou_type)
    expected = _oracle(gt_path, results, iou_type)
    assert 0.0 < expected["AP"] < 1.0
    from_outputs = coco_evaluate(outputs, gt_path, iou_type, label_to_category_id=LABEL_MAP)
    listed = [{"image_id": i, **out} for i, out in outputs.items()]
    from_list = coco_evaluate(listed, gt_path, iou_type, label_to_category_id=CATEGORY_IDS)
    assert from_outputs == from_list == coco_evaluate(results, gt_path, iou_type) == expected


def test_segm_areas_come_from_the_masks_not_the_boxes(gt_path):
    # A result dict carrying both keys must be evaluated like one with the mask only.
    results = _as_results(_random_outputs(with_masks=True), "segm")
    both = [{**r, "bbox": [0.0, 0.0, 2.0, 2.0]} for r in results]  # areas say "small"
    assert coco_evaluate(both, gt_path, "segm") == _oracle(gt_path, results, "segm")


def test_dataset_label_map_and_coco_inputs(gt_path):
    outputs = _random_outputs()
    expected = _oracle(gt_path, _as_results(outputs))
    dataset = FakeDataset(gt_path)
    assert coco_evaluate(outputs, dataset) == expected
    assert coco_evaluate(outputs, dataset.coco, label_to_category_id=LABEL_MAP) == expected
    assert coco_evaluate(outputs, _ground_truth(), label_to_category_id=LABEL_MAP) == expected
    raw = {
        i: {**out, "labels": torch.tensor([CATEGORY_IDS[k] for k in out["labels"]])}
        for i, out in outputs.items()
    }
    assert coco_evaluate(raw, dataset.coco) == expected  # labels taken as category ids
    # Running twice on the same COCO object (COCOeval annotates its ground truth) is stable.
    segm = _random_outputs(with_masks=True)
    first = coco_evaluate(segm, dataset, "segm")
    assert coco_evaluate(outputs, dataset) == expected
    assert coco_evaluate(segm, dataset, "segm") == first


def test_subset_and_image_ids_restrict_the_images(gt_path):
    dataset = FakeDataset(gt_path)
    outputs = _random_outputs()
    subset = torch.utils.data.Subset(dataset, [1, 3])  # images 2 and 4
    on_subset = {i: outputs[i] for i in (2, 4)}
    expected = _oracle(gt_path, _as_results(on_subset), img_ids=[2, 4])
    assert expected != _oracle(gt_path, _as_results(on_subset))
    assert coco_evaluate(on_subset, subset) == expected
    nested = torch.utils.data.Subset(torch.utils.data.Subset(dataset, [0, 1, 3]), [1, 2])
    assert coco_evaluate(on_subset, nested) == expected
    assert (
        coco_evaluate(outputs, gt_path, image_ids=[4, 2], label_to_category_id=LABEL_MAP)
        == expected
    )
    with pytest.raises(ValueError, match="images 1, 3, which are in the annotation file but not"):
        coco_evaluate(outputs, subset)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_backends_agree(gt_path, iou_type):
    pytest.importorskip("faster_coco_eval")
    outputs = _random_outputs(with_masks=iou_type == "segm")
    reference = coco_evaluate(outputs, gt_path, iou_type, label_to_category_id=LABEL_MAP)
    for coco_gt in (gt_path, FakeDataset(gt_path)):
        fast = coco_evaluate(
            outputs, coco_gt, iou_type, "faster_coco_eval", label_to_category_id=LABEL_MAP
        )
        assert list(fast) == NAMES and all(type(v) is float for v in fast.values())
        assert fast == pytest.approx(reference, abs=1e-12)
    for image_ids in ([4], [3]):  # empty predictions, buckets without ground truth
        assert coco_evaluate(
            [], gt_path, iou_type, "faster_coco_eval", image_ids=image_ids
        ) == coco_evaluate([], gt_path, iou_type, image_ids=image_ids)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_empty_predictions(gt_path, backend):
    if backend == "faster_coco_eval":
        pytest.importorskip("faster_coco_eval")
    empty = {
        "boxes": torch.zeros(0, 4),
        "scores": torch.zeros(0),
        "labels": torch.zeros(0, dtype=torch.long),
    }
    for predictions in ([], {}, {1: empty, 3: empty}):
        assert coco_evaluate(predictions, gt_path, backend=backend) == dict.fromkeys(NAMES, 0.0)
        assert coco_evaluate(predictions, gt_path, "segm", backend=backend) == dict.fromkeys(
            NAMES, 0.0
        )
    # Where a bucket has no ground truth COCOeval says -1; empty predictions say the same as a
    # useless detection would, so the numbers do not jump when the first detection appears.
    useless = [{"image_id": 4, "category_id": 1, "bbox": [0.0, 0.0, 3.0, 3.0], "score": 0.5}]
    only_large = coco_evaluate([], gt_path, backend=backend, image_ids=[4])
    assert only_large["APs"] == only_large["ARs"] == -1.0 and only_large["APl"] == 0.0
    assert only_large == _oracle(gt_path, useless, img_ids=[4])
    no_annotations = coco_evaluate([], gt_path, backend=backend, image_ids=[3])
    assert no_annotations == dict.fromkeys(NAMES, -1.0)
    assert no_annotations == _oracle(gt_path, [{**useless[0], "image_id": 3}], img_ids=[3])


def test_mask_forms_dtypes_and_devices(gt_path, device):
    outputs = _random_outputs(with_masks=True)
    expected = coco_evaluate(outputs, gt_path, "segm", label_to_category_id=LABEL_MAP)
    variants = {
        i: {
            "boxes": out["boxes"].half().to(device).requires_grad_(),
            "scores": out["scores"].double().to(device),
            "labels": out["labels"].int().to(device),
            "masks": torch.where(out["masks"], 0.9, 0.2).unsqueeze(1).to(device),  # (N, 1, H, W)
        }
        for i, out in outputs.items()
    }
    assert coco_evaluate(variants, gt_path, "segm", label_to_category_id=LABEL_MAP) == expected
    assert (
        coco_evaluate(variants, gt_path, "segm", label_to_category_id=LABEL_MAP, mask_threshold=0.1)
        != expected
    )
    # float16 boxes (the jittered ones round) are accepted for boxes too
    half = {i: {**out, "boxes": out["boxes"].half()} for i, out in outputs.items()}
    rounded = {i: {**out, "boxes": out["boxes"].half().float()} for i, out in outputs.items()}
    assert coco_evaluate(half, gt_path, label_to_category_id=LABEL_MAP) == coco_evaluate(
        rounded, gt_path, label_to_category_id=LABEL_MAP
    )


def test_inputs_are_not_modified(gt_path):
    outputs = _random_outputs(with_masks=True)
    results = _as_results(outputs, "segm")
    before = copy.deepcopy(results)
    coco_evaluate(results, gt_path, "segm")
    assert results == before
    boxes = {i: out["boxes"].clone() for i, out in outputs.items()}
    coco_evaluate(outputs, gt_path, label_to_category_id=LABEL_MAP)
    assert all(torch.equal(outputs[i]["boxes"], b) for i, b in boxes.items())


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_quiet_unless_verbose(gt_path, capsys, backend):
    if backend == "faster_coco_eval":
        pytest.importorskip("faster_coco_eval")
    results = _as_results(_random_outputs())
    coco_evaluate(results, gt_path, backend=backend)
    coco_evaluate([], gt_path, backend=backend)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    coco_evaluate(results, gt_path, backend=backend, verbose=True)
    assert "Average Precision" in capsys.readouterr().out


# ------------------------------------------------------------------------------ errors


def _one(**changes) -> dict:
    out = {
        "boxes": torch.tensor([[1.0, 2.0, 30.0, 40.0]]),
        "scores": torch.tensor([0.5]),
        "labels": torch.tensor([1]),
    }
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize(
    ("predictions", "kwargs", "error", "match"),
    [
        ({99: _one(), 98: _one()}, {}, ValueError, "not in coco_gt: 98, 99"),
        (
            {1: _one(labels=torch.tensor([5]))},
            {},
            ValueError,
            "missing from label_to_category_id: 5",
        ),
        (
            {1: _one(labels=torch.tensor([2]))},
            {"label_to_category_id": None, "coco_gt": "coco"},
            ValueError,
            "not category ids of coco_gt",
        ),
        ({1: _one()}, {"label_to_category_id": {1: 4}}, ValueError, "unknown category ids 4"),
        (
            {1: _one(boxes=torch.zeros(1, 5))},
            {},
            ValueError,
            r"must have shape \(N, 4\), got \(1, 5\)",
        ),
        (
            {1: _one(scores=torch.zeros(2))},
            {},
            ValueError,
            r"\['scores'\] must have shape \(1,\), got \(2,\)",
        ),
        ({1: _one(labels=torch.tensor([1.0]))}, {}, TypeError, "integer tensor"),
        ({1: _one(boxes=[[1.0, 2.0, 3.0, 4.0]])}, {}, TypeError, "must be a torch.Tensor"),
        ({1: _one(scores=None)}, {}, ValueError, r"has no \['scores'\]"),
        ({1: _one(scores=torch.tensor([float("nan")]))}, {}, ValueError, "finite"),
        ({1: _one()}, {"iou_type": "segm"}, ValueError, "has no 'masks'"),
        (
            {1: _one(masks=torch.ones(1, 64, 64))},
            {"iou_type": "segm"},
            ValueError,
            r"image's size \(120, 160\)",
        ),
        (
            {1: _one(masks=torch.ones(2, 120, 160))},
            {"iou_type": "segm"},
            ValueError,
            r"shape \(1, H, W\)",
        ),
        ([_one()], {}, ValueError, "has no 'image_id'"),
        (
            [{**_one(), "image_id": 1}, {**_one(), "image_id": 1}],
            {},
            ValueError,
            "several outputs for images 1",
        ),
        ({1: {**_one(), "image_id": 2}}, {}, ValueError, "has image_id 2, but its key is 1"),
        ([{"image_id": 1, "category_id": 3, "score": 0.5}], {}, ValueError, r"has no \['bbox'\]"),
        (
            [{"image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5}],
            {"iou_type": "segm"},
            ValueError,
            r"has no \['segmentation'\]",
        ),
        (
            [{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5}],
            {},
            ValueError,
            "category_id 2, not a category",
        ),
        (
            [{"image_id": 1, "category_id": 3, "bbox": [1, 2, 3], "score": 0.5}],
            {},
            ValueError,
            "4 finite numbers",
        ),
        (
            [{"image_id": 1, "category_id": 3, "segmentation": [[1, 2, 3, 4, 5, 6]], "score": 0.5}],
            {"iou_type": "segm"},
            ValueError,
            "compressed RLE",
        ),
        (
            [
                {"image_id": 1, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5},
                {**_one(), "image_id": 1},
            ],
            {},
            ValueError,
            "mix per-image outputs and COCO result dicts",
        ),
        ({1: _one()}, {"image_ids": [1, 42]}, ValueError, "image_ids not in coco_gt: 42"),
        ({1: _one()}, {"image_ids": []}, ValueError, "no images to evaluate"),
        ({1: _one()}, {"mask_threshold": 1.5}, ValueError, "mask_threshold must be in"),
    ],
)
def test_bad_inputs_raise(gt_path, predictions, kwargs, error, match):
    kwargs = dict(kwargs)
    coco_gt = kwargs.pop("coco_gt", None)
    coco_gt = gt_path if coco_gt in (None, "coco") else coco_gt
    kwargs.setdefault("label_to_category_id", LABEL_MAP)
    with pytest.raises(error, match=match):
        coco_evaluate(predictions, coco_gt, **kwargs)


def test_subset_of_a_plain_dataset_raises():
    with pytest.raises(TypeError, match="Subset of a dataset without .coco and .ids"):
        coco_evaluate([], torch.utils.data.Subset(list(range(4)), [0, 1]))


# ------------------------------------------------------------------------------ with CocoInstances


def test_with_coco_detection(tmp_path):
    coco_module = pytest.importorskip("visionblocks.data.coco")
    synthetic = pytest.importorskip("visionblocks.data.synthetic")
    ann = synthetic.make_synthetic_coco(tmp_path, num_images=3, image_size=(64, 80), num_classes=3)
    dataset = coco_module.CocoInstances(tmp_path / "images", ann, with_masks=True)
    outputs = {}
    for _, target in (dataset[i] for i in range(len(dataset))):
        keep = target["iscrowd"] == 0
        outputs[target["image_id"]] = {
            "boxes": target["boxes"][keep].as_subclass(torch.Tensor),
            "scores": torch.linspace(1.0, 0.5, int(keep.sum())),
            "labels": target["labels"][keep],
            "masks": target["masks"][keep].as_subclass(torch.Tensor),
        }
    for iou_type in ("bbox", "segm"):
        stats = coco_evaluate(outputs, dataset, iou_type)
        assert stats["AP"] == pytest.approx(1.0, abs=1e-12), iou_type


# ------------------------------------------------------------------------------ distributed


def _worker(rank: int, world_size: int, init_file: str, gt_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        outputs = _random_outputs(with_masks=True)
        mine = {i: outputs[i] for i in ((1, 2) if rank == 0 else (3, 4, 1))}  # image 1 on both
        segm = _as_results({i: outputs[i] for i in ((1, 2) if rank == 0 else (3, 4))}, "segm")
        report = {
            "bbox": coco_evaluate(mine, gt_path, label_to_category_id=LABEL_MAP),
            "segm": coco_evaluate(segm, FakeDataset(gt_path), "segm"),
        }
        try:
            bad = {99: mine[3]} if rank == 1 else mine
            coco_evaluate(bad, gt_path, label_to_category_id=LABEL_MAP)
        except ValueError as err:
            report["error"] = str(err)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_gloo_processes_gather_to_the_same_stats(gt_path):
    outputs = _random_outputs(with_masks=True)
    expected_bbox = _oracle(gt_path, _as_results(outputs))
    expected_segm = _oracle(gt_path, _as_results(outputs, "segm"), "segm")
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(2, init_file, gt_path, tmp), nprocs=2, join=True)
        reports = []
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                reports.append(json.load(f))
    for report in reports:
        assert report["bbox"] == expected_bbox
        assert report["segm"] == expected_segm
        assert "failed on rank 1" in report["error"] and "99" in report["error"]


def test_ground_truth_without_iscrowd_or_area_and_segm_without_masks(tmp_path):
    """pycocotools raises a bare KeyError on such files; the defaults are filled in instead."""
    import json

    gt = {
        "images": [{"id": 1, "height": 50, "width": 60}],
        "categories": [{"id": 1, "name": "a"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 20, 10]}],
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(gt))
    outputs = {1: {"boxes": torch.tensor([[5.0, 5.0, 25.0, 15.0]]), "scores": torch.tensor([0.8]),
                   "labels": torch.tensor([1])}}  # fmt: skip
    for backend in ("pycocotools", "faster_coco_eval"):
        assert coco_evaluate(outputs, path, backend=backend)["AP50"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs ground-truth segmentations, but annotations 1"):
        coco_evaluate([], path, iou_type="segm")


def test_result_dicts_may_hold_numpy_and_tensors(gt_path):
    results = [{"image_id": 2, "category_id": 3, "bbox": np.array([0.0, 0.0, 10.0, 10.0]),
                "score": torch.tensor(0.5)}]  # fmt: skip
    as_lists = [{**results[0], "bbox": [0.0, 0.0, 10.0, 10.0], "score": 0.5}]
    assert coco_evaluate(results, gt_path) == coco_evaluate(as_lists, gt_path)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_a_results_json_file_evaluates_like_the_results_in_memory(gt_path, iou_type, tmp_path):
    results = _as_results(_random_outputs(with_masks=iou_type == "segm", seed=3), iou_type)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))  # what detectron2 / mmdet write for COCO
    expected = _oracle(gt_path, results, iou_type)
    assert coco_evaluate(path, gt_path, iou_type) == expected
    assert coco_evaluate(str(path), gt_path, iou_type) == expected


def test_bad_results_files_are_named(gt_path, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no results file at '.*nope\.json'"):
        coco_evaluate(tmp_path / "nope.json", gt_path)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ValueError, match=r"results file '.*broken\.json' is not valid JSON"):
        coco_evaluate(broken, gt_path)
    broken.write_text('{"annotations": []}')
    with pytest.raises(ValueError, match="holds a dict; a COCO results file is a list"):
        coco_evaluate(broken, gt_path)
