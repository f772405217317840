"""Hungarian matching of DETR's queries to objects: `hungarian_match`, `HungarianMatcher`.

DETR and its descendants train on a one-to-one assignment of each image's ``Q`` queries to its
``M`` objects, the one of least total cost, solved by ``scipy.optimize.linear_sum_assignment``.
The cost of query ``q`` for object ``t`` is
``cost_class * class cost + cost_bbox * L1(box_q, box_t) - cost_giou * GIoU(box_q, box_t)``;
the class cost is DETR's ``-softmax(logits)[label]`` or, with ``focal=True``, Deformable
DETR's focal cost ``alpha (1 - p)^gamma (-log(p + 1e-8)) - (1 - alpha) p^gamma
(-log(1 - p + 1e-8))`` with ``p = sigmoid(logits)[label]``. The inputs and the result are those
of DETR's ``HungarianMatcher`` (``models/matcher.py`` of facebookresearch/detr and
fundamentalvision/Deformable-DETR), and so is the matching.

Costs: only the ``Q x M_i`` pairs of each image are computed (``Q * sum(M_i)`` entries), all
images in one pass: no matrix over all targets of the batch (DETR's first matcher built
``B*Q x sum(M_i)``, ``B`` times more), no padding to the largest image.

Host: the solver runs on the CPU. Each call copies the costs of all images to the host at once
(one ``.cpu()`` of a flat tensor, split there): the one host read, which waits for the device
to finish computing them; nothing before it reads a device tensor (the costs compile with
``torch.compile(fullgraph=True)``, the solve cannot), and the result is on the CPU, as DETR's.
Inside a compiled model the call is a graph break. A label outside ``[0, C)`` makes its row of
costs NaN on the device; the host then reports it, as it reports any NaN or infinite cost.

Convention:
    ``outputs["pred_logits"]``: ``(B, Q, C)`` logits (with softmax, ``C`` counts DETR's
    no-object class). ``outputs["pred_boxes"]`` and each ``targets[i]["boxes"]``: ``"cxcywh"``
    boxes (`visionblocks.ops.boxes`), normalised to ``[0, 1]`` in DETR; ``targets[i]["labels"]``:
    ``(M_i,)`` integer classes in ``[0, C)``. Other keys are ignored (DETR's ``aux_outputs``).
    The GIoU is `visionblocks.ops.generalized_box_iou`'s.

Dtypes:
    float16 and bfloat16 inputs are computed in float32, float64 in float64; the indices are
    int64 CPU tensors. No gradient is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, check_real, compute_dtype
from visionblocks.ops.boxes import _measure

__all__ = ["HungarianMatcher", "hungarian_match"]
__dir__ = public_dir(__name__, __all__)


def _check_inputs(
    outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]
) -> tuple[Tensor, Tensor]:
    """Shapes, dtypes and devices of the inputs (no values); the two predicted tensors."""
    check_type("outputs", outputs, Mapping)
    for key in ("pred_logits", "pred_boxes"):
        if key not in outputs:
            raise ValueError(f"outputs must have the key {key!r}, got keys {sorted(outputs)}")
    logits = check_floating("outputs['pred_logits']", outputs["pred_logits"])
    boxes = check_floating("outputs['pred_boxes']", outputs["pred_boxes"])
    if logits.dim() != 3 or logits.shape[-1] == 0:
        raise ValueError(
            f"outputs['pred_logits'] must have shape (B, Q, C) with C >= 1, got "
            f"{tuple(logits.shape)}"
        )
    if boxes.shape != (*logits.shape[:2], 4):
        raise ValueError(
            f"outputs['pred_boxes'] must have shape (B, Q, 4) = {(*logits.shape[:2], 4)} "
            f"(B, Q of outputs['pred_logits']), got {tuple(boxes.shape)}"
        )
    if not isinstance(targets, Sequence) or isinstance(targets, str):
        raise TypeError(f"targets must be a list of dicts, got {type(targets).__name__}")
    if len(targets) != len(logits):
        raise ValueError(
            f"targets must have one dict per image, B = {len(logits)} "
            f"(outputs['pred_logits'].shape[0]), got {len(targets)}"
        )
    on_device = [("outputs['pred_boxes']", boxes)]
    for i, target in enumerate(targets):
        check_type(f"targets[{i}]", target, Mapping)
        for key in ("labels", "boxes"):
            if key not in target:
                raise ValueError(f"targets[{i}] must have the key {key!r}, got {sorted(target)}")
        labels = check_real(f"targets[{i}]['labels']", target["labels"])
        t_boxes = check_floating(f"targets[{i}]['boxes']", target["boxes"])
        if labels.is_floating_point():
            raise TypeError(f"targets[{i}]['labels'] must be an integer tensor, got {labels.dtype}")
        if labels.dim() != 1 or t_boxes.shape != (len(labels), 4):
            raise ValueError(
                f"targets[{i}]['labels'] and targets[{i}]['boxes'] must have shapes (M,) and "
                f"(M, 4), got {tuple(labels.shape)} and {tuple(t_boxes.shape)}"
            )
        on_device += [(f"targets[{i}]['labels']", labels), (f"targets[{i}]['boxes']", t_boxes)]
    for name, t in on_device:
        if t.device != logits.device:
            raise ValueError(
                f"{name} is on {t.device} but outputs['pred_logits'] is on {logits.device}; "
                "move one to the other's device"
            )
    return logits, boxes


def _check_weights(
    cost_class: float, cost_bbox: float, cost_giou: float, focal: bool, alpha: float, gamma: float
) -> None:
    weights = {"cost_class": cost_class, "cost_bbox": cost_bbox, "cost_giou": cost_giou}
    if not any(
        [check_number(n, v, 0.0, math.inf, high_inclusive=False) for n, v in weights.items()]
    ):
        raise ValueError("cost_class, cost_bbox and cost_giou must not all be 0")
    check_type("focal", focal, bool)
    check_number("alpha", alpha, 0.0, 1.0)
    check_number("gamma", gamma, 0.0, math.inf, high_inclusive=False)


def _costs(
    logits: Tensor,
    boxes: Tensor,
    labels: list[Tensor],
    target_boxes: list[Tensor],
    weights: tuple[float, float, float],
    focal: bool,
    alpha: float,
    gamma: float,
) -> Tensor:
    """``(sum(M_i), Q)`` costs: rows ``[M_0 + ... + M_(i-1), ... + M_i)`` are image ``i``'s
    objects against its queries; NaN in the rows of labels outside ``[0, C)``. On the device."""
    num_classes = logits.shape[-1]
    dtype = compute_dtype(torch.promote_types(logits.dtype, boxes.dtype))
    # The image of each object (from the lengths, no host read; repeat_interleave would start
    # a thread pool), and the objects of all images.
    image = [i for i, t in enumerate(labels) for _ in range(len(t))]
    image = torch.tensor(image, dtype=torch.long, device=logits.device)
    label = torch.cat(labels).long()
    safe = label.clamp(0, num_classes - 1)  # the rows of other labels become NaN below
    logits = logits.to(dtype)
    prob = logits.sigmoid() if focal else logits.softmax(-1)
    p = prob.transpose(1, 2)[image, safe]  # (sum M, Q): each object's class, its queries
    if focal:  # Deformable DETR's cost, its 1e-8 included
        pos = alpha * (1 - p) ** gamma * -(p + 1e-8).log()
        neg = (1 - alpha) * p**gamma * -(1 - p + 1e-8).log()
        p = neg - pos  # minus the class cost, as the probability is DETR's
    objects = torch.cat(target_boxes).to(dtype).unsqueeze(1)  # (sum M, 1, 4)
    queries = boxes.to(dtype).index_select(0, image)  # (sum M, Q, 4): its image's queries
    l1 = torch.cdist(objects, queries, p=1)[:, 0]
    giou = _measure(_corners(objects), _corners(queries), 1, 1e-7)  # (sum M, Q)
    cost = (weights[1] * l1).sub_(p, alpha=weights[0]).sub_(giou, alpha=weights[2])
    return cost.masked_fill((safe != label).unsqueeze(1), float("nan"))


def _corners(boxes: Tensor) -> list[Tensor]:
    """``x1, y1, x2, y2`` of ``"cxcywh"`` boxes (`box_convert`'s), inverted ones collapsed as
    `generalized_box_iou` does: its GIoU, bit for bit, without its checks."""
    cx, cy, w, h = boxes.unbind(-1)
    x1, y1, x2, y2 = cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h
    return [x1, y1, torch.where(x2 < x1, x1, x2), torch.where(y2 < y1, y1, y2)]


def _linear_sum_assignment() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as err:
        raise ImportError(
            "hungarian_match needs scipy (its linear_sum_assignment): "
            "pip install scipy, or pip install visionblocks[matching]"
        ) from err
    return linear_sum_assignment


def hungarian_match(
    outputs: Mapping[str, Tensor],
    targets: Sequence[Mapping[str, Tensor]],
    cost_class: float = 1.0,
    cost_bbox: float = 1.0,
    cost_giou: float = 1.0,
    focal: bool = False,
    alpha: float = 0.25,
    gamma: float = 2.0,
) -> list[tuple[Tensor, Tensor]]:
    """DETR's Hungarian matching of queries to objects, image by image (module docstring).

    Args:
        outputs: ``{"pred_logits": (B, Q, C) logits, "pred_boxes": (B, Q, 4) "cxcywh" boxes}``.
        targets: ``B`` dicts ``{"labels": (M_i,) int classes in [0, C), "boxes": (M_i, 4)}``,
            ``M_i`` may be 0.
        cost_class: Weight of the class cost, ``>= 0``.
        cost_bbox: Weight of the L1 distance of the boxes, ``>= 0``.
        cost_giou: Weight of minus their GIoU, ``>= 0``; the three are not all 0.
        focal: Deformable DETR's focal class cost on sigmoid probabilities (else DETR's
            ``-softmax`` probability).
        alpha: The focal cost's weight of positives, in ``[0, 1]``.
        gamma: The focal cost's exponent, ``>= 0``.

    Returns:
        list[tuple[Tensor, Tensor]]: Per image, ``(query indices, target indices)``: int64 CPU
        tensors of length ``min(Q, M_i)``, query indices increasing, as DETR's.

    Raises:
        TypeError: An input of the wrong type or dtype (float labels, integer logits).
        ValueError: A missing key, a shape or device mismatch, ``len(targets) != B``, a
            negative or NaN weight, all weights 0; labels outside ``[0, C)`` or NaN or infinite
            costs (non-finite logits or boxes), naming the image.
        ImportError: scipy is not installed.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[[4.0, 0.0], [0.0, 4.0], [0.0, 0.0]]])  # 1 image, 3 queries
        >>> boxes = torch.tensor([[[0.2, 0.2, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2], [0.5] * 4]])
        >>> targets = [{"labels": torch.tensor([1, 0]), "boxes": boxes[0, :2].flip(0)}]
        >>> hungarian_match({"pred_logits": logits, "pred_boxes": boxes}, targets)
        [(tensor([0, 1]), tensor([1, 0]))]
    """
    linear_sum_assignment = _linear_sum_assignment()
    logits, boxes = _check_inputs(outputs, targets)
    _check_weights(cost_class, cost_bbox, cost_giou, focal, alpha, gamma)
    sizes = [len(t["labels"]) for t in targets]
    if sum(sizes) == 0 or logits.shape[1] == 0:
        return [_unmatched() for _ in targets]
    labels = [t["labels"] for t in targets]
    weights = (cost_class, cost_bbox, cost_giou)
    with torch.no_grad():
        t_boxes = [t["boxes"] for t in targets]
        cost = _costs(logits, boxes, labels, t_boxes, weights, focal, alpha, gamma)
    host = cost.cpu().numpy()  # the one transfer: every image's costs
    finite = bool(np.isfinite(host).all())
    out, start = [], 0
    for i, m in enumerate(sizes):
        block, start = host[start : start + m], start + m  # (M_i, Q)
        if not finite and not np.isfinite(block).all():
            raise ValueError(_non_finite(i, labels[i], logits.shape[-1]))
        if m == 0:
            out.append(_unmatched())
            continue
        query, target = linear_sum_assignment(block.T)
        out.append((torch.from_numpy(query).long(), torch.from_numpy(target).long()))
    return out


def _unmatched() -> tuple[Tensor, Tensor]:
    return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)


def _non_finite(i: int, labels: Tensor, num_classes: int) -> str:
    """The error of image ``i``'s non-finite costs (reading its labels: an error path)."""
    labels = labels.cpu()
    wrong = labels[(labels < 0) | (labels >= num_classes)]
    if len(wrong):
        return f"targets[{i}]['labels'] must be in [0, {num_classes}), got {wrong.tolist()}"
    return (
        f"the costs of image {i} are NaN or infinite: check outputs['pred_logits'][{i}], "
        f"outputs['pred_boxes'][{i}] and targets[{i}]['boxes'] for non-finite values"
    )


class HungarianMatcher(nn.Module):
    """Module form of `hungarian_match`, with DETR's ``HungarianMatcher`` arguments.

    Args:
        cost_class: Weight of the class cost.
        cost_bbox: Weight of the boxes' L1 distance.
        cost_giou: Weight of minus their GIoU.
        focal: Deformable DETR's focal class cost.
        alpha: The focal cost's weight of positives.
        gamma: The focal cost's exponent.

    Examples:
        >>> import torch
        >>> matcher = HungarianMatcher(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal=True)
        >>> matcher
        HungarianMatcher(cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal=True, alpha=0.25, gamma=2.0)
        >>> outputs = {"pred_logits": torch.zeros(2, 4, 3), "pred_boxes": torch.rand(2, 4, 4)}
        >>> targets = [{"labels": torch.tensor([2]), "boxes": torch.rand(1, 4)}] * 2
        >>> [len(q) for q, t in matcher(outputs, targets)]
        [1, 1]
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 1.0,
        cost_giou: float = 1.0,
        focal: bool = False,
        alpha: float = 0.25,
        gamma: float = 2.0,
    ) -> None:
        super().__init__()
        _check_weights(cost_class, cost_bbox, cost_giou, focal, alpha, gamma)
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.focal, self.alpha, self.gamma = focal, alpha, gamma

    def forward(
        self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]
    ) -> list[tuple[Tensor, Tensor]]:
        """`hungarian_match` with this module's weights."""
        return hungarian_match(
            outputs,
            targets,
            self.cost_class,
            self.cost_bbox,
            self.cost_giou,
            self.focal,
            self.alpha,
            self.gamma,
        )

    def extra_repr(self) -> str:
        return (
            f"cost_class={self.cost_class}, cost_bbox={self.cost_bbox}, "
            f"cost_giou={self.cost_giou}, focal={self.focal}, alpha={self.alpha}, "
            f"gamma={self.gamma}"
        )
