"""Conformance specs: `visionblocks.metrics` (`SegmentationMetrics`, `panoptic_quality`,
`format_metrics`)."""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec
from visionblocks import metrics


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _update() -> tuple[object, dict[str, object]]:
    metric = metrics.SegmentationMetrics(4, ignore_index=255)

    def update_then_compute(preds: torch.Tensor, target: torch.Tensor) -> dict:
        metric.reset()
        metric.update(preds, target)
        return metric.compute()

    target = torch.randint(0, 4, (2, 5, 6), generator=_gen())
    target[0, 0] = 255
    return update_then_compute, {
        "preds": torch.randn(2, 4, 5, 6, generator=_gen()),
        "target": target,
    }


def _panoptic() -> tuple[object, dict[str, object]]:
    category = torch.tensor([1, 2, 7])[torch.randint(0, 3, (2, 6, 5), generator=_gen())]
    target = torch.stack((category, torch.randint(0, 2, (2, 6, 5), generator=_gen())), -1)
    preds = target.clone()
    preds[:, :2, :, 1] = 3
    return metrics.panoptic_quality, {
        "preds": preds, "target": target, "things": [1, 2], "stuffs": [7],
        "allow_unknown_preds_category": False,
    }  # fmt: skip


def _table() -> tuple[object, dict[str, object]]:
    result = {"iou": torch.tensor([0.5, 0.25]), "miou": torch.tensor(0.375), "AP": 0.5}
    return metrics.format_metrics, {"results": result, "class_names": ["a", "b"], "digits": 3}


# fmt: off
SPECS = [
    # a negative ignore_index (-1, -100) is common; 0 classes is refused, 10**9 too (K * K)
    Spec(metrics.SegmentationMetrics, lambda: (metrics.SegmentationMetrics,
                                               {"num_classes": 3, "ignore_index": 255}),
         args=[Arg("num_classes", "int"),
               Arg("ignore_index", "int", optional=True, accept={"negative", "zero", "huge"})]),
    # logits (B, K, H, W) and indices (B, H, W): update, then compute
    Spec(metrics.SegmentationMetrics, _update, label="update",
         args=[Arg("preds", "tensor"), Arg("target", "int_tensor")],
         equivalences=("noncontiguous", "channels_last")),
    # duplicate category ids are harmless (a set), as in torchmetrics
    Spec(metrics.panoptic_quality, _panoptic,
         args=[Arg("preds", "int_tensor"), Arg("target", "int_tensor"),
               Arg("things", "sequence", accept={"longer"}),
               Arg("stuffs", "sequence", accept={"longer"}),
               Arg("allow_unknown_preds_category", "bool")],
         equivalences=("noncontiguous",)),
    Spec(metrics.format_metrics, _table,
         args=[Arg("results", "mapping"), Arg("class_names", "sequence", optional=True),
               Arg("digits", "int", accept={"zero"})]),
]
# fmt: on
