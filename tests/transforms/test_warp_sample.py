"""`warp_sample`: a whole sample (image, boxes, masks, key points, labels) under one matrix."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as tvf

from tests.helpers import assert_close
from tests.ops.test_warp_keypoints import HFLIP, PAIRS, PEOPLE, VISIBLE, shift
from visionblocks.ops.warp import affine_matrix, warp_affine
from visionblocks.ops.warp_targets import warp_points
from visionblocks.transforms import warp_sample

H, W = 40, 60
CENTER = ((W - 1) / 2, (H - 1) / 2)
ROT_SHEAR = affine_matrix(angle=-65.0, scale=0.8, shear=(15.0, 5.0), center=CENTER)


def make_sample(fmt: str = "XYXY"):
    image = tv_tensors.Image(torch.rand(3, H, W, generator=torch.Generator().manual_seed(3)))
    xyxy = torch.tensor([[5.0, 6.0, 20.0, 30.0], [30.0, 10.0, 55.0, 35.0], [50.0, 2.0, 59.0, 9.0]])
    boxes = tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(H, W))
    boxes = tvf.convert_bounding_box_format(boxes, new_format=fmt)
    masks = torch.zeros(3, H, W, dtype=torch.uint8)
    for k, (x1, y1, x2, y2) in enumerate(xyxy.long().tolist()):
        masks[k, y1:y2, x1:x2] = 1
    target = {
        "boxes": boxes,
        "labels": torch.tensor([1, 2, 3]),
        "masks": tv_tensors.Mask(masks),
        "keypoints": tv_tensors.KeyPoints(xyxy.view(3, 2, 2) - 0.5, canvas_size=(H, W)),
        "orig_size": torch.tensor([H, W, 0]),  # not per-instance, though it has 3 entries
        "image_id": 7,
    }
    return image, target


@pytest.mark.parametrize("fmt", ["XYXY", "XYWH", "CXCYWH"])
def test_warp_sample_matches_torchvision_affine(fmt):
    image, target = make_sample(fmt)
    kwargs = dict(angle=20.0, translate=[4, -3], scale=1.2, shear=[0.0, 0.0])
    ref_img = tvf.affine(image, interpolation=tvf.InterpolationMode.BILINEAR, **kwargs)
    ref_boxes = tvf.affine(target["boxes"], **kwargs)
    ref_masks = tvf.affine(target["masks"], **kwargs)
    m = affine_matrix(angle=-20.0, translate=(4.0, -3.0), scale=1.2, center=CENTER)
    out_img, out = warp_sample(image, target, m, min_size=None)
    assert isinstance(out_img, tv_tensors.Image)
    assert_close(out_img.as_subclass(torch.Tensor), ref_img.as_subclass(torch.Tensor), scale=10)
    assert isinstance(out["boxes"], tv_tensors.BoundingBoxes)
    assert out["boxes"].format == target["boxes"].format and out["boxes"].canvas_size == (H, W)
    # Boxes only: the corner method, as torchvision's (with masks the boxes are the warped
    # masks' boxes, see tests/ops/test_tight_boxes.py).
    _, boxes_only = warp_sample(image, {"boxes": target["boxes"]}, m, min_size=None)
    assert_close(
        boxes_only["boxes"].as_subclass(torch.Tensor), ref_boxes.as_subclass(torch.Tensor), scale=10
    )
    assert isinstance(out["masks"], tv_tensors.Mask) and out["masks"].dtype == torch.uint8
    # tv's NEAREST mask warp uses the same sample positions; allow near-tie pixels
    assert (out["masks"] != ref_masks).float().mean() < 1e-3
    assert out["labels"] is target["labels"] and out["image_id"] == 7


def test_warp_sample_drops_boxes_with_their_instances():
    image, target = make_sample("XYWH")
    m = affine_matrix(translate=(-32.0, 0.0))  # box 0 (x < 20) leaves, box 2 stays, box 1 is cut
    out_img, out = warp_sample(image, target, m, size=(36, 30))
    assert out_img.shape == (3, 36, 30)
    keep = [1, 2]
    assert out["boxes"].canvas_size == (36, 30) and out["boxes"].shape == (2, 4)
    assert out["boxes"].format == tv_tensors.BoundingBoxFormat.XYWH
    assert out["labels"].tolist() == [2, 3]
    assert out["masks"].shape == (2, 36, 30)
    assert isinstance(out["masks"], tv_tensors.Mask) and isinstance(
        out["keypoints"], tv_tensors.KeyPoints
    )
    assert out["keypoints"].shape == (2, 2, 2) and out["keypoints"].canvas_size == (36, 30)
    assert_close(
        out["keypoints"].as_subclass(torch.Tensor),
        target["keypoints"].as_subclass(torch.Tensor)[keep] - torch.tensor([32.0, 0.0]),
    )
    assert torch.equal(out["orig_size"], target["orig_size"])  # not in instance_keys
    xyxy = tvf.convert_bounding_box_format(out["boxes"], new_format="XYXY").as_subclass(
        torch.Tensor
    )
    assert_close(xyxy, torch.tensor([[0.0, 10.0, 23.0, 35.0], [18.0, 2.0, 27.0, 9.0]]))
    # min_size: box 1 is 23 x 25 px after the cut, box 2 is 9 x 7 px
    _, strict = warp_sample(image, target, m, size=(36, 30), min_size=8.0)
    assert strict["labels"].tolist() == [2]
    _, everything = warp_sample(image, target, m, size=(36, 30), min_size=None)
    assert everything["labels"].tolist() == [1, 2, 3] and everything["boxes"].shape == (3, 4)


def test_warp_sample_rotated_boxes_masks_fill_and_plain_inputs():
    corners = torch.tensor([[10.0, 10.0, 20.0, 10.0, 20.0, 15.0, 10.0, 15.0]])
    boxes = tv_tensors.BoundingBoxes(corners, format="XYXYXYXY", canvas_size=(H, W))
    semantic = tv_tensors.Mask(torch.ones(H, W, dtype=torch.uint8))
    m = ROT_SHEAR
    image = torch.rand(3, H, W)  # a plain tensor stays plain
    out_img, out = warp_sample(image, {"boxes": boxes, "seg": semantic}, m, mask_fill=255, fill=0.5)
    assert type(out_img) is torch.Tensor
    expected = warp_points(corners.view(4, 2) - 0.5, m) + 0.5
    assert_close(out["boxes"].as_subclass(torch.Tensor), expected.view(1, 8))
    assert out["seg"].shape == (H, W) and set(out["seg"].unique().tolist()) == {1, 255}
    assert_close(out_img, warp_affine(image, m, padding_mode="fill", fill=0.5))
    assert warp_sample(image, None, m)[1] is None


def test_warp_sample_errors():
    image, target = make_sample()
    m = torch.eye(2, 3)
    with pytest.raises(ValueError, match="several BoundingBoxes"):
        warp_sample(image, {**target, "other": target["boxes"]}, m)
    with pytest.raises(ValueError, match="has 2 rows but there are 3 boxes"):
        warp_sample(
            image, {**target, "labels": torch.tensor([1, 2])}, affine_matrix(translate=(-40.0, 0.0))
        )
    with pytest.raises(ValueError, match="has 2 rows but there are 3 boxes"):
        warp_sample(image, {**target, "labels": torch.tensor([1, 2])}, m)  # no box dropped


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"mask_fill": 256},
            ValueError,
            r"mask_fill=256 does not fit the masks' dtype torch.uint8",
        ),
        ({"instance_keys": ("labels", 3)}, TypeError, r"instance_keys\[1\] must be str"),
    ],
)
def test_warp_sample_options_are_checked(kwargs, error, match):
    image, target = make_sample()  # uint8 masks
    with pytest.raises(error, match=match):
        warp_sample(image, target, affine_matrix(), **kwargs)


def _sample(mask_size=(16, 20), canvas=(16, 20)):
    image = tv_tensors.Image(torch.zeros(3, 16, 20))
    target = {
        "boxes": tv_tensors.BoundingBoxes([[1, 2, 8, 9]], format="XYXY", canvas_size=canvas),
        "masks": tv_tensors.Mask(torch.zeros(1, *mask_size, dtype=torch.uint8)),
        "labels": torch.tensor([1]),
    }
    return image, target


@pytest.mark.parametrize(
    ("mask_size", "canvas", "message"),
    [
        ((16, 21), (16, 20), r"target\['masks'\] is a mask of size \(16, 21\) but the image is \(16, 20\)"),
        ((16, 20), (20, 16), r"target\['boxes'\] has canvas_size \(20, 16\) but the image is \(16, 20\)"),
    ],
)  # fmt: skip
def test_warp_sample_refuses_targets_of_another_size(mask_size, canvas, message):
    image, target = _sample(mask_size, canvas)
    with pytest.raises(ValueError, match=message):
        warp_sample(image, target, torch.eye(2, 3))
    image, target = _sample()  # the same sample with matching sizes warps
    _, out = warp_sample(image, target, torch.eye(2, 3))
    assert out["masks"].shape == (1, 16, 20) and out["boxes"].canvas_size == (16, 20)


# ------------------------------------------------------------------------ key points

KH, KW = 24, 32  # the canvas of tests/ops/test_warp_keypoints.py's people


def test_warp_sample_flips_key_points_and_refuses_without_pairs():
    image = tv_tensors.Image(torch.rand(3, KH, KW))
    target = {
        "boxes": tv_tensors.BoundingBoxes([[5, 3, 14, 9], [20, 12, 30, 18]], format="XYXY",
                                          canvas_size=(KH, KW)),
        "keypoints": tv_tensors.KeyPoints(PEOPLE.float(), canvas_size=(KH, KW)),
        "keypoints_visibility": VISIBLE,
        "labels": torch.tensor([1, 1]),
    }  # fmt: skip
    out_image, out = warp_sample(image, target, HFLIP, flip_pairs=PAIRS)
    assert torch.equal(out_image, tvf.horizontal_flip(image))
    expected = warp_points(PEOPLE, HFLIP)[:, [0, 2, 1]].float()
    assert isinstance(out["keypoints"], tv_tensors.KeyPoints)
    assert torch.equal(out["keypoints"].as_subclass(torch.Tensor), expected)
    assert out["keypoints_visibility"].tolist() == [[2, 2, 1], [2, 2, 0]]
    assert list(out) == list(target)  # the key order is kept
    with pytest.raises(ValueError, match="flip_pairs is None"):
        warp_sample(image, target, HFLIP)
    _, same_names = warp_sample(image, target, HFLIP, flip_pairs=[])
    assert torch.equal(
        same_names["keypoints"].as_subclass(torch.Tensor), warp_points(PEOPLE, HFLIP).float()
    )
    with pytest.raises(ValueError, match=r"flip_pairs: pair \(1, 5\) has an index outside"):
        warp_sample(image, target, HFLIP, flip_pairs=[(1, 5)])
    with pytest.raises(TypeError, match="flip_pairs must hold"):
        warp_sample(image, target, HFLIP, flip_pairs=[(1, "2")])


def test_instance_filtering_keeps_visibility_aligned():
    image = torch.rand(3, KH, KW)
    boxes = tv_tensors.BoundingBoxes(
        [[1, 1, 6, 6], [10, 2, 20, 12], [22, 10, 31, 20]], format="XYXY", canvas_size=(KH, KW)
    )
    points = torch.tensor(
        [[[2, 2], [4, 3]], [[12, 4], [18, 11]], [[24, 12], [30, 19]]]
    )  # integer points: rounded after the warp
    target = {
        "keypoints_visibility": torch.tensor([[2, 2], [1, 0], [2, 1]]),  # before its points
        "boxes": boxes,
        "keypoints": tv_tensors.KeyPoints(points, canvas_size=(KH, KW)),
        "labels": torch.tensor([7, 8, 9]),
    }
    m = shift(-8.25, 0.0)  # box 0 leaves; box 2's last point x 30 - 8 = 22 stays
    _, out = warp_sample(image, target, m, size=(KH, 20), flip_pairs=[(0, 1)])
    assert out["labels"].tolist() == [8, 9]
    assert out["keypoints"].dtype == torch.int64 and out["keypoints"].canvas_size == (KH, 20)
    assert out["keypoints"].tolist() == [[[4, 4], [10, 11]], [[16, 12], [22, 19]]]
    # the visibility rows are those of the kept instances; x 22 >= 19.5 leaves the canvas
    assert out["keypoints_visibility"].tolist() == [[1, 0], [2, 0]]
    assert list(out) == list(target)
    # with the visibility listed in instance_keys as well, it is filtered once
    keys = ("labels", "keypoints_visibility")
    _, twice = warp_sample(image, target, m, size=(KH, 20), flip_pairs=[], instance_keys=keys)
    assert twice["keypoints_visibility"].tolist() == [[1, 0], [2, 0]]
    # min_size=None keeps every instance and its flags
    _, everything = warp_sample(image, target, m, size=(KH, 20), min_size=None, flip_pairs=[])
    assert everything["keypoints_visibility"].tolist() == [[0, 0], [1, 0], [2, 0]]


def test_visibility_entry_is_checked():
    image = torch.rand(3, KH, KW)
    target = {
        "keypoints": tv_tensors.KeyPoints(PEOPLE.float(), canvas_size=(KH, KW)),
        "keypoints_visibility": VISIBLE.float(),
    }
    with pytest.raises(TypeError, match=r"target\['keypoints_visibility'\] must be an integer"):
        warp_sample(image, target, shift(1.0))
    target["keypoints_visibility"] = VISIBLE[:1]
    with pytest.raises(ValueError, match=r"must have the shape of target\['keypoints'\].*\(2, 3\)"):
        warp_sample(image, target, shift(1.0))
    target["keypoints_visibility"] = VISIBLE.to("meta")
    with pytest.raises(ValueError, match="must be on the same device"):
        warp_sample(image, target, shift(1.0))
    # a visibility without its key points is any other entry: copied
    _, out = warp_sample(image, {"other_visibility": "x"}, shift(1.0))
    assert out == {"other_visibility": "x"}


@pytest.mark.parametrize("key", ["keypoints", "gt_keypoints", "bodyKeypoints"])
def test_key_points_as_a_plain_tensor_are_refused_not_passed_through(key):
    image = torch.rand(3, KH, KW)
    with pytest.raises(
        TypeError,
        match=rf"target\['{key}'\] holds key points as a plain tensor"
        r".*unwarped.*tv_tensors.KeyPoints\(points, canvas_size=\(24, 32\)\)",
    ):
        warp_sample(image, {key: PEOPLE.float()}, shift(1.0))  # fmt: skip
    with pytest.raises(TypeError, match="plain tensor"):  # a mirror too, pairs or not
        warp_sample(image, {key: PEOPLE.float()}, HFLIP, flip_pairs=PAIRS)
    # COCO's (x, y, v) triples: the message says how to split off the visibility
    coco = torch.cat((PEOPLE.float(), VISIBLE[..., None].float()), -1)  # (N, K, 3)
    with pytest.raises(
        TypeError,
        match=rf"KeyPoints\(kp\[\.\.\., :2\].*target\['{key}_visibility'\]"
        r" = kp\[\.\.\., 2\]\.long\(\)",
    ):
        warp_sample(image, {key: coco}, shift(1.0))  # fmt: skip
    # a per-instance count under a keypoints-like name is no key point set: copied
    _, out = warp_sample(image, {"num_keypoints": torch.tensor([3, 2])}, shift(1.0))
    assert out["num_keypoints"].tolist() == [3, 2]
