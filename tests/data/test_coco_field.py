"""COCO files and images as users bring them: the exports in ``tests/fixtures/field``.

Each file mimics one tool's real export (fields, id conventions, its typical defects); see
``tests/fixtures/field/README.md``. The dataset must load each one, drop exactly the invalid
annotations (counted by reason, one warning), and `check_coco` / ``visionblocks check-coco``
must report the same and write a cleaned copy that loads without a warning.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torchvision import tv_tensors

from visionblocks.data import CocoInstances, CocoSegmentation, coco_evaluate

FIELD = Path(__file__).resolve().parents[1] / "fixtures" / "field"
IMAGES = FIELD / "images"

# file -> (with_masks, what the dataset drops, how many annotations it serves)
EXPECTED = {
    "cvat.json": (False, {"degenerate_box": [2], "short_polygon": [3]}, 4),
    "labelbox.json": (False, {"unknown_category": [1002], "odd_polygon": [1003]}, 3),
    "coco_annotator.json": (False, {"short_polygon": [32], "nonfinite": [33, 35]}, 2),
    "roboflow.json": (False, {"box_outside_image": [1]}, 3),
    "resized.json": (False, {"rle_size": [1], "polygon_outside_image": [2], "bad_rle": [3]}, 2),
    "lvis.json": (False, {}, 3),
}


def load(name: str, **kwargs) -> CocoInstances:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CocoInstances(IMAGES, FIELD / name, **kwargs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_export_loads_dropping_exactly_its_invalid_annotations(name):
    _, dropped, served = EXPECTED[name]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dataset = CocoInstances(IMAGES, FIELD / name)
    ours = [w for w in seen if "dropped" in str(w.message)]
    assert len(ours) == (1 if dropped else 0)  # one warning per dataset, none when clean
    if dropped:
        message = str(ours[0].message)
        for reason, ids in dropped.items():
            assert f"{reason}: id {ids[0]!r}" in message
    assert dataset.dropped == dropped
    assert len(dataset.coco.getAnnIds()) == served
    assert sum(len(e.ann_ids) for e in dataset._entries) == served
    for ann in dataset.coco.dataset["annotations"]:  # what pycocotools' evaluation expects
        assert ann["iscrowd"] in (0, 1) and np.isfinite(ann["area"])
    for index in range(len(dataset)):
        if dataset.ids[index] == 2 and name == "resized.json":
            continue  # the EXIF-rotated image, tested below
        image, target = dataset[index]
        assert isinstance(image, tv_tensors.Image) and image.dtype == torch.uint8
        assert image.shape == (3, 48, 64)
        boxes = target["boxes"]
        assert (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all()
        assert (boxes[:, 0::2] <= 64).all() and (boxes[:, 1::2] <= 48).all()


@pytest.mark.parametrize("name", sorted(n for n, (_, d, _) in EXPECTED.items() if d))
def test_raise_names_the_first_invalid_annotation(name):
    _, dropped, _ = EXPECTED[name]
    first = min(i for ids in dropped.values() for i in ids)
    with pytest.raises(ValueError, match=rf"{name}': annotation {first}\b"):
        CocoInstances(IMAGES, FIELD / name, invalid="raise")


def test_the_issue_examples_two_point_polygon_and_zero_height_box():
    dataset = load("cvat.json")
    assert 2 in dataset.dropped["degenerate_box"]  # [[50, 50, 60, 50]], bbox height 0
    assert 3 in dataset.dropped["short_polygon"]  # [[10, 25, 30, 40]]: 2 points
    _, target = dataset[0]
    assert target["labels"].tolist() == [0]  # only the sound car of image 1 is left


def test_masks_asked_for_drop_box_only_annotations_and_keep_restores_them():
    with_masks = load("cvat.json", with_masks=True)
    assert with_masks.dropped["empty_segmentation"] == [4, 5]
    kept = load("cvat.json", with_masks=True, invalid="keep")
    assert kept.kept_invalid == {"empty_segmentation": [4, 5], "short_polygon": [3]}
    assert kept.dropped == {"degenerate_box": [2]}  # a zero-height box is never kept
    _, target = kept[kept.ids.index(2)]
    assert target["masks"].shape == (2, 48, 64) and target["masks"].sum() == 0
    _, crowd = kept[kept.ids.index(3)]  # CVAT's mask annotation: an uncompressed crowd RLE
    assert crowd["iscrowd"].tolist() == [1] and crowd["masks"].sum() == 20


def test_clipped_boxes_and_filled_fields():
    dataset = load("roboflow.json")
    _, target = dataset[dataset.ids.index(1)]
    assert target["boxes"].tolist() == [[50.0, 40.0, 64.0, 48.0]]  # [50, 40, 30, 30] clipped
    labelbox = load("labelbox.json")
    ann = labelbox.coco.loadAnns(1001)[0]  # no area in the file: the polygon's, as COCO's
    rle = mask_utils.merge(mask_utils.frPyObjects(ann["segmentation"], 48, 64))
    assert ann["area"] == float(mask_utils.area(rle)) > 0
    annotator = load("coco_annotator.json")
    assert annotator.coco.loadAnns(34)[0]["iscrowd"] == 0  # no iscrowd in the file
    assert annotator.coco.loadAnns(31)[0]["iscrowd"] is False  # JSON false is 0


def test_min_box_size_drops_small_boxes():
    assert load("roboflow.json").dropped == {"box_outside_image": [1]}  # 0.5 px box kept
    dataset = load("roboflow.json", min_box_size=1)
    assert dataset.dropped == {"box_outside_image": [1], "small_box": [2]}


def test_segmentation_dataset_uses_the_same_policy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = CocoSegmentation(IMAGES, FIELD / "labelbox.json")
    assert dataset.dropped == {"unknown_category": [1002], "odd_polygon": [1003]}
    _, mask = dataset[dataset.ids.index(102)]
    assert set(mask.unique().tolist()) == {0, 3}  # the dog; the bike's odd polygon is gone


# ---------------------------------------------------------------------------- images
@pytest.mark.parametrize(
    "name", ["grey.png", "la.png", "rgba.png", "cmyk.jpg", "palette.png", "palette_alpha.png",
             "bilevel.png", "sub/nested.jpg"],
)  # fmt: skip
@pytest.mark.parametrize("decoder", ["torchvision", "pillow"])
def test_odd_images_become_three_channel_uint8(name, decoder, tmp_path, monkeypatch):
    if decoder == "pillow":  # the path every file takes once torchvision drops its decoders
        import torchvision.io

        def refuse(*args, **kwargs):
            raise RuntimeError("decoder unavailable")

        monkeypatch.setattr(torchvision.io, "decode_image", refuse)
    ann = tmp_path / "ann.json"
    image_entry = {"id": 1, "file_name": name, "height": 48, "width": 64}
    ann.write_text(json.dumps({"images": [image_entry], "annotations": [], "categories": []}))
    image, _ = CocoInstances(IMAGES, ann)[0]
    assert image.shape == (3, 48, 64) and image.dtype == torch.uint8
    with Image.open(IMAGES / name) as pil:
        expected = np.asarray(pil.convert("RGB")).transpose(2, 0, 1)
    tolerance = 2 if name == "cmyk.jpg" else 0  # libjpeg's and Pillow's CMYK conversions
    diff = np.abs(image.numpy().astype(int) - expected.astype(int)).max()
    assert diff <= tolerance


@pytest.mark.parametrize("decoder", ["torchvision", "pillow"])
def test_sixteen_bit_png_keeps_the_high_byte(decoder, tmp_path, monkeypatch):
    if decoder == "pillow":
        import torchvision.io

        monkeypatch.setattr(
            torchvision.io, "decode_image", lambda *a, **k: (_ for _ in ()).throw(RuntimeError())
        )
    ann = tmp_path / "ann.json"
    entry = {"id": 1, "file_name": "deep16.png", "height": 48, "width": 64}
    ann.write_text(json.dumps({"images": [entry], "annotations": [], "categories": []}))
    image, _ = CocoInstances(IMAGES, ann)[0]
    with Image.open(IMAGES / "deep16.png") as pil:
        high = (np.asarray(pil, dtype=np.int64) >> 8).astype(np.uint8)
    assert image.dtype == torch.uint8
    for channel in image:
        assert np.array_equal(channel.numpy(), high)


def test_exif_rotated_image_is_a_clear_error_naming_the_file():
    dataset = load("resized.json")
    with pytest.raises(ValueError, match=r"exif_rotated\.jpg.*is 48 x 64, but the annotation file "
                       r"says 64 x 48.*EXIF orientation 6.*exif_transpose"):  # fmt: skip
        dataset[dataset.ids.index(2)]


def test_missing_image_file_names_it_when_read(tmp_path):
    shutil.copytree(IMAGES, tmp_path / "images")
    (tmp_path / "images" / "rgb.jpg").unlink()
    dataset = CocoInstances(tmp_path / "images", FIELD / "lvis.json")  # rgb.jpg not used: fine
    assert len(dataset) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        broken = CocoInstances(tmp_path / "images", FIELD / "roboflow.json")
    with pytest.raises(FileNotFoundError, match=r"image id 0 not found: '.*rgb\.jpg'"):
        broken[0]


# ----------------------------------------------------------------------- LVIS and scale
def test_lvis_files_load_with_their_extra_fields_ignored():
    dataset = load("lvis.json")
    assert dataset.classes == ["aerosol_can", "airplane", "zucchini"]
    assert dataset.category_id_to_label == {1: 0, 3: 1, 1203: 2}
    assert [e.file_name for e in dataset._entries] == [
        "train2017/000000000009.jpg",
        "val2017/000000000042.jpg",
    ]
    _, target = dataset[0]
    assert target["labels"].tolist() == [1, 0] and target["iscrowd"].tolist() == [0, 0]
    outputs = {
        t["image_id"]: {"boxes": t["boxes"], "scores": torch.ones(len(t["labels"])),
                        "labels": t["labels"]}
        for t in (dataset[i][1] for i in range(len(dataset)))
    }  # fmt: skip
    assert coco_evaluate(outputs, dataset)["AP"] == pytest.approx(1.0)


def test_thousands_of_categories(tmp_path):
    categories = [{"id": 3 * i + 1, "name": f"class {i}", "frequency": "r"} for i in range(5000)]
    annotations = [
        {"id": i, "image_id": 1, "category_id": 3 * (i * 997 % 5000) + 1, "bbox": [i % 50, 1, 8, 8]}
        for i in range(300)
    ]
    image = {"id": 1, "file_name": "rgb.jpg", "height": 48, "width": 64}
    ann = tmp_path / "ann.json"
    ann.write_text(
        json.dumps({"images": [image], "annotations": annotations, "categories": categories})
    )
    dataset = CocoInstances(IMAGES, ann)
    assert len(dataset.classes) == 5000
    _, target = dataset[0]
    expected = [(a["category_id"] - 1) // 3 for a in annotations]
    assert target["labels"].tolist() == expected


def test_evaluation_counts_only_the_annotations_served():
    """Perfect predictions of the served targets give AP 1: dropped annotations are not misses."""
    dataset = load("labelbox.json")
    outputs = {}
    for index in range(len(dataset)):
        _, target = dataset[index]
        n = len(target["labels"])
        outputs[target["image_id"]] = {
            "boxes": target["boxes"], "scores": torch.ones(n), "labels": target["labels"]
        }  # fmt: skip
    assert coco_evaluate(outputs, dataset)["AP"] == pytest.approx(1.0)
