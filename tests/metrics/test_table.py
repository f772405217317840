"""`format_metrics`: segmentation, panoptic and COCO results as one plain-text table."""

from __future__ import annotations

import pytest
import torch

from visionblocks.metrics import SegmentationMetrics, format_metrics, panoptic_quality


def _segmentation() -> dict[str, torch.Tensor]:
    metric = SegmentationMetrics(3, ignore_index=255)
    metric.update(torch.tensor([[0, 1, 1, 2, 0, 2]]), torch.tensor([[0, 0, 1, 2, 2, 255]]))
    return metric.compute()


def test_segmentation_result():
    text = format_metrics(_segmentation(), class_names=["sky", "road", "car"], digits=3)
    assert text == "\n".join(
        [
            "class    iou     f1",
            "-----  -----  -----",
            "sky    0.333  0.500",
            "road   0.500  0.667",
            "car    0.500  0.667",
            "",
            "metric    value",
            "--------  -----",
            "miou      0.444",
            "mean_f1   0.611",
            "accuracy  0.600",
        ]
    )
    assert "confusion" not in text


def test_coco_results_side_by_side_with_nan_and_ints():
    bbox = {"AP": 0.5, "AP50": 0.75, "APl": -1.0}
    segm = {"AP": 0.25, "images": 3, "miou": float("nan")}
    lines = format_metrics({"bbox": bbox, "segm": segm}).splitlines()
    assert lines[0].split() == ["metric", "bbox", "segm"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows == {
        "AP": ["0.5000", "0.2500"],
        "AP50": ["0.7500"],
        "APl": ["-1.0000"],
        "images": ["3"],
        "miou": ["nan"],
    }
    assert lines[5].rstrip().endswith("3") and len(lines[5]) == len(lines[2])  # segm column


def test_real_coco_evaluate_with_segmentation_and_panoptic_per_class():
    pytest.importorskip("pycocotools")
    from visionblocks.data import coco_evaluate

    gt = {
        "images": [{"id": 1, "height": 100, "width": 100}],
        "categories": [{"id": 3, "name": "dog"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "iscrowd": 0,
                         "bbox": [10, 10, 40, 30], "area": 1200.0}],
    }  # fmt: skip
    outputs = {1: {"boxes": torch.tensor([[10.0, 10.0, 50.0, 40.0]]),
                   "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}}  # fmt: skip
    coco = coco_evaluate(outputs, gt, label_to_category_id={0: 3})
    text = format_metrics({"bbox": coco, "semantic": _segmentation()})
    assert "semantic iou" in text.splitlines()[0] and "AR100" in text
    panoptic = panoptic_quality(
        torch.tensor([[[[1, 0], [2, 0]]]]), torch.tensor([[[[1, 0], [2, 0]]]]), {1}, {2}
    )
    lines = format_metrics(panoptic, class_names=["person", "grass"]).splitlines()
    assert lines[0].split() == ["class", "pq_per_class", "sq_per_class", "rq_per_class"]
    assert lines[2].split() == ["person", "1.0000", "1.0000", "1.0000"]


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(TypeError, match="results must be a mapping"):
        format_metrics([0.5])
    with pytest.raises(TypeError, match=r"results\['AP'\] must be a number"):
        format_metrics({"AP": "high"})
    with pytest.raises(ValueError, match="one length"):
        format_metrics({"iou": [0.5, 0.5], "pq": [1.0]})
    with pytest.raises(ValueError, match="class_names must hold 2 names, got 1"):
        format_metrics({"iou": [0.5, 0.5]}, class_names=["a"])
    with pytest.raises(ValueError, match="no numbers"):
        format_metrics({"confusion": torch.eye(2)})
    with pytest.raises(ValueError, match="digits"):
        format_metrics({"AP": 0.5}, digits=-1)
