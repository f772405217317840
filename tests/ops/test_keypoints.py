"""Left/right key point pairs from names, and the permutation that swaps them."""

from __future__ import annotations

import warnings

import pytest
import torch

import visionblocks.ops as ops
from visionblocks.ops.keypoints import checked_pairs, flip_permutation, keypoint_flip_pairs

COCO_PERSON = [
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
    "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip",
    "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle",
]  # fmt: skip
# The flip index of torchvision's detection references (references/detection/transforms.py).
COCO_FLIP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]


def test_coco_person_pairs_and_permutation():
    pairs = keypoint_flip_pairs(COCO_PERSON)
    assert pairs == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16)]
    perm = flip_permutation(len(COCO_PERSON), pairs)
    assert perm.dtype == torch.int64 and perm.tolist() == COCO_FLIP
    assert torch.equal(perm[perm], torch.arange(17))  # its own inverse
    assert ops.keypoint_flip_pairs is keypoint_flip_pairs
    assert ops.flip_permutation is flip_permutation


def test_suffixes_case_and_names_without_side():
    names = ["Head", "hand_LEFT", "Left_Foot", "hand_right", "RIGHT_FOOT", "leftover", "tail"]
    # "leftover" has no side (no word "left"), but looks sided: a warning names it
    with pytest.warns(UserWarning, match=r"\['leftover'\] contain 'left' or 'right'"):
        assert keypoint_flip_pairs(names) == [(1, 3), (2, 4)]
    assert keypoint_flip_pairs(["nose"]) == [] and keypoint_flip_pairs([]) == []
    assert flip_permutation(0, []).shape == (0,)
    assert flip_permutation(3, []).tolist() == [0, 1, 2]


# Other common styles: OpenPose / Human3.6M (LShoulder), MPII (r ankle), snake with letters,
# camelCase, Blender (Hand.L), side words in the middle (animal datasets).
STYLES = [
    (["l_shoulder", "r_shoulder"], [(0, 1)]),
    (["L_ankle", "R_ankle", "nose"], [(0, 1)]),
    (["rightWrist", "leftWrist"], [(1, 0)]),
    (["left_eye", "right_eye"], [(0, 1)]),
    (["LeftHand", "RightHand"], [(0, 1)]),
    (["wristLeft", "wristRight"], [(0, 1)]),
    (["Neck", "RShoulder", "LShoulder", "RBigToe", "LBigToe", "MidHip"], [(2, 1), (4, 3)]),
    (["r ankle", "l ankle", "pelvis"], [(1, 0)]),
    (["Hand.L", "Hand.R", "hip_r", "hip_l", "FootR", "FootL"], [(0, 1), (3, 2), (5, 4)]),
    (["front_left_paw", "front_right_paw", "left-ear", "right-ear"], [(0, 1), (2, 3)]),
    (["LEFT_KNEE", "RIGHT_KNEE", "left1", "right1"], [(0, 1), (2, 3)]),
    (["lefthand", "righthand", "left", "right"], [(0, 1), (2, 3)]),  # joined: both present
]


@pytest.mark.parametrize(("names", "pairs"), STYLES)
def test_common_naming_styles_pair(names, pairs, recwarn):
    assert keypoint_flip_pairs(names) == pairs
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_letters_need_a_separator_or_a_capitalised_word():
    # vertebrae, lips, acronyms: no side, no warning
    names = ["L1", "L2", "S1", "T12", "Lip", "LED", "r2d2", "lr_x", "x_lr"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keypoint_flip_pairs(names) == []


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["l_shoulder", "nose"], "'l_shoulder' has no partner 'r_shoulder'"),
        (["LShoulder", "RHip"], "'LShoulder' has no partner 'RShoulder'"),
        (["leftWrist", "right_wrist"], "'leftWrist' has no partner 'rightWrist'"),
        (["Hand.L"], r"'Hand.L' has no partner 'Hand.R'"),
    ],
)
def test_sided_names_of_any_style_need_their_partner(names, match):
    with pytest.raises(ValueError, match=match):
        keypoint_flip_pairs(names)


@pytest.mark.parametrize(
    "names",
    [
        ["lefthand", "rgthand"],  # sided by eye, pairs with nothing
        ["nose", "left_right_ear"],  # two sides in one name
        ["upright"],
    ],
)
def test_names_that_look_sided_but_pair_with_nothing_warn(names):
    with pytest.warns(UserWarning, match="pass the flip pairs explicitly"):
        assert keypoint_flip_pairs(names) == []


def test_pair_order_does_not_matter():
    assert flip_permutation(4, [(2, 0)]).tolist() == flip_permutation(4, [(0, 2)]).tolist()
    assert flip_permutation(4, ((0, 3), [1, 2])).tolist() == [3, 2, 1, 0]


@pytest.mark.parametrize(
    ("names", "error", "match"),
    [
        ("left_eye", TypeError, "names must be a sequence of str, got str"),
        (["nose", 3], TypeError, r"names\[1\] must be a str, got int"),
        (["left_eye", "Left_Eye", "right_eye"], ValueError, "names must be unique"),
        (["left_eye", "nose"], ValueError, "'left_eye' has no partner 'right_eye'"),
        (["right_hand"], ValueError, "'right_hand' has no partner 'left_hand'"),
    ],
)
def test_flip_pairs_errors(names, error, match):
    with pytest.raises(error, match=match):
        keypoint_flip_pairs(names)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((2.0, []), TypeError, "num_keypoints must be an int"),
        ((True, []), TypeError, "num_keypoints must be an int"),
        ((-1, []), ValueError, "num_keypoints must be >= 0"),
        ((3, "01"), TypeError, "pairs must be a sequence"),
        ((3, [(0, 1.0)]), TypeError, r"pairs must hold \(int, int\) pairs"),
        ((3, [(0, 1, 2)]), TypeError, r"pairs must hold \(int, int\) pairs"),
        ((3, [(0, 3)]), ValueError, r"pairs: pair \(0, 3\) has an index outside \[0, K, "),
        ((3, [(0, -1)]), ValueError, "has an index outside"),
        ((3, [(1, 1)]), ValueError, "pairs a key point with itself"),
        ((4, [(0, 1), (1, 2)]), ValueError, "index 1 is in two pairs"),
    ],
)
def test_flip_permutation_errors(args, error, match):
    with pytest.raises(error, match=match):
        flip_permutation(*args)


def test_checked_pairs_names_its_argument_and_bounds_only_with_k():
    assert checked_pairs("flip_pairs", [(5, 9)]) == [(5, 9)]  # no K: any index >= 0
    with pytest.raises(ValueError, match=r"flip_pairs: pair \(5, 9\).*num_keypoints=6"):
        checked_pairs("flip_pairs", [(5, 9)], 6)
    with pytest.raises(TypeError, match="flip_pairs must be a sequence"):
        checked_pairs("flip_pairs", 3)
