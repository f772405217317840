"""Object keypoint similarity (OKS): COCO's IoU for key points, pairwise like `box_iou`.

OKS averages, over the labelled key points, a Gaussian of each key point's distance scaled
by the object's area and a per-key-point sigma; COCO's keypoint AP thresholds it as box AP
thresholds IoU. `keypoint_oks` gives pycocotools' ``COCOeval.computeOks`` for all pairs.

Convention:
    Coordinates are in the annotation file's convention (pycocotools shifts nothing by half a
    pixel), shared by ``pred``, ``gt`` and ``boxes``, in the units of the ``areas`` (pixels
    and square pixels); x right, y down. OKS is translation invariant (any convention shared
    by both sides gives the same values), not scale invariant (``areas`` carry the scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_real, check_same_device, check_tensor
from visionblocks.ops.boxes import BOX_FORMATS

__all__ = ["COCO_PERSON_SIGMAS", "keypoint_oks"]
__dir__ = public_dir(__name__, __all__)

COCO_PERSON_SIGMAS: tuple[float, ...] = tuple(
    s / 10.0
    for s in (.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87, .89, .89)
)  # fmt: skip
"""COCO's 17 person key-point sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees,
ankles; left before right), bit for bit pycocotools' ``Params(iouType="keypoints")
.kpt_oks_sigmas``."""

# pycocotools adds np.spacing(1) = 2**-52 to the area, so a zero area divides by no zero.
_AREA_EPS = 2.0**-52


def _shape_text(shape: Sequence[int]) -> str:
    return str(tuple(int(s) for s in shape))


def _check_shapes(
    pred: Tensor, gt: Tensor, visibility: Tensor, areas: Tensor, boxes: Tensor | None
) -> None:
    """Types and shapes: ``pred (N, K, 2|3)``, ``gt (M, K, 2)`` and the rest agree."""
    check_real("pred", pred)
    check_real("gt", gt)
    check_tensor("visibility", visibility)
    check_real("areas", areas)
    if visibility.is_floating_point() or visibility.is_complex():
        raise TypeError(
            "visibility must be a bool or integer tensor (COCO's 0 / 1 / 2 flags), got dtype "
            f"{visibility.dtype}"
        )
    if pred.dim() != 3 or pred.shape[-1] not in (2, 3):
        raise ValueError(
            f"pred must have shape (N, K, 2) or (N, K, 3) (x, y[, score]), got "
            f"{_shape_text(pred.shape)}"
        )
    if gt.dim() != 3 or gt.shape[-1] != 2:
        raise ValueError(f"gt must have shape (M, K, 2) (x, y), got {_shape_text(gt.shape)}")
    if pred.shape[1] != gt.shape[1]:
        raise ValueError(
            f"pred and gt must have the same number K of key points, got pred "
            f"{_shape_text(pred.shape)} (K={pred.shape[1]}) and gt {_shape_text(gt.shape)} "
            f"(K={gt.shape[1]})"
        )
    m, k = gt.shape[0], gt.shape[1]
    if k == 0:
        raise ValueError("pred and gt must have at least one key point (K >= 1), got K=0")
    if tuple(visibility.shape) != (m, k):
        raise ValueError(
            f"visibility must have shape (M, K) = {(m, k)} to match gt "
            f"{_shape_text(gt.shape)}, got {_shape_text(visibility.shape)}"
        )
    if tuple(areas.shape) != (m,):
        raise ValueError(
            f"areas must have shape (M,) = ({m},) to match gt {_shape_text(gt.shape)}, got "
            f"{_shape_text(areas.shape)}"
        )
    if boxes is not None:
        check_real("boxes", boxes)
        if tuple(boxes.shape) != (m, 4):
            raise ValueError(
                f"boxes must have shape (M, 4) = ({m}, 4) to match gt "
                f"{_shape_text(gt.shape)}, got {_shape_text(boxes.shape)}"
            )


def _sigma_tensor(
    sigmas: Tensor | Sequence[float], k: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``sigmas`` as a ``(K,)`` tensor of ``dtype`` on ``device``, checked (sizes, values)."""
    if isinstance(sigmas, Tensor):
        if not sigmas.is_floating_point():
            raise TypeError(f"sigmas must be a floating-point tensor, got dtype {sigmas.dtype}")
        if sigmas.dim() != 1 or sigmas.shape[0] != k:
            raise ValueError(
                f"sigmas must have shape (K,) = ({k},), one per key point of pred and gt, got "
                f"{_shape_text(sigmas.shape)}"
            )
        return sigmas.to(dtype)
    if isinstance(sigmas, (str, bytes)) or not isinstance(sigmas, Sequence):
        raise TypeError(
            f"sigmas must be a tensor or a sequence of floats, got {type(sigmas).__name__} "
            f"({sigmas!r})"
        )
    if len(sigmas) != k:
        hint = ""
        if tuple(sigmas) == COCO_PERSON_SIGMAS:  # (not `is`: torch.compile cannot trace it)
            hint = " (COCO's person sigmas, the default); pass the sigmas of your key points"
        raise ValueError(
            f"sigmas must hold K = {k} values, one per key point of pred and gt, got "
            f"{len(sigmas)}{hint}"
        )
    values = []
    for i, s in enumerate(sigmas):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise TypeError(f"sigmas[{i}] must be a float, got {type(s).__name__} ({s!r})")
        if not 0 < s < math.inf:  # also False for NaN
            raise ValueError(f"sigmas must be finite and > 0, got sigmas[{i}] = {s!r}")
        values.append(float(s))
    return torch.tensor(values, dtype=dtype, device=device)


def _check_values(areas: Tensor, sigmas: Tensor | None) -> None:
    """``areas >= 0`` and finite ``sigmas > 0`` (None: checked already): raised on CPU,
    device-side asserts on CUDA."""
    sigmas_ok = None if sigmas is None else (sigmas > 0) & torch.isfinite(sigmas)
    if reads_values(areas) and bool((areas < 0).any()):
        bad = areas[areas < 0]
        raise ValueError(
            f"areas must be >= 0, got {bad.numel()} negative value(s), e.g. {bad[0].item()!r}"
        )
    if sigmas_ok is not None and reads_values(sigmas) and not bool(sigmas_ok.all()):
        raise ValueError(f"sigmas must be finite and > 0, got {sigmas.tolist()}")
    if asserts_on_device(areas):  # CUDA: no host read
        assert_on_device(areas >= 0, "keypoint_oks: areas must be >= 0")
    if sigmas_ok is not None and asserts_on_device(sigmas):
        assert_on_device(sigmas_ok, "keypoint_oks: sigmas must be finite and > 0")


def keypoint_oks(
    pred: Tensor,
    gt: Tensor,
    visibility: Tensor,
    areas: Tensor,
    sigmas: Tensor | Sequence[float] = COCO_PERSON_SIGMAS,
    boxes: Tensor | None = None,
    box_fmt: str = "xyxy",
) -> Tensor:
    """Object keypoint similarity of every prediction with every ground truth, in ``[0, 1]``.

    pycocotools' ``COCOeval.computeOks`` for all ``N x M`` pairs at once. With ``d_k`` the
    distance of key point ``k``, ``σ_k`` its sigma and ``area`` the ground truth's (segment)
    area::

        e_k = d_k² / (2 · (area + ε) · (2 σ_k)²)        ε = 2⁻⁵² (NumPy's spacing(1))
        OKS = Σ_k [v_k > 0] · exp(-e_k) / Σ_k [v_k > 0]

    the mean over the ground truth's labelled key points (visibility ``v > 0``: COCO's 1,
    labelled but hidden, and 2, visible, count alike). A ground truth with **no** labelled key
    point (COCO's ``num_keypoints == 0``) follows pycocotools' rule: the mean runs over all K
    key points and ``d_k`` is the distance of the predicted point to the box grown by its own
    width and height on every side (``[x - w, x + 2w] x [y - h, y + 2h]``, 0 inside it). That
    needs ``boxes``; without them such columns are NaN (undefined). COCOeval ignores these
    ground truths anyway; their OKS only decides which detection they absorb.

    Differentiable in ``pred`` and ``gt``; compiles with ``torch.compile(fullgraph=True)``.
    Only CPU value checks read tensor values (CUDA: device-side asserts,
    `visionblocks.value_checks`).

    Args:
        pred (Tensor[N, K, 2] or Tensor[N, K, 3]): Predicted key points ``(x, y)``; a third
            column (a score or visibility, as keypoint R-CNN returns) is ignored, as
            pycocotools ignores the ``v`` of results. Floating or integer.
        gt (Tensor[M, K, 2]): Ground-truth key points ``(x, y)`` (``tv_tensors.KeyPoints``
            works); unlabelled points are not used (even NaN is fine there).
        visibility (Tensor[M, K]): COCO's flags (0 not labelled, 1 labelled but not visible,
            2 visible), integer, or bool (True: labelled).
        areas (Tensor[M]): Object areas of the ground truths (COCO's ``area``), ``>= 0``
            (zero: only an exact match counts).
        sigmas (Tensor[K] or sequence of K floats): Per-key-point sigmas, finite and ``> 0``.
            Default `COCO_PERSON_SIGMAS` (K = 17); any other K needs its own.
        boxes (Tensor[M, 4], optional): Ground-truth boxes in ``box_fmt``, used only for
            ground truths without a labelled key point (see above).
        box_fmt: Format of ``boxes``: ``"xyxy"`` (default), ``"xywh"`` (COCO's ``bbox``,
            pycocotools' exact arithmetic) or ``"cxcywh"``.

    Returns:
        Tensor[N, M]: OKS of prediction ``i`` with ground truth ``j``; NaN in the columns of
        ground truths without a labelled key point when ``boxes`` is None (and wherever an
        input used is NaN). Computed and returned in float64 when any input is float64,
        else float32 (half and integer inputs too, also under ``torch.autocast``); float32
        differs from pycocotools by the exponent's rounding only. ``N = 0`` or ``M = 0``
        gives an empty ``(N, M)``.

    Raises:
        TypeError: A non-tensor input (``sigmas`` may also be a sequence), complex or bool
            coordinates, areas or boxes, floating ``visibility``, integer ``sigmas``,
            ``box_fmt`` not a str.
        ValueError: Shapes that disagree, K = 0, ``sigmas`` not of length K, tensors on
            different devices, an unknown ``box_fmt``; on CPU also negative ``areas`` or
            sigmas not finite and ``> 0``.

    Examples:
        >>> import torch
        >>> gt = torch.tensor([[[10.0, 10.0], [20.0, 10.0], [15.0, 30.0]]])  # M=1, K=3
        >>> visibility = torch.tensor([[2, 2, 0]])  # the third point is not labelled
        >>> areas = torch.tensor([400.0])
        >>> sigmas = [0.05, 0.05, 0.1]
        >>> pred = torch.stack([gt[0], gt[0] + 2.0])  # exact, and 2 px off in x and y
        >>> keypoint_oks(pred, gt, visibility, areas, sigmas)
        tensor([[1.0000],
                [0.3679]])
        >>> empty = torch.tensor([[0, 0, 0]])  # no labelled point: distances to the grown box
        >>> box = torch.tensor([[10.0, 10.0, 20.0, 30.0]])  # xyxy, grown to [0, 30] x [-10, 50]
        >>> keypoint_oks(pred, gt, empty, areas, sigmas, boxes=box)
        tensor([[1.],
                [1.]])
        >>> keypoint_oks(pred, gt, empty, areas, sigmas)  # undefined without the box
        tensor([[nan],
                [nan]])
    """
    _check_shapes(pred, gt, visibility, areas, boxes)
    check_type("box_fmt", box_fmt, str)
    check_choice("box_fmt", box_fmt, BOX_FORMATS)
    check_same_device(pred=pred, gt=gt, visibility=visibility, areas=areas, boxes=boxes)
    given = [pred, gt, areas, *(() if boxes is None else (boxes,))]
    if isinstance(sigmas, Tensor):
        check_same_device(pred=pred, sigmas=sigmas)
        given.append(sigmas)
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in given) else torch.float32
    sigma = _sigma_tensor(sigmas, gt.shape[1], dtype, pred.device)
    _check_values(areas, sigma if isinstance(sigmas, Tensor) else None)

    xy = pred[..., :2].to(dtype).unsqueeze(1)  # (N, 1, K, 2)
    labelled = visibility > 0  # (M, K)
    any_labelled = labelled.any(-1, keepdim=True)  # (M, 1): pycocotools' k1 > 0
    # Values that are not used are zeroed, so that no NaN or inf there reaches a gradient.
    target = gt.to(dtype).masked_fill(~labelled.unsqueeze(-1), 0)
    d2 = (xy - target).square().sum(-1)  # (N, M, K): dx² + dy²
    if boxes is not None:  # distances to the grown box, for the ground truths with k1 == 0
        b = boxes.to(dtype).masked_fill(any_labelled, 0)
        if box_fmt == "xyxy":
            x, y, w, h = b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        elif box_fmt == "cxcywh":
            w, h = b[:, 2], b[:, 3]
            x, y = b[:, 0] - 0.5 * w, b[:, 1] - 0.5 * h
        else:
            x, y, w, h = b.unbind(-1)
        lo = torch.stack((x - w, y - h), -1).unsqueeze(1)  # (M, 1, 2), as pycocotools' x0, y0
        hi = torch.stack((x + w * 2, y + h * 2), -1).unsqueeze(1)  # x1, y1
        outside = (lo - xy).clamp_min(0) + (xy - hi).clamp_min(0)  # (N, M, K, 2)
        d2 = torch.where(any_labelled, d2, outside.square().sum(-1))
    scale = areas.to(dtype).unsqueeze(-1) + _AREA_EPS  # (M, 1)
    e = d2 / (2 * sigma) ** 2 / scale / 2  # pycocotools' order of operations
    weight = labelled | ~any_labelled  # every key point where none is labelled
    similarity = torch.where(weight, torch.exp(-e), 0).sum(-1)
    oks = similarity / weight.sum(-1).to(dtype)  # >= 1 point each
    if boxes is None:
        oks = torch.where(any_labelled.squeeze(-1), oks, math.nan)
    return oks
