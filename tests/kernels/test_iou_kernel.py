"""Triton GIoU / DIoU / CIoU kernels against the torch path: forward and backward, odd sizes."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close
from visionblocks._core.dispatch import use_triton
from visionblocks.losses.iou import (
    complete_box_iou_loss,
    distance_box_iou_loss,
    generalized_box_iou_loss,
)

RUNNABLE = _TRITON_RUNNABLE
pytestmark = pytest.mark.skipif(not RUNNABLE, reason=_NO_TRITON)

FUNCTIONS = {
    "generalized_box_iou_loss": generalized_box_iou_loss,
    "distance_box_iou_loss": distance_box_iou_loss,
    "complete_box_iou_loss": complete_box_iou_loss,
}


def random_pairs(n: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid pairs: a third overlapping jitters; some zero-width preds, zero-height targets."""
    gen = torch.Generator().manual_seed(n)
    xy = torch.rand(2, n, 2, generator=gen) * 20
    boxes = torch.cat([xy, xy + torch.rand(2, n, 2, generator=gen) * 8 + 0.5], -1)
    pred, target = boxes[0], boxes[1]
    k = n // 3
    jitter = pred[:k] + torch.randn(k, 4, generator=gen)
    target[:k] = torch.cat(
        [jitter[:, :2].minimum(jitter[:, 2:]), jitter[:, :2].maximum(jitter[:, 2:])], 1
    )
    pred[1::7, 2] = pred[1::7, 0]
    target[2::11, 3] = target[2::11, 1]
    return pred.to(device, dtype), target.to(device, dtype)


def run(fn, pred, target, grad_out, impl, **kwargs):
    pred = pred.clone().requires_grad_(True)
    target = target.clone().requires_grad_(True)
    loss = fn(pred, target, impl=impl, **kwargs)
    grads = torch.autograd.grad(loss, (pred, target), grad_out.to(loss.dtype))
    return (loss, *grads)


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1023, 4097])
def test_kernel_matches_torch_forward_and_backward(op, dtype, n, device):
    fn = FUNCTIONS[op]
    pred, target = random_pairs(n, dtype, str(device))
    grad_out = torch.rand(n, device=device)
    expected = run(fn, pred, target, grad_out, "torch")
    actual = run(fn, pred, target, grad_out, "triton")
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        assert_close(a, e, dtype=dtype)


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_kernel_float64_and_reductions(op, device):
    fn = FUNCTIONS[op]
    pred, target = random_pairs(257, torch.float64, str(device))
    for reduction in ("sum", "mean"):
        expected = run(fn, pred, target, torch.tensor(1.0), "torch", reduction=reduction)
        actual = run(fn, pred, target, torch.tensor(1.0), "triton", reduction=reduction)
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e)


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_kernel_degenerate_boxes_finite(op, device):
    fn = FUNCTIONS[op]
    pred = torch.tensor(
        [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.5, 1.5, 1.5, 1.5]],
        device=device,
    )
    target = torch.tensor(
        [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 2.0, 2.0]],
        device=device,
    )
    grad_out = torch.ones(4, device=device)
    actual = run(fn, pred, target, grad_out, "triton")
    expected = run(fn, pred, target, grad_out, "torch")
    for a, e in zip(actual, expected, strict=True):
        assert torch.isfinite(a).all()
        assert_close(a, e)


def test_kernel_grad_for_one_input_only(device):
    pred, target = random_pairs(100, torch.float32, str(device))
    pred.requires_grad_(True)
    (gp,) = torch.autograd.grad(complete_box_iou_loss(pred, target, "sum", impl="triton"), pred)
    (ep,) = torch.autograd.grad(complete_box_iou_loss(pred, target, "sum", impl="torch"), pred)
    assert_close(gp, ep)
    pred = pred.detach()
    target.requires_grad_(True)
    (gt,) = torch.autograd.grad(distance_box_iou_loss(pred, target, "sum", impl="triton"), target)
    (et,) = torch.autograd.grad(distance_box_iou_loss(pred, target, "sum", impl="torch"), target)
    assert_close(gt, et)


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_auto_is_torch_on_cpu_and_triton_runs_in_the_interpreter(op):
    cpu = torch.zeros(1, 4)
    assert not use_triton(op, "auto", cpu, cpu)
    assert use_triton(op, "triton", cpu, cpu)


def test_kernel_is_called_for_triton(monkeypatch):
    from visionblocks.kernels import iou as iou_kernels

    calls = []
    real = iou_kernels.generalized_box_iou_loss_triton

    def spy(pred, target, eps, reference=None):
        calls.append((pred.shape, eps))
        return real(pred, target, eps, reference=reference)

    monkeypatch.setattr("visionblocks.kernels.iou.generalized_box_iou_loss_triton", spy)
    pred, target = random_pairs(6, torch.float32, "cpu")
    generalized_box_iou_loss(pred.view(2, 3, 4), target.view(2, 3, 4), eps=1e-6, impl="triton")
    assert calls == [(torch.Size([6, 4]), 1e-6)]
