"""Non-finite predictions in the post-processing: dropped before NMS, documented.

`postprocess_detections` used to pass NaN boxes through clipping and NMS (whose comparisons
with NaN are false) into its output. Now a (location, class) pair with a NaN or infinite box
coordinate or score is no candidate, as in detectron2's ``fast_rcnn_inference``;
`postprocess_padded` does the same, and one NaN box no longer poisons the NMS offset of the
whole batch.
"""

from __future__ import annotations

import pytest
import torch

import visionblocks
from visionblocks.models.postprocess import postprocess_detections, postprocess_padded

NAN, INF = float("nan"), float("inf")
SIZE = (32, 48)


def predictions():
    """Four locations, two classes; rows 1 and 2 are broken (a NaN and an inf coordinate)."""
    scores = torch.tensor([[0.9, 0.1], [0.95, 0.0], [0.0, 0.97], [0.2, 0.8]])
    boxes = torch.tensor(
        [
            [0.0, 0.0, 10.0, 10.0],
            [NAN, 1.0, 11.0, 11.0],
            [20.0, 20.0, INF, 30.0],
            [20.0, 20.0, 30.0, 30.0],
        ]
    )
    return scores, boxes


def test_non_finite_boxes_are_dropped_before_nms():
    scores, boxes = predictions()
    out = postprocess_detections([scores], [boxes], SIZE, score_thresh=0.05)
    assert torch.isfinite(out["boxes"]).all()
    # rows 1 and 2 would have been the best of their classes: gone, and suppress nothing
    assert out["scores"].tolist() == pytest.approx([0.9, 0.8, 0.2, 0.1])
    assert out["labels"].tolist() == [0, 1, 0, 1]
    assert out["boxes"].tolist() == [
        [0.0, 0.0, 10.0, 10.0],
        [20.0, 20.0, 30.0, 30.0],
        [20.0, 20.0, 30.0, 30.0],
        [0.0, 0.0, 10.0, 10.0],
    ]
    # the same as removing the broken rows by hand
    good = torch.tensor([0, 3])
    ref = postprocess_detections([scores[good]], [boxes[good]], SIZE, score_thresh=0.05)
    for key in ("boxes", "scores", "labels"):
        assert torch.equal(out[key], ref[key])


def test_a_level_of_nan_boxes_gives_no_detections():
    boxes = torch.full((3, 4), NAN)
    out = postprocess_detections([torch.full((3, 2), 0.9)], [boxes], SIZE)
    assert out["boxes"].shape == (0, 4) and out["scores"].shape == (0,)
    assert out["labels"].dtype == torch.int64


def test_non_finite_scores_are_dropped_when_value_checks_are_off():
    scores, boxes = predictions()
    boxes = boxes.nan_to_num(0.0, posinf=30.0)
    scores[0, 0], scores[3, 1] = NAN, INF
    with pytest.raises(ValueError, match=r"scores\[0\] must hold probabilities in \[0, 1\]"):
        postprocess_detections([scores], [boxes], SIZE)
    with visionblocks.value_checks(False):
        out = postprocess_detections([scores], [boxes], SIZE, nms_thresh=1.0)
    # the NaN (row 0, class 0) and the inf (row 3, class 1) are gone; 0.0 is below 0.05
    assert out["scores"].tolist() == pytest.approx([0.97, 0.95, 0.2, 0.1])
    assert out["labels"].tolist() == [1, 0, 0, 1]


def test_padded_drops_them_too_and_keeps_the_batch_offset_finite():
    scores, boxes = predictions()
    clean_scores, clean_boxes = scores.clone(), boxes.clone()
    clean_boxes[1:3] = torch.tensor([[1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 25.0, 30.0]])
    batch_scores = torch.stack((scores, clean_scores))
    batch_boxes = torch.stack((boxes, clean_boxes))
    sizes = torch.tensor([SIZE, SIZE])
    out = postprocess_padded([batch_scores], [batch_boxes], sizes, max_detections=6)
    assert torch.isfinite(out["boxes"]).all()
    for b in range(2):
        ref = postprocess_detections([batch_scores[b]], [batch_boxes[b]], SIZE)
        n = int(out["num_detections"][b])
        assert n == len(ref["scores"])
        assert torch.allclose(out["scores"][b, :n], ref["scores"])
        assert torch.equal(out["labels"][b, :n], ref["labels"])
        assert torch.allclose(out["boxes"][b, :n], ref["boxes"])
    # image 1, with finite boxes only, has its 5 detections (NMS unharmed by image 0's NaN)
    assert out["num_detections"].tolist() == [4, 5]


def test_nan_candidates_do_not_crowd_out_finite_ones_in_padded():
    # topk puts NaN first: with topk_candidates=1, a NaN box must not take the only slot
    scores = torch.tensor([[[0.9], [0.5]]])
    boxes = torch.tensor([[[NAN, 0.0, 5.0, 5.0], [0.0, 0.0, 5.0, 5.0]]])
    out = postprocess_padded([scores], [boxes], torch.tensor([SIZE]), topk_candidates=1)
    assert out["num_detections"].tolist() == [1]
    assert out["scores"][0, 0].item() == pytest.approx(0.5)
    ref = postprocess_detections([scores[0]], [boxes[0]], SIZE, topk_candidates=1)
    assert ref["scores"].tolist() == pytest.approx([0.5])


class _Padded(torch.nn.Module):
    def forward(self, scores, boxes, sizes):
        return postprocess_padded([scores], [boxes], sizes, score_thresh=0.5, max_detections=4)


def _candidates(hits: list[list[tuple[int, int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight locations and three classes per image, all scoring 0.1 but the ``(location,
    class)`` hits, scoring 0.95, 0.9...; locations 0 and 1 overlap, the others do not."""
    scores = torch.full((len(hits), 8, 3), 0.1)
    for b, image_hits in enumerate(hits):
        for i, (location, label) in enumerate(image_hits):
            scores[b, location, label] = 0.95 - 0.05 * i
    corner = torch.arange(8.0)[:, None] * 12
    corner[1] = 1.0
    boxes = torch.cat([corner, corner, corner + 10, corner + 10], 1).expand(len(hits), 8, 4)
    return scores, boxes.clone()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torchvision's fake nms
def test_the_exported_form_keeps_zero_one_and_two_detections():
    # torchvision's fake nms assumed >= 2 kept boxes: the exported program raised
    # "Runtime assertion failed for expression u1 >= 2" with fewer detections.
    from torch.export import Dim

    batch = Dim("batch", min=1, max=64)
    example = (*_candidates([[(2, 0), (3, 1)], [(4, 2)]]), torch.tensor([[96, 96]] * 2))
    shapes = ({0: batch}, {0: batch}, {0: batch})
    program = torch.export.export(_Padded(), example, dynamic_shapes=shapes).module()
    cases = {
        0: [[], []],
        1: [[(2, 0)], []],
        "1 of 2 overlapping": [[(0, 1), (1, 1)], []],
        2: [[], [(0, 0), (5, 2)]],
        "many": [[(0, 0), (1, 0), (2, 1), (3, 2), (4, 0), (5, 1)], [(6, 2), (7, 0)], []],
    }
    expected_counts = {0: [0, 0], 1: [1, 0], "1 of 2 overlapping": [1, 0], 2: [0, 2]}
    for name, hits in cases.items():
        scores, boxes = _candidates(hits)
        sizes = torch.tensor([[96, 96]] * len(hits))
        eager, got = _Padded()(scores, boxes, sizes), program(scores, boxes, sizes)
        assert got["num_detections"].tolist() == expected_counts.get(name, [4, 2, 0]), name
        for key in eager:
            assert torch.equal(got[key], eager[key]), (name, key)
