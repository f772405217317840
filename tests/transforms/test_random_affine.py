"""`RandomAffine` inside ``v2.Compose``: torchvision's draws and geometry, our sample warp."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as tvf

from tests.helpers import assert_close
from visionblocks.transforms import RandomAffine, warp_sample
from visionblocks.transforms.affine import torchvision_matrix

H, W = 48, 64
ARGS = dict(degrees=25.0, translate=(0.1, 0.15), scale=(0.7, 1.3), shear=(-8.0, 8.0, -4.0, 4.0))


def sample(with_points: bool = True):
    gen = torch.Generator().manual_seed(0)
    image = tv_tensors.Image((torch.rand(3, H, W, generator=gen) * 255).to(torch.uint8))
    masks = torch.zeros(3, H, W, dtype=torch.uint8)
    masks[0, 5:20, 6:30] = masks[1, 25:45, 35:60] = masks[2, 10:14, 50:62] = 1
    target = {
        "boxes": tv_tensors.BoundingBoxes(
            [[6, 5, 30, 20], [35, 25, 60, 45], [50, 10, 62, 14]], format="XYXY", canvas_size=(H, W)
        ),
        "masks": tv_tensors.Mask(masks),
        "labels": torch.tensor([1, 2, 3]),
    }
    if with_points:  # two points per instance: left and right
        if not hasattr(tv_tensors, "KeyPoints"):
            pytest.skip("tv_tensors.KeyPoints needs torchvision >= 0.23")
        points = torch.tensor([[[10.0, 10.0], [25.0, 12.0]], [[40.0, 30.0], [55.0, 40.0]],
                               [[52.0, 11.0], [60.0, 12.0]]])  # fmt: skip
        target["keypoints"] = tv_tensors.KeyPoints(points, canvas_size=(H, W))
        target["keypoints_visibility"] = torch.tensor([[2, 2], [2, 1], [1, 2]])
    return image, target


def test_draws_what_v2_random_affine_draws_and_moves_the_image_as_its_affine():
    ours, theirs = RandomAffine(**ARGS), v2.RandomAffine(**ARGS)
    image, _ = sample(with_points=False)
    draw = getattr(theirs, "make_params", None) or theirs._get_params  # 0.21 renamed it
    for seed in range(5):
        torch.manual_seed(seed)
        params = ours.make_params([image])
        torch.manual_seed(seed)
        expected = draw([image])
        for key in ("angle", "translate", "scale", "shear"):
            assert list(torch.tensor(params[key]).flatten().tolist()) == pytest.approx(
                list(torch.tensor(expected[key]).flatten().tolist())
            )
        smooth = tv_tensors.Image(tvf.gaussian_blur(image.float(), [9, 9], [3.0, 3.0]))
        want = tvf.affine(smooth, interpolation=v2.InterpolationMode.BILINEAR, **expected)
        got = ours.transform(smooth, params)
        inner = (slice(None), slice(8, -8), slice(8, -8))  # torchvision's border differs
        torch.testing.assert_close(got[inner], want[inner], atol=0.5, rtol=0)


def test_in_compose_with_torchvision_transforms_on_tv_tensors():
    augment = v2.Compose(
        [
            v2.RandomPhotometricDistort(p=1.0),
            RandomAffine(**ARGS, hflip=0.5, flip_pairs=[(0, 1)]),
            v2.ToDtype(torch.float32, scale=True),
            v2.SanitizeBoundingBoxes(min_size=2.0),
        ]
    )
    image, target = sample(with_points=False)
    torch.manual_seed(3)
    out_image, out = augment(image, target)
    assert isinstance(out_image, tv_tensors.Image) and out_image.dtype == torch.float32
    assert isinstance(out["boxes"], tv_tensors.BoundingBoxes) and isinstance(
        out["masks"], tv_tensors.Mask
    )
    assert len(out["labels"]) == len(out["boxes"]) == len(out["masks"]) >= 1
    masks = out["masks"].as_subclass(torch.Tensor)
    for box, mask in zip(out["boxes"].as_subclass(torch.Tensor), masks):
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        tight = [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]
        assert box.tolist() == torch.stack(tight).float().tolist()  # the warped mask's box


def test_seeded_runs_repeat_and_equal_warp_sample_with_the_drawn_matrix():
    augment = RandomAffine(**ARGS, hflip=0.5, flip_pairs=[(0, 1)])
    image, target = sample(with_points=hasattr(tv_tensors, "KeyPoints"))
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(augment(image, target))
    (img_a, tgt_a), (img_b, tgt_b), (img_c, _) = runs
    assert torch.equal(img_a, img_b) and not torch.equal(img_a, img_c)
    assert all(torch.equal(tgt_a[k], tgt_b[k]) for k in tgt_a)
    torch.manual_seed(7)
    matrix = augment.make_params([image])["matrix"]
    ref_image, ref = warp_sample(image, target, matrix, min_size=None, flip_pairs=[(0, 1)])
    assert torch.equal(img_a, ref_image) and all(torch.equal(tgt_a[k], ref[k]) for k in ref)


def test_flip_swaps_key_point_pairs_and_needs_them():
    image, target = sample()
    flip = RandomAffine(0.0, hflip=1.0, flip_pairs=[(0, 1)])
    out_image, out = flip(image, target)
    assert torch.equal(out_image, tvf.horizontal_flip(image))
    moved = target["keypoints"].as_subclass(torch.Tensor).clone()
    moved[..., 0] = W - 1 - moved[..., 0]
    assert torch.equal(out["keypoints"].as_subclass(torch.Tensor), moved[:, [1, 0]])
    assert out["keypoints_visibility"].tolist() == [[2, 2], [1, 2], [2, 1]]
    with pytest.raises(ValueError, match="flip_pairs is None"):
        RandomAffine(0.0, hflip=1.0)(image, target)


def test_samples_as_torchvision_accepts_them():
    image, target = sample(with_points=False)
    augment = RandomAffine(**ARGS, min_size=4.0)
    torch.manual_seed(1)
    _, expected = augment(image, target)
    torch.manual_seed(1)
    flat = augment({"image": image, **target})  # one dict
    assert list(flat) == ["image", *target] and isinstance(flat["image"], tv_tensors.Image)
    assert all(torch.equal(flat[k], expected[k]) for k in target)
    torch.manual_seed(1)
    plain_image, plain = augment(image.as_subclass(torch.Tensor), target)  # a plain tensor
    assert type(plain_image) is torch.Tensor and torch.equal(plain["boxes"], expected["boxes"])
    torch.manual_seed(1)
    batch = augment(image[None].expand(2, 3, H, W))  # one draw for a batch, as torchvision
    assert batch.shape == (2, 3, H, W) and torch.equal(batch[0], batch[1])
    torch.manual_seed(1)
    loose = RandomAffine(**ARGS)(image, target["boxes"], target["masks"])  # no dict: kept
    assert len(loose) == 3 and loose[1].shape == (3, 4)
    with pytest.raises(ValueError, match="pass min_size=None"):
        augment(image, target["boxes"], target["labels"])
    with pytest.raises(TypeError, match="needs an image"):
        augment({"labels": [1, 2]})


def test_min_size_drops_instances_with_their_labels():
    image, target = sample(with_points=False)
    shift = RandomAffine((0.0, 0.0), translate=(1.0, 0.0), min_size=1.0)
    for seed in range(100):  # a shift that moves box 0 (x 6..30) out, boxes 1 and 2 not
        torch.manual_seed(seed)
        if -55 <= shift.make_params([image])["translate"][0] <= -31:
            break
    torch.manual_seed(seed)
    _, out = shift(image, target)
    assert out["labels"].tolist() == [2, 3]  # box 0 left the image with its label and mask
    assert len(out["boxes"]) == len(out["masks"]) == len(out["labels"])


def test_arguments_are_checked_and_hooks_exist_under_both_names():
    with pytest.raises(ValueError, match="degrees"):
        RandomAffine(-5.0)
    with pytest.raises(ValueError, match="hflip"):
        RandomAffine(5.0, hflip=1.5)
    with pytest.raises(ValueError, match="scale must hold finite numbers"):
        RandomAffine(5.0, scale=(float("nan"), 1.0))
    with pytest.raises(ValueError, match="min_size"):
        RandomAffine(5.0, min_size=-1.0)
    # torchvision < 0.21 calls _get_params/_transform, later releases make_params/transform
    assert RandomAffine._get_params is RandomAffine.make_params
    assert RandomAffine._transform is RandomAffine.transform
    assert "degrees=[-5.0, 5.0]" in repr(RandomAffine(5.0))
    pil = pytest.importorskip("PIL.Image")
    with pytest.raises(TypeError, match="ToImage"):
        RandomAffine(5.0)(pil.new("RGB", (8, 6)))


def test_matrix_is_torchvision_s_about_the_image_centre():
    """x' = M x for the centre pixel: it stays put under turn, scale and shear."""
    m = torchvision_matrix((H, W), 30.0, (0, 0), 1.2, (10.0, 5.0))
    centre = torch.tensor([(W - 1) / 2, (H - 1) / 2, 1.0], dtype=torch.float64)
    assert_close(m @ centre, centre[:2])


def test_key_points_as_a_plain_tensor_are_refused_in_a_compose():
    image, target = sample(with_points=False)
    points = torch.tensor([[[10.0, 8.0], [20.0, 8.0]]] * 3)
    augment = v2.Compose([RandomAffine(10.0, hflip=0.5, flip_pairs=[(0, 1)])])
    for sample_in in ({**target, "keypoints": points}, {"keypoints": points}):
        with pytest.raises(TypeError, match=r"target\['keypoints'\] holds key points as a plain"):
            augment(image, sample_in)
    # wrapped, they move with the image
    torch.manual_seed(0)
    wrapped = tv_tensors.KeyPoints(points, canvas_size=(H, W))
    _, out = augment(image, {"keypoints": wrapped})
    assert isinstance(out["keypoints"], tv_tensors.KeyPoints)
    assert not torch.equal(out["keypoints"].as_subclass(torch.Tensor), points)
