"""`clip_boxes_to_image` and `remove_small_boxes` against torchvision's."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo

from visionblocks.ops import clip_boxes_to_image, remove_small_boxes


def _boxes(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 40 - 10
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g) * 8], 1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_clip_equals_torchvision(dtype):
    boxes = _boxes(30, dtype).view(3, 10, 4)
    out = clip_boxes_to_image(boxes, (20, 25))
    assert out.dtype == dtype and torch.equal(out, tvo.clip_boxes_to_image(boxes, (20, 25)))
    assert out[..., 0::2].max() <= 25 and out[..., 1::2].max() <= 20 and out.min() >= 0


def test_clip_gradient_equals_torchvision():
    boxes = _boxes(20).requires_grad_()
    seed = torch.randn(20, 4)
    (grad,) = torch.autograd.grad(clip_boxes_to_image(boxes, (20, 25)), boxes, seed)
    (peer,) = torch.autograd.grad(tvo.clip_boxes_to_image(boxes, (20, 25)), boxes, seed)
    assert torch.equal(grad, peer)


@pytest.mark.parametrize("min_size", [0.0, 3.0, 6.5, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_remove_small_equals_torchvision(min_size, dtype):
    boxes = _boxes(60, dtype, seed=1)
    boxes[5] = boxes[5, [2, 3, 0, 1]]  # inverted: negative sides
    keep = remove_small_boxes(boxes, min_size)
    assert keep.dtype == torch.int64
    assert torch.equal(keep, tvo.remove_small_boxes(boxes, min_size))
    sides = (boxes[keep, 2:] - boxes[keep, :2]).float()
    assert (sides >= min_size).all() and 5 not in keep.tolist()


def test_script_and_compile():
    boxes = _boxes(12)
    clip = torch.jit.script(clip_boxes_to_image)
    small = torch.jit.script(remove_small_boxes)
    assert torch.equal(clip(boxes, (20, 25)), clip_boxes_to_image(boxes, (20, 25)))
    assert torch.equal(small(boxes, 3.0), remove_small_boxes(boxes, 3.0))
    compiled = torch.compile(clip_boxes_to_image, fullgraph=True, backend="eager")
    assert torch.equal(compiled(boxes, (20, 25)), clip_boxes_to_image(boxes, (20, 25)))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: clip_boxes_to_image(torch.zeros(3, 5), (4, 4)), ValueError, "boxes"),
        (lambda: clip_boxes_to_image(torch.zeros(3, 4), (4, 4, 4)), ValueError, "size"),
        (lambda: clip_boxes_to_image(torch.zeros(3, 4), (4.0, 4)), TypeError, "size"),
        (lambda: clip_boxes_to_image(torch.zeros(3, 4), (-1, 4)), ValueError, "size"),
        (lambda: remove_small_boxes(torch.zeros(2, 3, 4), 1.0), ValueError, r"\(N, 4\)"),
        (lambda: remove_small_boxes(torch.zeros(3, 4), "1"), TypeError, "min_size"),
        (lambda: remove_small_boxes(torch.zeros(3, 4), float("nan")), ValueError, "min_size"),
        (lambda: remove_small_boxes(torch.zeros(3, 4, device="meta"), 1.0), ValueError, "meta"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
