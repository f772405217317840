"""TorchScript of the box ops and the IoU losses.

``torch.jit.script`` compiles the same formula the eager functions run (their input checks sit
under ``if not torch.jit.is_scripting()``): the scripted results must equal the eager ones
exactly, and torchvision's scripted ops on valid boxes up to its ``eps``.
"""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from torch import Tensor, nn

from visionblocks.losses import iou as L
from visionblocks.ops import boxes as B

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning")

IOU_NAMES = ["box_iou", "generalized_box_iou", "distance_box_iou", "complete_box_iou"]
LOSS_NAMES = ["generalized_box_iou_loss", "distance_box_iou_loss", "complete_box_iou_loss"]
_SCRIPTED: dict[str, object] = {}


def scripted(module, name: str):
    key = f"{module.__name__}.{name}"
    if key not in _SCRIPTED:
        _SCRIPTED[key] = torch.jit.script(getattr(module, name))
    return _SCRIPTED[key]


def boxes_with_degenerates(*shape: int, dtype=torch.float32, scale: float = 10.0) -> Tensor:
    """Random ``"xyxy"`` boxes; along the last box dim: zero-width, zero-height, point boxes."""
    g = torch.Generator().manual_seed(hash((shape, scale)) % 2**31)
    xy = torch.rand(*shape, 2, generator=g, dtype=torch.float64) * scale
    wh = torch.rand(*shape, 2, generator=g, dtype=torch.float64) * scale / 2
    n = shape[-1]
    if n > 3:
        wh[..., 0, 0] = 0  # zero width
        wh[..., 1, 1] = 0  # zero height
        wh[..., 2, :] = 0  # a point
    return torch.cat([xy, xy + wh], -1).to(dtype)


def close(eager: Tensor, script: Tensor, exact: bool) -> None:
    assert script.dtype == eager.dtype and script.shape == eager.shape
    if exact:  # NaN (eps = 0) in the same places
        torch.testing.assert_close(script, eager, rtol=0, atol=0, equal_nan=True)
    else:
        tol = 1e-6 if eager.dtype == torch.float32 else 1e-13
        torch.testing.assert_close(script, eager, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [*IOU_NAMES, "box_area", "box_convert"])
def test_scripts(name):
    fn = scripted(B, name)
    assert isinstance(fn, torch.jit.ScriptFunction)


@pytest.mark.parametrize("name", IOU_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [10.0, 2e-4, 1e-15, 1e15])
@pytest.mark.parametrize("shapes", [((7,), (5,)), ((2, 6), (6,)), ((3, 1, 4), (2, 5))])
def test_pairwise_equals_eager(name, dtype, scale, shapes):
    a = boxes_with_degenerates(*shapes[0], dtype=dtype, scale=scale)
    b = boxes_with_degenerates(*shapes[1], dtype=dtype, scale=scale)
    b[..., 4:5, :] = a[..., 4:5, :] if a.dim() == 2 else b[..., 4:5, :]  # identical boxes
    eager = getattr(B, name)(a, b)
    close(eager, scripted(B, name)(a, b), exact=True)


@pytest.mark.parametrize("name", IOU_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [10.0, 1e-15, 1e15])
@pytest.mark.parametrize("shapes", [((9,), (9,)), ((2, 6), (6,)), ((3, 1, 5), (2, 5))])
def test_aligned_equals_eager(name, dtype, scale, shapes):
    a = boxes_with_degenerates(*shapes[0], dtype=dtype, scale=scale)
    b = boxes_with_degenerates(*shapes[1], dtype=dtype, scale=scale)
    eager = getattr(B, name)(a, b, aligned=True, eps=1e-6)
    script = scripted(B, name)(a, b, aligned=True, eps=1e-6)
    close(eager, script, exact=True)


@pytest.mark.parametrize("name", IOU_NAMES)
def test_degenerate_values(name):
    fn = scripted(B, name)
    box = torch.tensor([[0.3, 0.3, 0.3002, 0.3002], [1e3, 1e3, 3e3, 2e3]])
    assert torch.equal(fn(box, box, True), torch.ones(2))  # identical: exactly 1
    assert torch.equal(fn(box, box), getattr(B, name)(box, box))
    flat = torch.tensor([[1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 2.0, 2.0]])  # zero-area
    assert torch.equal(scripted(B, "box_iou")(flat, flat, True), torch.zeros(2))
    assert torch.isfinite(fn(flat, flat)).all()
    disjoint = torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([[5.0, 5.0, 6.0, 6.0]])
    assert torch.equal(fn(*disjoint), getattr(B, name)(*disjoint))
    inverted = torch.tensor([[2.0, 2.0, 1.0, 3.0]]), torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    assert torch.equal(fn(*inverted), getattr(B, name)(*inverted))
    empty = torch.zeros(0, 4)
    assert fn(empty, box).shape == (0, 2)


@pytest.mark.parametrize("name", IOU_NAMES)
def test_dtypes_and_eps_match_eager(name):
    fn, eager = scripted(B, name), getattr(B, name)
    a = boxes_with_degenerates(6, dtype=torch.float64)
    for x in (a.half(), a.bfloat16(), (a * 10).long(), (a * 10).to(torch.uint8)):
        close(eager(x, x), fn(x, x), exact=True)
    mixed = fn(a.float(), a)
    assert mixed.dtype == torch.float64
    close(eager(a, a, eps=0.0), fn(a, a, False, 0.0), exact=True)  # NaN where 0 / 0


@pytest.mark.parametrize("name", IOU_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torchvision_scripted(name, dtype):
    a = boxes_with_degenerates(8, 3, dtype=dtype)[..., 0, :]  # valid boxes of positive area
    b = boxes_with_degenerates(6, 3, dtype=dtype)[..., 0, :] + 1
    a[..., 2:] += 0.5
    b[..., 2:] += 0.5
    ours = scripted(B, name)(a, b)
    theirs = torch.jit.script(getattr(tvo, name))(a, b)
    tol = 1e-5 if dtype == torch.float32 else 1e-6  # torchvision adds eps=1e-7 everywhere
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)


def test_box_convert_and_area_equal_eager():
    conv, area = scripted(B, "box_convert"), scripted(B, "box_area")
    a = boxes_with_degenerates(3, 6)
    tv_conv = torch.jit.script(tvo.box_convert)
    for x in (a, (a * 10).long(), a.double()):
        for i in B.BOX_FORMATS:
            for o in B.BOX_FORMATS:
                close(B.box_convert(x, i, o), conv(x, i, o), exact=True)
                if x.is_floating_point():
                    close(tv_conv(x, i, o), conv(x, i, o), exact=True)
    for x in (a, a.half(), (a * 10).to(torch.uint8), (a * 10).long()):
        close(B.box_area(x), area(x), exact=True)
    torch.testing.assert_close(area(a), torch.jit.script(tvo.box_area)(a))
    with pytest.raises(torch.jit.Error, match="box formats must be"):
        conv(a, "xyxy", "yxyx")


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    ("dtype", "scale"),
    [(torch.float16, 10.0)]
    + [(d, s) for d in (torch.float32, torch.float64) for s in (10.0, 1e-15, 1e15)],
)
def test_losses_equal_eager(name, dtype, reduction, scale):
    pred = boxes_with_degenerates(3, 7, dtype=dtype, scale=scale)
    target = boxes_with_degenerates(3, 7, dtype=dtype, scale=scale * 0.9)
    target[0, 4] = pred[0, 4]  # identical: loss exactly 0
    eager = getattr(L, name)(pred, target, reduction)
    script = scripted(L, name)(pred, target, reduction)
    close(eager, script, exact=True)
    if reduction == "none":
        assert script[0, 4] == 0


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_losses_match_torchvision_scripted_and_reject_triton(name):
    pred = boxes_with_degenerates(10, dtype=torch.float64)[4:]
    target = boxes_with_degenerates(10, dtype=torch.float64)[4:] + 0.5
    fn = scripted(L, name)
    theirs = torch.jit.script(getattr(tvo, name))(pred, target, "mean", 1e-7)
    torch.testing.assert_close(fn(pred, target, "mean"), theirs, rtol=1e-6, atol=1e-6)
    with pytest.raises(torch.jit.Error, match="impl must be 'auto' or 'torch'"):
        fn(pred, target, "mean", 1e-7, "triton")
    with pytest.raises(torch.jit.Error, match="reduction must be"):
        fn(pred, target, "avg")


def test_losses_gradients_finite_and_equal_to_eager():
    pred = boxes_with_degenerates(9, dtype=torch.float64).requires_grad_()
    target = boxes_with_degenerates(9, dtype=torch.float64, scale=8.0)
    for name in LOSS_NAMES:
        (g_script,) = torch.autograd.grad(scripted(L, name)(pred, target, "sum"), pred)
        (g_eager,) = torch.autograd.grad(getattr(L, name)(pred, target, "sum"), pred)
        assert torch.isfinite(g_script).all()
        torch.testing.assert_close(g_script, g_eager, rtol=0, atol=0)


class _Matcher(nn.Module):
    """A scripted module calling the scripted functions from its forward."""

    def forward(self, pred: Tensor, gt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        iou = B.box_iou(pred, gt)
        giou = B.generalized_box_iou(pred, gt, aligned=False)
        cx = B.box_convert(gt, "xyxy", "cxcywh")
        loss = L.complete_box_iou_loss(pred[: gt.shape[0]], gt, reduction="sum")
        return iou + giou + B.complete_box_iou(pred, gt, False, 1e-7), cx, loss


def test_called_from_scripted_module():
    module = torch.jit.script(_Matcher())
    pred, gt = boxes_with_degenerates(6), boxes_with_degenerates(4) + 1
    out, cx, loss = module(pred, gt)
    ref = B.box_iou(pred, gt) + B.generalized_box_iou(pred, gt) + B.complete_box_iou(pred, gt)
    torch.testing.assert_close(out, ref)
    assert torch.equal(cx, B.box_convert(gt, "xyxy", "cxcywh"))
    torch.testing.assert_close(loss, L.complete_box_iou_loss(pred[:4], gt, reduction="sum"))
