"""The demo's postprocessing and picture: class-aware hits, the deployed score threshold,
per-class AP, the counts of the drawn images, and labels that do not overlap."""

from __future__ import annotations

import itertools

import pytest
import torch

from visionblocks.cli._demo_eval import found_once, hits, per_class_ap, score_threshold

CIRCLE, SQUARE = 0, 1


def _pred(boxes, labels, scores):
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "scores": torch.tensor(scores, dtype=torch.float32),
    }


def _target(boxes, labels):
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
    }


def test_a_hit_is_the_best_box_of_the_objects_class_and_taken_once():
    target = _target([[10, 10, 40, 40], [60, 60, 90, 90]], [CIRCLE, SQUARE])
    pred = _pred(
        [[11, 11, 40, 40], [10, 10, 41, 41], [10, 10, 40, 40], [60, 60, 90, 90], [0, 0, 5, 5]],
        [CIRCLE, CIRCLE, SQUARE, SQUARE, CIRCLE],
        [0.7, 0.9, 0.8, 0.3, 0.95],
    )
    # the circle's best-scoring circle box takes it, its duplicate does not; a square box on
    # the circle is no hit (class-aware); the box on nothing is no hit
    assert hits(pred, target).tolist() == [False, True, False, True, False]
    assert hits(pred, _target([], [])).tolist() == [False] * 5
    assert hits(_pred([], [], []), target).tolist() == []
    low = _pred([[10, 10, 40, 25]], [CIRCLE], [0.9])  # IoU 0.5 with the circle: a hit
    assert hits(low, target).tolist() == [True]
    low["boxes"][0, 3] = 24.0  # IoU below 0.5
    assert hits(low, target).tolist() == [False]


def test_the_score_threshold_is_the_cut_of_highest_f1_midway_between_scores():
    scores = torch.tensor([0.5, 0.95, 0.2, 0.9, 0.6])
    hit = torch.tensor([True, True, False, True, False])
    # cuts after 1..5 ranked detections: F1 = 2 TP / (kept + 3 objects) is
    # 0.5, 0.8, 0.667, 0.857 (0.95 0.9 0.6 0.5 kept), 0.75
    assert score_threshold(scores, hit, 3) == pytest.approx((0.5 + 0.2) / 2)
    # every object found once and nothing else above: the cut keeps exactly the hits
    assert score_threshold(scores, torch.tensor([1, 1, 0, 1, 1]).bool(), 4) == pytest.approx(0.35)
    # one missed object more does not move the cut; with nothing but hits, it goes below them
    assert score_threshold(scores, hit, 4) == pytest.approx(0.35)
    assert score_threshold(scores[[1, 3, 0]], hit[[1, 3, 0]], 3) == pytest.approx(0.25)
    # no cut between equal scores: a tie of a hit and a miss is kept or dropped together
    tied = torch.tensor([0.9, 0.5, 0.5])
    assert score_threshold(tied, torch.tensor([True, True, False]), 2) == pytest.approx(0.25)
    assert score_threshold(tied, torch.tensor([True, False, False]), 1) == pytest.approx(0.7)
    assert score_threshold(scores, torch.zeros(5, dtype=torch.bool), 3) is None
    assert score_threshold(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 3) is None


def test_found_once_counts_objects_boxes_and_hits():
    targets = [_target([[10, 10, 40, 40]], [CIRCLE]), _target([[60, 60, 90, 90]], [SQUARE])]
    good = [_pred([[10, 10, 40, 40]], [CIRCLE], [0.9]), _pred([[60, 60, 90, 90]], [SQUARE], [0.8])]
    assert found_once(good, targets) == {"images": 2, "objects": 2, "boxes": 2, "found": 2}
    wrong = [_pred([[10, 10, 40, 40]], [SQUARE], [0.9]), good[1]]
    assert found_once(wrong, targets) == {"images": 2, "objects": 2, "boxes": 2, "found": 1}
    twice = [_pred([[10, 10, 40, 40], [10, 10, 40, 40]], [CIRCLE, SQUARE], [0.9, 0.8]), good[1]]
    assert found_once(twice, targets) == {"images": 2, "objects": 2, "boxes": 3, "found": 2}


def test_per_class_ap_scores_each_class_alone(tmp_path):
    from visionblocks.data import CocoInstances, make_synthetic_coco

    ann = make_synthetic_coco(tmp_path, num_images=6, image_size=(64, 64), seed=0,
                              progress=False)  # fmt: skip
    data = CocoInstances(ann.parent / "images", ann)
    truth = {}
    for i in range(len(data)):
        target = data[i][1]
        boxes = target["boxes"].as_subclass(torch.Tensor)
        truth[target["image_id"]] = {"boxes": boxes, "labels": target["labels"],
                                     "scores": torch.ones(len(boxes))}  # fmt: skip
    assert {name: ap["AP"] for name, ap in per_class_ap(truth, data).items()} == pytest.approx(
        dict.fromkeys(data.classes, 1.0)
    )
    # the squares called circles: circles keep AP 1 at AP50 (the extra boxes score lower),
    # squares get 0, triangles are untouched
    renamed = {}
    for i, p in truth.items():
        square = p["labels"] == data.classes.index("square")
        renamed[i] = {**p, "labels": torch.where(square, data.classes.index("circle"), p["labels"]),
                      "scores": torch.where(square, 0.5, 1.0)}  # fmt: skip
    result = per_class_ap(renamed, data)
    assert result["square"] == {"AP": 0.0, "AP50": 0.0}
    assert result["triangle"]["AP"] == pytest.approx(1.0)
    assert result["circle"]["AP50"] == pytest.approx(1.0)


def _label_extents(fig):
    fig.canvas.draw()
    return [
        [(text, text.get_bbox_patch().get_window_extent()) for text in ax.texts] for ax in fig.axes
    ]


def test_the_picture_places_labels_apart_with_a_legend():
    from visionblocks.cli._demo_plots import MAX_DRAWN, prediction_figure

    # crowded: three objects side by side, each with its class name, and on each two
    # predictions of two classes (what a threshold too low gives), plus twelve on the first
    boxes = [[8, 40, 40, 72], [44, 40, 76, 72], [80, 40, 112, 72]]
    target = _target(boxes, [CIRCLE, SQUARE, CIRCLE])
    pred = _pred(boxes * 2, [CIRCLE, SQUARE, CIRCLE, SQUARE, CIRCLE, SQUARE],
                 [0.91, 0.88, 0.85, 0.52, 0.49, 0.47])  # fmt: skip
    crowd = _pred([boxes[0]] * 12, [CIRCLE] * 12, torch.linspace(0.9, 0.3, 12).tolist())
    images = [torch.rand(3, 128, 128)] * 3
    fig = prediction_figure(images, [pred, crowd, _pred([], [], [])],
                            [target, target, _target([], [])], ["circle", "square"],
                            score_thresh=0.3)  # fmt: skip
    try:
        per_axes = _label_extents(fig)
        assert [len(labels) for labels in per_axes[:3]] == [9, 3 + MAX_DRAWN, 0]
        texts = [text.get_text() for text, _ in per_axes[0]]
        assert texts[:3] == ["circle", "square", "circle"] and "square 0.88" in texts
        frames = [ax.get_window_extent() for ax in fig.axes]
        assert not any(a.overlaps(b) for a, b in itertools.combinations(frames, 2))
        for ax, labels in zip(fig.axes, per_axes):
            frame = ax.get_window_extent()
            for _, extent in labels:  # inside its image, clear of every other label
                assert frame.x0 - 1 <= extent.x0 and extent.x1 <= frame.x1 + 1
                assert frame.y0 - 1 <= extent.y0 and extent.y1 <= frame.y1 + 1
            for (a, one), (b, other) in itertools.combinations(labels, 2):
                assert not one.overlaps(other), (a.get_text(), b.get_text())
        (legend,) = fig.legends
        names = [t.get_text() for t in legend.get_texts()]
        assert names[0] == "ground truth: class"
        assert names[1] == f"prediction: class score (score >= 0.30; the {MAX_DRAWN} best)"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
