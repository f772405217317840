"""Greedy NMS of rotated boxes as the custom op ``visionblocks::nms_rotated`` (private).

Semantics: `visionblocks.ops.rotated.nms_rotated`. Boxes sorted by score (stable) are taken
in blocks; a block is first suppressed by the boxes kept so far, then its greedy pass is the
fixed point of ``keep[i] = alive[i] and not any(keep[j] and iou[j, i] > threshold, j < i)``
iterated from ``keep = alive`` (after ``t`` rounds the first ``t`` boxes are final; as many
rounds as the longest chain of suppressions). Memory ``O(block^2)``; eager host reads: one
per round, one per block and the output's length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from visionblocks.ops._rotated_overlap import rotated_iou

__all__ = ["BLOCK", "nms_rotated_op"]

BLOCK = 1024  # boxes per block of the greedy pass on CPU
CUDA_BLOCK = 4096


def _suppressing(
    a: Tensor, b: Tensor, threshold: float, ca: Tensor | None, cb: Tensor | None
) -> Tensor:
    """``(n, m)``: ``a[i]`` and ``b[j]`` overlap by more than the threshold (same category)."""
    over = rotated_iou(a, b, False, 1e-7, "auto") > threshold  # the kernel on CUDA
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
    """Kept indices (int64, by decreasing score) of checked float ``(N, 5)`` cxcywhr boxes,
    their ``(N,)`` scores and optional ``(N,)`` categories ``idxs``."""
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
