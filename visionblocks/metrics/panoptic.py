"""Panoptic quality (PQ, SQ, RQ) of panoptic segmentations: `panoptic_quality`."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_same_device, check_tensor

__all__ = ["panoptic_quality"]
__dir__ = public_dir(__name__, __all__)


def _categories(name: str, values: Collection[int]) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Collection):
        raise TypeError(f"{name} must be a collection of int category ids, got {values!r}")
    for value in values:
        check_type(f"{name}[...]", value, int)
    return sorted(set(values))


def _check_panoptic(name: str, value: object) -> Tensor:
    check_tensor(name, value)
    assert isinstance(value, Tensor)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() < 3 or value.shape[-1] != 2:
        raise ValueError(
            f"{name} must have shape (B, *spatial, 2) (category id, instance id per pixel), "
            f"got {tuple(value.shape)}"
        )
    if value.device.type == "meta":
        raise ValueError(f"{name} must hold values, got a tensor on the meta device")
    return value


def _distinct(values: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """The distinct values of ``values`` (non-negative, below ``size``) in increasing order,
    their counts and the rank of each element among them: by counting (``bincount``) when
    ``size`` is small, else by ``torch.unique`` (a sort, much slower on several CPU threads)."""
    if size <= max(4 * values.numel(), 1 << 20):
        counts = torch.bincount(values, minlength=size)
        present = counts > 0
        distinct = present.nonzero().squeeze(1)
        return distinct, counts[distinct], (present.cumsum(0) - 1)[values]
    distinct, rank, counts = torch.unique(values, return_inverse=True, return_counts=True)
    return distinct, counts, rank


def panoptic_quality(
    preds: Tensor,
    target: Tensor,
    things: Collection[int],
    stuffs: Collection[int],
    allow_unknown_preds_category: bool = False,
) -> dict[str, Tensor]:
    """Panoptic quality (Kirillov et al., 2019) of a batch, as ``torchmetrics``'
    ``PanopticQuality`` computes it.

    Each image's segments are its distinct ``(category id, instance id)`` pairs; stuff
    categories have one segment per image (their instance ids are ignored). A category id
    that is neither a thing nor a stuff is void: in ``target`` always, in ``preds`` only with
    ``allow_unknown_preds_category``. A predicted and a target segment of the same category
    match when their IoU, with the pixels where the other side is void left out of the union,
    exceeds 0.5 (compared exactly, in integers). Unmatched target segments are false
    negatives and unmatched predicted ones false positives, unless more than half of them is
    void on the other side. Per class, ``SQ = sum of matched IoUs / TP``,
    ``RQ = TP / (TP + FP / 2 + FN / 2)`` and ``PQ = SQ * RQ`` (0 where undefined); the overall
    values are their means over the classes with a segment (NaN when there is none).

    Segments and their overlaps are counted with ``bincount`` (``torch.unique`` for sparse
    ids), for all images at once: the number of segments depends on the values, so this is
    a metric for evaluation, not for ``torch.compile`` (it reads the device a few times per
    call).

    Args:
        preds (Tensor[B, *S, 2]): Integer category id and instance id of every pixel.
        target (Tensor[B, *S, 2]): The same for the ground truth.
        things: The category ids of things (countable: instances are told apart).
        stuffs: The category ids of stuffs; disjoint from ``things``, not both empty.
        allow_unknown_preds_category: Count predicted category ids that are neither things
            nor stuffs as void, instead of raising.

    Returns:
        dict[str, Tensor]: ``pq``, ``sq``, ``rq`` (float64 scalars) and ``pq_per_class``,
        ``sq_per_class``, ``rq_per_class`` (float64, one value per category: ``things``
        sorted, then ``stuffs`` sorted, torchmetrics' order).

    Raises:
        TypeError: Non-tensor or non-integer inputs; ``things``/``stuffs`` not collections
            of ints.
        ValueError: Shapes that differ or are not ``(B, *S, 2)``, different or meta devices,
            ``things`` and ``stuffs`` overlapping or both empty, unknown predicted category
            ids without ``allow_unknown_preds_category``.

    Examples:
        >>> target = torch.tensor([[[[1, 0], [1, 0], [1, 1], [7, 0]]]])  # (B=1, 1, 4, 2)
        >>> preds = torch.tensor([[[[1, 5], [1, 5], [1, 5], [7, 3]]]])
        >>> out = panoptic_quality(preds, target, things={1}, stuffs={7})
        >>> out["pq"], out["pq_per_class"]  # things: SQ 2/3 * RQ 1/1.5; stuffs: 1
        (tensor(0.7222, dtype=torch.float64), tensor([0.4444, 1.0000], dtype=torch.float64))
    """
    _check_panoptic("preds", preds)
    _check_panoptic("target", target)
    if preds.shape != target.shape:
        raise ValueError(
            f"preds and target must have the same shape, got {tuple(preds.shape)} and "
            f"{tuple(target.shape)}"
        )
    check_same_device(preds=preds, target=target)
    thing_ids, stuff_ids = _categories("things", things), _categories("stuffs", stuffs)
    if set(thing_ids) & set(stuff_ids):
        raise ValueError(
            f"things and stuffs must be disjoint, both hold {sorted(set(thing_ids) & set(stuff_ids))}"
        )
    if not thing_ids and not stuff_ids:
        raise ValueError("things and stuffs must not both be empty")
    check_type("allow_unknown_preds_category", allow_unknown_preds_category, bool)

    device, num_things = preds.device, len(thing_ids)
    ordered = thing_ids + stuff_ids  # the continuous ids 0..C-1 (C: void)
    c = len(ordered)
    sorted_ids, order = torch.tensor(ordered, device=device).sort()

    def colours(x: Tensor, name: str, allow_unknown: bool) -> tuple[Tensor, Tensor]:
        category, instance = x.flatten(1, -2).long().unbind(-1)
        category = category.contiguous()
        pos = torch.searchsorted(sorted_ids, category).clamp_max(c - 1)
        known = sorted_ids[pos] == category
        if not allow_unknown and not bool(known.all()):
            unknown = torch.unique(category[~known]).tolist()
            raise ValueError(
                f"{name} holds category ids that are neither things nor stuffs: {unknown} "
                "(allow_unknown_preds_category=True counts them as void)"
            )
        cont = torch.where(known, order[pos], c)
        return cont, torch.where(cont < num_things, instance, 0)  # stuff and void: one segment

    cat_p, inst_p = colours(preds, "preds", allow_unknown_preds_category)
    cat_t, inst_t = colours(target, "target", True)
    batch, n = cat_p.shape
    # One key per (image, category, instance): instance ids compacted to ranks first.
    instance = torch.cat((inst_p, inst_t), 1).reshape(-1)
    low, high = (int(v) for v in torch.aminmax(instance)) if instance.numel() else (0, 0)
    instances, _, rank = _distinct(instance - low, high - low + 1)
    num_ranks = max(instances.numel(), 1)
    image = torch.arange(batch, device=device).unsqueeze(1)
    cats = torch.cat((cat_p, cat_t), 1)
    keys = ((image * (c + 1) + cats) * num_ranks + rank.view(batch, 2 * n)).reshape(-1)
    unique_keys, _, segment = _distinct(keys, batch * (c + 1) * num_ranks)
    s = unique_keys.numel()
    seg_cat = unique_keys // num_ranks % (c + 1)
    segment = segment.reshape(batch, 2 * n)
    seg_p, seg_t = segment[:, :n].reshape(-1), segment[:, n:].reshape(-1)
    area_p = torch.bincount(seg_p, minlength=s)
    area_t = torch.bincount(seg_t, minlength=s)

    pairs, inter, _ = _distinct(seg_p * s + seg_t, s * s)
    pp, pt = pairs // s, pairs % s
    cat_pp, cat_pt = seg_cat[pp], seg_cat[pt]
    zeros = torch.zeros(s, dtype=torch.int64, device=device)
    pred_void = zeros.index_add(0, pp, inter * (cat_pt == c))  # predicted segment on void
    void_target = zeros.index_add(0, pt, inter * (cat_pp == c))  # target segment under void
    union = area_p[pp] - pred_void[pp] + area_t[pt] - void_target[pt] - inter
    match = (cat_pp == cat_pt) & (cat_pt != c) & (2 * inter > union)
    matched_p = zeros.index_add(0, pp, match.long()) > 0
    matched_t = zeros.index_add(0, pt, match.long()) > 0

    def per_class(where: Tensor, values: Tensor) -> Tensor:
        return torch.zeros(c + 1, dtype=values.dtype, device=device).index_add(0, where, values)[:c]

    iou = torch.where(match, inter.double() / union.clamp_min(1).double(), 0.0)
    iou_sum = per_class(cat_pt, iou)
    tp = per_class(cat_pt, match.long())
    fn = per_class(seg_cat, ((area_t > 0) & ~matched_t & (2 * void_target <= area_t)).long())
    fp = per_class(seg_cat, ((area_p > 0) & ~matched_p & (2 * pred_void <= area_p)).long())

    sq = torch.where(tp > 0, iou_sum / tp.clamp_min(1), 0.0)
    denominator = tp.double() + 0.5 * fp + 0.5 * fn
    rq = torch.where(denominator > 0, tp / denominator.clamp_min(0.5), 0.0)
    pq = sq * rq
    present = (denominator > 0).double()
    count = present.sum()
    return {
        "pq": (pq * present).sum() / count,
        "sq": (sq * present).sum() / count,
        "rq": (rq * present).sum() / count,
        "pq_per_class": pq,
        "sq_per_class": sq,
        "rq_per_class": rq,
    }
