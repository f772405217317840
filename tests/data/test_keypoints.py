"""CocoKeypoints against pycocotools' own loading; keypoint categories, the invalid-annotation
policy's key point reasons, check-coco, collate and samplers, pickling, transforms v2 and the
synthetic keypoint data."""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import Params
from torch.utils.data import ConcatDataset, DataLoader, SequentialSampler
from torchvision import tv_tensors
from torchvision.transforms import v2

from visionblocks.cli import main
from visionblocks.data import (
    COCO_KEYPOINT_NAMES,
    INVALID_REASONS,
    CocoKeypoints,
    GroupedBatchSampler,
    aspect_ratio_groups,
    check_coco,
    collate_detection,
    instance_fields,
    make_synthetic_coco,
)
from visionblocks.data._coco_checks import KEYPOINT_REASONS
from visionblocks.ops.keypoints import keypoint_flip_pairs
from visionblocks.registry import DATASETS

K = len(COCO_KEYPOINT_NAMES)
# COCO's person skeleton, 1-based as in person_keypoints_*.json
COCO_SKELETON = [
    [16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12], [7, 13], [6, 7], [6, 8],
    [7, 9], [8, 10], [9, 11], [2, 3], [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7],
]  # fmt: skip
PERSON = {
    "id": 1,
    "name": "person",
    "supercategory": "person",
    "keypoints": list(COCO_KEYPOINT_NAMES),
    "skeleton": COCO_SKELETON,
}
DOG = {"id": 3, "name": "dog", "supercategory": "animal"}


def _points(seed: int, h: int, w: int, k: int = K) -> list[float]:
    """COCO ``keypoints`` of ``k`` random points: v in 0/1/2, coordinates 0 where v = 0."""
    rng = np.random.default_rng(seed)
    values: list[float] = []
    for _ in range(k):
        v = int(rng.integers(0, 3))
        x, y = (int(rng.integers(0, w)), int(rng.integers(0, h))) if v else (0, 0)
        values += [x, y, v]
    return values


def _person(ann_id: int, image_id: int, bbox: list[float], keypoints=None, **extra) -> dict:
    ann = {"id": ann_id, "image_id": image_id, "category_id": 1, "bbox": bbox, "iscrowd": 0}
    if keypoints is not None:
        ann["keypoints"] = keypoints
        ann["num_keypoints"] = sum(v > 0 for v in keypoints[2::3])
    ann.update(extra)
    return ann


def _write_images(root: Path, images: list[dict]) -> None:
    (root / "images").mkdir(parents=True, exist_ok=True)
    for k, info in enumerate(images):
        rgb = np.random.default_rng(k).integers(0, 255, (info["height"], info["width"], 3))
        Image.fromarray(rgb.astype(np.uint8)).save(root / "images" / info["file_name"])


def write_keypoint_file(root: Path) -> Path:
    """A small person-keypoint file: persons (one crowd, one without ``keypoints``, one with
    float flags), a dog (no key points), an image without annotations, another size."""
    images = [
        {"id": 1, "file_name": "a.png", "height": 40, "width": 60},
        {"id": 2, "file_name": "b.png", "height": 40, "width": 60},
        {"id": 3, "file_name": "c.png", "height": 30, "width": 50},
    ]
    floats = [float(v) for v in _points(5, 30, 50)]
    annotations = [
        _person(10, 1, [5, 5, 20, 30], _points(1, 40, 60),
                segmentation=[[5, 5, 25, 5, 25, 35, 5, 35]], area=600.0),
        _person(11, 1, [30, 2, 25, 35], _points(2, 40, 60)),
        {"id": 12, "image_id": 1, "category_id": 3, "bbox": [2, 2, 5, 5], "iscrowd": 0},
        _person(13, 1, [40, 20, 15, 15], [0] * (3 * K), iscrowd=1,
                segmentation=[[40, 20, 55, 20, 55, 35]]),
        _person(30, 3, [1, 1, 10, 10]),  # no keypoints at all: unlabelled
        _person(31, 3, [20, 5, 20, 20], floats),  # 2.0 is the flag 2
    ]  # fmt: skip
    _write_images(root, images)
    path = root / "person_keypoints.json"
    data = {"images": images, "annotations": annotations, "categories": [PERSON, DOG]}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def kp_file(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keypoints")
    return root / "images", write_keypoint_file(root)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("synthetic_keypoints")
    ann = make_synthetic_coco(
        root, num_images=10, image_size=(64, 96), seed=2, keypoints=True, crowd_prob=0.4,
        empty_prob=0.1, image_format="png",
    )  # fmt: skip
    return root / "images", ann


def _expected(coco: COCO, image_id: int, category_ids: list[int], k: int):
    """``(keypoints (n, k, 2), visibility (n, k))`` of pycocotools' annotations of the image."""
    anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id], catIds=category_ids))
    values = np.array([a.get("keypoints", [0] * (3 * k)) for a in anns], dtype=np.float64)
    values = values.reshape(len(anns), k, 3)
    return values[..., :2], values[..., 2], anns


# ------------------------------------------------------------------------------ oracles
def test_every_item_equals_pycocotools_loading(kp_file):
    dataset = CocoKeypoints(*kp_file)
    coco = COCO(str(kp_file[1]))
    assert dataset.ids == [1, 2, 3]
    for index, image_id in enumerate(dataset.ids):
        image, target = dataset[index]
        points, flags, anns = _expected(coco, image_id, [1], K)
        assert isinstance(target["keypoints"], tv_tensors.KeyPoints)
        assert target["keypoints"].dtype == torch.float32
        assert target["keypoints"].canvas_size == tuple(image.shape[-2:])
        assert target["keypoints_visibility"].dtype == torch.int64
        assert target["keypoints"].shape == (len(anns), K, 2)
        assert target["keypoints_visibility"].shape == (len(anns), K)
        np.testing.assert_array_equal(target["keypoints"].numpy(), points)
        np.testing.assert_array_equal(target["keypoints_visibility"].numpy(), flags)
        assert [a["id"] for a in anns] == [a for a in dataset._entries[index].ann_ids]
        assert len(target["boxes"]) == len(target["labels"]) == len(anns)
    # v = 0 points keep the file's coordinates (COCO writes 0, 0)
    _, target = dataset[0]
    hidden = target["keypoints_visibility"] == 0
    assert hidden.any() and (target["keypoints"][hidden] == 0).all()


def test_synthetic_items_equal_pycocotools_loading(synthetic):
    dataset = CocoKeypoints(*synthetic)
    coco = COCO(str(synthetic[1]))
    figure = coco.getCatIds(catNms=["figure"])
    assert dataset.classes == ["figure"] and dataset.num_keypoints == 9
    seen = 0
    for index, image_id in enumerate(dataset.ids):
        _, target = dataset[index]
        points, flags, anns = _expected(coco, image_id, figure, 9)
        np.testing.assert_array_equal(target["keypoints"].numpy(), points.astype(np.float32))
        np.testing.assert_array_equal(target["keypoints_visibility"].numpy(), flags)
        assert target["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
        seen += len(anns)
    assert seen > 10


def test_metadata_of_coco_person_files(kp_file):
    dataset = CocoKeypoints(*kp_file)
    assert dataset.keypoint_names == list(COCO_KEYPOINT_NAMES) and dataset.num_keypoints == 17
    assert dataset.skeleton == [(a - 1, b - 1) for a, b in COCO_SKELETON]
    assert dataset.flip_pairs == keypoint_flip_pairs(COCO_KEYPOINT_NAMES)
    assert dataset.flip_pairs[:2] == [(1, 2), (3, 4)] and len(dataset.flip_pairs) == 8
    expected = torch.as_tensor(Params(iouType="keypoints").kpt_oks_sigmas, dtype=torch.float32)
    assert dataset.sigmas.dtype == torch.float32 and torch.equal(dataset.sigmas, expected)
    assert dataset.classes == ["person"] and dataset.num_other == 1  # the dog is left out
    assert "keypoints=17" in repr(dataset)


def test_annotations_without_keypoints_are_unlabelled_and_filled_for_evaluation(kp_file):
    dataset = CocoKeypoints(*kp_file)
    _, target = dataset[dataset.ids.index(3)]
    assert target["keypoints_visibility"][0].tolist() == [0] * K  # annotation 30
    assert (target["keypoints_visibility"][1] > 0).sum() > 0  # 31: float flags read
    ann = dataset.coco.loadAnns(30)[0]
    assert ann["keypoints"] == [0] * (3 * K) and ann["num_keypoints"] == 0
    assert all("num_keypoints" in a for a in dataset.coco.dataset["annotations"])
    assert dataset.dropped == {} and dataset.kept_invalid == {}


def test_empty_images_give_typed_empty_keypoints(kp_file):
    dataset = CocoKeypoints(*kp_file)
    _, target = dataset[dataset.ids.index(2)]
    assert target["keypoints"].shape == (0, K, 2) and target["keypoints"].canvas_size == (40, 60)
    assert target["keypoints_visibility"].shape == (0, K)
    assert target["keypoints_visibility"].dtype == torch.int64
    assert len(CocoKeypoints(*kp_file, remove_empty=True)) == 2


def test_other_categories_drop_or_keep(kp_file):
    kept = CocoKeypoints(*kp_file, other_categories="keep")
    assert kept.classes == ["person", "dog"] and kept.num_other == 0
    _, target = kept[0]
    dog = target["labels"] == 1
    assert dog.sum() == 1 and (target["keypoints_visibility"][dog] == 0).all()
    assert (target["keypoints"][dog] == 0).all()
    dropped = CocoKeypoints(*kp_file)
    assert len(dropped[0][1]["labels"]) == len(target["labels"]) - 1
    assert 12 not in dropped.coco.getAnnIds() and 12 in kept.coco.getAnnIds()
    assert dropped.coco.getCatIds() == [1]
    raw = CocoKeypoints(*kp_file, contiguous_labels=False, other_categories="keep")
    assert sorted(set(raw[0][1]["labels"].tolist())) == [1, 3]


@pytest.mark.parametrize(
    ("crowd", "rows", "ignored"), [("keep", [10, 11, 13], 0), ("drop", [10, 11], 0),
                                   ("ignore", [10, 11], 1)]
)  # fmt: skip
def test_crowd_policies_keep_keypoint_rows_aligned(kp_file, crowd, rows, ignored):
    dataset = CocoKeypoints(*kp_file, crowd=crowd)
    _, target = dataset[0]
    coco = COCO(str(kp_file[1]))
    points = np.array([a["keypoints"] for a in coco.loadAnns(rows)]).reshape(len(rows), K, 3)
    np.testing.assert_array_equal(target["keypoints"].numpy(), points[..., :2])
    np.testing.assert_array_equal(target["keypoints_visibility"].numpy(), points[..., 2])
    assert len(target.get("ignore_boxes", ())) == ignored
    # with transforms, crowd rows travel along and are split off afterwards
    moved = CocoKeypoints(*kp_file, crowd=crowd, transforms=v2.Identity())
    _, again = moved[0]
    assert torch.equal(again["keypoints"], target["keypoints"])
    assert torch.equal(again["keypoints_visibility"], target["keypoints_visibility"])
    assert isinstance(again["keypoints"], tv_tensors.KeyPoints)


def test_registered_as_a_dataset(kp_file):
    assert DATASETS.get("coco_keypoints") is CocoKeypoints
    built = DATASETS.build({"type": "coco_keypoints", "root": kp_file[0], "ann_file": kp_file[1]})
    assert isinstance(built, CocoKeypoints) and len(built) == 3


def test_masks_and_polygons_come_along(kp_file):
    with pytest.warns(UserWarning, match="empty_segmentation"):  # 11 has none: an empty mask
        dataset = CocoKeypoints(*kp_file, with_masks=True, with_polygons=True, invalid="keep")
    _, target = dataset[0]
    assert target["masks"].shape == (3, 40, 60) and target["masks"][1].sum() == 0
    assert [len(p) for p in target["polygons"]] == [1, 0, 1]
    assert target["polygons"][0][0].tolist() == [[5, 5], [25, 5], [25, 35], [5, 35]]


# ----------------------------------------------------------------- keypoint categories
def _minimal(categories: list[dict], annotations: list[dict] | None = None) -> dict:
    return {
        "images": [{"id": 1, "file_name": "a.png", "height": 8, "width": 8}],
        "annotations": annotations if annotations is not None else [],
        "categories": categories,
    }


def _write(tmp_path: Path, data: dict) -> Path:
    (tmp_path / "images").mkdir(exist_ok=True)
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(data))
    return path


EYES = {"id": 1, "name": "face", "keypoints": ["left_eye", "right_eye"], "skeleton": [[1, 2]]}


@pytest.mark.parametrize(
    ("categories", "match"),
    [
        ([{"id": 1, "name": "x"}], "has no keypoint category"),
        ([{**EYES, "keypoints": "left_eye"}], r"categories\[0\] \(id 1\) has keypoints"),
        ([{**EYES, "keypoints": ["a", "a"]}], r"names the key points \['a'\] twice"),
        ([{**EYES, "skeleton": [[0, 1]]}], r"skeleton \[\[0, 1\]\].*1-based"),
        ([{**EYES, "skeleton": [[1, 2, 3]]}], "expected a list of \\[i, j\\] pairs"),
        ([{**EYES, "sigmas": [0.1]}], r"sigmas \[0.1\], expected 2 positive numbers"),
        ([{**EYES, "sigmas": [0.1, -1]}], "expected 2 positive numbers"),
        (
            [EYES, {"id": 2, "name": "cyclops", "keypoints": ["eye"]}],
            "keypoint categories 1 and 2 differ",
        ),
    ],
)
def test_bad_keypoint_categories_are_refused(tmp_path, categories, match):
    path = _write(tmp_path, _minimal(categories))
    with pytest.raises(ValueError, match=match):
        CocoKeypoints(tmp_path / "images", path)
    problems = check_coco(path, keypoints=True).file_problems  # the linter says the same
    assert any(re.search(match, problem) for problem in problems)


def test_several_keypoint_categories_sharing_their_points(tmp_path):
    categories = [EYES, {**EYES, "id": 2, "name": "mask"}, {"id": 5, "name": "hat"}]
    anns = [
        {"id": 1, "image_id": 1, "category_id": 2, "bbox": [1, 1, 4, 4],
         "keypoints": [2, 2, 2, 4, 2, 1], "num_keypoints": 2},
        {"id": 2, "image_id": 1, "category_id": 5, "bbox": [1, 1, 4, 4]},
    ]  # fmt: skip
    dataset = CocoKeypoints(tmp_path / "images", _write(tmp_path, _minimal(categories, anns)))
    assert dataset.classes == ["face", "mask"] and dataset.num_other == 1
    assert dataset.skeleton == [(0, 1)] and dataset.flip_pairs == [(0, 1)]
    assert dataset.sigmas is None  # not COCO's names, and the file gives none
    assert dataset._entries[0].visibility.tolist() == [[2, 1]]


def test_sigmas_from_the_file_and_explicit_flip_pairs(tmp_path):
    names = ["head", "hand_a", "hand_b"]
    category = {"id": 1, "name": "x", "keypoints": names, "sigmas": [0.1, 0.2, 0.3]}
    path = _write(tmp_path, _minimal([category]))
    dataset = CocoKeypoints(tmp_path / "images", path)
    assert torch.allclose(dataset.sigmas, torch.tensor([0.1, 0.2, 0.3]))
    assert dataset.flip_pairs == [] and dataset.skeleton == []  # no sides, no bones
    assert CocoKeypoints(tmp_path / "images", path, flip_pairs=[(1, 2)]).flip_pairs == [(1, 2)]
    assert CocoKeypoints(tmp_path / "images", path, flip_pairs=[]).flip_pairs == []


@pytest.mark.parametrize(
    ("flip_pairs", "error", "match"),
    [
        ([(1, 3)], ValueError, r"flip_pairs must be .* in \[0, 3\).*outside"),
        ([(1, 2), (2, 0)], ValueError, "flip_pairs.*in two pairs"),
        ([(1, 1)], ValueError, "flip_pairs.*with itself"),
        ([(1, 2.0)], TypeError, "flip_pairs"),
        ("12", TypeError, "flip_pairs must be a sequence"),
        (3, TypeError, "flip_pairs must be a sequence"),
    ],
)
def test_bad_flip_pairs(tmp_path, flip_pairs, error, match):
    category = {"id": 1, "name": "x", "keypoints": ["head", "hand_a", "hand_b"]}
    path = _write(tmp_path, _minimal([category]))
    with pytest.raises(error, match=match):
        CocoKeypoints(tmp_path / "images", path, flip_pairs=flip_pairs)


def test_names_without_a_partner_ask_for_flip_pairs(tmp_path):
    category = {"id": 1, "name": "x", "keypoints": ["left_eye", "nose"]}
    path = _write(tmp_path, _minimal([category]))
    with pytest.raises(ValueError, match=r"flip_pairs: cannot read .*'left_eye' has no partner"):
        CocoKeypoints(tmp_path / "images", path)
    assert CocoKeypoints(tmp_path / "images", path, flip_pairs=[]).flip_pairs == []


def test_unknown_categories_are_still_invalid_when_others_are_dropped(tmp_path):
    anns = [{"id": 1, "image_id": 1, "category_id": 9, "bbox": [1, 1, 4, 4]}]
    path = _write(tmp_path, _minimal([EYES, {"id": 5, "name": "hat"}], anns))
    with pytest.warns(UserWarning, match="unknown_category"):
        dataset = CocoKeypoints(tmp_path / "images", path)
    assert dataset.dropped == {"unknown_category": [1]}


# -------------------------------------------------------------------- invalid key points
# (annotation fields, reason, message); the category has K = 2 key points
KEYPOINT_INVALID_CASES = [
    ({"keypoints": "1 1 2"}, "bad_keypoints", r"annotation 1 has keypoints 1 1 2, expected a"),
    ({"keypoints": [[1, 1, 2], [2, 2, 2]]}, "bad_keypoints", "flat list"),
    ({"keypoints": [1, 1, True, 2, 2, 2]}, "bad_keypoints", "flat list"),
    ({"keypoints": [1, 1, 2]}, "keypoints_length", r"3 keypoints values, expected 3 x 2 = 6"),
    ({"keypoints": [1, 1, 2] * 3}, "keypoints_length", "9 keypoints values"),
    ({"keypoints": [1, math.nan, 2, 2, 2, 2]}, "nonfinite_keypoints", "NaN or inf key points"),
    ({"keypoints": [1, 1, 2, math.inf, 2, 2]}, "nonfinite_keypoints", "NaN or inf"),
    ({"keypoints": [1, 1, 3, 2, 2, 2]}, "bad_visibility", "visibility 3 for key point 0"),
    ({"keypoints": [1, 1, 2, 2, 2, 1.5]}, "bad_visibility", "visibility 1.5 for key point 1"),
    ({"keypoints": [1, 1, 2, 2, 2, -1]}, "bad_visibility", "expected 0 \\(not labelled\\)"),
    (
        {"keypoints": [1, 1, 2, 0, 0, 0], "num_keypoints": 2},
        "num_keypoints_mismatch",
        r"num_keypoints 2, but 1 of its key points are labelled",
    ),
    ({"keypoints": [1, 1, 2, 2, 2, 1], "num_keypoints": "2"}, "num_keypoints_mismatch", "'2'"),
]


def test_every_keypoint_reason_has_a_case():
    assert {reason for _, reason, _ in KEYPOINT_INVALID_CASES} == set(KEYPOINT_REASONS)
    assert set(KEYPOINT_REASONS) <= set(INVALID_REASONS)


def _eyes_file(tmp_path: Path, annotation: dict) -> Path:
    ann = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], **annotation}
    return _write(tmp_path, _minimal([EYES], [ann]))


@pytest.mark.parametrize(("annotation", "reason", "match"), KEYPOINT_INVALID_CASES)
def test_invalid_keypoints_follow_the_policy(tmp_path, annotation, reason, match):
    path = _eyes_file(tmp_path, annotation)
    root = tmp_path / "images"
    with pytest.raises(ValueError, match=match):
        CocoKeypoints(root, path, invalid="raise")
    with pytest.warns(UserWarning, match=rf"dropped 1 of 1 annotation\(s\).*{reason}: id 1"):
        dropped = CocoKeypoints(root, path)
    assert dropped.dropped == {reason: [1]} and dropped.coco.getAnnIds() == []
    assert dropped._entries[0].keypoints.shape == (0, 2, 2)
    # keep: the box is sound, so the annotation stays without its invalid key points
    with pytest.warns(UserWarning, match=rf"kept 1 invalid annotation\(s\).*{reason}: id 1"):
        kept = CocoKeypoints(root, path, invalid="keep")
    assert kept.kept_invalid == {reason: [1]} and kept.dropped == {}
    ann = kept.coco.loadAnns(1)[0]
    visibility = kept._entries[0].visibility.tolist()
    if reason == "num_keypoints_mismatch":  # the flags stand, the count is redone
        assert ann["num_keypoints"] == sum(v > 0 for v in annotation["keypoints"][2::3])
        assert visibility == [annotation["keypoints"][2::3]]
    else:
        assert ann["keypoints"] == [0] * 6 and ann["num_keypoints"] == 0
        assert visibility == [[0, 0]]
    # CocoInstances does not serve key points: it does not check them either
    from visionblocks.data import CocoInstances

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CocoInstances(root, path, invalid="raise").coco.getAnnIds() == [1]


def test_box_problems_come_before_keypoint_problems(tmp_path):
    path = _eyes_file(tmp_path, {"bbox": [0, 0, 0, 4], "keypoints": [1]})
    with pytest.warns(UserWarning):
        kept = CocoKeypoints(tmp_path / "images", path, invalid="keep")
    assert kept.dropped == {"degenerate_box": [1]} and kept.kept_invalid == {}


def test_keep_repairs_several_problems_of_one_annotation(tmp_path):
    path = _eyes_file(tmp_path, {"area": -1, "keypoints": [1, 1, 7, 2, 2, 2]})
    with pytest.warns(UserWarning):
        kept = CocoKeypoints(tmp_path / "images", path, invalid="keep")
    assert kept.kept_invalid == {"bad_area": [1], "bad_visibility": [1]}
    assert kept.coco.loadAnns(1)[0]["area"] == 16.0


# ------------------------------------------------------------------------- check-coco
def _dirty(tmp_path: Path) -> Path:
    anns = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4],
         "keypoints": [1, 1, 2, 2, 2, 2], "num_keypoints": 2},
        {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4],
         "keypoints": [1, 1, 5, 2, 2, 2]},
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4],
         "keypoints": [1, 1, 2, 2, 2, 2], "num_keypoints": 1},
        {"id": 4, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], "keypoints": [1, 1]},
        {"id": 5, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4]},
        {"id": 6, "image_id": 1, "category_id": 5, "bbox": [0, 0, 4, 4], "keypoints": "junk"},
    ]  # fmt: skip
    return _write(tmp_path, _minimal([EYES, {"id": 5, "name": "hat"}], anns))


def test_check_coco_reports_what_the_dataset_drops(tmp_path):
    path = _dirty(tmp_path)
    report = check_coco(path)
    with pytest.warns(UserWarning):
        dataset = CocoKeypoints(tmp_path / "images", path, other_categories="keep")
    assert (
        report.invalid
        == dataset.dropped
        == {
            "bad_visibility": [2],
            "num_keypoints_mismatch": [3],
            "keypoints_length": [4],
        }
    )
    assert report.keypoint_counts == {1: 2} and not report.ok
    assert report.notes["missing_keypoints"] == [5]  # 6 is a hat: its keypoints are ignored
    text = str(report)
    assert "key points checked as CocoKeypoints: 2 per instance of category id(s) 1" in text
    assert "annotation 2 has visibility 5 for key point 0" in text
    # as CocoInstances, which ignores key points
    plain = check_coco(path, keypoints=False)
    assert plain.ok and plain.keypoint_counts == {}


def test_check_coco_fix_drops_or_repairs_like_the_dataset(tmp_path):
    path = _dirty(tmp_path)
    fixed = check_coco(path).fixed()
    assert [a["id"] for a in fixed["annotations"]] == [1, 5, 6]
    assert fixed["annotations"][1]["keypoints"] == [0] * 6  # filled in, as on load
    assert fixed["annotations"][1]["num_keypoints"] == 0
    assert fixed["annotations"][2]["keypoints"] == "junk"  # not a keypoint category
    out = tmp_path / "clean.json"
    out.write_text(json.dumps(fixed))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loads without a warning
        assert len(CocoKeypoints(tmp_path / "images", out).coco.getAnnIds()) == 2
    repaired = check_coco(path, keep_repairable=True).fixed()
    by_id = {a["id"]: a for a in repaired["annotations"]}
    assert sorted(by_id) == [1, 2, 3, 4, 5, 6]
    assert by_id[2]["keypoints"] == [0] * 6 and by_id[3]["num_keypoints"] == 2


def test_check_coco_cli(tmp_path, capsys):
    path = _dirty(tmp_path)
    assert main(["check-coco", str(path)]) == 1
    out = capsys.readouterr().out
    assert "keypoints_length" in out and "num_keypoints_mismatch" in out
    assert main(["check-coco", str(path), "--no-keypoints"]) == 0
    clean = tmp_path / "clean.json"
    assert main(["check-coco", str(path), "--fix", str(clean)]) == 0
    assert main(["check-coco", str(clean), "--keypoints"]) == 0
    plain = _write(tmp_path, _minimal([{"id": 1, "name": "x"}]))
    assert main(["check-coco", str(plain)]) == 0  # no keypoint category: as CocoInstances
    assert main(["check-coco", str(plain), "--keypoints"]) == 1
    assert "has no keypoint category" in capsys.readouterr().out


def test_check_coco_keypoints_argument_is_checked(tmp_path):
    with pytest.raises(TypeError, match="keypoints must be bool"):
        check_coco(_dirty(tmp_path), keypoints="yes")


# ---------------------------------------------------------- collate, samplers, pickling
def test_dataloader_with_collate_keeps_keypoints_per_image(synthetic):
    dataset = CocoKeypoints(*synthetic)
    loader = DataLoader(dataset, batch_size=3, collate_fn=collate_detection)
    index = 0
    for batch in loader:
        assert batch.images.shape[0] == len(batch.targets) == len(batch.image_sizes)
        for target in batch.targets:
            expected = dataset[index][1]
            assert isinstance(target["keypoints"], tv_tensors.KeyPoints)
            assert torch.equal(target["keypoints"], expected["keypoints"])
            assert torch.equal(target["keypoints_visibility"], expected["keypoints_visibility"])
            assert target["image_id"] == dataset.ids[index]
            index += 1
    assert index == len(dataset)


def test_worker_processes_and_pickling(synthetic):
    dataset = CocoKeypoints(*synthetic)
    restored = pickle.loads(pickle.dumps(dataset))
    assert restored._coco is None and restored.flip_pairs == dataset.flip_pairs
    assert torch.equal(restored.sigmas, dataset.sigmas)
    assert all("keypoints" in a for a in restored.coco.dataset["annotations"])  # reloaded
    loader = DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=collate_detection)
    targets = [t for batch in loader for t in batch.targets]
    for index, target in enumerate(targets):
        assert torch.equal(target["keypoints"], dataset[index][1]["keypoints"])
        assert target["keypoints"].canvas_size == (64, 96)


def test_aspect_ratio_groups_and_grouped_batches(tmp_path, synthetic):
    wide = CocoKeypoints(*synthetic)
    ann = make_synthetic_coco(tmp_path, num_images=5, image_size=(96, 64), seed=3, keypoints=True)
    tall = CocoKeypoints(tmp_path / "images", ann)
    both = ConcatDataset([wide, tall])
    groups = aspect_ratio_groups(both)
    assert groups == [1] * len(wide) + [0] * len(tall)
    sampler = GroupedBatchSampler(SequentialSampler(both), groups, batch_size=4)
    loader = DataLoader(both, batch_sampler=sampler, collate_fn=collate_detection)
    seen = []
    for batch in loader:
        shapes = {tuple(t["keypoints"].canvas_size) for t in batch.targets}
        seen += [t["image_id"] for t in batch.targets]
        if len(batch.targets) == 4:  # full batches never mix groups
            assert len(shapes) == 1
        for target in batch.targets:
            n = len(target["boxes"])
            assert target["keypoints"].shape == (n, 9, 2)
            assert target["keypoints_visibility"].shape == (n, 9)
    assert len(seen) == len(both)


# ------------------------------------------------------------------------ transforms v2
def test_horizontal_flip_moves_the_keypoints(synthetic):
    plain = CocoKeypoints(*synthetic)
    flipped = CocoKeypoints(*synthetic, transforms=v2.RandomHorizontalFlip(p=1.0))
    moved = 0
    for index in range(len(plain)):
        _, before = plain[index]
        _, after = flipped[index]
        assert isinstance(after["keypoints"], tv_tensors.KeyPoints)
        # pixel indices: x -> W - 1 - x; torchvision swaps no names, nor the visibility
        expected = before["keypoints"].clone()
        expected[..., 0] = 96 - 1 - expected[..., 0]
        torch.testing.assert_close(after["keypoints"].as_subclass(torch.Tensor), expected)
        assert torch.equal(after["keypoints_visibility"], before["keypoints_visibility"])
        moved += len(before["boxes"])
    assert moved > 0


def _crop_last(getter) -> v2.Compose:
    return v2.Compose([v2.CenterCrop((64, 40)), v2.SanitizeBoundingBoxes(labels_getter=getter)])


def test_sanitize_with_instance_fields_keeps_visibility_aligned(synthetic):
    plain = CocoKeypoints(*synthetic)
    cropped = CocoKeypoints(*synthetic, transforms=_crop_last(instance_fields))
    removed = kept_rows = 0
    for index in range(len(plain)):
        _, before = plain[index]
        _, after = cropped[index]
        n = len(after["boxes"])
        assert isinstance(after["keypoints"], tv_tensors.KeyPoints)  # wrapped again
        assert after["keypoints"].canvas_size == (64, 40) and after["keypoints"].shape[0] == n
        assert len(after["keypoints_visibility"]) == len(after["labels"]) == n
        # each kept row is an instance of before, moved by the crop (28 pixels to the left)
        original = before["keypoints"].as_subclass(torch.Tensor) - torch.tensor([28.0, 0.0])
        for row in range(n):
            same = (original == after["keypoints"][row].as_subclass(torch.Tensor)).all(-1)
            match = int(torch.nonzero(same.all(-1))[0])
            vis = before["keypoints_visibility"][match]
            assert torch.equal(after["keypoints_visibility"][row], vis)
            assert after["labels"][row] == before["labels"][match]
        removed += len(before["boxes"]) - n
        kept_rows += n
    assert removed > 0 and kept_rows > 0  # the crop dropped rows: alignment was exercised


def test_default_sanitize_getter_gives_a_clear_error(synthetic):
    dataset = CocoKeypoints(*synthetic, transforms=_crop_last("default"))
    with pytest.raises(ValueError, match=r"labels_getter=visionblocks\.data\.instance_fields"):
        for index in range(len(dataset)):
            dataset[index]


# ---------------------------------------------------------------------- synthetic data
def test_synthetic_keypoint_file(synthetic):
    data = json.loads(synthetic[1].read_text())
    assert data["info"]["parameters"]["keypoints"] is True
    *shapes, figure = data["categories"]
    assert [c["name"] for c in shapes] == ["circle", "square", "triangle"]
    assert figure["name"] == "figure" and figure["id"] == 4 and len(figure["keypoints"]) == 9
    assert keypoint_flip_pairs(figure["keypoints"]) == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert len(figure["sigmas"]) == 9 and len(figure["skeleton"]) == 10
    coco = COCO()
    coco.dataset = data
    coco.createIndex()
    flags = []
    for ann in data["annotations"]:
        if ann["category_id"] != 4:
            assert "keypoints" not in ann
            continue
        points = np.array(ann["keypoints"], dtype=float).reshape(9, 3)
        assert ann["num_keypoints"] == int((points[:, 2] > 0).sum())
        if ann["iscrowd"]:
            assert ann["num_keypoints"] == 0 and not points.any()
            continue
        flags += points[:, 2].tolist()
        assert not points[points[:, 2] == 0].any()  # v = 0 is written 0, 0, 0
        mask = coco.annToMask(ann)
        labelled = points[points[:, 2] > 0]
        cols, rows = np.floor(labelled[:, :2] + 0.5).astype(int).T
        assert mask[rows, cols].all()  # every key point lies on its figure
        x, y, w, h = ann["bbox"]
        assert (labelled[:, 0] >= x - 0.5).all() and (labelled[:, 0] <= x + w - 0.5).all()
        assert (labelled[:, 1] >= y - 0.5).all() and (labelled[:, 1] <= y + h - 0.5).all()
    assert {0.0, 1.0, 2.0} <= set(flags)
    assert any(a["iscrowd"] and a["category_id"] == 4 for a in data["annotations"])


def test_synthetic_keypoints_are_deterministic_and_options_hold(tmp_path):
    a = make_synthetic_coco(tmp_path / "a", 3, (48, 64), seed=7, keypoints=True)
    b = make_synthetic_coco(tmp_path / "b", 3, (48, 64), seed=7, keypoints=True)
    c = make_synthetic_coco(tmp_path / "c", 3, (48, 64), seed=8, keypoints=True)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    for name in ("000001.jpg", "000003.jpg"):
        assert (tmp_path / "a" / "images" / name).read_bytes() == (
            tmp_path / "b" / "images" / name
        ).read_bytes()
    only = make_synthetic_coco(
        tmp_path / "d", 3, (48, 64), num_classes=0, keypoints=True, category_ids=[9]
    )
    data = json.loads(only.read_text())
    assert [c["id"] for c in data["categories"]] == [9]
    assert data["annotations"] and {x["category_id"] for x in data["annotations"]} == {9}
    plain = make_synthetic_coco(tmp_path / "e", 3, (48, 64), seed=7)
    assert "keypoints" not in json.loads(plain.read_text())["info"]["parameters"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"keypoints": 1}, TypeError, "keypoints must be bool"),
        ({"num_classes": 0}, ValueError, r"num_classes must be in \[1, 10\]"),
        ({"num_classes": -1, "keypoints": True}, ValueError, r"num_classes must be in \[0, 10\]"),
        (
            {"keypoints": True, "category_ids": [1, 2, 3]},
            ValueError,
            r"category_ids must hold num_classes \+ 1 = 4 ids \(the figure's last",
        ),
    ],
)
def test_synthetic_keypoint_argument_errors(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_synthetic_coco(tmp_path, 1, (32, 32), **kwargs)
