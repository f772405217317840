"""coco_evaluate(iou_type="keypoints") against pycocotools' COCOeval(iouType="keypoints") run
directly on the same files (the oracle), and faster_coco_eval."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from visionblocks.data.evaluate import COCO_KEYPOINT_STAT_NAMES, coco_evaluate
from visionblocks.ops.oks import COCO_PERSON_SIGMAS, keypoint_oks

NAMES = ["AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl"]
PERSON = [
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip",
    "left_knee", "right_knee", "left_ankle", "right_ankle",
]  # fmt: skip
CATEGORY_IDS = [1, 5]  # two keypoint categories of the same K
LABEL_MAP = dict(enumerate(CATEGORY_IDS))
SIZES = {1: (480, 640), 2: (300, 400), 3: (200, 200), 4: (600, 500)}  # (H, W); 3 is empty
OBJECTS = [  # (image_id, category_id, w, h): areas 0.6 w h, small, medium and large
    (1, 1, 30, 40),
    (1, 1, 90, 160),
    (1, 5, 200, 300),
    (2, 1, 60, 120),
    (2, 1, 120, 200),
    (2, 5, 25, 50),
    (4, 1, 300, 450),
    (4, 5, 70, 150),
    (4, 1, 50, 90),
]
NO_POINTS = {4}  # indices of OBJECTS whose key points are all unlabelled (num_keypoints 0)
CROWD = (4, 1, [10, 400, 200, 150])


def _objects(k: int = 17, seed: int = 0) -> list[dict]:
    """Random poses inside random boxes; unlabelled points at (0, 0), as COCO files have."""
    rng = np.random.default_rng(seed)
    objects = []
    for index, (image_id, category_id, w, h) in enumerate(OBJECTS):
        height, width = SIZES[image_id]
        x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
        points = np.column_stack([x + rng.uniform(0, w, k), y + rng.uniform(0, h, k)]).round(1)
        v = rng.choice([0, 1, 2], size=k, p=[0.25, 0.25, 0.5])
        v[0] = 2
        if index in NO_POINTS:
            v[:] = 0
        points[v == 0] = 0
        objects.append(
            {
                "image_id": image_id,
                "category_id": category_id,
                "bbox": [x, y, w, h],
                "points": points,
                "v": v,
                "area": 0.6 * w * h,
            }
        )
    return objects


def _ground_truth(k: int = 17, seed: int = 0) -> dict:
    annotations = []
    for i, obj in enumerate(_objects(k, seed), start=1):
        annotations.append(
            {
                "id": i,
                "image_id": obj["image_id"],
                "category_id": obj["category_id"],
                "bbox": [float(v) for v in obj["bbox"]],
                "area": float(obj["area"]),
                "iscrowd": 0,
                "keypoints": np.column_stack([obj["points"], obj["v"]]).ravel().tolist(),
                "num_keypoints": int((obj["v"] > 0).sum()),
            }
        )
    image_id, category_id, box = CROWD
    annotations.append(
        {
            "id": 100,
            "image_id": image_id,
            "category_id": category_id,
            "bbox": box,
            "area": float(box[2] * box[3]),
            "iscrowd": 1,
            "keypoints": [0] * (3 * k),
            "num_keypoints": 0,
        }
    )
    names = PERSON if k == 17 else [f"point_{i}" for i in range(k)]
    return {
        "images": [
            {"id": i, "height": h, "width": w, "file_name": f"{i}.jpg"}
            for i, (h, w) in SIZES.items()
        ],
        "categories": [
            {"id": c, "name": f"c{c}", "keypoints": names, "skeleton": [[1, 2]]}
            for c in CATEGORY_IDS
        ],
        "annotations": annotations,
    }


def _write(tmp_path, data: dict, name: str = "keypoints.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def gt_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(tmp_path_factory.mktemp("coco_keypoints"), _ground_truth())


def _oracle(path: str, results: list[dict], img_ids=None, sigmas=None) -> dict:
    """pycocotools run by hand on COCO keypoint result dicts."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(path)
        evaluator = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), "keypoints")
        if img_ids is not None:
            evaluator.params.imgIds = sorted(img_ids)
        if sigmas is not None:
            evaluator.params.kpt_oks_sigmas = np.asarray(sigmas)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return dict(zip(NAMES, map(float, evaluator.stats)))


def _empty_output(k: int = 17) -> dict:
    return {"keypoints": torch.zeros(0, k, 2), "scores": torch.zeros(0),
            "labels": torch.zeros(0, dtype=torch.long)}  # fmt: skip


def _outputs(rows: dict[int, list], k: int) -> dict:
    outputs = {}
    for image_id in SIZES:
        found = rows.get(image_id, [])
        if not found:
            outputs[image_id] = _empty_output(k)
            continue
        points, scores, labels = zip(*found)
        outputs[image_id] = {
            "keypoints": torch.tensor(np.stack(points), dtype=torch.float32),
            "scores": torch.tensor(scores, dtype=torch.float32),
            "labels": torch.tensor(labels, dtype=torch.int64),
        }
    return outputs


def _perfect_outputs(k: int = 17, seed: int = 0) -> dict:
    rows: dict[int, list] = {}
    for index, obj in enumerate(_objects(k, seed)):
        if index not in NO_POINTS:
            label = CATEGORY_IDS.index(obj["category_id"])
            rows.setdefault(obj["image_id"], []).append((obj["points"], 1.0 - 0.01 * index, label))
    return _outputs(rows, k)


def _random_outputs(k: int = 17, seed: int = 0) -> dict:
    """Jittered poses (a little to a lot), misses, mislabels, detections of the ground
    truths without labelled points, and false detections."""
    rng = np.random.default_rng(seed + 100)
    rows: dict[int, list] = {}
    for obj in _objects(k):
        x, y, w, h = obj["bbox"]
        for _ in range(int(rng.integers(0, 3))):
            spread = rng.uniform(0.005, 0.12) * np.sqrt(obj["area"])
            points = obj["points"] + rng.normal(0, 1, (k, 2)) * spread
            hidden = obj["v"] == 0
            points[hidden] = np.column_stack([x + rng.uniform(0, w, k), y + rng.uniform(0, h, k)])[
                hidden
            ]
            label = CATEGORY_IDS.index(obj["category_id"]) if rng.random() < 0.8 else 1
            rows.setdefault(obj["image_id"], []).append((points, float(rng.random()), label))
    for image_id, (height, width) in SIZES.items():
        for _ in range(2):
            centre = rng.uniform([0, 0], [width, height])
            points = centre + rng.normal(0, 20, (k, 2))
            rows.setdefault(image_id, []).append(
                (points, float(rng.random()), int(rng.integers(2)))
            )
    return _outputs(rows, k)


def _as_results(outputs: dict, category_ids=CATEGORY_IDS) -> list[dict]:
    """COCO keypoint result dicts written independently of the code under test."""
    results = []
    for image_id, out in outputs.items():
        for i, points in enumerate(out["keypoints"].tolist()):
            flat = []
            for x, y in points:
                flat += [x, y, 1]
            results.append(
                {
                    "image_id": image_id,
                    "category_id": category_ids[int(out["labels"][i])],
                    "keypoints": flat,
                    "score": float(out["scores"][i]),
                }
            )
    return results


class FakeDataset:
    """The dataset contract (``coco``, ``ids``, ``label_to_category_id``) without images, as
    the keypoint dataset has it."""

    def __init__(self, path: str):
        with contextlib.redirect_stdout(io.StringIO()):
            self.coco = COCO(path)
        self.ids = sorted(self.coco.imgs)
        self.label_to_category_id = dict(LABEL_MAP)

    def __len__(self) -> int:
        return len(self.ids)


# ------------------------------------------------------------------------------ correctness


def test_perfect_predictions_give_ap_one(gt_path):
    outputs = _perfect_outputs()
    stats = coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    assert list(stats) == NAMES == list(COCO_KEYPOINT_STAT_NAMES)
    assert all(type(v) is float for v in stats.values())
    for name in NAMES:
        assert stats[name] == pytest.approx(1.0, abs=1e-12), name
    assert stats == _oracle(gt_path, _as_results(outputs))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_and_result_dicts_match_pycocotools(gt_path, seed):
    outputs = _random_outputs(seed=seed)
    results = _as_results(outputs)
    expected = _oracle(gt_path, results)
    assert 0.05 < expected["AP"] < 0.95 and expected["APm"] != expected["APl"]
    from_outputs = coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    listed = [{"image_id": i, **out} for i, out in outputs.items()]
    from_list = coco_evaluate(listed, gt_path, "keypoints", label_to_category_id=CATEGORY_IDS)
    from_results = coco_evaluate(results, gt_path, "keypoints")
    assert from_outputs == from_list == from_results == expected


def test_the_oks_of_the_evaluation_is_keypoint_oks(gt_path):
    """COCOeval's own OKS matrices (computeOks) equal keypoint_oks on the same data, ground
    truths without labelled points (and the crowd) included."""
    compared, boxed = 0, 0
    for seed in (3, 4, 5):
        results = _as_results(_random_outputs(seed=seed))
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(gt_path)
            evaluator = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), "keypoints")
            evaluator.evaluate()
        for (image_id, category_id), ious in evaluator.ious.items():
            if len(ious) == 0:
                continue
            gts = evaluator._gts[image_id, category_id]
            dts = sorted(evaluator._dts[image_id, category_id], key=lambda d: -d["score"])
            points = torch.tensor([g["keypoints"] for g in gts], dtype=torch.float64)
            points = points.view(len(gts), -1, 3)
            pred = torch.tensor([d["keypoints"] for d in dts], dtype=torch.float64)
            oks = keypoint_oks(
                pred.view(len(dts), -1, 3),
                points[..., :2],
                points[..., 2].long(),
                torch.tensor([g["area"] for g in gts], dtype=torch.float64),
                boxes=torch.tensor([g["bbox"] for g in gts], dtype=torch.float64),
                box_fmt="xywh",
            )
            np.testing.assert_allclose(oks.numpy(), ious, rtol=0, atol=1e-13)
            compared += oks.numel()
            boxed += sum(g["num_keypoints"] == 0 for g in gts) * len(dts)
    assert compared >= 50 and boxed >= 5


def test_result_files_and_bbox_keys(gt_path, tmp_path):
    results = _as_results(_random_outputs(seed=4))
    expected = _oracle(gt_path, results)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert coco_evaluate(path, gt_path, "keypoints") == expected
    assert coco_evaluate(str(path), gt_path, "keypoints") == expected
    # A "bbox" beside "keypoints" (detectron2 writes one) is dropped: areas from the points.
    boxed = [{**r, "bbox": [0.0, 0.0, 2.0, 2.0]} for r in results]
    assert _oracle(gt_path, boxed) != expected  # pycocotools would take the boxes' areas
    assert coco_evaluate(boxed, gt_path, "keypoints") == expected
    # a third value of any kind changes nothing; numpy and tensors are accepted
    other = [
        {**r, "keypoints": np.asarray(r["keypoints"]) * np.tile([1, 1, 0], 17)} for r in results
    ]
    assert coco_evaluate(other, gt_path, "keypoints") == expected
    tensors = [{**r, "keypoints": torch.tensor(r["keypoints"]).double(),
                "score": torch.tensor(r["score"]).double()} for r in results]  # fmt: skip
    assert coco_evaluate(tensors, gt_path, "keypoints") == expected


def test_output_forms_dtypes_and_devices(gt_path, device):
    outputs = _random_outputs(seed=5)
    expected = coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    variants = {}
    for i, out in outputs.items():
        n = len(out["scores"])
        variants[i] = {
            # keypoint R-CNN's output: (N, K, 3) with a visibility column, boxes, point scores
            "keypoints": torch.cat([out["keypoints"], torch.ones(n, 17, 1)], -1)
            .double()
            .to(device)
            .requires_grad_(),
            "keypoints_scores": torch.randn(n, 17).to(device),
            "boxes": torch.zeros(n, 4, device=device),
            "scores": out["scores"].half().float().to(device),
            "labels": out["labels"].int().to(device),
        }
    rounded = {i: {**out, "scores": out["scores"].half().float()} for i, out in outputs.items()}
    assert coco_evaluate(
        variants, gt_path, "keypoints", label_to_category_id=LABEL_MAP
    ) == coco_evaluate(rounded, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    half = {i: {**out, "keypoints": out["keypoints"].half()} for i, out in outputs.items()}
    as_float = {
        i: {**out, "keypoints": out["keypoints"].half().float()} for i, out in outputs.items()
    }
    assert coco_evaluate(half, gt_path, "keypoints", label_to_category_id=LABEL_MAP) == (
        coco_evaluate(as_float, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    )
    assert expected == _oracle(gt_path, _as_results(outputs))


def test_dataset_subset_and_image_ids(gt_path):
    outputs = _random_outputs(seed=6)
    dataset = FakeDataset(gt_path)
    expected = _oracle(gt_path, _as_results(outputs))
    assert coco_evaluate(outputs, dataset, "keypoints") == expected
    assert coco_evaluate(outputs, dataset.coco, "keypoints", label_to_category_id=LABEL_MAP) == (
        expected
    )
    on_subset = {i: outputs[i] for i in (2, 4)}
    subset = torch.utils.data.Subset(dataset, [1, 3])
    restricted = _oracle(gt_path, _as_results(on_subset), img_ids=[2, 4])
    assert coco_evaluate(on_subset, subset, "keypoints") == restricted
    assert (
        coco_evaluate(
            outputs, gt_path, "keypoints", image_ids=[4, 2], label_to_category_id=LABEL_MAP
        )
        == restricted
    )


def test_other_numbers_of_key_points_need_their_sigmas(tmp_path):
    k = 5
    path = _write(tmp_path, _ground_truth(k=k))
    outputs = _random_outputs(k=k, seed=7)
    sigmas = [0.03, 0.05, 0.07, 0.09, 0.11]
    expected = _oracle(path, _as_results(outputs), sigmas=sigmas)
    assert 0.0 < expected["AP"] < 1.0
    for given in (sigmas, np.asarray(sigmas), torch.tensor(sigmas), tuple(sigmas)):
        stats = coco_evaluate(
            outputs, path, "keypoints", label_to_category_id=LABEL_MAP, sigmas=given
        )
        assert stats == expected
    wider = coco_evaluate(
        outputs, path, "keypoints", label_to_category_id=LABEL_MAP, sigmas=[0.2] * k
    )
    assert wider["AP"] > expected["AP"]
    if importlib.util.find_spec("faster_coco_eval") is not None:
        fast = coco_evaluate(
            outputs, path, "keypoints", "faster_coco_eval", label_to_category_id=LABEL_MAP,
            sigmas=sigmas,
        )  # fmt: skip
        assert fast == pytest.approx(expected, abs=1e-12)
    with pytest.raises(
        ValueError,
        match="K=5 key points and its categories give no sigmas; the default ones are COCO's 17",
    ):
        coco_evaluate(outputs, path, "keypoints", label_to_category_id=LABEL_MAP)
    with pytest.raises(ValueError, match=r"one value per key point .*\(K=5\), got 4"):
        coco_evaluate([], path, "keypoints", sigmas=sigmas[:4])


def test_person_sigmas_are_the_default(gt_path):
    outputs = _random_outputs(seed=8)
    default = coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    given = coco_evaluate(
        outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP, sigmas=COCO_PERSON_SIGMAS
    )
    assert default == given == _oracle(gt_path, _as_results(outputs))  # pycocotools' own


def test_backends_agree(gt_path):
    pytest.importorskip("faster_coco_eval")
    outputs = _random_outputs(seed=9)
    reference = coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    for coco_gt in (gt_path, FakeDataset(gt_path)):
        fast = coco_evaluate(
            outputs, coco_gt, "keypoints", "faster_coco_eval", label_to_category_id=LABEL_MAP
        )
        assert list(fast) == NAMES and all(type(v) is float for v in fast.values())
        assert fast == pytest.approx(reference, abs=1e-12)
    for image_ids in ([4], [3]):
        assert coco_evaluate(
            [], gt_path, "keypoints", "faster_coco_eval", image_ids=image_ids
        ) == coco_evaluate([], gt_path, "keypoints", image_ids=image_ids)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_empty_predictions(gt_path, backend):
    if backend == "faster_coco_eval":
        pytest.importorskip("faster_coco_eval")
    empty = _empty_output()
    for predictions in ([], {}, {1: empty, 3: empty}):
        stats = coco_evaluate(predictions, gt_path, "keypoints", backend=backend)
        assert stats == dict.fromkeys(NAMES, 0.0)
    # where a bucket has no ground truth COCOeval says -1, as for a useless detection
    useless = [{"image_id": 1, "category_id": 1, "keypoints": [1.0, 1.0, 1.0] * 17, "score": 0.5}]
    only_one = coco_evaluate([], gt_path, "keypoints", backend=backend, image_ids=[1])
    assert only_one == _oracle(gt_path, useless, img_ids=[1])
    nothing = coco_evaluate([], gt_path, "keypoints", backend=backend, image_ids=[3])
    assert nothing == dict.fromkeys(NAMES, -1.0)


def test_ground_truth_without_num_keypoints(tmp_path):
    """pycocotools raises a bare KeyError on such a file; the count of v > 0 is filled in."""
    data = _ground_truth()
    for ann in data["annotations"]:
        del ann["num_keypoints"]
    path = _write(tmp_path, data)
    outputs = _random_outputs(seed=10)
    with pytest.raises(KeyError, match="num_keypoints"):
        _oracle(path, _as_results(outputs))
    expected = _oracle(_write(tmp_path, _ground_truth(), "full.json"), _as_results(outputs))
    assert coco_evaluate(outputs, path, "keypoints", label_to_category_id=LABEL_MAP) == expected


def test_inputs_are_not_modified(gt_path):
    outputs = _random_outputs(seed=10)
    results = _as_results(outputs)
    before = copy.deepcopy(results)
    coco_evaluate(results, gt_path, "keypoints")
    assert results == before
    points = {i: out["keypoints"].clone() for i, out in outputs.items()}
    coco_evaluate(outputs, gt_path, "keypoints", label_to_category_id=LABEL_MAP)
    assert all(torch.equal(outputs[i]["keypoints"], p) for i, p in points.items())


# ------------------------------------------------------------------------------ errors


def _one(**changes) -> dict:
    out = {
        "keypoints": torch.full((1, 17, 2), 50.0),
        "scores": torch.tensor([0.5]),
        "labels": torch.tensor([0]),
    }
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def _result(**changes) -> dict:
    return {"image_id": 1, "category_id": 1, "keypoints": [5.0, 5.0, 1.0] * 17, "score": 0.5,
            **changes}  # fmt: skip


@pytest.mark.parametrize(
    ("predictions", "kwargs", "error", "match"),
    [
        ({1: _one(keypoints=None)}, {}, ValueError, r"has no \['keypoints'\]"),
        ({1: _one(scores=None)}, {}, ValueError, r"has no \['scores'\]"),
        (
            {1: _one(keypoints=torch.zeros(1, 5, 2))},
            {},
            ValueError,
            r"\['keypoints'\] must have shape \(N, 17, 2\) or \(N, 17, 3\).*got \(1, 5, 2\)",
        ),
        ({1: _one(keypoints=torch.zeros(1, 17, 4))}, {}, ValueError, r"\(N, 17, 2\)"),
        ({1: _one(keypoints=[[1.0, 2.0]])}, {}, TypeError, "must be a torch.Tensor"),
        (
            {1: _one(keypoints=torch.zeros(1, 17, 2, dtype=torch.complex64))},
            {},
            TypeError,
            "must be a real tensor",
        ),
        ({1: _one(scores=torch.zeros(2))}, {}, ValueError, r"\['scores'\] must have shape \(1,\)"),
        ({1: _one(labels=torch.tensor([0.0]))}, {}, TypeError, "integer tensor"),
        (
            {1: _one(keypoints_scores=torch.zeros(1, 16))},
            {},
            ValueError,
            r"\['keypoints_scores'\] must have shape \(1, 17\)",
        ),
        (
            {1: _one(keypoints=torch.full((1, 17, 2), float("nan")))},
            {},
            ValueError,
            "keypoints, keypoints_scores and scores must be finite",
        ),
        ({1: _one(labels=torch.tensor([7]))}, {}, ValueError, "missing from label_to_category_id"),
        ([_result(keypoints=[1.0, 2.0] * 17)], {}, ValueError, "flat list of 3 \\* K = 51"),
        ([_result(keypoints=[[1.0, 2.0, 1.0]] * 17)], {}, ValueError, "got 17 values"),
        ([_result(keypoints="abc")], {}, ValueError, "flat list of 3"),
        (
            [_result(keypoints=[float("inf"), 2.0, 1.0] * 17)],
            {},
            ValueError,
            "must hold finite numbers",
        ),
        ([_result(category_id=9)], {}, ValueError, "category_id 9, not a category"),
        ([{"image_id": 1, "category_id": 1, "score": 0.5}], {}, ValueError, "has no"),
        ([_result(image_id=99)], {}, ValueError, "not in coco_gt: 99"),
        ([], {"sigmas": [0.1] * 16}, ValueError, r"one value per key point .*\(K=17\), got 16"),
        ([], {"sigmas": [0.1] * 16 + [0.0]}, ValueError, r"sigmas must be finite and > 0"),
        ([], {"sigmas": [0.1] * 16 + [float("nan")]}, ValueError, "finite and > 0"),
        ([], {"sigmas": [0.1] * 16 + ["a"]}, TypeError, r"sigmas\[16\] must be a float"),
        ([], {"sigmas": "abc"}, TypeError, "sigmas must be a sequence"),
        ([], {"sigmas": torch.ones(17, 1)}, ValueError, "sigmas must be a 1-D real tensor"),
        ([], {"sigmas": [0.1] * 17, "iou_type": "bbox"}, ValueError, "keypoints' only"),
        ([], {"iou_type": "keypoint"}, ValueError, "iou_type must be one of"),
    ],
)
def test_bad_inputs_raise(gt_path, predictions, kwargs, error, match):
    kwargs = {"iou_type": "keypoints", "label_to_category_id": LABEL_MAP, **kwargs}
    with pytest.raises(error, match=match):
        coco_evaluate(predictions, gt_path, **kwargs)


def test_annotations_without_key_points_count_as_unlabelled(tmp_path):
    """pycocotools raises a bare KeyError on them; they are read as CocoKeypoints reads them
    (no point labelled: ignored, as crowds are)."""
    data = _ground_truth()
    annotation = data["annotations"][2]  # a large object with detections near it
    del annotation["keypoints"], annotation["num_keypoints"]
    path = _write(tmp_path, data)
    outputs = _random_outputs(seed=12)
    with pytest.raises(KeyError, match="keypoints"):
        _oracle(path, _as_results(outputs))
    annotation.update(keypoints=[0] * 51, num_keypoints=0)
    expected = _oracle(_write(tmp_path, data, "unlabelled.json"), _as_results(outputs))
    assert expected != _oracle(gt_path_of(tmp_path), _as_results(outputs))
    assert coco_evaluate(outputs, path, "keypoints", label_to_category_id=LABEL_MAP) == expected


def gt_path_of(tmp_path) -> str:
    return _write(tmp_path, _ground_truth(), "again.json")


def _broken(change) -> dict:
    data = _ground_truth()
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda d: d["annotations"][0].update(keypoints=[1, 1, 2] * 5),
            "several: K=5 in annotations 1; K=17 in annotations 2, .*, category 1, category 5",
        ),
        (
            lambda d: d["categories"][1].update(keypoints=["a", "b"]),
            "several: K=17 in annotations .*, category 1; K=2 in category 5",
        ),
        (lambda d: d["annotations"][0].update(keypoints=[1, 2]), "annotations 1 have keypoints"),
        (lambda d: d["annotations"][0].update(keypoints=[]), "not a flat list"),
        (
            lambda d: d["annotations"][0].pop("keypoints"),
            "annotations 1 have num_keypoints > 0 but no keypoints",
        ),
        (
            lambda d: [
                c.pop("keypoints") for c in d["categories"] + d["annotations"] if "keypoints" in c
            ],
            "needs a keypoint ground truth",
        ),
        (
            lambda d: [c.update(sigmas=[0.1 * (c["id"] > 1) + 0.05] * 17) for c in d["categories"]],
            "keypoint categories of coco_gt give different sigmas",
        ),
        (
            lambda d: d["categories"][0].update(sigmas=[0.1] * 16),
            r"the categories' sigmas must hold one value per key point .*\(K=17\), got 16",
        ),
        (
            lambda d: d["categories"][0].update(sigmas=[-0.1] * 17),
            "the sigmas of category 1 must be finite and > 0",
        ),
    ],
)
def test_bad_ground_truths_raise(tmp_path, change, match):
    path = _write(tmp_path, _broken(change))
    with pytest.raises(ValueError, match=match):
        coco_evaluate([], path, "keypoints")


def test_sigmas_of_the_categories_are_the_default(tmp_path):
    data = _ground_truth(k=5)
    sigmas = [0.04, 0.06, 0.08, 0.1, 0.12]
    for category in data["categories"]:
        category["sigmas"] = sigmas
    path = _write(tmp_path, data)
    outputs = _random_outputs(k=5, seed=13)
    expected = _oracle(path, _as_results(outputs), sigmas=sigmas)
    assert coco_evaluate(outputs, path, "keypoints", label_to_category_id=LABEL_MAP) == expected
    given = coco_evaluate(
        outputs, path, "keypoints", label_to_category_id=LABEL_MAP, sigmas=[0.2] * 5
    )
    assert given == _oracle(path, _as_results(outputs), sigmas=[0.2] * 5) != expected


def test_with_coco_keypoints(tmp_path):
    keypoints = pytest.importorskip("visionblocks.data.keypoints")
    synthetic = pytest.importorskip("visionblocks.data.synthetic")
    ann = synthetic.make_synthetic_coco(
        tmp_path, num_images=4, image_size=(64, 96), seed=1, keypoints=True
    )
    dataset = keypoints.CocoKeypoints(tmp_path / "images", ann)
    outputs, jittered = {}, {}
    for _, target in (dataset[i] for i in range(len(dataset))):
        keep = target["iscrowd"] == 0
        n = int(keep.sum())
        points = target["keypoints"][keep].as_subclass(torch.Tensor)
        outputs[target["image_id"]] = {
            "keypoints": points,
            "scores": torch.linspace(1.0, 0.5, n),
            "labels": target["labels"][keep],
        }
        noise = torch.randn(points.shape, generator=torch.Generator().manual_seed(n)) * 2
        jittered[target["image_id"]] = {**outputs[target["image_id"]], "keypoints": points + noise}
    stats = coco_evaluate(outputs, dataset, "keypoints")  # the file's sigmas (K = 9)
    assert stats["AP"] == pytest.approx(1.0, abs=1e-12)
    with open(ann) as f:
        sigmas = next(c["sigmas"] for c in json.load(f)["categories"] if "keypoints" in c)
    assert dataset.sigmas.tolist() == pytest.approx(sigmas)
    path = _write(tmp_path, dataset.coco.dataset, "dataset.json")  # the dataset's own view
    expected = _oracle(path, _as_results(jittered, dataset.label_to_category_id), sigmas=sigmas)
    assert coco_evaluate(jittered, dataset, "keypoints") == expected
    assert 0.0 < expected["AP"] < 1.0


# ------------------------------------------------------------------------------ distributed


def _worker(rank: int, world_size: int, init_file: str, gt_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        outputs = _random_outputs(seed=11)
        mine = {i: outputs[i] for i in ((1, 2) if rank == 0 else (3, 4, 1))}  # image 1 on both
        results = _as_results({i: outputs[i] for i in ((1, 2) if rank == 0 else (3, 4))})
        report = {
            "outputs": coco_evaluate(mine, gt_path, "keypoints", label_to_category_id=LABEL_MAP),
            "results": coco_evaluate(results, FakeDataset(gt_path), "keypoints"),
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_gloo_processes_gather_to_the_same_stats(gt_path):
    expected = _oracle(gt_path, _as_results(_random_outputs(seed=11)))
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(2, init_file, gt_path, tmp), nprocs=2, join=True)
        reports = []
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                reports.append(json.load(f))
    for report in reports:
        assert report["outputs"] == report["results"] == expected
