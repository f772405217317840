"""CocoSegmentation: semantic masks against a pycocotools reference painting."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pycocotools.coco import COCO
from torchvision import tv_tensors
from torchvision.transforms import v2

from tests.data.coco_fixtures import H, W
from visionblocks.data.segmentation import CocoSegmentation
from visionblocks.registry import DATASETS


def make(coco_dir, **kwargs) -> CocoSegmentation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's degenerate box
        return CocoSegmentation(*coco_dir, **kwargs)


def reference(coco: COCO, image_id: int, ignore: int = 255) -> np.ndarray:
    """Paint with pycocotools: instances by decreasing area, then crowd and unknown pixels."""
    info = coco.imgs[image_id]
    out = np.zeros((info["height"], info["width"]), np.int64)
    label = {cid: i + 1 for i, cid in enumerate(sorted(coco.cats))}
    anns = [a for a in coco.imgToAnns[image_id] if a["bbox"][2] > 0 and a["bbox"][3] > 0]
    instances = sorted((a for a in anns if not a["iscrowd"]), key=lambda a: -a["area"])
    for ann in instances:
        if ann.get("segmentation"):
            out[coco.annToMask(ann) > 0] = label[ann["category_id"]]
    for ann in anns:
        if ann["iscrowd"]:
            out[coco.annToMask(ann) > 0] = ignore
        elif not ann.get("segmentation"):
            x, y, w, h = ann["bbox"]
            out[int(np.floor(y)) : int(np.ceil(y + h)), int(np.floor(x)) : int(np.ceil(x + w))] = (
                ignore
            )
    return out


def test_semantic_masks_equal_the_pycocotools_painting(coco_dir):
    dataset = make(coco_dir)
    coco = COCO(str(coco_dir[1]))
    seen = set()
    for index, image_id in enumerate(dataset.ids):
        image, mask = dataset[index]
        assert isinstance(mask, tv_tensors.Mask) and mask.dtype == torch.int64
        assert mask.shape == image.shape[-2:]
        np.testing.assert_array_equal(mask.numpy(), reference(coco, image_id))
        seen |= set(mask.unique().tolist())
    assert seen == {0, 1, 2, 3, 255}


def test_labels_classes_and_ignore_index(coco_dir):
    dataset = make(coco_dir, ignore_index=-1)
    assert dataset.classes == ["background", "cat", "dog", "emu"] and dataset.num_classes == 4
    assert dataset.category_id_to_label == {1: 1, 3: 2, 7: 3}
    assert dataset.label_to_category_id == {1: 1, 2: 3, 3: 7}
    _, mask = dataset[dataset.ids.index(5)]  # crowd only
    assert set(mask.unique().tolist()) == {0, -1}
    with pytest.raises(ValueError, match=r"ignore_index=2 collides with a label \(0..3\)"):
        make(coco_dir, ignore_index=2)


def test_cross_entropy_ignores_crowd_pixels(coco_dir):
    _, mask = make(coco_dir)[0]
    logits = torch.randn(1, 4, H, W)
    loss = F.cross_entropy(logits, mask[None], ignore_index=255, reduction="sum")
    keep = mask != 255
    expected = F.cross_entropy(logits.permute(0, 2, 3, 1)[0][keep], mask[keep], reduction="sum")
    torch.testing.assert_close(loss, expected)


def test_smaller_instances_are_painted_over_larger_ones(tmp_path):
    import json

    from PIL import Image

    (tmp_path / "images").mkdir()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "images" / "a.png")
    big = [[0.0, 0.0, 20.0, 0.0, 20.0, 20.0, 0.0, 20.0]]
    small = [[5.0, 5.0, 10.0, 5.0, 10.0, 10.0, 5.0, 10.0]]
    anns = [  # the small one first in the file: painting order must not follow the file
        {"id": 1, "image_id": 1, "category_id": 2, "segmentation": small, "bbox": [5, 5, 5, 5], "area": 25, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 1, "segmentation": big, "bbox": [0, 0, 20, 20], "area": 400, "iscrowd": 0},
    ]  # fmt: skip
    cats = [{"id": 1, "name": "big"}, {"id": 2, "name": "small"}]
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png", "height": 20,
                                           "width": 20}], "annotations": anns, "categories": cats}))  # fmt: skip
    _, mask = CocoSegmentation(tmp_path / "images", ann)[0]
    assert mask[7, 7] == 2 and mask[0, 0] == 1 and (mask == 2).sum() == 25


def test_remove_empty_and_transforms(coco_dir):
    assert make(coco_dir, remove_empty=True).ids == [1, 2, 4, 6]
    flip = make(coco_dir, transforms=v2.RandomHorizontalFlip(p=1.0))
    plain = make(coco_dir)
    _, flipped = flip[0]
    assert torch.equal(flipped, torch.flip(plain[0][1], dims=[-1]))
    resized = make(coco_dir, transforms=v2.Resize((80, 120)))
    _, mask = resized[0]
    assert mask.shape == (80, 120) and set(mask.unique().tolist()) <= {0, 1, 2, 3, 255}


def test_registered_and_errors(coco_dir):
    assert DATASETS.get("coco_segmentation") is CocoSegmentation
    assert "ignore_index=255" in repr(make(coco_dir))
