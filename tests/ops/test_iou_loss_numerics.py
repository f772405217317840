"""GIoU / DIoU / CIoU losses: the coordinate range, no host reads, the eps rule in half
precision."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close
from tests.ops.test_iou_loss import LOSSES
from visionblocks.losses.iou import generalized_box_iou_loss

# --- the coordinate range, devices, values ------------------------------------------------------

FNS = [fn for fn, _, _ in LOSSES.values()]
FN_IDS = list(LOSSES)


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
@pytest.mark.parametrize("scale", [1e15, 1e-15])
def test_scaled_boxes_give_exact_losses_and_gradients(fn, scale, impl):
    # Scale invariance inside the documented float32 range (no rescaling is done).
    pred = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0], [0.5, 1.0, 4.0, 1.5]])
    target = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0], [1.0, 0.5, 2.0, 3.0]])
    small = pred.clone().requires_grad_(True)
    expected = fn(small, target, impl=impl)
    expected.sum().backward()
    scaled = (pred * scale).requires_grad_(True)
    out = fn(scaled, target * scale, impl=impl)
    out.sum().backward()
    assert out[0].item() == 0.0  # identical boxes: IoU 1, no penalty
    assert_close(out, expected)
    assert_close(scaled.grad * scale, small.grad)  # d/dx scales by 1/scale


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_loss_inputs_on_different_devices_raise(fn):
    with pytest.raises(ValueError, match="pred and target must be on the same device"):
        fn(torch.zeros(2, 4), torch.zeros(2, 4, device="meta"))


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
def test_non_finite_boxes_give_nan(fn, monkeypatch):
    # NaN and inf are not refused (the range check is about finite coordinates): NaN, as in
    # torchvision. With value checks off nothing is read on the host.
    import visionblocks

    def no_read(*args, **kwargs):
        raise AssertionError("a host read")

    target = torch.tensor([[0.0, 0.0, 1.0, float("nan")], [0.0, 0.0, 1.0, 1.0]])
    pred = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, float("inf")]])
    assert torch.isnan(fn(pred, target)).all()
    for name in ("item", "tolist", "__bool__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, no_read)
    with visionblocks.value_checks(False):
        out = fn(pred, target)
    monkeypatch.undo()
    assert torch.isnan(out).all()
    assert fn(torch.zeros(0, 4, device="meta"), torch.zeros(0, 4, device="meta")).shape == (0,)


# --- the eps rule, half precision, reproducibility (issue 14) ---------------------------------


@pytest.mark.parametrize("fn", FNS, ids=FN_IDS)
@pytest.mark.parametrize("scale", [1e-15, 2e-4, 1.0, 1e15])
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
