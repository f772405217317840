"""CocoInstances against pycocotools and torchvision's wrapped CocoDetection; crowd, empty
and degenerate annotations; transforms v2; bad input; pickling and DataLoader workers."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from pycocotools.coco import COCO
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.transforms import v2

from tests.data.coco_fixtures import H, W
from visionblocks.data._coco_checks import REPAIRABLE as INVALID_REPAIRABLE
from visionblocks.data.coco import CocoInstances
from visionblocks.registry import DATASETS


def make(coco_dir, **kwargs) -> CocoInstances:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's degenerate box
        return CocoInstances(*coco_dir, **kwargs)


def by_id(dataset: CocoInstances, image_id: int):
    return dataset[dataset.ids.index(image_id)]


# ------------------------------------------------------------------------------ oracles
def test_every_mask_equals_pycocotools_ann_to_mask(coco_dir):
    dataset = make(coco_dir, with_masks=True, crowd="keep", invalid="keep")
    coco = COCO(str(coco_dir[1]))
    for index, image_id in enumerate(dataset.ids):
        _, target = dataset[index]
        anns = [
            a
            for a in coco.loadAnns(coco.getAnnIds(imgIds=image_id))
            if a["bbox"][2] > 0 and a["bbox"][3] > 0
        ]
        assert len(anns) == len(target["masks"])
        for ann, mask in zip(anns, target["masks"]):
            expected = coco.annToMask(ann) if ann.get("segmentation") else 0 * mask.numpy()
            np.testing.assert_array_equal(mask.numpy(), expected)
        areas = torch.tensor([a["area"] for a in anns], dtype=torch.float32)
        assert torch.equal(target["area"], areas.reshape(-1))
        crowd = torch.tensor([a["iscrowd"] for a in anns], dtype=torch.int64)
        assert torch.equal(target["iscrowd"], crowd.reshape(-1))


def test_matches_torchvision_wrapped_dataset(coco_dir):
    """Peer oracle: torchvision's CocoDetection + wrap_dataset_for_transforms_v2."""
    ours = make(coco_dir, with_masks=True, contiguous_labels=False)
    peer = torchvision.datasets.wrap_dataset_for_transforms_v2(
        torchvision.datasets.CocoDetection(*map(str, coco_dir)),
        target_keys={"boxes", "labels", "masks", "image_id"},
    )
    assert ours.ids == peer.ids
    for index in range(len(ours)):
        if ours.ids[index] == 4:  # annotations without a segmentation crash torchvision's wrapper
            continue
        image, target = ours[index]
        peer_image, peer_target = peer[index]
        assert torch.equal(image, tv_tensors.Image(v2.functional.pil_to_tensor(peer_image)))
        if "boxes" not in peer_target:  # torchvision gives only image_id for empty images
            assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
            continue
        keep = (peer_target["boxes"][:, 2:] > peer_target["boxes"][:, :2]).all(1)
        assert torch.equal(target["labels"], peer_target["labels"][keep])
        assert torch.equal(target["masks"], peer_target["masks"][keep])
        clipped = peer_target["boxes"][keep].clamp(min=0)
        clipped[:, 0::2] = clipped[:, 0::2].clamp(max=image.shape[-1])
        clipped[:, 1::2] = clipped[:, 1::2].clamp(max=image.shape[-2])
        torch.testing.assert_close(target["boxes"].as_subclass(torch.Tensor), clipped.float())


@pytest.mark.parametrize(("image_id", "mode"), [(2, "L"), (3, "RGBA"), (4, "CMYK")])
def test_grey_rgba_and_cmyk_files_become_rgb(coco_dir, image_id, mode):
    dataset = make(coco_dir)
    image, _ = by_id(dataset, image_id)
    name = {2: "grey.png", 3: "rgba.png", 4: "cmyk.jpg"}[image_id]
    with Image.open(coco_dir[0] / name) as pil:
        assert pil.mode == mode
        expected = torch.from_numpy(np.asarray(pil.convert("RGB")).copy()).permute(2, 0, 1)
    assert isinstance(image, tv_tensors.Image) and image.dtype == torch.uint8
    assert torch.equal(image.as_subclass(torch.Tensor), expected)


def test_sixteen_bit_png_is_scaled_to_eight_bits(tmp_path):
    (tmp_path / "images").mkdir()
    values = np.arange(40 * 60, dtype=np.uint16).reshape(40, 60) * 27
    Image.fromarray(values).save(tmp_path / "images" / "deep.png")
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps({"images": [{"id": 1, "file_name": "deep.png", "height": 40,
                                           "width": 60}], "annotations": [], "categories": []}))  # fmt: skip
    image, _ = CocoInstances(tmp_path / "images", ann)[0]
    assert image.dtype == torch.uint8
    assert torch.equal(image[0], torch.from_numpy((values >> 8).astype(np.uint8)))


# ------------------------------------------------------------------ labels and structure
def test_labels_are_contiguous_in_category_id_order(coco_dir):
    dataset = make(coco_dir)
    assert dataset.classes == ["cat", "dog", "emu"]  # ids 1, 3, 7
    assert dataset.category_id_to_label == {1: 0, 3: 1, 7: 2}
    assert dataset.label_to_category_id == {0: 1, 1: 3, 2: 7}
    _, target = by_id(dataset, 1)
    assert target["labels"].tolist() == [1, 2, 0, 1] and target["labels"].dtype == torch.int64
    raw = make(coco_dir, contiguous_labels=False)
    assert by_id(raw, 1)[1]["labels"].tolist() == [3, 7, 1, 3]
    assert raw.category_id_to_label == {1: 1, 3: 3, 7: 7}


def test_target_types_and_boxes(coco_dir):
    _, target = by_id(make(coco_dir, with_masks=True), 1)
    boxes = target["boxes"]
    assert isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.dtype == torch.float32
    assert boxes.format == tv_tensors.BoundingBoxFormat.XYXY and boxes.canvas_size == (H, W)
    assert boxes.tolist()[0] == [2.0, 2.0, 20.0, 14.0]  # [x, y, w, h] -> xyxy
    assert isinstance(target["masks"], tv_tensors.Mask) and target["masks"].dtype == torch.uint8
    assert target["area"].dtype == torch.float32 and target["iscrowd"].tolist() == [0, 0, 0, 1]
    assert target["image_id"] == 1 and isinstance(target["image_id"], int)


def test_boxes_are_clipped_and_missing_segmentations_give_empty_masks(coco_dir):
    _, target = by_id(make(coco_dir, with_masks=True, invalid="keep"), 4)
    assert target["boxes"].tolist() == [[50.0, 30.0, 60.0, 40.0]]  # [50, 30, 20, 20] clipped
    assert target["masks"].shape == (1, H, W) and target["masks"].sum() == 0


def test_annotations_without_segmentation_are_dropped_when_masks_are_asked_for(coco_dir):
    with_masks = make(coco_dir, with_masks=True)
    assert with_masks.dropped == {"degenerate_box": [40], "empty_segmentation": [41]}
    assert by_id(with_masks, 4)[1]["masks"].shape == (0, H, W)
    boxes_only = make(coco_dir)  # without masks, a box needs no segmentation
    assert boxes_only.dropped == {"degenerate_box": [40]}
    assert by_id(boxes_only, 4)[1]["boxes"].tolist() == [[50.0, 30.0, 60.0, 40.0]]
    kept = make(coco_dir, with_masks=True, invalid="keep")
    assert kept.dropped == {"degenerate_box": [40]}  # a bad box is dropped even under keep
    assert kept.kept_invalid == {"empty_segmentation": [41]}


def test_empty_images_give_typed_empty_targets(coco_dir):
    _, target = by_id(make(coco_dir, with_masks=True, crowd="ignore"), 3)
    assert target["boxes"].shape == (0, 4) and target["boxes"].dtype == torch.float32
    assert target["labels"].shape == (0,) and target["labels"].dtype == torch.int64
    assert target["masks"].shape == (0, H, W) and target["masks"].dtype == torch.uint8
    assert target["iscrowd"].shape == (0,) and target["area"].shape == (0,)
    assert target["ignore_boxes"].shape == (0, 4)


def test_degenerate_boxes_are_dropped_and_reported_once(coco_dir):
    with pytest.warns(UserWarning, match=r"dropped 1 of 9 annotation\(s\).*degenerate_box: id 40"):
        dataset = CocoInstances(*coco_dir)
    assert dataset.num_degenerate == 1 and dataset.dropped == {"degenerate_box": [40]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for index in range(len(dataset)):  # items never warn again
            dataset[index]
    assert by_id(dataset, 4)[1]["labels"].tolist() == [2]


# ------------------------------------------------------------------------- crowd policies
def test_crowd_keep_drop_ignore(coco_dir):
    keep = by_id(make(coco_dir, crowd="keep", with_masks=True), 1)[1]
    drop = by_id(make(coco_dir, crowd="drop", with_masks=True), 1)[1]
    ignore = by_id(make(coco_dir, crowd="ignore", with_masks=True), 1)[1]
    assert keep["iscrowd"].tolist() == [0, 0, 0, 1] and len(keep["masks"]) == 4
    assert drop["iscrowd"].tolist() == [0, 0, 0] and len(drop["masks"]) == 3
    assert "ignore_boxes" not in drop and "ignore_boxes" not in keep
    assert torch.equal(ignore["boxes"], drop["boxes"]) and torch.equal(
        ignore["masks"], drop["masks"]
    )
    assert ignore["ignore_boxes"].tolist() == [[2.0, 25.0, 30.0, 38.0]]
    assert isinstance(ignore["ignore_boxes"], tv_tensors.BoundingBoxes)


@pytest.mark.parametrize(
    ("kwargs", "ids"),
    [
        ({}, [1, 2, 3, 4, 5, 6]),
        ({"remove_empty": True}, [1, 2, 4, 5, 6]),
        ({"remove_empty": True, "crowd": "drop"}, [1, 2, 4, 6]),
        ({"remove_empty": True, "crowd": "ignore"}, [1, 2, 4, 6]),
        ({"remove_crowd_only": True}, [1, 2, 3, 4, 6]),
        ({"remove_crowd_only": True, "remove_empty": True}, [1, 2, 4, 6]),
    ],
)
def test_image_filters(coco_dir, kwargs, ids):
    dataset = make(coco_dir, **kwargs)
    assert dataset.ids == ids and len(dataset) == len(ids)
    assert [dataset.get_height_and_width(i) for i in range(len(dataset))][-1] == (30, 20)


# --------------------------------------------------------------------------- transforms
def test_transforms_v2_pipeline_moves_boxes_and_masks_together(coco_dir):
    pipeline = v2.Compose(
        [
            v2.RandomHorizontalFlip(p=1.0),
            v2.Resize((80, 120)),
            v2.ToDtype(torch.float32, scale=True),
            v2.SanitizeBoundingBoxes(),
        ]
    )
    dataset = make(coco_dir, with_masks=True, transforms=pipeline)
    image, target = by_id(dataset, 2)
    assert image.shape == (3, 80, 120) and image.dtype == torch.float32
    mask = target["masks"][0].bool()
    ys, xs = torch.nonzero(mask, as_tuple=True)
    box = target["boxes"][0]
    assert (
        abs(xs.min().item() - box[0].item()) <= 2 and abs(xs.max().item() + 1 - box[2].item()) <= 2
    )
    assert (
        abs(ys.min().item() - box[1].item()) <= 2 and abs(ys.max().item() + 1 - box[3].item()) <= 2
    )
    plain = make(coco_dir, with_masks=True)
    flipped = torch.flip(by_id(plain, 2)[1]["masks"][0], dims=[-1])
    assert mask[::2, ::2].equal(flipped.bool())  # x2 nearest resize of the flipped mask


def test_transforms_work_on_empty_images(coco_dir):
    dataset = make(coco_dir, with_masks=True, transforms=v2.RandomHorizontalFlip(p=1.0))
    _, target = by_id(dataset, 3)
    assert target["boxes"].shape == (0, 4) and target["masks"].shape == (0, H, W)


# -------------------------------------------------------------------------- bad input
def _write(tmp_path: Path, data: dict) -> Path:
    (tmp_path / "images").mkdir(exist_ok=True)
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(data))
    return path


def _minimal(**changes) -> dict:
    data = {
        "images": [{"id": 1, "file_name": "a.png", "height": 4, "width": 4}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2]}],
        "categories": [{"id": 1, "name": "x"}],
    }
    data.update(changes)
    return data


@pytest.mark.parametrize("name", ["../outside.png", "/etc/passwd", "a/../../b.png", "C:\\x.png"])
def test_file_names_leaving_the_root_are_refused(tmp_path, name):
    ann = _write(tmp_path, _minimal(images=[{"id": 1, "file_name": name, "height": 4, "width": 4}]))
    with pytest.raises(ValueError, match=r"image 1 has file_name .*leads out of the image root"):
        CocoInstances(tmp_path / "images", ann)


def test_missing_image_names_file_and_id(tmp_path):
    ann = _write(tmp_path, _minimal())
    dataset = CocoInstances(tmp_path / "images", ann)
    with pytest.raises(FileNotFoundError, match=r"image id 1 not found: '.*images/a\.png'"):
        dataset[0]


def test_image_of_another_size_than_the_file_says(tmp_path):
    ann = _write(tmp_path, _minimal())
    Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(tmp_path / "images" / "a.png")
    with pytest.raises(ValueError, match=r"is 5 x 4, but the annotation file says 4 x 4"):
        CocoInstances(tmp_path / "images", ann)[0]


def test_broken_annotation_files_are_named(tmp_path):
    (tmp_path / "images").mkdir()
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    with pytest.raises(ValueError, match=r"'.*broken\.json' is not valid JSON"):
        CocoInstances(tmp_path / "images", broken)
    broken.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"broken\.json' holds a list"):
        CocoInstances(tmp_path / "images", broken)
    broken.write_text('{"images": []}')
    with pytest.raises(ValueError, match="has no 'annotations' / 'categories' list"):
        CocoInstances(tmp_path / "images", broken)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"annotations": [{"id": 1, "image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]}]},
            r"point at image ids 9 that are not in 'images'",
        ),
        (
            {"categories": [{"id": 1, "name": "x"}, {"id": 1, "name": "y"}]},
            "duplicate categories ids 1",
        ),
        (
            {"images": [{"id": 1, "file_name": "a.png", "height": 0, "width": 4}]},
            "height/width 0/4",
        ),
    ],
)
def test_inconsistent_annotation_files_raise_at_construction(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        CocoInstances(tmp_path / "images", _write(tmp_path, _minimal(**changes)))


def test_index_errors(coco_dir):
    dataset = make(coco_dir)
    with pytest.raises(IndexError, match="index 6 is out of range for a dataset of 6 images"):
        dataset[6]
    with pytest.raises(TypeError, match="dataset index must be an int"):
        dataset["0"]
    assert dataset[-1][1]["image_id"] == 6


# ---------------------------------------------------------------- pickling and workers
def test_pickles_without_the_coco_object_and_reloads_it(coco_dir):
    dataset = make(coco_dir, with_masks=True)
    blob = pickle.dumps(dataset)
    assert b"pycocotools" not in blob  # the COCO object stays behind
    clone = pickle.loads(blob)
    assert clone._coco is None and clone.coco.getImgIds() == dataset.coco.getImgIds()
    for index in range(len(dataset)):
        assert torch.equal(clone[index][1]["masks"], dataset[index][1]["masks"])


@pytest.mark.slow  # worker processes
def test_dataloader_with_workers_gives_the_same_items(coco_dir):
    dataset = make(coco_dir, with_masks=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    items = list(loader)
    assert [t["image_id"] for _, t in items] == dataset.ids
    for (image, target), index in zip(items, range(len(dataset))):
        expected_image, expected = dataset[index]
        assert torch.equal(image, expected_image) and torch.equal(
            target["masks"], expected["masks"]
        )
        assert isinstance(target["boxes"], tv_tensors.BoundingBoxes)


def test_registered_as_a_dataset(coco_dir):
    for name in ("coco_detection", "coco", "coco_instances"):
        assert DATASETS.get(name) is CocoInstances
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = DATASETS.build({"type": "coco", "root": coco_dir[0], "ann_file": coco_dir[1]})
    assert isinstance(built, CocoInstances) and len(built) == 6
    assert "images=6, classes=3" in repr(built)


# -------------------------------------------------------- transforms that drop boxes
@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> tuple[Path, Path]:
    from visionblocks.data.synthetic import make_synthetic_coco

    root = tmp_path_factory.mktemp("crowded")
    ann = make_synthetic_coco(root, num_images=12, image_size=(96, 128), seed=4, crowd_prob=1.0)
    return root / "images", ann


def _crop_pipeline(getter) -> v2.Compose:
    return v2.Compose(
        [v2.RandomIoUCrop(), v2.Resize((64, 64)), v2.SanitizeBoundingBoxes(labels_getter=getter)]
    )


@pytest.mark.parametrize("crowd", ["keep", "drop", "ignore"])
def test_crops_and_sanitize_keep_every_instance_field_aligned(crowded, crowd):
    from visionblocks.data import instance_fields

    torch.manual_seed(0)
    dataset = CocoInstances(
        *crowded, with_masks=True, crowd=crowd, transforms=_crop_pipeline(instance_fields)
    )
    removed = 0
    for index in range(len(dataset)):
        _, target = dataset[index]
        n = len(target["boxes"])
        assert len(target["labels"]) == len(target["iscrowd"]) == len(target["area"]) == n
        assert target["masks"].shape == (n, 64, 64)
        if crowd == "ignore":
            assert target["iscrowd"].sum() == 0
            assert isinstance(target["ignore_boxes"], tv_tensors.BoundingBoxes)
            assert target["ignore_boxes"].canvas_size == (64, 64)
        removed += len(dataset._entries[index].iscrowd) - n
    assert removed > 0  # the crops did remove boxes, so alignment was really exercised


def test_ignore_boxes_follow_the_geometric_transforms(crowded):
    plain = CocoInstances(*crowded, crowd="ignore")
    flipped = CocoInstances(*crowded, crowd="ignore", transforms=v2.RandomHorizontalFlip(p=1.0))
    for index in range(len(plain)):
        expected = plain[index][1]["ignore_boxes"]
        got = flipped[index][1]["ignore_boxes"]
        assert len(expected) == 1
        assert torch.allclose(got[:, [2, 0]], 128 - expected[:, [0, 2]])


def test_default_sanitize_getter_gives_a_clear_error(crowded):
    dataset = CocoInstances(*crowded, transforms=_crop_pipeline("default"))
    torch.manual_seed(1)
    with pytest.raises(ValueError, match=r"labels_getter=visionblocks\.data\.instance_fields"):
        for index in range(len(dataset)):
            dataset[index]


# ------------------------------------------------------------ malformed annotations
INVALID_CASES = [
    (
        {"segmentation": [[1, 1, float("nan"), 3, 3, 1]]},
        "nonfinite",
        r"annotation 1: segmentation polygon 0 has NaN or inf",
    ),
    (
        {"segmentation": [[1, 1, 1e9, 3, 3, 1]]},
        "polygon_outside_image",
        r"far outside the 4 x 4 image",
    ),
    ({"segmentation": [[[1, 1], [3, 3], [3, 1]]]}, "bad_polygon", "must be a flat list"),
    ({"segmentation": [[1, 1, 3]]}, "odd_polygon", "odd number of coordinates"),
    ({"segmentation": [[1, 1, 3, 3]]}, "short_polygon", "at least 3 points"),
    (
        {"segmentation": {"size": [5, 4], "counts": [0, 16]}},
        "rle_size",
        r"RLE segmentation has size \[5, 4\], but the image is 4 x 4",
    ),
    (
        {"segmentation": {"size": [4, 4], "counts": [3, 20]}},
        "bad_rle",
        "summing to height \\* width = 16",
    ),
    ({"segmentation": {"size": [4, 4], "counts": [3, -1, 14]}}, "bad_rle", "non-negative ints"),
    (
        {"segmentation": {"size": [4, 4], "counts": "zzzz"}},
        "bad_rle",
        "compressed RLE counts do not decode",
    ),
    ({"segmentation": "a polygon"}, "bad_segmentation", "segmentation of type str"),
    ({"bbox": [0, 0, float("nan"), 2]}, "nonfinite", r"has bbox \[0, 0, nan, 2\]"),
    ({"bbox": [0, 0, float("inf"), 2]}, "nonfinite", "finite"),
    ({"bbox": [0, 0, 2]}, "bad_bbox", r"has bbox \[0, 0, 2\]"),
    ({"bbox": None}, "bad_bbox", "has bbox None"),
    ({"bbox": [0, 0, 2, 0]}, "degenerate_box", "zero or negative width or height"),
    ({"bbox": [0, 0, -2, 2]}, "degenerate_box", "zero or negative width or height"),
    ({"bbox": [5, 0, 2, 2]}, "box_outside_image", "entirely outside the 4 x 4 image"),
    ({"bbox": [-3, 0, 2, 2]}, "box_outside_image", "entirely outside"),
    ({"category_id": 5}, "unknown_category", "category_id 5, which is not in 'categories'"),
    ({"category_id": "1"}, "unknown_category", "category_id '1'"),
    ({"iscrowd": "0"}, "bad_iscrowd", "has iscrowd '0', expected 0 or 1"),
    ({"area": float("nan")}, "bad_area", "has area nan"),
    ({"area": -4}, "bad_area", "has area -4"),
]


def test_every_invalid_reason_has_a_case():
    from tests.data.test_keypoints import KEYPOINT_INVALID_CASES
    from visionblocks.data import INVALID_REASONS

    # small_box needs min_box_size and empty_segmentation with_masks: tested on their own
    # (test_coco_field.py, test_annotations_without_segmentation_are_dropped_...); the key
    # point reasons need a keypoint category (test_keypoints.py).
    covered = {reason for _, reason, _ in INVALID_CASES} | {"small_box", "empty_segmentation"}
    covered |= {reason for _, reason, _ in KEYPOINT_INVALID_CASES}
    assert covered == set(INVALID_REASONS)


@pytest.mark.parametrize(("annotation", "reason", "match"), INVALID_CASES)
def test_invalid_annotations_follow_the_policy(tmp_path, annotation, reason, match):
    ann = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2], **annotation}
    path = _write(tmp_path, _minimal(annotations=[ann]))
    with pytest.raises(ValueError, match=match):
        CocoInstances(tmp_path / "images", path, invalid="raise")
    with pytest.warns(UserWarning, match=rf"dropped 1 of 1 annotation\(s\).*{reason}: id 1"):
        dropped = CocoInstances(tmp_path / "images", path)
    assert dropped.dropped == {reason: [1]} and dropped.coco.getAnnIds() == []
    assert dropped._entries[0].boxes.shape == (0, 4)
    with pytest.warns(UserWarning):
        kept = CocoInstances(tmp_path / "images", path, invalid="keep")
    if reason in INVALID_REPAIRABLE:  # the box is sound: kept, without the bad parts
        assert kept.kept_invalid == {reason: [1]} and kept.dropped == {}
        ann = kept.coco.loadAnns(1)[0]
        assert "segmentation" not in ann and ann["area"] == 4.0
        assert kept._entries[0].segmentations == [None]
    else:
        assert kept.dropped == {reason: [1]} and kept.kept_invalid == {}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"annotations": [{"id": 1, "image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]}]},
            r"1 annotation\(s\) point at image ids 9 that are not in 'images'",
        ),
        (
            {"images": [{"id": 1, "file_name": "a.png", "height": 4}]},
            r"images\[0\] lacks \['width'\]",
        ),
        ({"annotations": [{"image_id": 1, "category_id": 1}]}, r"annotations\[0\] lacks \['id'\]"),
        (
            {"images": [{"id": 1, "file_name": "a.png", "height": 4, "width": 4}] * 2},
            "duplicate images ids 1",
        ),
    ],
)
def test_malformed_files_raise_whatever_the_policy(tmp_path, changes, match):
    path = _write(tmp_path, _minimal(**changes))
    for invalid in ("drop", "keep", "raise"):
        with pytest.raises(ValueError, match=match):
            CocoInstances(tmp_path / "images", path, invalid=invalid)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"images": [{"id": "a", "file_name": "a.png", "height": 4, "width": 4}]},
            r"images\[0\] has id 'a'",
        ),
        ({"categories": [{"id": True, "name": "x"}]}, r"categories\[0\] has id True"),
        (
            {"images": [{"id": 1, "file_name": "", "height": 4, "width": 4}]},
            "expected a non-empty string",
        ),
    ],
)
def test_id_types_and_file_names(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        CocoInstances(tmp_path / "images", _write(tmp_path, _minimal(annotations=[], **changes)))


def test_two_point_polygons_are_dropped_or_refused(tmp_path):
    """pycocotools itself crashes on them (annToMask raises a TypeError)."""
    ann = {
        "id": 1,
        "image_id": 1,
        "category_id": 1,
        "bbox": [1, 1, 2, 2],
        "segmentation": [[1, 1, 2, 2]],
    }
    path = _write(tmp_path, _minimal(annotations=[ann]))
    with pytest.raises(ValueError, match="at least 3 points"):
        CocoInstances(tmp_path / "images", path, invalid="raise")
    with pytest.warns(UserWarning, match="short_polygon"):
        assert CocoInstances(tmp_path / "images", path).dropped == {"short_polygon": [1]}


def test_transforms_must_return_image_and_target(coco_dir):
    from visionblocks.data import CocoSegmentation

    only_image = make(coco_dir, transforms=lambda image, target: image)
    with pytest.raises(
        TypeError, match=r"transforms must return \(image, target dict\).*got a Image"
    ):
        only_image[0]
    triple = make(coco_dir, transforms=lambda image, target: (image, target, None))
    with pytest.raises(TypeError, match="got a tuple of 3"):
        triple[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        segmentation = CocoSegmentation(*coco_dir, transforms=lambda image, mask: image)
    with pytest.raises(TypeError, match=r"transforms must return \(image, mask\)"):
        segmentation[0]
