"""Greedy NMS of rotated boxes as the custom op ``visionblocks::nms_rotated``.

Private helper of `visionblocks.ops.rotated` (`nms_rotated`, `batched_nms_rotated`, whose
docstrings hold the semantics). A custom op, like torchvision's ``nms``: its output size
depends on the values, so eager calls read them on the host, while ``torch.compile`` (with
``torch._dynamo.config.capture_dynamic_output_shape_ops = True``) and fake tensors see one
opaque node whose length is a new unbacked size, and read nothing.

**Algorithm.** The boxes are sorted by score (descending, stable: ties keep index order, as
torchvision's ``nms``) and processed in blocks of `BLOCK` boxes. A block's boxes are first
suppressed by the boxes kept so far (IoU against them, in tiles of `BLOCK` columns); then the
greedy pass inside the block is the fixed point of ``keep[i] = alive[i] and not any(keep[j]
and iou[j, i] > threshold for j < i)``, iterated from ``keep = alive``: after ``t`` rounds the
first ``t`` boxes of the block are final, every fixed point is the greedy answer, and it
comes in as many rounds as the longest chain of suppressions (a handful in practice, each one
``BLOCK x BLOCK`` comparisons on the device). Memory: ``O(BLOCK^2)`` besides the output.

**Host reads** (eager): one per round (did ``keep`` change?), one per block (the kept boxes),
and the output's length. Blocks of `BLOCK` boxes on CPU, `CUDA_BLOCK` on CUDA.
"""

from __future__ import annotations

import torch
from torch import Tensor

from visionblocks.kernels._dispatch import resolve_impl
from visionblocks.ops._rotated_overlap import rotated_iou

__all__ = ["BLOCK", "nms_rotated_op"]

BLOCK = 1024
"""Boxes per block of the greedy pass (and columns per tile against the kept boxes); on
CUDA, `CUDA_BLOCK` (fewer rounds, each a few more comparisons on the device)."""
CUDA_BLOCK = 4096


def _pairwise(a: Tensor, b: Tensor) -> Tensor:
    """``(n, m)`` IoU of cxcywhr boxes (the kernel on CUDA, as ``impl="auto"`` picks)."""
    use_kernel = resolve_impl("auto", "rotated_box_iou", a, b) == "triton"
    return rotated_iou(a, b, False, 1e-7, use_kernel, "auto")


def _suppressing(
    a: Tensor, b: Tensor, threshold: float, ca: Tensor | None, cb: Tensor | None
) -> Tensor:
    """``(n, m)``: whether box ``a[i]`` and box ``b[j]`` overlap by more than the threshold
    (and, for batched NMS, share a category)."""
    over = _pairwise(a, b) > threshold
    if ca is not None and cb is not None:
        over = over & (ca.unsqueeze(1) == cb.unsqueeze(0))
    return over


def _greedy(boxes: Tensor, scores: Tensor, idxs: Tensor | None, threshold: float) -> Tensor:
    n = boxes.shape[0]
    order = torch.sort(scores, descending=True, stable=True).indices
    boxes = boxes[order]
    cats = idxs[order] if idxs is not None else None
    keep = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    kept_boxes = boxes[:0]
    kept_cats = cats[:0] if cats is not None else None
    step = CUDA_BLOCK if boxes.is_cuda else BLOCK
    for start in range(0, n, step):
        stop = min(start + step, n)
        block = boxes[start:stop]
        cat = cats[start:stop] if cats is not None else None
        alive = torch.ones(stop - start, dtype=torch.bool, device=boxes.device)
        for k0 in range(0, kept_boxes.shape[0], step):
            other = kept_cats[k0 : k0 + step] if kept_cats is not None else None
            hit = _suppressing(block, kept_boxes[k0 : k0 + step], threshold, cat, other)
            alive = alive & ~hit.any(1)
        later = torch.ones(stop - start, stop - start, dtype=torch.bool, device=boxes.device)
        later = torch.triu(later, diagonal=1)  # [j, i]: j comes before i
        over = _suppressing(block, block, threshold, cat, cat) & later
        current = alive
        while True:
            nxt = alive & ~(over & current.unsqueeze(1)).any(0)
            if torch.equal(nxt, current):
                break
            current = nxt
        keep[start:stop] = current
        kept_boxes = torch.cat((kept_boxes, block[current]))
        if kept_cats is not None and cat is not None:
            kept_cats = torch.cat((kept_cats, cat[current]))
    return order[keep]


@torch.library.custom_op("visionblocks::nms_rotated", mutates_args=())
def nms_rotated_op(
    boxes: Tensor, scores: Tensor, idxs: Tensor | None, iou_threshold: float
) -> Tensor:
    """Kept indices (int64, by decreasing score) of checked ``(N, 5)`` cxcywhr ``boxes``
    (float32 or float64, no gradient), ``(N,)`` ``scores`` and optional ``(N,)`` category
    ``idxs`` (boxes of different categories never suppress each other)."""
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    with torch.no_grad():
        return _greedy(boxes, scores, idxs, iou_threshold)


@nms_rotated_op.register_fake
def _(boxes: Tensor, scores: Tensor, idxs: Tensor | None, iou_threshold: float) -> Tensor:
    torch._check(boxes.dim() == 2 and boxes.shape[-1] == 5, lambda: "boxes must be (N, 5)")
    torch._check(scores.dim() == 1, lambda: "scores must be (N,)")
    kept = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty(kept, dtype=torch.int64)
