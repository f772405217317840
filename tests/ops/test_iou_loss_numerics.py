"""GIoU / DIoU / CIoU losses: huge and tiny boxes, value checks, the eps rule in half
precision, reproducible sums, and the GPU layout of the torch path (run on the CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close
from tests.ops.test_iou_loss import LOSSES, loss_and_grads, random_pairs, reference
from visionblocks.ops import _iou_core, _iou_loss_torch
from visionblocks.ops.iou_loss import generalized_box_iou_loss

# --- huge coordinates, devices and value checks (issue 19) ------------------------------------

FNS = [fn for fn, _, _ in LOSSES.values()]
FN_IDS = list(LOSSES)


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
@pytest.mark.parametrize("offset", [1e19, 3e37])
def test_huge_boxes_give_exact_losses_and_gradients(fn, offset):
    pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0], [0.5, 1.0, 4.0, 1.5]])
    target = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0], [1.0, 0.5, 2.0, 3.0]])
    small = pred.clone().requires_grad_(True)
    expected = fn(small, target)
    expected.sum().backward()
    huge = (pred * offset).requires_grad_(True)
    out = fn(huge, target * offset)
    out.sum().backward()
    assert out[0].item() == 0.0  # identical boxes: IoU 1, no penalty
    assert_close(out, expected)
    assert_close(huge.grad * offset, small.grad)  # scale invariance: d/dx scales by 1/offset


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_loss_inputs_on_different_devices_raise(fn):
    with pytest.raises(ValueError, match="pred and target must be on the same device"):
        fn(torch.zeros(2, 4), torch.zeros(2, 4, device="meta"))


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_non_finite_target_raises_but_pred_may_overflow(fn):
    target = torch.tensor([[0.0, 0.0, 1.0, float("nan")]])
    with pytest.raises(ValueError, match="target must hold finite box coordinates"):
        fn(torch.zeros(1, 4), target)
    pred = torch.tensor([[0.0, 0.0, 1.0, float("inf")]])  # mixed precision: the scaler's job
    assert torch.isnan(fn(pred, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))).all()


# --- the eps rule, half precision, reproducibility (issue 14) ---------------------------------


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
@pytest.mark.parametrize("scale", [1e-30, 2e-4, 1.0, 1e30])
def test_identical_boxes_give_zero_loss_at_every_scale(fn, scale, impl):
    boxes = torch.tensor([[0.5, 0.5, 0.7, 0.9], [0.0, 0.0, 1.0, 1.0], [0.3, 0.3, 0.3002, 0.3002]])
    boxes = boxes * scale
    assert torch.equal(fn(boxes, boxes.clone(), impl=impl), torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_half_zero_width_line_gradients_are_finite(fn, dtype, impl):
    # Collinear zero-width boxes: gradients of about 1/eps in float32, clamped to the half range.
    pred = torch.tensor(
        [[1.0, 0.0, 1.0, 2.0], [2.0, 0.0, 2.0, 2.0]], dtype=dtype, requires_grad=True
    )
    target = torch.tensor(
        [[1.0, 1.0, 1.0, 3.0], [2.0, 0.5, 2.0, 1.0]], dtype=dtype, requires_grad=True
    )
    loss = fn(pred, target, reduction="sum", impl=impl)
    grads = torch.autograd.grad(loss, (pred, target))
    for g in grads:
        assert g.dtype == dtype and torch.isfinite(g).all()
    if fn is generalized_box_iou_loss and dtype == torch.float16:
        assert grads[0].abs().max() == torch.finfo(dtype).max


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_sums_do_not_depend_on_the_thread_count(fn, monkeypatch):
    monkeypatch.setattr(_iou_loss_torch, "_PIECE", 64)  # several parts
    pred, target = random_pairs(3000)
    pred.requires_grad_(True)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            loss = fn(pred, target, reduction="sum", impl="torch")
            results.append((loss, *torch.autograd.grad(loss * 2, pred)))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(other, results[0], strict=True):
            assert torch.equal(a, b)
    assert_close(results[0][0], fn(pred, target, impl="torch").sum())


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_gpu_layout_on_the_cpu(name, reduction, monkeypatch):
    # Whole-tensor pieces with fresh buffers, as on GPUs (without a GPU: the layout only).
    monkeypatch.setattr(_iou_core, "on_cpu", lambda device: False)
    monkeypatch.setattr(_iou_loss_torch, "_CUDA_PIECE", 50)  # several pieces
    pred, target = random_pairs(120, torch.float64)
    actual = loss_and_grads(LOSSES[name][0], pred, target, reduction=reduction, impl="torch")
    expected = loss_and_grads(reference(name), pred, target, reduction=reduction)
    for a, e in zip(actual, expected, strict=True):
        assert_close(a, e)
