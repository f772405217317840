"""CocoInstances(with_polygons=True): the file's polygons per instance, in box order, aligned
through the crowd policies, and refused when transforms move the boxes without them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from torchvision import tv_tensors
from torchvision.transforms import v2

from visionblocks.data import CocoInstances, instance_fields


def make(coco_dir, **kwargs) -> CocoInstances:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's degenerate box
        return CocoInstances(*coco_dir, with_polygons=True, **kwargs)


def _expected(ann: dict) -> list[np.ndarray]:
    seg = ann.get("segmentation")
    if not isinstance(seg, list):
        return []  # RLE (or none)
    return [np.asarray(p, dtype=np.float32).reshape(-1, 2) for p in seg]


@pytest.mark.parametrize("crowd", ["keep", "drop", "ignore"])
def test_polygons_are_the_files_in_box_order(coco_dir, crowd):
    dataset = make(coco_dir, crowd=crowd)
    coco = COCO(str(coco_dir[1]))
    for index, image_id in enumerate(dataset.ids):
        _, target = dataset[index]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        anns = [a for a in anns if a["id"] in dataset._entries[index].ann_ids]
        if crowd != "keep":
            anns = [a for a in anns if not a["iscrowd"]]
        polygons = target["polygons"]
        assert isinstance(polygons, list) and len(polygons) == len(target["boxes"]) == len(anns)
        for got, ann in zip(polygons, anns):
            expected = _expected(ann)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert g.dtype == torch.float32 and g.shape == e.shape
                np.testing.assert_array_equal(g.numpy(), e)
    _, first = dataset[0]
    counts = [len(p) for p in first["polygons"]]
    assert counts == ([1, 2, 0, 0] if crowd == "keep" else [1, 2, 0])  # RLE instances: []


def test_polygons_follow_crowd_ignore_through_transforms(coco_dir):
    plain = make(coco_dir, crowd="ignore")
    moved = make(coco_dir, crowd="ignore", transforms=v2.ToDtype(torch.float32, scale=True))
    for index in range(len(plain)):
        a, b = plain[index][1]["polygons"], moved[index][1]["polygons"]
        assert len(a) == len(b)
        assert all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_empty_images_and_no_polygons_by_default(coco_dir):
    dataset = make(coco_dir)
    assert dataset[dataset.ids.index(3)][1]["polygons"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert "polygons" not in CocoInstances(*coco_dir)[0][1]
    with pytest.raises(TypeError, match="with_polygons must be bool"):
        CocoInstances(*coco_dir, with_polygons="yes")


def test_a_transform_that_moves_boxes_but_not_polygons_raises(coco_dir):
    flipped = make(coco_dir, transforms=v2.RandomHorizontalFlip(p=1.0))
    with pytest.raises(ValueError, match=r"boxes of image id 1 moved but target\['polygons'\]"):
        flipped[0]


def test_a_transform_that_drops_boxes_but_not_polygons_raises(coco_dir):
    crop = v2.Compose(
        [v2.CenterCrop((40, 20)), v2.SanitizeBoundingBoxes(labels_getter=instance_fields)]
    )
    dataset = make(coco_dir, transforms=crop)
    with pytest.raises(
        ValueError,
        match=r"entries in 'polygons'.*visionblocks\.transforms \(RandomAffine, warp_sample\)",
    ):
        dataset[0]


def _flip_everything(image, target):
    """A horizontal flip that knows polygons (continuous coordinates: x -> W - x)."""
    width = image.shape[-1]
    image, boxes = v2.functional.horizontal_flip(image), target["boxes"]
    out = dict(target, boxes=v2.functional.horizontal_flip(boxes))
    out["polygons"] = [
        [torch.stack([width - p[:, 0], p[:, 1]], -1) for p in instance]
        for instance in target["polygons"]
    ]
    return image, out


def test_a_transform_that_moves_the_polygons_is_fine(coco_dir):
    plain, flipped = make(coco_dir), make(coco_dir, transforms=_flip_everything)
    _, before = plain[0]
    _, after = flipped[0]
    assert isinstance(after["boxes"], tv_tensors.BoundingBoxes)
    box = after["boxes"][0]
    polygon = after["polygons"][0][0]
    # the box is still the polygon's box after the flip
    assert torch.equal(box[[0, 2]], torch.stack([polygon[:, 0].min(), polygon[:, 0].max()]))
    assert torch.equal(polygon[:, 0], 60 - before["polygons"][0][0][:, 0])
