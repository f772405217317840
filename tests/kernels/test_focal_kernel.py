"""The fused sigmoid focal loss kernel against the torch path, forward and backward.

Runs on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (set by tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import _NO_TRITON, _TRITON_RUNNABLE
from tests.helpers import assert_close, gradcheck
from visionblocks.losses.focal import sigmoid_focal_loss

if not _TRITON_RUNNABLE:
    pytest.skip(_NO_TRITON, allow_module_level=True)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = [(1, 1), (11, 93), (17, 241)]  # 1, 1023, 4097 elements
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run(impl: str, x: torch.Tensor, targets: torch.Tensor, grad_out_seed: int = 0, **kwargs):
    """Value and input gradient for an upstream gradient shared by both implementations."""
    x = x.detach().clone().requires_grad_(True)
    out = sigmoid_focal_loss(x, targets, impl=impl, **kwargs)
    gen = torch.Generator().manual_seed(grad_out_seed)
    grad_out = torch.randn(out.shape, generator=gen).to(device=out.device, dtype=out.dtype)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    return out, grad


def make_targets(shape, kind: str, dtype: torch.dtype):
    rows, num_classes = shape
    labels = torch.randint(-1, num_classes + 1, (rows,), device=DEVICE)  # -1 and C included
    if kind == "index":
        return labels
    soft = torch.rand(shape, device=DEVICE)
    onehot = (labels.unsqueeze(1) == torch.arange(num_classes, device=DEVICE)).float()
    soft[: rows // 2] = onehot[: rows // 2]  # half binary, half soft
    soft[labels == -1, 0] = -1.0  # marked as ignored when ignore_index=-1
    return soft.to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["float", "index"])
def test_kernel_matches_torch_path(shape, dtype, kind):
    x = (torch.randn(shape, device=DEVICE) * 4).to(dtype)
    targets = make_targets(shape, kind, dtype)
    weights = [None, torch.rand(shape[1], device=DEVICE), torch.rand(shape[0], 1, device=DEVICE)]
    cases = [
        {"reduction": "none", "ignore_index": -1},
        {"reduction": "mean", "ignore_index": -1, "weight": weights[1]},
        {"reduction": "sum", "ignore_index": -1, "weight": weights[2], "alpha": None},
        {"reduction": "mean", "gamma": 0.5, "alpha": 0.75, "weight": weights[2]},
        {"reduction": "none", "gamma": 0.0, "weight": weights[1], "normalizer": 3.0},
    ]
    if kind == "float":  # no ignore_index: targets of -1 are not valid soft targets
        cases = [c for c in cases if "ignore_index" in c]
    for kwargs in cases:
        expected, expected_grad = run("torch", x, targets, **kwargs)
        actual, grad = run("triton", x, targets, **kwargs)
        assert actual.dtype == expected.dtype and grad.dtype == dtype
        assert_close(actual, expected, dtype=dtype)
        assert_close(grad, expected_grad, dtype=dtype)


def test_kernel_expanded_weight_and_non_contiguous():
    x = torch.randn(9, 30, device=DEVICE).t()  # (30, 9), non-contiguous
    labels = torch.randint(0, 10, (30,), device=DEVICE)
    weight = torch.rand(1, 9, device=DEVICE).expand(30, 9)  # stride 0 rows
    for reduction in ("none", "sum"):
        expected, expected_grad = run("torch", x, labels, reduction=reduction, weight=weight)
        actual, grad = run("triton", x, labels, reduction=reduction, weight=weight)
        assert_close(actual, expected)
        assert_close(grad, expected_grad)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
def test_kernel_extreme_logits(gamma):
    x = torch.tensor([[1e4, -1e4, 1e4, -1e4, 30.0, -30.0]], device=DEVICE)
    t = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0]], device=DEVICE)
    for targets in (t, torch.tensor([0], device=DEVICE)):
        expected, expected_grad = run("torch", x, targets, gamma=gamma)
        actual, grad = run("triton", x, targets, gamma=gamma)
        assert torch.isfinite(actual).all() and torch.isfinite(grad).all()
        assert_close(actual, expected)
        assert_close(grad, expected_grad)


def test_kernel_empty_and_all_ignored():
    x = torch.randn(0, 4, device=DEVICE, requires_grad=True)
    loss = sigmoid_focal_loss(x, torch.zeros(0, 4, device=DEVICE), reduction="mean", impl="triton")
    loss.backward()
    assert loss.item() == 0 and x.grad.shape == (0, 4)
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    labels = torch.full((3,), -1, device=DEVICE)
    loss = sigmoid_focal_loss(x, labels, reduction="mean", ignore_index=-1, impl="triton")
    loss.backward()
    assert loss.item() == 0 and torch.all(x.grad == 0)


def test_kernel_gradcheck_float64():
    labels = torch.tensor([0, 2, -1], device=DEVICE)
    weight = torch.rand(3, device=DEVICE, dtype=torch.float64)
    t = torch.rand(3, 3, device=DEVICE, dtype=torch.float64)
    x = torch.randn(3, 3, device=DEVICE)
    gradcheck(
        lambda x: sigmoid_focal_loss(
            x, labels, 0.25, 1.5, "none", weight=weight, ignore_index=-1, impl="triton"
        ),
        [x],
    )
    gradcheck(lambda x: sigmoid_focal_loss(x, t, 0.25, 2.0, "sum", impl="triton"), [x])
