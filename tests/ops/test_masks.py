"""Mask ops against their oracles: `paste_masks` = torchvision's ``paste_masks_in_image``,
`crop_masks` = ultralytics' ``crop_mask``, `mask_iou` = pycocotools' ``maskUtils.iou`` on
RLEs, `masks_to_boxes` = torchvision's ``masks_to_boxes`` plus one on the max corner; plus
chunking, memory, gradients, compile and fake CUDA."""

from __future__ import annotations

import math
import weakref

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.models.detection.roi_heads import paste_masks_in_image
from torchvision.ops import masks_to_boxes as tv_masks_to_boxes

import visionblocks.ops.masks as masks_module
from visionblocks.ops import crop_masks, mask_iou, masks_to_boxes, matrix_nms, paste_masks


def _boxes(n: int, height: int, width: int, seed: int, spill: float = 10.0) -> torch.Tensor:
    """Boxes over the image, some spilling past its edges by up to ``spill`` pixels."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * torch.tensor([width, height]) - spill
    wh = torch.rand(n, 2, generator=g) * torch.tensor([width, height]) / 2 + 0.3
    boxes = torch.cat((xy, xy + wh), 1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(-spill, width + spill)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(-spill, height + spill)
    return boxes


def _tv_paste(masks: torch.Tensor, boxes: torch.Tensor, size, padding: int = 1) -> torch.Tensor:
    return paste_masks_in_image(masks[:, None], boxes, size, padding=padding)[:, 0]


@pytest.mark.parametrize(
    ("m", "padding", "size"), [(28, 1, (97, 131)), (14, 0, (60, 40)), (7, 2, (33, 33))]
)
def test_paste_masks_matches_torchvision(m, padding, size):
    g = torch.Generator().manual_seed(m)
    masks = torch.rand(40, m, m, generator=g)
    # boxes inside the image or spilling by less than torchvision's slicing tolerates
    boxes = _boxes(40, *size, seed=m, spill=0.4)
    ours, ref = paste_masks(masks, boxes, size, padding), _tv_paste(masks, boxes, size, padding)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    assert torch.equal(ours > 0.5, ref > 0.5)
    # float64: the same indices and weights, so the same values up to float64 rounding
    ours64 = paste_masks(masks.double(), boxes, size, padding)
    torch.testing.assert_close(ours64, _tv_paste(masks.double(), boxes, size, padding))


def test_paste_masks_edge_boxes():
    """Degenerate, inverted, integer and identity-sized boxes; boxes wholly outside paste nothing."""
    masks = torch.rand(6, 8, 8, generator=torch.Generator().manual_seed(1))
    boxes = torch.tensor(
        [[3.0, 3.0, 3.0, 3.0], [5.0, 2.0, 4.0, 9.0], [0.0, 0.0, 8.0, 8.0], [2.0, 1.0, 11.0, 10.0],
         [0.0, 0.0, 15.9, 15.9], [1.5, 2.5, 2.5, 12.0]]
    )  # fmt: skip
    torch.testing.assert_close(
        paste_masks(masks, boxes, (16, 16)), _tv_paste(masks, boxes, (16, 16)), rtol=0, atol=1e-5
    )
    ints = boxes.long()
    assert torch.equal(
        paste_masks(masks, ints, (16, 16)), paste_masks(masks, ints.float(), (16, 16))
    )
    outside = torch.tensor([[20.0, 20.0, 30.0, 30.0], [-30.0, -30.0, -20.0, -20.0]])
    assert paste_masks(masks[:2], outside, (16, 16)).abs().sum() == 0
    empty = paste_masks(masks[:0], boxes[:0], (5, 7))
    assert empty.shape == (0, 5, 7) and empty.dtype == masks.dtype


def test_paste_masks_chunks_give_one_result(monkeypatch):
    masks = torch.rand(9, 6, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    boxes = _boxes(9, 20, 24, seed=2, spill=0.4)
    whole = paste_masks(masks, boxes, (20, 24))
    monkeypatch.setattr(masks_module, "_CHUNK_ELEMENTS", 1500)  # blocks of 2 instances
    assert torch.equal(paste_masks(masks, boxes, (20, 24)), whole)
    leaf = masks.clone().requires_grad_()
    chunked = paste_masks(leaf, boxes, (20, 24))  # recorded: written by copies
    assert torch.equal(chunked.detach(), whole)
    grad = torch.randn(
        chunked.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    chunked.backward(grad)
    ref_leaf = masks.clone().requires_grad_()
    _tv_paste(ref_leaf, boxes, (20, 24)).backward(grad)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)


def test_paste_masks_gradcheck():
    masks = torch.rand(3, 5, 5, dtype=torch.float64, requires_grad=True)
    boxes = torch.tensor([[1.0, 2.0, 9.0, 7.0], [0.0, 0.0, 3.0, 11.0], [4.2, 3.3, 8.8, 9.1]])
    assert torch.autograd.gradcheck(lambda m: paste_masks(m, boxes, (12, 10)), (masks,))


def test_paste_masks_dtypes_and_autocast():
    masks = torch.rand(4, 10, 10, generator=torch.Generator().manual_seed(4))
    boxes = _boxes(4, 30, 30, seed=4, spill=0.4)
    ref = paste_masks(masks, boxes, (30, 30))
    half = paste_masks(masks.bfloat16(), boxes.half(), (30, 30))
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), ref, rtol=0, atol=1e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(paste_masks(masks, boxes, (30, 30)), ref)


class _PeakMemory(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once among those created inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in self.seen or storage.nbytes() == 0:
                    continue
                self.seen.add(key)
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, key, storage.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes


def _peak(fn) -> int:
    with torch.no_grad(), _PeakMemory() as mode:
        result = fn()
        del result
    return mode.peak


def test_paste_masks_memory_is_the_output_plus_a_bounded_block():
    """Hundreds of instances: the peak is the output plus at most one block's work (the
    block holds ``_CHUNK_ELEMENTS`` numbers); torchvision's holds every pasted mask twice
    (the list and the stacked result)."""
    n, m, size = 300, 28, (120, 160)
    masks = torch.rand(n, m, m, generator=torch.Generator().manual_seed(5))
    boxes = _boxes(n, *size, seed=5, spill=0.4)
    output = n * size[0] * size[1] * 4
    block = masks_module._CHUNK_ELEMENTS * 4
    ours, theirs = (
        _peak(lambda: paste_masks(masks, boxes, size)),
        _peak(lambda: _tv_paste(masks, boxes, size)),
    )
    assert ours <= output + block, (ours, output)
    assert theirs >= 2 * output


def test_crop_masks_matches_ultralytics():
    ops = pytest.importorskip("ultralytics.utils.ops")
    g = torch.Generator().manual_seed(6)
    masks = torch.randn(12, 40, 56, generator=g)
    boxes = _boxes(12, 40, 56, seed=6)
    boxes[0] = torch.tensor([3.0, 4.0, 3.0, 9.0])  # empty
    boxes[1] = torch.tensor([-5.0, -5.0, 70.0, 50.0])  # whole mask
    boxes[2] = torch.tensor([2.0, 3.0, 7.0, 8.0])  # integer edges: x1 kept, x2 not
    before = masks.clone()
    ours = crop_masks(masks, boxes)
    assert torch.equal(masks, before)  # ultralytics' crops in place; ours returns a new tensor
    assert torch.equal(ours, ops.crop_mask(masks.clone(), boxes))
    for dtype in (torch.bool, torch.uint8, torch.float16):
        m = (masks > 0).to(dtype)
        assert torch.equal(crop_masks(m, boxes), ops.crop_mask(m.clone(), boxes))
    assert torch.equal(
        crop_masks(masks, boxes.round().long()), ops.crop_mask(masks.clone(), boxes.round())
    )


def test_crop_masks_non_finite_values_outside_give_nan_as_ultralytics():
    """The documented choice: masks times the box indicator, as ultralytics' ``crop_mask``,
    so an infinite or NaN value outside the box gives NaN (not a silent 0); finite values
    outside give 0, values inside are unchanged, a NaN box keeps nothing but non-finite
    values."""
    masks = torch.tensor([[[math.inf, -math.inf, 2.0], [math.nan, math.inf, 1.0]]] * 2)
    boxes = torch.tensor([[1.0, 1.0, 2.0, 2.0], [math.nan, 0.0, 3.0, 2.0]])
    nan = math.nan
    want = torch.tensor(
        [[[nan, nan, 0.0], [nan, math.inf, 0.0]], [[nan, nan, 0.0], [nan] * 2 + [0.0]]]
    )
    got = crop_masks(masks, boxes)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    ops = pytest.importorskip("ultralytics.utils.ops")
    torch.testing.assert_close(
        got, ops.crop_mask(masks.clone(), boxes), equal_nan=True, rtol=0, atol=0
    )
    inside = crop_masks(masks, torch.tensor([[0.0, 0.0, 3.0, 2.0]] * 2))
    torch.testing.assert_close(inside, masks, equal_nan=True, rtol=0, atol=0)


def test_crop_masks_gradient():
    masks = torch.randn(2, 6, 7, dtype=torch.float64, requires_grad=True)
    boxes = torch.tensor([[1.0, 1.0, 4.0, 5.0], [0.0, 2.0, 7.0, 3.0]])
    out = crop_masks(masks, boxes)
    out.sum().backward()
    assert torch.equal(masks.grad, (out != 0).double())


def _rle(masks: torch.Tensor):
    from pycocotools import mask as mask_utils

    return mask_utils.encode(np.asfortranarray(masks.permute(1, 2, 0).numpy().astype(np.uint8)))


def test_mask_iou_matches_pycocotools():
    mask_utils = pytest.importorskip("pycocotools.mask")
    g = torch.Generator().manual_seed(7)
    a = torch.rand(9, 23, 31, generator=g) > 0.6
    b = torch.rand(6, 23, 31, generator=g) > 0.3
    a[0] = False  # empty against masks, and against an empty one: 0
    b[0] = False
    b[1] = a[1]  # identical: exactly 1
    ref = torch.from_numpy(np.asarray(mask_utils.iou(_rle(a), _rle(b), [0] * 6)))
    ours = mask_iou(a, b)
    assert ours.dtype == torch.float32 and ours.shape == (9, 6)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=0)
    assert ours[1, 1] == 1 and ours[0].abs().sum() == 0 and ours[:, 0].abs().sum() == 0
    assert torch.equal(mask_iou(a.to(torch.uint8), b.float()), ours)
    torch.testing.assert_close(mask_iou(a.double(), b), ref)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(mask_iou(a, b), ours)  # the product is not lowered


def test_mask_iou_integer_masks_are_binary():
    """0/255 uint8 and 0/2 int64 masks gave IoUs of 0 and 2 (counted as weights); nonzero
    pixels are the mask, as pycocotools' RLEs of them and `masks_to_boxes`."""
    mask_utils = pytest.importorskip("pycocotools.mask")
    g = torch.Generator().manual_seed(9)
    a = torch.rand(5, 11, 13, generator=g) > 0.5
    b = torch.rand(4, 11, 13, generator=g) > 0.4
    b[1] = a[2]
    ref = torch.from_numpy(np.asarray(mask_utils.iou(_rle(a * 255), _rle(b * 255), [0] * 4)))
    ours = mask_iou(a, b)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=0)
    for x, y in ((a.to(torch.uint8) * 255, b.to(torch.uint8) * 255), (a.long() * 2, b.long() * -7)):
        assert torch.equal(mask_iou(x, y), ours)
        assert torch.equal(mask_iou(x, b.float()), ours)  # a binary float mask weighs 0 or 1
    soft = mask_iou(a.float() * 2, a.float()).diagonal()  # floating masks weigh: 2n / n
    assert torch.equal(soft, torch.full((5,), 2.0))


def test_mask_iou_soft_masks_are_matrix_nms_formula():
    g = torch.Generator().manual_seed(8)
    soft = torch.rand(5, 7, 7, generator=g, dtype=torch.float64)
    flat = soft.flatten(1)
    inter = flat @ flat.T
    union = flat.sum(1)[:, None] + flat.sum(1)[None] - inter
    torch.testing.assert_close(mask_iou(soft, soft), inter / union)
    scores = torch.rand(5, generator=g)
    keep, decayed = matrix_nms(scores, masks=soft > 0.5)
    assert keep.shape == decayed.shape == (5,)


@pytest.mark.slow
def test_mask_iou_counts_stay_exact_past_float32():
    """More than 2**24 pixels: integer masks are counted in float64."""
    side = 4097
    a = torch.ones(1, side, side, dtype=torch.bool)
    b = a.clone()
    b[0, 0, 0] = False
    iou = mask_iou(a, b)
    assert iou.dtype == torch.float64 and iou.item() == (side * side - 1) / (side * side)


def test_masks_to_boxes_is_torchvisions_plus_one():
    g = torch.Generator().manual_seed(9)
    masks = torch.zeros(20, 30, 45, dtype=torch.bool)
    for i in range(20):
        x1, y1 = (
            torch.randint(0, 40, (1,), generator=g).item(),
            torch.randint(0, 25, (1,), generator=g).item(),
        )
        masks[i, y1 : y1 + 1 + i % 5, x1 : x1 + 1 + i % 7] = True
        masks[i] |= torch.rand(30, 45, generator=g) > 0.995
    ref = tv_masks_to_boxes(masks)
    for dtype in (torch.bool, torch.uint8, torch.float32, torch.float64):
        ours = masks_to_boxes(masks.to(dtype))
        assert ours.dtype == torch.float32
        assert torch.equal(ours, ref + torch.tensor([0.0, 0.0, 1.0, 1.0]))
    empty = masks_to_boxes(torch.zeros(2, 4, 4))
    assert torch.equal(empty, torch.zeros(2, 4))
    assert masks_to_boxes(torch.zeros(3, 0, 5)).shape == (3, 4)
    assert masks_to_boxes(torch.zeros(0, 4, 5)).shape == (0, 4)


def _all(masks, boxes, size):
    return (
        paste_masks(masks, boxes, size),
        crop_masks(masks, boxes),
        mask_iou(masks > 0.5, masks > 0.2),
        masks_to_boxes(masks > 0.7),
    )


@pytest.mark.slow  # a dynamo compile of the chunked loop (~13 s); the public-name compile test stays quick
def test_compiles_fullgraph_with_chunks(monkeypatch):
    monkeypatch.setattr(masks_module, "_CHUNK_ELEMENTS", 3000)
    masks = torch.rand(7, 6, 6, generator=torch.Generator().manual_seed(10))
    boxes = _boxes(7, 12, 13, seed=10, spill=0.4)
    compiled = torch.compile(_all, fullgraph=True, dynamic=True, backend="aot_eager")
    for got, want in zip(
        compiled(masks, boxes, (12, 13)), _all(masks, boxes, (12, 13)), strict=True
    ):
        torch.testing.assert_close(got, want)


def test_fake_cuda_reads_nothing(monkeypatch):
    monkeypatch.setattr(masks_module, "_CHUNK_ELEMENTS", 3000)  # blocks: the out= writes too
    with FakeTensorMode():
        masks = torch.empty(7, 6, 6, device="cuda")
        boxes = torch.empty(7, 4, device="cuda")
        pasted, cropped, iou, boxes_out = _all(masks, boxes, (12, 13))
        assert pasted.shape == (7, 12, 13) and pasted.device.type == "cuda"
        assert cropped.shape == (7, 6, 6) and iou.shape == (7, 7) and boxes_out.shape == (7, 4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: paste_masks(torch.rand(2, 4, 4), torch.rand(3, 4), (5, 5)),
            ValueError,
            r"boxes must have shape \(N, 4\) = \(2, 4\)",
        ),
        (
            lambda: paste_masks(torch.rand(2, 4, 4), torch.rand(2, 4), (5,)),
            ValueError,
            "image_size must be",
        ),
        (
            lambda: paste_masks(torch.ones(2, 4, 4, dtype=torch.bool), torch.rand(2, 4), (5, 5)),
            TypeError,
            "masks must be a floating",
        ),
        (  # an empty mask size divided by zero
            lambda: paste_masks(torch.ones(1, 0, 0), torch.tensor([[1.0, 1, 5, 3]]), (4, 7)),
            ValueError,
            r"masks must have shape \(N, M, M\) with M > 0, got \(1, 0, 0\)",
        ),
        (
            lambda: paste_masks(torch.rand(2, 4, 4), torch.rand(2, 4), (5, 5), padding=-1),
            ValueError,
            "padding",
        ),
        (lambda: mask_iou(torch.rand(2, 4, 4), torch.rand(2, 4, 5)), ValueError, r"same \(H, W\)"),
        (
            lambda: mask_iou(torch.rand(4, 4), torch.rand(2, 4, 4)),
            ValueError,
            r"masks1 must have shape \(N, H, W\)",
        ),
        (
            lambda: crop_masks(torch.rand(2, 4, 4), torch.ones(2, 4, dtype=torch.bool)),
            TypeError,
            "boxes must be a real",
        ),
        (
            lambda: masks_to_boxes(torch.rand(2, 4, 4, dtype=torch.complex64)),
            TypeError,
            "masks must be a real or bool",
        ),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
