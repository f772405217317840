"""Key points through warps: visibility follows the canvas, a mirror swaps left and right.

Hand-computed cases, torchvision transforms v2 where its convention agrees with ours,
``torch.compile(fullgraph=True)`` and fake CUDA tensors (`warp_sample` on key points: tests/transforms).

torchvision 0.29 on ``tv_tensors.KeyPoints``: ``horizontal_flip`` / ``vertical_flip`` map
``x -> W - 1 - x`` (pixel centres on integers, our convention: equal to our flip matrices);
``affine`` turns and scales the points about ``(W / 2, H / 2)`` taken in the points' own
coordinates, as for boxes in the edge convention, while its images turn about the centre
pixel ``((W - 1) / 2, (H - 1) / 2)``: its key points land ``(I - s R) (0.5, 0.5)`` away from
where its image moves the pixel (1 px for a 90° turn). They equal our `warp_points` with
``center=(W / 2, H / 2)``, not with the image's matrix. Translations agree. Neither swaps
left/right names nor carries visibility (pytorch/vision #9281).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as tvf

import visionblocks
from tests.helpers import assert_close, gradcheck
from tests.package.test_fake_cuda import no_driver
from visionblocks.ops import (
    affine_matrix,
    keypoint_flip_pairs,
    warp_affine,
    warp_keypoints,
    warp_points,
)

H, W = 24, 32
NAMES = ["nose", "left_eye", "right_eye"]
PAIRS = keypoint_flip_pairs(NAMES)  # [(1, 2)]
HFLIP = torch.tensor([[-1.0, 0.0, W - 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
VFLIP = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, H - 1.0]], dtype=torch.float64)
TURN180 = torch.tensor([[-1.0, 0.0, W - 1.0], [0.0, -1.0, H - 1.0]], dtype=torch.float64)
# Two people: nose, left eye (on the person's left: larger x, facing us), right eye.
PEOPLE = torch.tensor(
    [[[10.0, 6.0], [12.0, 5.0], [8.0, 5.0]], [[25.0, 15.0], [27.0, 14.0], [23.0, 14.0]]],
    dtype=torch.float64,
)
VISIBLE = torch.tensor([[2, 1, 2], [2, 0, 2]])


def shift(tx: float, ty: float = 0.0) -> torch.Tensor:
    return torch.tensor([[1.0, 0.0, tx], [0.0, 1.0, ty]], dtype=torch.float64)


# ---------------------------------------------------------------------------- hand-computed


def test_horizontal_flip_of_a_three_point_skeleton_swaps_the_eyes():
    points, flags = warp_keypoints(PEOPLE[:1], HFLIP, (H, W), VISIBLE[:1], PAIRS)
    # x -> 31 - x; then the eyes swap places in the K axis: index 1 (left eye) is the point
    # that was the right eye, now on the person's left.
    expected = torch.tensor([[[21.0, 6.0], [23.0, 5.0], [19.0, 5.0]]], dtype=torch.float64)
    assert torch.equal(points, expected)
    assert flags.tolist() == [[2, 2, 1]]  # the flags travel with their points
    # Without the swap the left eye would sit on the right: x 19 < nose 21 < 23.
    plain = warp_points(PEOPLE[:1], HFLIP)
    assert plain[0, 1, 0] < plain[0, 0, 0] < plain[0, 2, 0]
    assert points[0, 2, 0] < points[0, 0, 0] < points[0, 1, 0]


@pytest.mark.parametrize(
    ("matrix", "swaps"),
    [(HFLIP, True), (VFLIP, True), (TURN180, False), (shift(1.0), False)],
    ids=["hflip", "vflip", "turn180", "shift"],
)
def test_only_mirroring_warps_swap(matrix, swaps):
    points, flags = warp_keypoints(PEOPLE, matrix, (H, W), VISIBLE, PAIRS)
    moved = warp_points(PEOPLE, matrix)
    perm = [0, 2, 1] if swaps else [0, 1, 2]
    assert torch.equal(points, moved[:, perm])
    assert torch.equal(flags, VISIBLE[:, perm])


def test_a_negative_scale_on_one_axis_and_a_rotation_still_mirror():
    mirror = affine_matrix(angle=30.0, center=(15.5, 11.5)).double() * torch.tensor(
        [[-1.0], [1.0]], dtype=torch.float64
    )
    assert torch.linalg.det(mirror[:, :2]) < 0
    points, _ = warp_keypoints(PEOPLE, mirror, (1000, 1000), VISIBLE, PAIRS)
    assert torch.equal(points, warp_points(PEOPLE, mirror)[:, [0, 2, 1]])


def test_points_that_leave_the_canvas_become_invisible():
    # Pixel j spans [j - 0.5, j + 0.5): the canvas is [-0.5, W - 0.5) x [-0.5, H - 0.5).
    xs = torch.tensor([-0.5, -0.5001, 0.0, W - 1.0, W - 0.5001, W - 0.5, float("nan")])
    points = torch.stack((xs, torch.full_like(xs, 3.0)), -1).double()
    _, inside = warp_keypoints(points, shift(0.0), (H, W))
    assert inside.dtype == torch.bool
    assert inside.tolist() == [True, False, True, True, True, False, False]
    ys = torch.tensor([-0.5, -0.5001, 0.0, H - 1.0, H - 0.5001, H - 0.5, float("nan")])
    ys = torch.stack((torch.full_like(ys, 3.0), ys), -1).double()
    _, inside = warp_keypoints(ys, shift(0.0), (H, W))
    assert inside.tolist() == [True, False, True, True, True, False, False]
    # A shift moves the second person's eye (x 27) out of a 28-wide canvas, not the nose.
    _, flags = warp_keypoints(PEOPLE, shift(0.6), (H, 28), VISIBLE, [])
    assert flags.tolist() == [[2, 1, 2], [2, 0, 2]]
    _, flags = warp_keypoints(PEOPLE, shift(1.0), (H, 28), VISIBLE, [])
    assert flags.tolist() == [[2, 1, 2], [2, 0, 2]]  # 27 + 1 = 28 > 27.5, but it was 0
    _, flags = warp_keypoints(PEOPLE, shift(0.6), (H, 26), VISIBLE, [])
    assert flags.tolist() == [[2, 1, 2], [0, 0, 2]]  # 25.6 >= 25.5: the nose leaves


def test_invisible_stays_invisible_other_values_are_kept():
    visibility = torch.tensor([[0, 1, 2]])
    _, flags = warp_keypoints(PEOPLE[:1], shift(2.0), (H, W), visibility, PAIRS)
    assert flags.tolist() == [[0, 1, 2]] and flags.dtype == visibility.dtype
    _, flags = warp_keypoints(PEOPLE[:1], shift(-8.4), (H, W), visibility, PAIRS)
    assert flags.tolist() == [[0, 1, 2]]  # the right eye at x 8 - 8.4 = -0.4: on pixel 0
    _, flags = warp_keypoints(PEOPLE[:1], shift(-8.6), (H, W), visibility, PAIRS)
    assert flags.tolist() == [[0, 1, 0]]  # -0.6: off the canvas
    _, flags = warp_keypoints(PEOPLE[:1], shift(-12.0), (H, W), visibility, PAIRS)
    assert flags.tolist() == [[0, 1, 0]]  # nose -2, right eye -4 leave; left eye 0 stays
    flags = warp_keypoints(PEOPLE[:1], shift(-12.0), (H, W), visibility.bool(), PAIRS)[1]
    assert flags.dtype == torch.bool and flags.tolist() == [[False, True, False]]
    u8 = torch.tensor([[0, 1, 2]], dtype=torch.uint8)
    assert warp_keypoints(PEOPLE[:1], HFLIP, (H, W), u8, PAIRS)[1].tolist() == [[0, 2, 1]]


def test_batched_matrices_swap_only_where_they_mirror():
    mats = torch.stack((shift(1.0), HFLIP))  # (2, 2, 3) against (2, K, 2): one each
    points, flags = warp_keypoints(PEOPLE, mats, (H, W), VISIBLE, PAIRS)
    assert torch.equal(points[0], warp_points(PEOPLE[0], mats[0]))
    assert torch.equal(points[1], warp_points(PEOPLE[1], mats[1])[[0, 2, 1]])
    assert flags.tolist() == [[2, 1, 2], [2, 2, 0]]
    # (2, 1, 2, 3) matrices against (K, 2) points of one person: broadcast to (2, 1, K, 2)
    points, flags = warp_keypoints(PEOPLE[0], mats[:, None], (H, W), VISIBLE[0], PAIRS)
    assert points.shape == (2, 1, 3, 2) and flags.shape == (2, 1, 3)
    assert flags.tolist() == [[[2, 1, 2]], [[2, 2, 1]]]


def test_points_and_gradients_equal_warp_points_when_nothing_mirrors():
    m = affine_matrix(angle=20.0, scale=1.1, center=(15.5, 11.5)).double()
    points, _ = warp_keypoints(PEOPLE, m, (H, W), VISIBLE, PAIRS)
    assert torch.equal(points, warp_points(PEOPLE, m))
    gradcheck(lambda p, a: warp_keypoints(p, a, (H, W), None, PAIRS)[0], [PEOPLE, HFLIP])


# ------------------------------------------------------------------------------- mirroring


def test_a_mirror_without_flip_pairs_is_refused():
    with pytest.raises(ValueError, match="matrix mirrors the image.*pass flip_pairs"):
        warp_keypoints(PEOPLE, HFLIP, (H, W), VISIBLE)
    with pytest.raises(ValueError, match="flip_pairs is None"):
        warp_keypoints(PEOPLE, torch.stack((shift(0.0), HFLIP)), (H, W))
    # [] says there are no pairs; one key point per instance has none; no mirror: fine
    points, _ = warp_keypoints(PEOPLE, HFLIP, (H, W), VISIBLE, [])
    assert torch.equal(points, warp_points(PEOPLE, HFLIP))
    warp_keypoints(PEOPLE[:, :1], HFLIP, (H, W))
    warp_keypoints(PEOPLE, TURN180, (H, W))
    with visionblocks.value_checks(False):  # a value check: off with the others
        warp_keypoints(PEOPLE, HFLIP, (H, W))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"visibility": VISIBLE.float()}, TypeError, "visibility must be an integer or bool"),
        ({"visibility": VISIBLE[0]}, ValueError, r"visibility must have the shape of points"),
        ({"visibility": VISIBLE.to("meta")}, ValueError, "visibility must be on the same"),
        ({"flip_pairs": [(0, 3)]}, ValueError, "flip_pairs: pair"),
        ({"flip_pairs": "12"}, TypeError, "flip_pairs must be a sequence"),
        ({"size": (0, 3)}, ValueError, "size must be positive"),
        # COCO's (x, y, v) triples: the message says how to split off the visibility
        ({"points": torch.cat((PEOPLE, VISIBLE[..., None].double()), -1)}, ValueError,
         r"got \(2, 3, 3\): for COCO's \(x, y, v\) triples pass the coordinates "
         r"points\[\.\.\., :2\] and the visibility points\[\.\.\., 2\]\.long\(\) apart"),
    ],
)  # fmt: skip
def test_warp_keypoints_errors(kwargs, error, match):
    call = {"points": PEOPLE, "matrix": shift(1.0), "size": (H, W), **kwargs}
    with pytest.raises(error, match=match):
        warp_keypoints(**call)


# ----------------------------------------------------------------------------- torchvision


@pytest.mark.parametrize("flip", ["horizontal", "vertical"])
def test_flips_equal_torchvision_v2_coordinates(flip):
    gen = torch.Generator().manual_seed(0)
    points = torch.rand(4, 5, 2, generator=gen) * torch.tensor([W - 1.0, H - 1.0])
    kp = tv_tensors.KeyPoints(points, canvas_size=(H, W))
    fn = tvf.horizontal_flip if flip == "horizontal" else tvf.vertical_flip
    ref = fn(kp).as_subclass(torch.Tensor)
    matrix = (HFLIP if flip == "horizontal" else VFLIP).float()
    ours, inside = warp_keypoints(points, matrix, (H, W), None, [])  # no names: no swap
    assert torch.equal(ours, ref) and inside.all()
    # the image moves the same way: a pixel and the point on its centre stay together
    img = torch.zeros(1, H, W)
    img[0, 7, 19] = 1.0
    row, col = warp_affine(img, matrix, mode="nearest")[0].nonzero()[0].tolist()
    assert warp_points(torch.tensor([[19.0, 7.0]]), matrix).tolist() == [[col, row]]


@pytest.mark.parametrize(
    ("angle", "translate", "scale"),
    [(30.0, (3, -2), 1.0), (0.0, (0, 0), 1.5), (-110.0, (1, 1), 0.7), (90.0, (0, 0), 1.0)],
)
def test_affine_equals_torchvision_about_its_centre_half_a_pixel_off_its_image(
    angle, translate, scale
):
    gen = torch.Generator().manual_seed(1)
    points = torch.rand(6, 2, generator=gen, dtype=torch.float64) * 20 + 2
    kp = tv_tensors.KeyPoints(points, canvas_size=(H, W))
    ref = tvf.affine(kp, angle=angle, translate=list(translate), scale=scale, shear=[0.0, 0.0])
    ref = ref.as_subclass(torch.Tensor)
    args = {"angle": -angle, "translate": tuple(map(float, translate)), "scale": scale}
    tv_centre = affine_matrix(**args, center=(W / 2, H / 2)).double()
    assert_close(warp_points(points, tv_centre), ref, dtype=torch.float32)
    image_centre = affine_matrix(**args, center=((W - 1) / 2, (H - 1) / 2)).double()
    ours = warp_points(points, image_centre)
    # (I - s R) (0.5, 0.5): zero only without rotation and scale
    lin = image_centre[:, :2]
    offset = (torch.eye(2, dtype=torch.float64) - lin) @ torch.tensor([0.5, 0.5]).double()
    assert_close(ref - ours, offset.expand_as(ref), dtype=torch.float32)
    assert offset.norm() > 0.1


def test_translation_equals_torchvision_affine():
    points = torch.tensor([[3.0, 4.0], [20.0, 10.0]])
    kp = tv_tensors.KeyPoints(points, canvas_size=(H, W))
    ref = tvf.affine(kp, angle=0.0, translate=[5, -2], scale=1.0, shear=[0.0, 0.0])
    ours, _ = warp_keypoints(points, shift(5.0, -2.0).float(), (H, W))
    assert torch.equal(ours, ref.as_subclass(torch.Tensor))


def test_inside_agrees_with_sanitize_key_points_on_integer_points():
    gen = torch.Generator().manual_seed(2)
    points = torch.randint(-3, W + 3, (200, 2), generator=gen).float()
    points[:, 1] = points[:, 1] * H / W
    points = points.round()
    kept = v2.SanitizeKeyPoints()(tv_tensors.KeyPoints(points, canvas_size=(H, W)))
    _, inside = warp_keypoints(points, shift(0.0).float(), (H, W))
    assert torch.equal(points[inside], kept.as_subclass(torch.Tensor))
    assert 0 < inside.sum() < len(points)
    # Between pixel centres they differ: -0.3 lies on pixel 0 (kept by us, not by
    # torchvision), W - 0.3 lies on no pixel (the reverse).
    edge = torch.tensor([[-0.3, 1.0], [W - 0.3, 1.0]])
    kept = v2.SanitizeKeyPoints()(tv_tensors.KeyPoints(edge, canvas_size=(H, W)))
    assert torch.equal(kept.as_subclass(torch.Tensor), edge[1:])
    assert warp_keypoints(edge, shift(0.0).float(), (H, W))[1].tolist() == [True, False]


# ----------------------------------------------------------------------- compile, fake CUDA


def _keypoint_call(points, matrices, visibility):
    return warp_keypoints(points, matrices, (H, W), visibility, PAIRS)


def test_compiles_fullgraph_and_equals_eager():
    mats = torch.stack((affine_matrix(angle=15.0, center=(15.5, 11.5)), HFLIP.float()))
    points, visibility = PEOPLE.float(), VISIBLE
    torch._dynamo.reset()
    compiled = torch.compile(_keypoint_call, fullgraph=True, backend="aot_eager")
    with visionblocks.value_checks(True):
        got, want = compiled(points, mats, visibility), _keypoint_call(points, mats, visibility)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert want[1].tolist() == [[2, 1, 2], [2, 2, 0]]


def test_fake_cuda_reads_nothing():
    cuda = torch.device("cuda")
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        points = torch.zeros(2, 3, 2, device=cuda)
        mats = torch.zeros(2, 2, 3, device=cuda)
        visibility = torch.zeros(2, 3, dtype=torch.int64, device=cuda)
        with no_driver():
            moved, flags = warp_keypoints(points, mats, (H, W), visibility, PAIRS)
            # without pairs: the mirror check is a device-side assert, not a host read
            _, inside = warp_keypoints(points, mats, (H, W))
    assert moved.device.type == flags.device.type == inside.device.type == "cuda"
    assert flags.dtype == torch.int64 and inside.dtype == torch.bool


def test_a_turn_by_90_degrees_is_not_a_mirror():
    # cos(90°) in float32 is -4.4e-8, not 0: a turn by 90° has determinant 1
    turn = affine_matrix(angle=90.0, center=(11.5, 11.5))
    assert math.isclose(float(torch.linalg.det(turn[:, :2])), 1.0, rel_tol=1e-6)
    points, _ = warp_keypoints(PEOPLE.float(), turn, (H, H), VISIBLE)  # no pairs needed
    assert torch.equal(points, warp_points(PEOPLE.float(), turn))


def test_coco_triples_in_warp_points_say_how_to_split():
    triples = torch.cat((PEOPLE, VISIBLE[..., None].double()), -1)
    with pytest.raises(ValueError, match=r"points\[\.\.\., :2\].*points\[\.\.\., 2\]"):
        warp_points(triples, shift(1.0))
