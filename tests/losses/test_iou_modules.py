"""GeneralizedBoxIoULoss / DistanceBoxIoULoss / CompleteBoxIoULoss: agree with the functions,
registry, repr, errors."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close
from visionblocks.losses.iou import (
    CompleteBoxIoULoss,
    DistanceBoxIoULoss,
    GeneralizedBoxIoULoss,
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)
from visionblocks.registry import LOSSES

MODULES = [
    ("giou", GeneralizedBoxIoULoss, generalized_box_iou_loss),
    ("diou", DistanceBoxIoULoss, distance_box_iou_loss),
    ("ciou", CompleteBoxIoULoss, complete_box_iou_loss),
]


def boxes(n: int) -> torch.Tensor:
    xy = torch.rand(n, 2) * 10
    return torch.cat([xy, xy + torch.rand(n, 2) * 5 + 0.5], 1)


@pytest.mark.parametrize(("name", "cls", "fn"), MODULES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_module_equals_function(name, cls, fn, reduction, impl):
    pred, target = boxes(33), boxes(33)
    pred.requires_grad_(True)
    module = cls(reduction=reduction, eps=1e-6, impl=impl)
    out = module(pred, target)
    expected = fn(pred, target, reduction, 1e-6, impl=impl)
    assert_close(out, expected)
    (g1,) = torch.autograd.grad(out.sum(), pred)
    (g2,) = torch.autograd.grad(expected.sum(), pred)
    assert_close(g1, g2)


@pytest.mark.parametrize(("name", "cls", "fn"), MODULES)
def test_registry_entries_and_build(name, cls, fn):
    assert name in LOSSES
    assert LOSSES.get(name) is cls
    assert LOSSES.get(fn.__name__.removesuffix("_loss")) is cls  # generalized_box_iou, ...
    assert cls.__name__.lower() == fn.__name__.replace("_", "")  # the function's stem
    built = LOSSES.build({"type": name, "reduction": "sum"})
    assert isinstance(built, cls) and built.reduction == "sum"
    assert cls().reduction == "mean"  # torch loss-module default


@pytest.mark.parametrize(("name", "cls", "fn"), MODULES)
def test_extra_repr(name, cls, fn):
    assert repr(cls(reduction="none", eps=1e-5)) == f"{cls.__name__}(reduction='none', eps=1e-05)"


def test_forward_validates_inputs():
    with pytest.raises(ValueError, match="must have the same shape"):
        GeneralizedBoxIoULoss()(boxes(3), boxes(4))
