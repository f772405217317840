"""``ignore_index`` against narrow integer targets: compared exactly, never wrapped.

torch compares a Python int with a ``uint8``/``int8`` tensor in the tensor's dtype, so
``target == -100`` is True for 156 and ``target == 256`` for 0. A ``uint8`` mask never holds
-100: nothing is ignored, exactly as with the same values in int64.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close
from visionblocks._core.tensor_checks import exact_ignore
from visionblocks.losses import (
    binary_cross_entropy_with_logits,
    cross_entropy,
    dice_loss,
    lovasz_loss,
    sigmoid_focal_loss,
    softmax_focal_loss,
)
from visionblocks.metrics import SegmentationMetrics


def test_exact_ignore_keeps_only_representable_numbers():
    u8, i8 = torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.int8)
    assert exact_ignore(u8, -100) is None and exact_ignore(u8, 256) is None
    assert exact_ignore(u8, 255) == 255 and exact_ignore(i8, -1) == -1
    assert exact_ignore(i8, 255) is None and exact_ignore(torch.zeros(1), 255) == 255
    assert exact_ignore(torch.zeros(1, dtype=torch.long), 2**70) is None
    assert exact_ignore(u8, None) is None and exact_ignore(u8, 0.5) == 0.5


def test_segmentation_losses_do_not_wrap_ignore_index():
    # 156 is a class (COCO-Stuff has 171): -100, the usual ignore value, must not drop it
    target = torch.tensor([[156, 3, 156, 7]], dtype=torch.uint8)
    pred = torch.randn(1, 200, 4, generator=torch.Generator().manual_seed(0))
    for fn in (
        lambda t, i: dice_loss(pred, t, "multiclass", ignore_index=i),
        lambda t, i: lovasz_loss(pred, t, "multiclass", ignore_index=i),
        lambda t, i: cross_entropy(pred, t, ignore_index=i),
        lambda t, i: softmax_focal_loss(pred, t, ignore_index=i),
    ):
        assert_close(fn(target, -100), fn(target.long(), -100))
        assert_close(fn(target, 256), fn(target.long(), 256))  # 256 is not 0 either
        assert not torch.equal(fn(target, -100), fn(target, 156))


def test_int8_targets_with_an_unrepresentable_ignore_index_are_checked_in_full():
    # 255 does not fit int8: -1 is then an out-of-range class, not an ignored one
    logits, target = torch.zeros(2, 3), torch.tensor([0, -1], dtype=torch.int8)
    with pytest.raises(IndexError, match=r"equal ignore_index \(255\), got -1"):
        cross_entropy(logits, target, ignore_index=255)
    assert_close(
        cross_entropy(logits, target, ignore_index=-1),
        cross_entropy(logits, target.long(), ignore_index=-1),
    )


def test_binary_cross_entropy_does_not_wrap_ignore_index():
    inputs = torch.zeros(3)
    target = torch.tensor([1, 0, 0], dtype=torch.uint8)
    out = binary_cross_entropy_with_logits(inputs, target, ignore_index=256, reduction="none")
    assert (out > 0).all()  # 256 is no uint8 value: the class-0 elements count
    with pytest.raises(ValueError, match=r"targets must be in \[0, 1\].*255"):
        binary_cross_entropy_with_logits(
            inputs, torch.tensor([1, 0, 255], dtype=torch.uint8), ignore_index=-1
        )


def test_sigmoid_focal_class_indices_do_not_wrap_ignore_index():
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([156, 3, 156, 7], dtype=torch.uint8)
    expected = sigmoid_focal_loss(logits, target.long(), ignore_index=-100, reduction="sum")
    assert_close(sigmoid_focal_loss(logits, target, ignore_index=-100, reduction="sum"), expected)


def test_segmentation_metrics_do_not_wrap_ignore_index():
    target = torch.tensor([[156, 3, 156, 7]], dtype=torch.uint8)
    metrics = SegmentationMetrics(200, ignore_index=-100)
    metrics.update(target, target)
    assert metrics.confusion.sum().item() == 4  # all four pixels counted
    wide = SegmentationMetrics(200, ignore_index=-100)
    wide.update(target.long(), target.long())
    assert torch.equal(metrics.confusion, wide.confusion)
