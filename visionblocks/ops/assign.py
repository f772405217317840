"""Anchor assignment without the anchors x objects IoU matrix: best IoUs, `Matcher`, ATSS.

RetinaNet-, Faster R-CNN- and ATSS-style training matches ``N`` anchors to ``M`` objects
through their ``N x M`` IoU matrix (torchvision's ``Matcher`` input), gigabytes for hundreds
of thousands of anchors. The functions here compute the assignment in blocks, without it:

- `best_box_iou`: each anchor's best IoU and object, and each object's best IoU;
- `match_anchors`: torchvision's ``Matcher`` on `visionblocks.ops.box_iou`'s matrix;
- `atss_assign`: ATSS's adaptive selection, as mmdetection's ``ATSSAssigner``.

Peak extra memory is ``O(block x M + N + M)``: a block holds as many anchors as ``block_bytes``
allows (`BLOCK_BYTES` by default); every IoU is bitwise the entry of `visionblocks.ops.box_iou`'s
matrix, and no result depends on the block size. ``impl="triton"`` runs `best_box_iou` and
`match_anchors` as Triton kernels on CUDA (`visionblocks.kernels.assign`), which hold no block of
IoUs; ``impl="auto"`` keeps the torch path, also on CUDA, until a GPU run confirms the kernels
bitwise equal to it. All three read no tensor values on the host and compile with
``torch.compile(fullgraph=True)`` (one graph per shape).

Convention:
    Boxes are ``"xyxy"`` (`visionblocks.ops.boxes`), in one unit for anchors and objects.
    IoUs follow `box_iou`: a zero-area box has IoU 0 with everything, an inverted box counts
    as zero width (height).

Ties:
    An anchor whose best IoU is reached by several objects is given the first of them (the
    lowest index), as ``torch.max(dim)`` and so ``Matcher`` give; the kernels too.

NaN:
    NaN boxes are not rejected (no host reads); a NaN IoU is the best value (``torch.max``),
    with the first such object as the index, which `match_anchors` keeps, as ``Matcher`` on
    the same matrix: drop NaN boxes first.

Dtypes:
    IoUs are computed and returned in float32 (float64 for float64 boxes), as `box_iou`;
    indices are int64. ``torch.autocast`` changes nothing. The results carry no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from visionblocks._core.checks import check_int, check_number, check_type
from visionblocks._core.dispatch import forced_triton, use_triton, validate_impl
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_real, check_same_device, compute_dtype
from visionblocks.ops._assign_blocks import any_equal, reduce_blocks, rows_per_block
from visionblocks.ops.boxes import _overlap, check_eps

__all__ = [
    "BELOW_LOW_THRESHOLD",
    "BETWEEN_THRESHOLDS",
    "BLOCK_BYTES",
    "BestIoU",
    "atss_assign",
    "best_box_iou",
    "match_anchors",
]
__dir__ = public_dir(__name__, __all__)

BELOW_LOW_THRESHOLD: int = -1
"""`match_anchors`'s value for an anchor whose best IoU is below ``low_threshold`` (a
negative), torchvision's ``Matcher.BELOW_LOW_THRESHOLD``; also `atss_assign`'s negatives."""

BETWEEN_THRESHOLDS: int = -2
"""`match_anchors`'s value for an anchor whose best IoU is in ``[low_threshold,
high_threshold)`` (ignored by the loss), torchvision's ``Matcher.BETWEEN_THRESHOLDS``."""

BLOCK_BYTES: int = 8 * 2**20
"""Default memory budget of one block of anchors: 8 MiB of IoU temporaries (699 anchors
a block for 500 objects in float32), small enough to stay in cache."""

_IOU_TEMPS = 6  # pair-sized temporaries of box_iou's formula at its peak
_TOPK_BYTES = 40  # per pair: ATSS's distances, indices and a stable sort's outputs


class BestIoU(NamedTuple):
    """`best_box_iou`'s results.

    Attributes:
        anchor_values (Tensor[N]): Each anchor's best IoU over the objects.
        anchor_indices (Tensor[N]): The object giving it (int64; the first on ties).
        box_values (Tensor[M]): Each object's best IoU over the anchors.

    Examples:
        >>> boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        >>> best_box_iou(boxes, boxes).anchor_indices
        tensor([0])
    """

    anchor_values: Tensor
    anchor_indices: Tensor
    box_values: Tensor


def _check_boxes(anchors: Tensor, boxes: Tensor) -> None:
    for name, value in (("anchors", anchors), ("boxes", boxes)):
        check_real(name, value)
        if value.dim() != 2 or value.shape[-1] != 4:
            letter = "N" if name == "anchors" else "M"
            raise ValueError(
                f"{name} must have shape ({letter}, 4) (x1, y1, x2, y2), got {tuple(value.shape)}"
            )
    check_same_device(anchors=anchors, boxes=boxes)


def _check_block_bytes(block_bytes: int | None) -> int:
    return BLOCK_BYTES if block_bytes is None else check_int("block_bytes", block_bytes, 1)


def _kernel_inputs(anchors: Tensor, boxes: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Floating boxes as they are (the kernels cast on load), integer ones in ``dtype``."""
    return (
        anchors if anchors.is_floating_point() else anchors.to(dtype),
        boxes if boxes.is_floating_point() else boxes.to(dtype),
    )


def _iou_rows(anchors: Tensor, boxes: Tensor, eps: float):
    """``score(start, stop)``: `box_iou` of anchors ``start:stop`` with every box."""
    return lambda start, stop: _overlap(anchors[start:stop], boxes, 0, False, eps)


def _block(boxes: Tensor, dtype: torch.dtype, pair_bytes: int, block_bytes: int) -> int:
    itemsize = 8 if dtype == torch.float64 else 4
    return rows_per_block(boxes.shape[0], pair_bytes * itemsize, block_bytes)


def _best_torch(anchors: Tensor, boxes: Tensor, eps: float, block_bytes: int) -> BestIoU:
    """The blocked torch path of `best_box_iou` (boxes in the compute dtype, non-empty)."""
    block = _block(boxes, anchors.dtype, _IOU_TEMPS, block_bytes)
    score = _iou_rows(anchors, boxes, eps)
    values, indices, best = reduce_blocks(score, anchors.shape[0], block, columns=True)
    assert best is not None
    return BestIoU(values, indices, best)


def _best(anchors: Tensor, boxes: Tensor, eps: float, block_bytes: int, impl: str) -> BestIoU:
    """`best_box_iou` of checked, detached boxes."""
    dtype = compute_dtype(torch.promote_types(anchors.dtype, boxes.dtype))
    n, m = anchors.shape[0], boxes.shape[0]
    if n == 0 or m == 0:
        return BestIoU(
            torch.zeros(n, dtype=dtype, device=anchors.device),
            torch.full((n,), -1, dtype=torch.long, device=anchors.device),
            torch.zeros(m, dtype=dtype, device=anchors.device),
        )
    # auto=False: "auto" keeps the torch path (module notes); "triton" runs the kernels.
    if use_triton("best_box_iou", impl, anchors, boxes, auto=False):
        from visionblocks.kernels.assign import best_box_iou_triton

        def reference(a: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
            return tuple(_best_torch(a.to(dtype), b.to(dtype), eps, block_bytes))

        args = (*_kernel_inputs(anchors, boxes, dtype), eps)
        fallback = None if forced_triton(impl) else reference
        return BestIoU(*best_box_iou_triton(*args, reference=fallback))
    return _best_torch(anchors.to(dtype), boxes.to(dtype), eps, block_bytes)


def best_box_iou(
    anchors: Tensor,
    boxes: Tensor,
    *,
    eps: float = 1e-7,
    block_bytes: int | None = None,
    impl: str = "auto",
) -> BestIoU:
    """Each anchor's best IoU and object, and each object's best IoU, without the IoU matrix.

    Bitwise ``iou.max(dim=1)`` (values and indices) and ``iou.max(dim=0).values`` of
    ``iou = box_iou(anchors, boxes)`` (``(N, M)``), computed in blocks of anchors.

    Args:
        anchors (Tensor[N, 4]): Anchors (or proposals), ``(x1, y1, x2, y2)``, floating or integer.
        boxes (Tensor[M, 4]): Ground-truth boxes, same device.
        eps: `box_iou`'s ``eps`` (in place of a union that is exactly zero; ``>= 0``).
        block_bytes: Memory budget of one block of anchors in bytes (default `BLOCK_BYTES`);
            the results do not depend on it.
        impl: ``"auto"`` (the torch path; see the module notes), ``"torch"`` or ``"triton"``
            (the kernel on CUDA, `visionblocks.kernels.assign`).

    Returns:
        BestIoU: ``anchor_values (N,)``, ``anchor_indices (N,)`` int64 (the first best object
        on ties), ``box_values (M,)``; IoUs in float32 (float64 for float64 boxes). No
        objects: every anchor gets IoU 0 and index -1; no anchors: every object IoU 0.

    Raises:
        TypeError: Boxes not real tensors, ``eps`` or ``block_bytes`` of the wrong type.
        ValueError: Bad shapes or devices, ``eps`` < 0, ``block_bytes`` < 1, unknown ``impl``.
        RuntimeError: ``impl="triton"`` where the kernel cannot run.

    Examples:
        >>> import torch
        >>> anchors = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0], [8.0, 8.0, 9.0, 9.0]])
        >>> boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [2.0, 0.0, 4.0, 2.0]])
        >>> best = best_box_iou(anchors, boxes)
        >>> best.anchor_values, best.anchor_indices
        (tensor([1.0000, 0.3333, 0.0000]), tensor([0, 0, 0]))
        >>> best.box_values
        tensor([1.0000, 0.3333])
    """
    _check_boxes(anchors, boxes)
    eps = check_eps(eps)
    block_bytes = _check_block_bytes(block_bytes)
    validate_impl(impl)
    return _best(anchors.detach(), boxes.detach(), eps, block_bytes, impl)


def _check_thresholds(high_threshold: float, low_threshold: float, allow: bool) -> None:
    check_number("high_threshold", high_threshold, 0.0, 1.0)
    check_number("low_threshold", low_threshold, 0.0, 1.0)
    if low_threshold > high_threshold:
        raise ValueError(
            "low_threshold must be <= high_threshold, "
            f"got low_threshold={low_threshold!r} and high_threshold={high_threshold!r}"
        )
    check_type("allow_low_quality_matches", allow, bool)


def match_anchors(
    anchors: Tensor,
    *,
    boxes: Tensor,
    high_threshold: float,
    low_threshold: float,
    allow_low_quality_matches: bool = False,
    eps: float = 1e-7,
    block_bytes: int | None = None,
    impl: str = "auto",
) -> Tensor:
    """torchvision's ``Matcher`` as a function of the boxes, without the IoU matrix.

    Equal to ``Matcher(high_threshold, low_threshold, allow_low_quality_matches)(iou.T)`` for
    ``iou = box_iou(anchors, boxes)``: each anchor gets the object of its best IoU if that IoU
    is ``>= high_threshold``, `BELOW_LOW_THRESHOLD` (-1) if it is ``< low_threshold`` and
    `BETWEEN_THRESHOLDS` (-2) in between. With ``allow_low_quality_matches``, every anchor
    that reaches some object's best IoU (over all anchors; ties included, and a best IoU of
    0, as in ``Matcher``) gets its own best object back whatever its IoU (Faster R-CNN's
    rule). Unlike ``Matcher``, which raises for an empty matrix, no objects give ``-1`` for
    every anchor (as torchvision's detection models do), and no anchors an empty result.

    Every argument after ``anchors`` is keyword-only: ``box_iou(gt, anchors)`` and ``Matcher``
    take the objects first, and the shapes cannot tell the two apart, so
    ``match_anchors(gt, anchors, ...)`` raises ``TypeError`` rather than matching the objects
    to the anchors.

    Args:
        anchors (Tensor[N, 4]): Anchors (or proposals), ``(x1, y1, x2, y2)``.
        boxes (Tensor[M, 4]): Ground-truth boxes, same device.
        high_threshold: IoU from which an anchor is matched (in ``[0, 1]``).
        low_threshold: IoU below which an anchor is a negative (``0 <= low <= high``).
        allow_low_quality_matches: Also match each object's best anchors (see above).
        eps: `box_iou`'s ``eps`` (``>= 0``).
        block_bytes: Memory budget of one block of anchors (default `BLOCK_BYTES`).
        impl: ``"auto"`` (the torch path; see the module notes), ``"torch"`` or ``"triton"``.

    Returns:
        Tensor[N]: int64, an object index in ``[0, M)``, -1 or -2.

    Raises:
        TypeError: Arguments after ``anchors`` given by position; boxes not real tensors; a
            threshold not a number; ``allow_low_quality_matches`` not a bool; ``eps``,
            ``block_bytes`` wrong type.
        ValueError: Bad shapes or devices; a threshold outside ``[0, 1]`` or NaN,
            ``low_threshold > high_threshold``; ``eps`` < 0; ``block_bytes`` < 1; unknown ``impl``.
        RuntimeError: ``impl="triton"`` where the kernels cannot run.

    Examples:
        >>> import torch
        >>> anchors = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0],
        ...                         [0.0, 0.0, 4.0, 2.0], [8.0, 8.0, 9.0, 9.0]])
        >>> boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [2.5, 0.0, 4.5, 2.0]])
        >>> match_anchors(anchors, boxes=boxes, high_threshold=0.5, low_threshold=0.4)
        tensor([ 0, -1,  0, -1])
        >>> match_anchors(anchors, boxes=boxes, high_threshold=0.5, low_threshold=0.3)
        tensor([ 0, -2,  0, -1])
        >>> match_anchors(anchors, boxes=boxes, high_threshold=0.9, low_threshold=0.4)
        tensor([ 0, -1, -2, -1])

        Anchor 2 reaches object 1's best IoU (1/3), so it gets its own best object, 0, back:

        >>> match_anchors(anchors, boxes=boxes, high_threshold=0.9, low_threshold=0.4,
        ...               allow_low_quality_matches=True)
        tensor([ 0, -1,  0, -1])
    """
    _check_boxes(anchors, boxes)
    _check_thresholds(high_threshold, low_threshold, allow_low_quality_matches)
    eps = check_eps(eps)
    block_bytes = _check_block_bytes(block_bytes)
    validate_impl(impl)
    anchors, boxes = anchors.detach(), boxes.detach()
    n, m, device = anchors.shape[0], boxes.shape[0], anchors.device
    if m == 0:
        return torch.full((n,), BELOW_LOW_THRESHOLD, dtype=torch.long, device=device)
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=device)
    values, indices, box_values = _best(anchors, boxes, eps, block_bytes, impl)
    below = values < low_threshold
    between = (values >= low_threshold) & (values < high_threshold)
    matches = torch.where(
        below, BELOW_LOW_THRESHOLD, torch.where(between, BETWEEN_THRESHOLDS, indices)
    )
    if not allow_low_quality_matches:
        return matches
    dtype = compute_dtype(torch.promote_types(anchors.dtype, boxes.dtype))
    if use_triton("match_anchors", impl, anchors, boxes, auto=False):
        from visionblocks.kernels.assign import box_iou_reaches_triton

        def reference(a: Tensor, b: Tensor, eps: float, targets: Tensor) -> Tensor:
            return _reaches_torch(a.to(dtype), b.to(dtype), eps, targets, block_bytes)

        args = (*_kernel_inputs(anchors, boxes, dtype), eps, box_values)
        fallback = None if forced_triton(impl) else reference
        reaches = box_iou_reaches_triton(*args, reference=fallback)
    else:
        reaches = _reaches_torch(anchors.to(dtype), boxes.to(dtype), eps, box_values, block_bytes)
    return torch.where(reaches, indices, matches)


def _reaches_torch(
    anchors: Tensor, boxes: Tensor, eps: float, targets: Tensor, block_bytes: int
) -> Tensor:
    """Whether each anchor's IoU with some object ``j`` equals ``targets[j]`` (blocks)."""
    block = _block(boxes, anchors.dtype, _IOU_TEMPS + 1, block_bytes)
    return any_equal(_iou_rows(anchors, boxes, eps), anchors.shape[0], block, targets)


def _check_levels(levels: Sequence[int], total: int) -> tuple[int, ...]:
    if isinstance(levels, (str, bytes)) or not isinstance(levels, (list, tuple)):
        raise TypeError(
            "num_anchors_per_level must be a list or tuple of ints, "
            f"got {type(levels).__name__} ({levels!r})"
        )
    if not levels:
        raise ValueError("num_anchors_per_level is empty; give the anchor count of each level")
    out = tuple(check_int(f"num_anchors_per_level[{i}]", v, 0) for i, v in enumerate(levels))
    if sum(out) != total:
        raise ValueError(
            f"num_anchors_per_level must add up to the number of anchors ({total}), "
            f"got {list(out)} (sum {sum(out)})"
        )
    return out


def _centres(boxes: Tensor) -> tuple[Tensor, Tensor]:
    return (boxes[:, 0] + boxes[:, 2]) / 2.0, (boxes[:, 1] + boxes[:, 3]) / 2.0


def _closest(
    cx: Tensor, cy: Tensor, gx: Tensor, gy: Tensor, start: int, stop: int, k: int, block: int
) -> Tensor:
    """Indices ``(k, M)`` of the ``k`` anchors of ``start:stop`` closest to each object's
    centre, closest first, ties to the lower index (a stable sort, merged blockwise)."""
    best_d: Tensor | None = None
    best_i: Tensor | None = None
    for lo in range(start, stop, block):
        hi = min(lo + block, stop)
        dx, dy = cx[lo:hi, None] - gx, cy[lo:hi, None] - gy
        d = (dx * dx + dy * dy).sqrt()  # (rows, M)
        i = torch.arange(lo, hi, device=cx.device)[:, None].expand_as(d)
        if best_d is not None and best_i is not None:
            # Kept candidates first (lower indices): the stable sort keeps index order.
            d, i = torch.cat([best_d, d]), torch.cat([best_i, i])
        order = torch.sort(d, dim=0, stable=True).indices[:k]
        best_d, best_i = d.gather(0, order), i.gather(0, order)
    assert best_i is not None
    return best_i


def atss_assign(
    anchors: Tensor,
    boxes: Tensor,
    num_anchors_per_level: Sequence[int],
    topk: int = 9,
    *,
    eps: float = 1e-7,
    block_bytes: int | None = None,
) -> Tensor:
    """ATSS's adaptive training sample selection, without the anchors x objects matrices.

    For each object: on each level, the ``min(topk, level size)`` anchors with centres
    closest to the object's are candidates; their IoUs' mean plus (unbiased) standard
    deviation is the threshold; a candidate whose IoU reaches it and whose centre lies
    inside the box by more than 0.01 on every side is a positive, given to the object of
    highest IoU (the first on ties). mmdetection's ``ATSSAssigner.assign`` (Zhang et al.,
    CVPR 2020) with `box_iou`'s IoU; distance ties go to the lower anchor index, where
    ``Tensor.topk`` leaves them unspecified. Peak memory ``O(block x M + N + topk x levels x M)``.

    Args:
        anchors (Tensor[N, 4]): The anchors of all levels, level after level, ``(x1, y1, x2, y2)``.
        boxes (Tensor[M, 4]): Ground-truth boxes, same device.
        num_anchors_per_level: Anchors on each level (ints ``>= 0`` adding up to ``N``).
        topk: Candidates per level and object (``>= 1``; ATSS uses 9).
        eps: `box_iou`'s ``eps`` (``>= 0``).
        block_bytes: Memory budget of one block of anchors (default `BLOCK_BYTES`).

    Returns:
        Tensor[N]: int64, the object index in ``[0, M)`` of each positive anchor,
        `BELOW_LOW_THRESHOLD` (-1) for the negatives (mmdetection's ``assigned_gt_inds``
        minus 1). No objects: every anchor is -1.

    Raises:
        TypeError: Boxes not real tensors; ``num_anchors_per_level`` not a list or tuple of
            ints; ``topk``, ``eps`` or ``block_bytes`` of the wrong type.
        ValueError: Bad shapes or devices; level sizes negative or not adding up to ``N``;
            ``topk`` < 1; ``eps`` < 0; ``block_bytes`` < 1; fewer than 2 candidates per
            object (``topk=1`` on one level: the standard deviation of one IoU is undefined).

    Examples:
        >>> import torch
        >>> centres = torch.arange(8.0) * 4 + 2  # one level, anchors 8 wide every 4 pixels
        >>> anchors = torch.stack([centres - 4, centres * 0, centres + 4, centres * 0 + 8], 1)
        >>> boxes = torch.tensor([[4.0, 0.0, 14.0, 8.0]])  # centre x = 9

        The candidates are anchors 2, 1 and 3 (centres 10, 6, 14; IoUs 0.8, 0.5, 0.29), the
        threshold their mean plus standard deviation, 0.79:

        >>> atss_assign(anchors, boxes, [8], topk=3)
        tensor([-1, -1,  0, -1, -1, -1, -1, -1])
    """
    _check_boxes(anchors, boxes)
    levels = _check_levels(num_anchors_per_level, anchors.shape[0])
    topk = check_int("topk", topk, 1)
    eps = check_eps(eps)
    block_bytes = _check_block_bytes(block_bytes)
    dtype = compute_dtype(torch.promote_types(anchors.dtype, boxes.dtype))
    a, b = anchors.detach().to(dtype), boxes.detach().to(dtype)
    n, m = a.shape[0], b.shape[0]
    negatives = torch.full((n,), BELOW_LOW_THRESHOLD, dtype=torch.long, device=a.device)
    if n == 0 or m == 0:
        return negatives
    cx, cy = _centres(a)
    gx, gy = _centres(b)
    block = _block(b, dtype, _TOPK_BYTES // 4, block_bytes)
    candidates, start = [], 0
    for size in levels:
        if size:
            k = min(topk, size)
            candidates.append(_closest(cx, cy, gx, gy, start, start + size, k, block))
        start += size
    cand = torch.cat(candidates)  # (K, M) anchor indices
    if cand.shape[0] < 2:  # mmdetection's std of one IoU is NaN: no anchor would be positive
        raise ValueError(
            f"atss_assign needs at least 2 candidates per object for the threshold's standard "
            f"deviation, got {cand.shape[0]} (topk={topk} on levels of sizes {list(levels)})"
        )
    iou = _overlap(a[cand], b, 0, True, eps)  # (K, M): box_iou's entries, bitwise
    threshold = iou.mean(dim=0) + iou.std(dim=0)
    ccx, ccy = cx[cand], cy[cand]
    inside = torch.minimum(
        torch.minimum(ccx - b[:, 0], ccy - b[:, 1]), torch.minimum(b[:, 2] - ccx, b[:, 3] - ccy)
    )
    positive = (iou >= threshold) & (inside > 0.01)
    # An anchor positive for several objects: the highest IoU, then the lowest object index.
    flat = cand.reshape(-1)
    value = torch.where(positive, iou, float("-inf")).reshape(-1)
    best = torch.full((n,), float("-inf"), dtype=dtype, device=a.device)
    best = best.scatter_reduce(0, flat, value, "amax")
    objects = torch.arange(m, device=a.device).expand_as(cand).reshape(-1)
    hit = positive.reshape(-1) & (value == best[flat])
    first = torch.full((n,), m, dtype=torch.long, device=a.device)
    first = first.scatter_reduce(0, flat, torch.where(hit, objects, m), "amin")
    return torch.where(first < m, first, negatives)
