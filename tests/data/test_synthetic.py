"""make_synthetic_coco: COCO format, pixel/annotation consistency (pycocotools as the oracle),
options, determinism and argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_utils
import pytest
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pycocotools.coco import COCO

from visionblocks.data._synthetic_draw import _uncompressed_rle
from visionblocks.data.synthetic import SYNTHETIC_CLASSES, make_synthetic_coco


def _load(ann_file: Path) -> COCO:
    coco = COCO()  # built from the dict: no "loading annotations" print
    coco.dataset = json.loads(ann_file.read_text())
    coco.createIndex()
    return coco


def _pixels(ann_file: Path, image: dict) -> np.ndarray:
    return np.asarray(Image.open(ann_file.parent / "images" / image["file_name"]).convert("RGB"))


def _mask_box(mask: np.ndarray) -> np.ndarray:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=float)


@pytest.fixture(scope="module")
def png_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All ten classes, crowds, empty images, lossless pixels, a non-square size."""
    root = tmp_path_factory.mktemp("png")
    return make_synthetic_coco(
        root, 16, (96, 128), 10, seed=3, image_format="png", crowd_prob=0.5, empty_prob=0.15
    )


@pytest.fixture(scope="module")
def jpg_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_coco(tmp_path_factory.mktemp("jpg"), 8, (80, 64), seed=5)


def test_files_and_coco_format(png_set: Path) -> None:
    data = json.loads(png_set.read_text())
    assert png_set.name == "annotations.json"
    assert set(data) == {"info", "licenses", "images", "annotations", "categories"}
    assert data["licenses"] == []
    assert data["info"]["parameters"] == {
        "num_images": 16,
        "image_size": [96, 128],
        "num_classes": 10,
        "seed": 3,
        "min_objects": 1,
        "max_objects": 6,
        "object_size": [0.1, 0.35],
        "image_format": "png",
        "crowd_prob": 0.5,
        "empty_prob": 0.15,
        "category_ids": list(range(1, 11)),
    }
    assert [im["id"] for im in data["images"]] == list(range(1, 17))
    for im in data["images"]:
        assert set(im) == {"id", "file_name", "height", "width"}
        with Image.open(png_set.parent / "images" / im["file_name"]) as img:
            assert (img.format, img.mode, img.size) == ("PNG", "RGB", (128, 96))
        assert (im["height"], im["width"]) == (96, 128)
    assert sorted(p.name for p in (png_set.parent / "images").iterdir()) == [
        im["file_name"] for im in data["images"]
    ]
    anns = data["annotations"]
    assert [a["id"] for a in anns] == list(range(1, len(anns) + 1))
    keys = {"id", "image_id", "category_id", "segmentation", "bbox", "area", "iscrowd"}
    assert all(set(a) == keys for a in anns)
    assert {a["category_id"] for a in anns} <= set(range(1, 11))
    assert data["categories"] == [
        {"id": k + 1, "name": name, "supercategory": "shape"}
        for k, name in enumerate(SYNTHETIC_CLASSES)
    ]
    # the options really happened: crowds, empty images, several classes
    assert any(a["iscrowd"] for a in anns)
    assert {im["id"] for im in data["images"]} - {a["image_id"] for a in anns}
    assert len({a["category_id"] for a in anns}) >= 8


def test_loads_with_pycocotools_and_torchvision(jpg_set: Path) -> None:
    coco = COCO(str(jpg_set))
    assert coco.getImgIds() == list(range(1, 9))
    assert coco.getCatIds() == [1, 2, 3]
    dataset = torchvision.datasets.CocoDetection(str(jpg_set.parent / "images"), str(jpg_set))
    assert len(dataset) == 8
    for index in range(len(dataset)):
        image, target = dataset[index]
        assert image.size == (64, 80)
        assert 1 <= len(target) <= 6
        assert target == coco.loadAnns(coco.getAnnIds(imgIds=[index + 1]))


def test_masks_areas_boxes_against_pycocotools(png_set: Path) -> None:
    coco = _load(png_set)
    for ann in coco.dataset["annotations"]:
        mask = coco.annToMask(ann).astype(bool)
        assert mask.sum() == ann["area"] > 0
        x, y, w, h = ann["bbox"]
        box = np.array([x, y, x + w, y + h])
        if ann["iscrowd"]:
            assert box.tolist() == _mask_box(mask).tolist()
            continue
        (polygon,) = ann["segmentation"]
        xs, ys = np.array(polygon[0::2]), np.array(polygon[1::2])
        assert len(polygon) % 2 == 0 and len(xs) >= 3
        assert box.tolist() == pytest.approx([xs.min(), ys.min(), xs.max(), ys.max()], abs=1e-6)
        assert xs.min() >= 0 and ys.min() >= 0 and xs.max() <= 128 and ys.max() <= 96
        np.testing.assert_allclose(box, _mask_box(mask), atol=1.0)


def test_painted_pixels_are_the_masks(png_set: Path) -> None:
    """Each annotation's pixels have one colour, which no other pixel of the image has."""
    coco = _load(png_set)
    for image in coco.dataset["images"]:
        pixels = _pixels(png_set, image)
        cover = np.zeros(pixels.shape[:2], dtype=int)
        for ann in coco.imgToAnns[image["id"]]:
            mask = coco.annToMask(ann).astype(bool)
            cover += mask
            colours = np.unique(pixels[mask], axis=0)
            assert len(colours) == 1
            assert np.array_equal((pixels == colours[0]).all(-1), mask)
        assert cover.max() <= 1  # no overlaps


def test_objects_contrast_with_their_surroundings(jpg_set: Path, png_set: Path) -> None:
    for ann_file in (jpg_set, png_set):
        coco = _load(ann_file)
        for image in coco.dataset["images"]:
            pixels = _pixels(ann_file, image).astype(float)
            for ann in coco.imgToAnns[image["id"]]:
                mask = coco.annToMask(ann).astype(bool)
                ring = np.zeros_like(mask)  # background within 2 pixels of the object
                for dy in range(-2, 3):
                    for dx in range(-2, 3):
                        ring |= np.roll(mask, (dy, dx), axis=(0, 1))
                ring &= ~mask
                inside, around = pixels[mask].mean(0), pixels[ring].mean(0)
                assert np.linalg.norm(inside - around) > 70


def test_polygons_are_simple_shapes(png_set: Path) -> None:
    """Shoelace area ~ pixel area: no self-intersecting or inside-out outline, for every class."""
    coco = _load(png_set)
    for ann in coco.dataset["annotations"]:
        if ann["iscrowd"] or ann["area"] < 200:
            continue
        xs, ys = np.array(ann["segmentation"][0][0::2]), np.array(ann["segmentation"][0][1::2])
        shoelace = 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))
        assert shoelace == pytest.approx(ann["area"], rel=0.12)


def test_crowd_annotations(tmp_path: Path) -> None:
    ann_file = make_synthetic_coco(tmp_path, 6, (64, 64), 2, seed=1, crowd_prob=1.0)
    coco = _load(ann_file)
    for image_id in coco.getImgIds():
        crowds = [a for a in coco.imgToAnns[image_id] if a["iscrowd"]]
        assert len(crowds) == 1
        (crowd,) = crowds
        rle = crowd["segmentation"]
        assert set(rle) == {"counts", "size"} and rle["size"] == [64, 64]
        assert all(isinstance(c, int) for c in rle["counts"]) and sum(rle["counts"]) == 64 * 64
        mask = coco.annToMask(crowd)
        # our uncompressed RLE is the one pycocotools makes of the same mask
        assert mask_utils.frPyObjects(rle, 64, 64) == mask_utils.encode(np.asfortranarray(mask))
        assert (
            crowd["bbox"] == mask_utils.toBbox(mask_utils.encode(np.asfortranarray(mask))).tolist()
        )
        assert crowd["area"] == mask.sum() > 0
    plain = make_synthetic_coco(tmp_path / "plain", 6, (64, 64), 2, seed=1)
    assert not any(a["iscrowd"] for a in json.loads(plain.read_text())["annotations"])


def test_empty_images(tmp_path: Path) -> None:
    ann_file = make_synthetic_coco(tmp_path, 3, (32, 48), seed=2, empty_prob=1.0, crowd_prob=1.0)
    data = json.loads(ann_file.read_text())
    assert len(data["images"]) == 3 and data["annotations"] == []
    dataset = torchvision.datasets.CocoDetection(str(tmp_path / "images"), str(ann_file))
    assert dataset[0][1] == []
    none = make_synthetic_coco(tmp_path / "none", 0)
    assert json.loads(none.read_text())["images"] == []


def test_object_count_and_size(tmp_path: Path) -> None:
    ann_file = make_synthetic_coco(
        tmp_path, 5, (100, 200), seed=4, min_objects=3, max_objects=3, object_size=(0.2, 0.25)
    )
    coco = _load(ann_file)
    for image_id in coco.getImgIds():
        anns = coco.imgToAnns[image_id]
        assert len(anns) == 3
        for ann in anns:  # the outline fits in a disc of diameter size, stretched up to 15%
            assert max(ann["bbox"][2:]) <= 0.25 * 100 * 1.15 + 0.02
            assert max(ann["bbox"][2:]) >= 0.2 * 100 * 0.85 * 0.6


def test_non_contiguous_category_ids(tmp_path: Path) -> None:
    ann_file = make_synthetic_coco(tmp_path, 6, (64, 64), 3, seed=0, category_ids=[7, 3, 12])
    coco = _load(ann_file)
    cats = coco.dataset["categories"]
    assert [(c["id"], c["name"]) for c in cats] == [(7, "circle"), (3, "square"), (12, "triangle")]
    assert coco.getCatIds() == [7, 3, 12]
    assert {a["category_id"] for a in coco.dataset["annotations"]} == {3, 7, 12}


def test_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    kwargs = {"image_size": (48, 40), "num_classes": 4, "crowd_prob": 0.5}
    a = make_synthetic_coco(tmp_path / "a", 5, seed=9, **kwargs)
    b = make_synthetic_coco(tmp_path / "b", 5, seed=9, **kwargs)
    c = make_synthetic_coco(tmp_path / "c", 5, seed=10, **kwargs)
    prefix = make_synthetic_coco(tmp_path / "p", 3, seed=9, **kwargs)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    images = sorted((tmp_path / "a" / "images").iterdir())
    for path in images:
        assert path.read_bytes() == (tmp_path / "b" / "images" / path.name).read_bytes()
        assert path.read_bytes() != (tmp_path / "c" / "images" / path.name).read_bytes()
    # image k does not depend on num_images
    for path in images[:3]:
        assert path.read_bytes() == (tmp_path / "p" / "images" / path.name).read_bytes()
    anns = json.loads(a.read_text())["annotations"]
    assert json.loads(prefix.read_text())["annotations"] == [x for x in anns if x["image_id"] <= 3]


def test_overwrites_into_existing_root(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "root"
    make_synthetic_coco(root, 3, (32, 32), seed=0)
    ann_file = make_synthetic_coco(str(root), 2, (32, 32), seed=1)
    assert ann_file == root / "annotations.json"
    assert json.loads(ann_file.read_text())["info"]["parameters"]["seed"] == 1
    fresh = make_synthetic_coco(tmp_path / "fresh", 2, (32, 32), seed=1)
    assert ann_file.read_bytes() == fresh.read_bytes()
    for name in ("000001.jpg", "000002.jpg"):
        assert (root / "images" / name).read_bytes() == (
            fresh.parent / "images" / name
        ).read_bytes()
    assert (root / "images" / "000003.jpg").exists()  # files it does not write are left alone
    assert not list(root.glob("*.partial"))


def test_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = {"image_size": (16, 16), "min_objects": 0, "max_objects": 0}
    make_synthetic_coco(tmp_path / "a", 3, **small)
    assert "synthetic COCO" not in capsys.readouterr().err
    make_synthetic_coco(tmp_path / "b", 3, progress=True, **small)
    assert "synthetic COCO" in capsys.readouterr().err
    make_synthetic_coco(tmp_path / "c", 200, **small)  # automatic from 200 images
    assert "200/200" in capsys.readouterr().err
    make_synthetic_coco(tmp_path / "d", 200, progress=False, **small)
    assert "synthetic COCO" not in capsys.readouterr().err


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    h=st.integers(16, 70),
    w=st.integers(16, 70),
    seed=st.integers(0, 2**32),
    low=st.floats(0.05, 1.0),
)
def test_consistency_on_random_arguments(
    tmp_path: Path, h: int, w: int, seed: int, low: float
) -> None:
    ann_file = make_synthetic_coco(
        tmp_path / f"{h}_{w}_{seed}", 2, (h, w), 10, seed, object_size=(low, 1.0), crowd_prob=0.5
    )
    coco = _load(ann_file)
    for ann in coco.dataset["annotations"]:
        mask = coco.annToMask(ann).astype(bool)
        assert mask.sum() == ann["area"] > 0
        x, y, bw, bh = ann["bbox"]
        assert x >= 0 and y >= 0 and x + bw <= w + 1e-6 and y + bh <= h + 1e-6
        np.testing.assert_allclose([x, y, x + bw, y + bh], _mask_box(mask), atol=1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"root": 3}, TypeError, "root must be str or PathLike"),
        ({"image_size": (8, 64)}, ValueError, r"image_size\[0\] must be in \[16"),
        ({"image_size": (64, True)}, TypeError, r"image_size\[1\] must be int"),
        ({"num_classes": 0}, ValueError, r"num_classes must be in \[1, 10\]"),
        ({"num_classes": 11}, ValueError, r"num_classes must be in \[1, 10\]"),
        ({"min_objects": -1}, ValueError, "min_objects must be in"),
        ({"min_objects": 4, "max_objects": 3}, ValueError, r"max_objects must be in \[4"),
        ({"object_size": (0.0, 0.5)}, ValueError, r"object_size\[0\] must be in \(0.0, 1.0\]"),
        ({"object_size": (0.5, 0.4)}, ValueError, r"object_size\[1\] must be in \[0.5, 1.0\]"),
        ({"object_size": (0.1, 1.5)}, ValueError, r"object_size\[1\] must be in"),
        ({"object_size": ("a", 0.5)}, TypeError, "object_size must be a number"),
        ({"image_format": "jpeg"}, ValueError, "image_format must be one of 'jpg', 'png'"),
        ({"crowd_prob": 1.5}, ValueError, r"crowd_prob must be in \[0.0, 1.0\]"),
        ({"empty_prob": -0.1}, ValueError, r"empty_prob must be in \[0.0, 1.0\]"),
        ({"empty_prob": None}, TypeError, "empty_prob must be a number"),
        ({"category_ids": [1, 2]}, ValueError, "category_ids must hold num_classes=3 ids"),
        ({"category_ids": [1, 1, 2]}, ValueError, "category_ids must be distinct"),
        ({"category_ids": [0, 1, 2]}, ValueError, r"category_ids\[\] must be in \[1"),
        ({"category_ids": "123"}, TypeError, "category_ids must be a sequence of int"),
        ({"progress": 1}, TypeError, "progress must be bool"),
    ],
)
def test_argument_errors(tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    kwargs = {"root": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        make_synthetic_coco(**kwargs)
    assert not (tmp_path / "annotations.json").exists()


@pytest.mark.parametrize("fill", ["random", "zeros", "ones", "corner"])
def test_uncompressed_rle_matches_pycocotools(fill: str) -> None:
    mask = np.zeros((7, 5), dtype=bool)
    if fill == "random":
        mask = np.random.default_rng(0).random((7, 5)) < 0.5
        mask[0, 0] = True  # a run of ones first: counts start with 0
    elif fill == "ones":
        mask[:] = True
    elif fill == "corner":
        mask[-1, -1] = True
    rle = _uncompressed_rle(mask)
    assert rle["size"] == [7, 5] and sum(rle["counts"]) == 35
    assert mask_utils.frPyObjects(rle, 7, 5) == mask_utils.encode(np.asfortranarray(mask, np.uint8))


@pytest.mark.parametrize("size", [(33, 517), (16, 16)])
def test_objects_stay_recognisable_in_small_images(tmp_path, size):
    ann = make_synthetic_coco(tmp_path, num_images=10, image_size=size, seed=0)
    areas = [a["area"] for a in json.loads(ann.read_text())["annotations"]]
    assert areas and min(areas) >= 20  # shapes of about 5 x 5 pixels or more
