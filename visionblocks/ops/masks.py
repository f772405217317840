"""Instance-mask ops: paste RoI masks into the image, crop masks to boxes, pairwise mask IoU,
and the boxes of masks.

Convention:
    Masks are ``(N, H, W)``: one image-sized mask per instance (``(N, M, M)`` RoI masks for
    `paste_masks`). Pixel ``(row, col)`` covers ``[col, col + 1) x [row, row + 1)``; boxes
    are ``"xyxy"`` with an exclusive max, so a mask whose pixels fill columns ``2..5`` has
    ``x1 = 2, x2 = 6`` (torchvision's ``masks_to_boxes`` gives ``x2 = 5``). Nothing here reads
    tensor values on the host, and every op compiles with ``torch.compile(fullgraph=True)``;
    matrix products run in float32 (float64 for float64 inputs) also under ``torch.autocast``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_floating,
    check_real,
    check_same_device,
    check_tensor,
    compute_dtype,
)

__all__ = ["crop_masks", "mask_iou", "masks_to_boxes", "paste_masks"]
__dir__ = public_dir(__name__, __all__)

_CHUNK_ELEMENTS = 2**24
"""`paste_masks` works on as many instances at a time as fit this many elements."""
_MAX_SIDE = 2**20


def _check_masks(name: str, masks: object) -> Tensor:
    check_tensor(name, masks)
    if masks.is_complex():
        raise TypeError(f"{name} must be a real or bool tensor, got dtype {masks.dtype}")
    if masks.dim() != 3:
        raise ValueError(f"{name} must have shape (N, H, W), got {tuple(masks.shape)}")
    return masks


def _check_boxes(boxes: object, n: int, of: str, masks: Tensor) -> Tensor:
    check_real("boxes", boxes)
    if boxes.dim() != 2 or tuple(boxes.shape) != (n, 4):
        raise ValueError(
            f"boxes must have shape (N, 4) = ({n}, 4) like {of}, got {tuple(boxes.shape)}"
        )
    check_same_device(**{of: masks, "boxes": boxes})
    return boxes


def _no_autocast(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Turn autocast off for a matrix product that must stay in its input's dtype."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


class _Product(torch.autograd.Function):
    """``a @ b`` with its backward products, all outside ``torch.autocast`` (a gradient taken
    inside an autocast region would otherwise be lowered)."""

    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        with _no_autocast(a.device):
            return a @ b

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        with _no_autocast(grad.device):
            grad_a = grad @ b.transpose(-1, -2) if ctx.needs_input_grad[0] else None
            grad_b = a.transpose(-1, -2) @ grad if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def _interp_weights(
    start: Tensor, stop: Tensor, size: int, mask_size: int, padding: int, dtype: torch.dtype
) -> Tensor:
    """``(N, size, mask_size)`` weights of bilinear resizing (``align_corners=False``) of the
    padded mask onto pixels ``start..stop`` (int64, inclusive) of an image row or column;
    zero outside them, and on the padding (zeros in torchvision's padded mask)."""
    padded = mask_size + 2 * padding
    pixel = torch.arange(size, device=start.device)
    offset = pixel - start[:, None]  # (N, size): index into the resized box
    length = (stop - start + 1).clamp_min(1)[:, None]
    inside = (pixel >= start[:, None]) & (pixel <= stop[:, None])
    # torch's upsample_bilinear2d: source = scale * (dst + 0.5) - 0.5, clamped at 0
    scale = padded / length.to(dtype)
    source = ((offset.clamp_min(0).to(dtype) + 0.5) * scale - 0.5).clamp_min(0)
    low = source.floor().clamp_max(padded - 1)
    frac = (source - low).clamp(0, 1)
    low = low.long()
    high = low + (low < padded - 1).long()
    weights = torch.zeros(*low.shape, mask_size, dtype=dtype, device=start.device)
    for index, weight in ((low, (1 - frac) * inside), (high, frac * inside)):
        index = index - padding  # the padding ring is zero: its weights are dropped
        real = (index >= 0) & (index < mask_size)
        weights.scatter_add_(
            2, index.clamp(0, mask_size - 1)[..., None], (weight * real)[..., None]
        )
    return weights


def paste_masks(
    masks: Tensor, boxes: Tensor, image_size: Sequence[int], padding: int = 1
) -> Tensor:
    """Paste RoI masks into an image of ``image_size`` at their boxes (Mask R-CNN's last step).

    torchvision's ``paste_masks_in_image`` (``torchvision/models/detection/roi_heads.py``):
    each mask is padded with ``padding`` zero pixels per side, its box grown by the same
    factor ``(M + 2 * padding) / M`` about its centre and cut to integers (towards zero, as
    ``.to(torch.int64)``), the padded mask resized bilinearly (``align_corners=False``) to the
    box's ``x2 - x1 + 1`` columns and ``y2 - y1 + 1`` rows, and pasted with its top-left pixel
    at ``(x1, y1)``, cut to the image. torchvision loops over the masks with host reads of
    every box; here the resizing is two batched matrix products per block of instances
    (separable bilinear weights, ``(N, H, M)`` and ``(N, W, M)``), so nothing is read on the
    host, and memory beyond the output is bounded by the block size whatever ``N``. Values
    equal torchvision's up to float rounding; a box wholly outside the image gives a zero mask
    (torchvision's slicing raises or wraps around there). Rectangular ``(Mh, Mw)`` masks scale
    each axis by its own factor (torchvision uses the width's for both).

    Args:
        masks (Tensor[N, M, M]): RoI mask probabilities or logits, floating point; ``M > 0``.
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes in image pixels (floating or integer).
        image_size: ``(H, W)`` of the image (ints in ``[0, 2**20]``).
        padding: Zero pixels added around each mask before resizing (torchvision's 1).

    Returns:
        Tensor[N, H, W]: The pasted masks, ``masks``' dtype (computed in float32, or float64),
        zero outside the boxes. torchvision's has a channel dimension: ``out[:, None]``.

    Raises:
        TypeError: Non-tensor or non-floating ``masks``, complex or bool ``boxes``, non-int
            sizes.
        ValueError: Bad shapes (an empty ``M``: no mask to resize), devices on which the two
            differ, sizes out of range.

    Examples:
        >>> import torch
        >>> masks = torch.ones(1, 4, 4)
        >>> paste_masks(masks, torch.tensor([[1.0, 1.0, 5.0, 3.0]]), (4, 7))
        tensor([[[0.0000, 0.1964, 0.2500, 0.2500, 0.2500, 0.1964, 0.0000],
                 [0.0000, 0.7857, 1.0000, 1.0000, 1.0000, 0.7857, 0.0000],
                 [0.0000, 0.7857, 1.0000, 1.0000, 1.0000, 0.7857, 0.0000],
                 [0.0000, 0.1964, 0.2500, 0.2500, 0.2500, 0.1964, 0.0000]]])
    """
    check_floating("masks", masks)
    if masks.dim() != 3 or 0 in masks.shape[1:]:
        raise ValueError(f"masks must have shape (N, M, M) with M > 0, got {tuple(masks.shape)}")
    _check_boxes(boxes, masks.shape[0], "masks", masks)
    check_type("image_size", image_size, (tuple, list, torch.Size))
    if len(image_size) != 2:
        raise ValueError(f"image_size must be (H, W), got {image_size!r}")
    height, width = (check_int("image_size", s, 0, _MAX_SIDE) for s in image_size)
    check_int("padding", padding, 0, _MAX_SIDE)
    n, mask_h, mask_w = masks.shape
    check_allocation("the pasted masks", (n, height, width), masks.dtype)
    dtype = compute_dtype(masks.dtype)
    # torchvision's expand_boxes in the boxes' dtype, then truncation to int64
    b = boxes.to(compute_dtype(boxes.dtype))
    half_w = (b[:, 2] - b[:, 0]) * 0.5 * (float(mask_w + 2 * padding) / mask_w)
    half_h = (b[:, 3] - b[:, 1]) * 0.5 * (float(mask_h + 2 * padding) / mask_h)
    cx, cy = (b[:, 2] + b[:, 0]) * 0.5, (b[:, 3] + b[:, 1]) * 0.5
    grown = torch.stack((cx - half_w, cy - half_h, cx + half_w, cy + half_h), 1).long()
    # Blocks bound the weights and the intermediate product; the output is written in place
    # (a copy when gradients are recorded: ``out=`` has none).
    per_instance = (height + width) * (mask_h + mask_w) * 4 + mask_h * width
    step = max(1, _CHUNK_ELEMENTS // max(per_instance, 1))
    if n <= step:
        step = max(n, 1)
    out = masks.new_empty((n, height, width), dtype=dtype)
    record = torch.is_grad_enabled() and masks.requires_grad
    for s in range(0, n, step):
        g = grown[s : s + step]
        wx = _interp_weights(g[:, 0], g[:, 2], width, mask_w, padding, dtype)
        wy = _interp_weights(g[:, 1], g[:, 3], height, mask_h, padding, dtype)
        rows = _Product.apply(masks[s : s + step].to(dtype), wx.transpose(1, 2))
        if n == step:
            return _Product.apply(wy, rows).to(masks.dtype)
        if record:
            out[s : s + step] = _Product.apply(wy, rows)
        else:
            with _no_autocast(masks.device):
                torch.bmm(wy, rows, out=out[s : s + step])
    return out.to(masks.dtype)


def crop_masks(masks: Tensor, boxes: Tensor) -> Tensor:
    """Zero every mask outside its box (YOLACT's and ultralytics' ``crop_mask``).

    Pixel ``(row, col)`` is kept when ``x1 <= col < x2`` and ``y1 <= row < y2``, as
    ``ultralytics/utils/ops.py``'s ``crop_mask``; unlike it, ``masks`` is not modified (a new
    tensor; gradients flow to ``masks``). As there, masks are multiplied by the box's 0/1
    indicator: an infinite or NaN value outside the box gives NaN, not 0 (non-finite masks
    stay visible, and the product is several times faster than a select); a NaN box keeps
    nothing.

    Args:
        masks (Tensor[N, H, W]): Masks of any real dtype or bool (prototype masks, logits).
        boxes (Tensor[N, 4]): ``"xyxy"`` boxes in pixels of the masks (floating or integer).

    Returns:
        Tensor[N, H, W]: The cropped masks, ``masks``' dtype.

    Raises:
        TypeError: Non-tensor or complex masks, complex or bool boxes.
        ValueError: Bad shapes, or the two on different devices.

    Examples:
        >>> import torch
        >>> crop_masks(torch.ones(1, 3, 4), torch.tensor([[1.0, 0.5, 3.0, 2.0]]))
        tensor([[[0., 0., 0., 0.],
                 [0., 1., 1., 0.],
                 [0., 0., 0., 0.]]])
    """
    _check_masks("masks", masks)
    _check_boxes(boxes, masks.shape[0], "masks", masks)
    _, height, width = masks.shape
    b = boxes.to(compute_dtype(boxes.dtype))[:, :, None, None]
    cols = torch.arange(width, device=masks.device, dtype=b.dtype)
    rows = torch.arange(height, device=masks.device, dtype=b.dtype)[:, None]
    keep_cols = (cols >= b[:, 0]) & (cols < b[:, 2])  # (N, 1, W)
    keep_rows = (rows >= b[:, 1]) & (rows < b[:, 3])  # (N, H, 1)
    return (masks * keep_cols).mul_(keep_rows)


def mask_iou(masks1: Tensor, masks2: Tensor) -> Tensor:
    """Pairwise IoU of two sets of masks: ``|A ∩ B| / |A ∪ B|`` from one matrix product.

    Bool and integer masks are binary: nonzero pixels are the mask (``0/255`` uint8 masks
    too, as `masks_to_boxes`); the IoUs equal pycocotools' ``maskUtils.iou`` on their RLEs
    (``iscrowd=0``). Floating masks are soft and weigh: ``|A ∩ B| = sum(a * b)``,
    ``|A| = sum(a)`` (matrix NMS's mask IoU; binarise them first for pycocotools' IoU). Two
    empty masks (a zero union) have IoU 0, as pycocotools.

    Args:
        masks1 (Tensor[N, H, W]): Masks of any real dtype or bool (binary unless floating).
        masks2 (Tensor[M, H, W]): Masks of the same size.

    Returns:
        Tensor[N, M]: The IoUs in float32; float64 for a float64 input, and for integer or
        bool masks of more than ``2**24`` pixels (so that the counts stay exact).

    Raises:
        TypeError: Non-tensor or complex masks.
        ValueError: Not ``(N, H, W)``, different ``(H, W)`` or devices.

    Examples:
        >>> import torch
        >>> a = torch.zeros(2, 4, 4, dtype=torch.bool)
        >>> a[0, :2, :2] = True; a[1, :2] = True
        >>> mask_iou(a, a)
        tensor([[1.0000, 0.5000],
                [0.5000, 1.0000]])
    """
    _check_masks("masks1", masks1)
    _check_masks("masks2", masks2)
    if masks1.shape[1:] != masks2.shape[1:]:
        raise ValueError(
            "masks1 and masks2 must have the same (H, W), got "
            f"{tuple(masks1.shape[1:])} and {tuple(masks2.shape[1:])}"
        )
    check_same_device(masks1=masks1, masks2=masks2)
    exact = not (masks1.is_floating_point() or masks2.is_floating_point())
    if torch.float64 in (masks1.dtype, masks2.dtype) or (
        exact and masks1.shape[1] * masks1.shape[2] > 2**24
    ):
        dtype = torch.float64
    else:
        dtype = torch.float32
    a, b = (_counts(m.flatten(1), dtype) for m in (masks1, masks2))
    inter = _Product.apply(a, b.T)
    union = a.sum(1)[:, None] + b.sum(1)[None, :] - inter
    return torch.where(union > 0, inter / union.masked_fill(union <= 0, 1), 0)


def _counts(masks: Tensor, dtype: torch.dtype) -> Tensor:
    """``masks`` in ``dtype``: floating ones as they are (weights), bool and integer ones 1 on
    their nonzero pixels (converting bool through uint8 is the faster copy)."""
    if masks.is_floating_point():
        return masks.to(dtype)
    if masks.dtype == torch.bool:
        return masks.view(torch.uint8).to(dtype)
    return masks.to(dtype).ne_(0)


def masks_to_boxes(masks: Tensor) -> Tensor:
    """The ``"xyxy"`` box of each mask's nonzero pixels, with an exclusive max.

    torchvision's ``masks_to_boxes`` gives the last column and row (``x2 = 5`` for pixels in
    columns ``2..5``); here ``x2 = 6`` (the module's Convention), so ``box_area`` counts the
    pixels of a full rectangle. An empty mask gives ``(0, 0, 0, 0)`` (torchvision's raises).
    No host reads (torchvision's runs ``torch.where`` per mask).

    Args:
        masks (Tensor[N, H, W]): Masks of any real dtype or bool; nonzero pixels count.

    Returns:
        Tensor[N, 4]: float32 boxes, exact for ``H, W <= 2**24``.

    Raises:
        TypeError: Non-tensor or complex masks.
        ValueError: Not ``(N, H, W)``.

    Examples:
        >>> import torch
        >>> masks = torch.zeros(2, 5, 8, dtype=torch.uint8)
        >>> masks[0, 1:3, 2:6] = 1
        >>> masks_to_boxes(masks)
        tensor([[2., 1., 6., 3.],
                [0., 0., 0., 0.]])
    """
    _check_masks("masks", masks)
    _, height, width = masks.shape
    if height == 0 or width == 0:
        return masks.new_zeros((masks.shape[0], 4), dtype=torch.float32)

    def span(hit: Tensor, size: int) -> tuple[Tensor, Tensor]:
        index = torch.arange(size, device=masks.device)
        first = torch.where(hit, index, size).amin(1, keepdim=True)
        last = torch.where(hit, index + 1, 0).amax(1, keepdim=True)
        return first.clamp_max(last), last  # empty: (0, 0)

    x1, x2 = span(masks.any(1).bool(), width)  # uint8 masks: any() gives uint8
    y1, y2 = span(masks.any(2).bool(), height)
    return torch.cat((x1, y1, x2, y2), 1).float()
