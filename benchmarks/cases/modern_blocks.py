"""Size sweep of issue 41's blocks against the code users have today, at 1 and 2 threads.

"Never slower than the peer at any size": one case per ``(op, size, threads)`` in the
``sweep`` group, named ``sweep_<op>_<size>_t<threads>``, timed as `benchmarks.cases.sweep`'s
points (calibrated loops of at least ``MIN_SAMPLE_MS``, Python-level calls counted, target
``MIN_RATIO``). Each side returns what it computed and the check compares them on small inputs.

- box coders: `decode_distances` / `encode_distances` against ultralytics' ``dist2bbox`` /
  ``bbox2dist`` (``reg_max=16``), `decode_deltas` / `encode_deltas` against torchvision's
  ``BoxCoder((10, 10, 5, 5))``; 10 to 10^6 boxes.
- priors: `make_anchor_points` against ultralytics' ``make_anchors`` (strides 8, 16, 32) and
  `AnchorGenerator` against torchvision's (RetinaNet's 5 levels, 9 anchors per cell, 2 images);
  images of 64, 640 and 1280 pixels.
- NMS family: `nms` / `batched_nms` against torchvision's (10 to 10^4 boxes, 80 classes),
  `soft_nms` against the classic greedy loop in NumPy (``numpy_soft_nms`` here, the
  authors' ``cpu_soft_nms`` of bharatsingh430/soft-nms ``lib/nms/cpu_nms.pyx``, one box per
  step with the step's IoUs vectorised, as mmcv's and the Python ports run it) on one cluster
  of overlapping boxes (every step decays every box) and on boxes spread over an image;
  `matrix_nms` against mmdetection's ``mask_matrix_nms`` re-expressed for boxes
  (``mmdet_matrix_nms`` here, open-mmlab/mmdetection ``mmdet/models/layers/matrix_nms.py``).
- losses, forward + backward (gradient of the logits): `distribution_focal_loss` against
  ultralytics' ``DFLoss`` as ``v8DetectionLoss`` uses it (weighted sum over the normalizer;
  16 bins per side, 10 to 10^5 boxes), `varifocal_loss` against ultralytics'
  ``VarifocalLoss`` and `quality_focal_loss` against mmdetection's
  ``quality_focal_loss_tensor_target`` (``mmdet_qfl`` here, ``mmdet/models/losses/
  gfocal_loss.py``), both on ``(N, 80)`` logits, 1 to 67,200 rows (8,400 anchors x 8 images).
- `ModelEMA.update` against ultralytics' ``ModelEMA.update`` (same ramp, ``tau=2000``) on a
  linear layer, a small conv net and torchvision's ResNet-18.

The cases with an ultralytics peer are registered only where ultralytics is installed (a
test and benchmark dependency).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.cases.sweep import MIN_RATIO, MIN_SAMPLE_MS, THREADS
from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import same_outputs

__all__ = ["MODERN_CASES", "mmdet_matrix_nms", "mmdet_qfl", "numpy_soft_nms"]

HAS_ULTRALYTICS = importlib.util.find_spec("ultralytics") is not None
CODER_SIZES = (10, 100, 10_000, 1_000_000)
IMAGE_SIZES = (64, 640, 1280)
NMS_SIZES = (10, 1_000, 10_000)
SOFT_NMS_SIZES = (10, 100, 1_000)
MATRIX_NMS_SIZES = (10, 100, 1_000)
DFL_BOXES = (10, 64, 1_000, 100_000)
SCORE_ROWS = (1, 100, 8_400, 67_200)
_CLASSES = 80
_BINS = 16
_CHECK_LIMIT = 100_000  # boxes, rows or elements the output check uses at most


def _decade(n: int) -> str:
    k = len(str(n)) - 1
    return f"1e{k}" if n == 10**k else str(n)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _boxes(n: int, g: torch.Generator, extent: float = 600.0, side: float = 200.0) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=g) * extent
    return torch.cat([xy, xy + torch.rand(n, 2, generator=g) * side + 1], dim=-1)


# --- box coders ----------------------------------------------------------------------------


def _coder_setup(kind: str, n: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen()
        if kind == "decode_distances":  # points (grid units) and predicted distances
            return torch.rand(n, 2, generator=g) * 80, torch.rand(n, 4, generator=g) * 15
        if kind == "encode_distances":  # points and their target boxes (grid units)
            points = torch.rand(n, 2, generator=g) * 80
            return points, torch.cat([points - torch.rand(n, 2, generator=g) * 20,
                                      points + torch.rand(n, 2, generator=g) * 20], -1)  # fmt: skip
        anchors = _boxes(n, g)
        if kind == "decode_deltas":
            return anchors, torch.randn(n, 4, generator=g)
        return anchors, _boxes(n, g)

    return setup


def _ours_coder(kind: str) -> Callable[[Any], torch.Tensor]:
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        from visionblocks.ops import box_coders

        ref, x = state
        if kind == "decode_distances":
            return box_coders.decode_distances(ref, x)
        if kind == "encode_distances":
            return box_coders.encode_distances(ref, x, reg_max=_BINS - 1)
        if kind == "decode_deltas":
            return box_coders.decode_deltas(ref, deltas=x, weights=(10.0, 10.0, 5.0, 5.0))
        return box_coders.encode_deltas(ref, boxes=x, weights=(10.0, 10.0, 5.0, 5.0))

    run.__name__ = f"_ours_{kind}"
    return run


def _ultralytics_dist2bbox(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from ultralytics.utils.tal import dist2bbox

    points, distances = state
    return dist2bbox(distances, points, xywh=False)


def _ultralytics_bbox2dist(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from ultralytics.utils.tal import bbox2dist

    points, boxes = state
    return bbox2dist(points, boxes, _BINS - 1)


def _torchvision_coder(decode: bool) -> Callable[[Any], torch.Tensor]:
    def run(state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        from torchvision.models.detection._utils import BoxCoder

        anchors, x = state
        coder = BoxCoder((10.0, 10.0, 5.0, 5.0))  # as a detector holds it: built once
        if decode:
            return coder.decode_single(x, anchors)
        return coder.encode_single(x, anchors)

    run.__name__ = "_torchvision_decode" if decode else "_torchvision_encode"
    return run


# --- priors ---------------------------------------------------------------------------------

_POINT_STRIDES = (8, 16, 32)
_RETINA_STRIDES = (8, 16, 32, 64, 128)
_RETINA_SIZES = tuple(
    (s, int(s * 2 ** (1 / 3)), int(s * 2 ** (2 / 3))) for s in (32, 64, 128, 256, 512)
)
_RETINA_RATIOS = ((0.5, 1.0, 2.0),) * 5


def _points_setup(image: int) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        feats = [
            torch.zeros(1, 1, math.ceil(image / s), math.ceil(image / s)) for s in _POINT_STRIDES
        ]
        return {"feats": feats, "strides": torch.tensor(_POINT_STRIDES, dtype=torch.float32)}

    return setup


def _ours_points(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from visionblocks.ops import make_anchor_points

    return make_anchor_points(state["feats"], state["strides"])


def _ultralytics_points(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from ultralytics.utils.tal import make_anchors

    return make_anchors(state["feats"], state["strides"])


def _anchors_setup(image: int) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        from torchvision.models.detection.anchor_utils import AnchorGenerator as TVGenerator
        from torchvision.models.detection.image_list import ImageList

        from visionblocks.ops import AnchorGenerator

        images = torch.zeros(2, 1, image, image)
        feats = [
            torch.zeros(2, 1, math.ceil(image / s), math.ceil(image / s)) for s in _RETINA_STRIDES
        ]
        return {
            "images": ImageList(images, [(image, image)] * 2),
            "feats": feats,
            "ours": AnchorGenerator(_RETINA_SIZES, _RETINA_RATIOS),
            "peer": TVGenerator(_RETINA_SIZES, _RETINA_RATIOS),
        }

    return setup


def _ours_anchors(state: dict[str, Any]) -> list[torch.Tensor]:
    return state["ours"](state["images"], state["feats"])


def _torchvision_anchors(state: dict[str, Any]) -> list[torch.Tensor]:
    return state["peer"](state["images"], state["feats"])


# --- NMS family -----------------------------------------------------------------------------


def _nms_setup(n: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    def setup() -> tuple[torch.Tensor, ...]:
        g = _gen()
        boxes = _boxes(n, g, extent=1000.0, side=100.0)
        return boxes, torch.rand(n, generator=g), torch.randint(0, _CLASSES, (n,), generator=g)

    return setup


def _ours_nms(state: tuple[torch.Tensor, ...]) -> torch.Tensor:
    from visionblocks.ops import nms

    return nms(state[0], state[1], 0.5)


def _torchvision_nms(state: tuple[torch.Tensor, ...]) -> torch.Tensor:
    import torchvision.ops

    return torchvision.ops.nms(state[0], state[1], 0.5)


def _ours_batched_nms(state: tuple[torch.Tensor, ...]) -> torch.Tensor:
    from visionblocks.ops import batched_nms

    return batched_nms(*state, 0.5)


def _torchvision_batched_nms(state: tuple[torch.Tensor, ...]) -> torch.Tensor:
    import torchvision.ops

    return torchvision.ops.batched_nms(*state, 0.5)


def _soft_nms_setup(n: int, cluster: bool) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        g = _gen()
        if cluster:  # detections of one object: every pair overlaps
            centre = 100 + torch.randn(n, 2, generator=g) * 3
            half = 40 + torch.randn(n, 2, generator=g) * 3
            boxes = torch.cat([centre - half, centre + half], -1)
        else:
            boxes = _boxes(n, g, extent=1000.0, side=100.0)
        scores = torch.rand(n, generator=g)
        method = "linear" if cluster else "gaussian"
        return {"boxes": boxes, "scores": scores, "method": method,
                "np": (boxes.numpy(), scores.numpy())}  # fmt: skip

    return setup


def _ours_soft_nms(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from visionblocks.ops import soft_nms

    return soft_nms(state["boxes"], state["scores"], method=state["method"])


def numpy_soft_nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float = 0.3,
    sigma: float = 0.5,
    score_threshold: float = 0.001,
    method: str = "linear",
) -> tuple[np.ndarray, np.ndarray]:
    """The classic greedy soft-NMS in NumPy: the authors' ``cpu_soft_nms`` (bharatsingh430/
    soft-nms, ``lib/nms/cpu_nms.pyx``) one pick per step, each step's IoUs vectorised, with
    `visionblocks.ops.soft_nms`'s documented changes (no ``+ 1``, ties to the earlier box in
    (score, index) order, boxes below the threshold dropped from the start)."""
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] >= score_threshold]
    x1, y1, x2, y2 = (boxes[order, k].copy() for k in range(4))
    live, idx = scores[order].copy(), order
    areas = (x2 - x1) * (y2 - y1)
    keep, kept = [], []
    while live.size:
        i = int(live.argmax())
        keep.append(idx[i])
        kept.append(live[i])
        w = np.maximum(0.0, np.minimum(x2[i], x2) - np.maximum(x1[i], x1))
        h = np.maximum(0.0, np.minimum(y2[i], y2) - np.maximum(y1[i], y1))
        inter = w * h
        iou = inter / (areas[i] + areas - inter)
        if method == "linear":
            live = live * np.where(iou > iou_threshold, 1 - iou, 1.0)
        else:
            live = live * np.exp(-(iou * iou) / sigma)
        alive = live >= score_threshold
        alive[i] = False
        x1, y1, x2, y2, areas, live, idx = (a[alive] for a in (x1, y1, x2, y2, areas, live, idx))
    return np.asarray(keep, dtype=np.int64), np.asarray(kept, dtype=np.float64)


def _numpy_soft_nms(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    keep, kept = numpy_soft_nms(*state["np"], method=state["method"])
    return torch.from_numpy(keep), torch.from_numpy(kept)


def _matrix_nms_setup(n: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen()
        return _boxes(n, g, extent=300.0, side=100.0), torch.rand(n, generator=g)

    return setup


def _ours_matrix_nms(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.ops import matrix_nms

    return matrix_nms(state[1], boxes=state[0])


def mmdet_matrix_nms(
    boxes: torch.Tensor, scores: torch.Tensor, sigma: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdetection's ``mask_matrix_nms`` (``mmdet/models/layers/matrix_nms.py``, Gaussian
    kernel, one label, no ``nms_pre``/``max_num``/``filter_thr``) with box IoUs
    (``torchvision.ops.box_iou``) in place of mask IoUs: indices and decayed scores."""
    import torchvision.ops

    scores, order = torch.sort(scores, descending=True)
    n = len(order)
    iou = torchvision.ops.box_iou(boxes[order], boxes[order]).triu(diagonal=1)
    compensate = iou.max(0)[0].expand(n, n).transpose(1, 0)
    decay = torch.exp(-1 * sigma * iou**2) / torch.exp(-1 * sigma * compensate**2)
    scores = scores * decay.min(0)[0]
    rank = torch.argsort(scores, descending=True)
    return order[rank], scores[rank]


def _mmdet_matrix_nms(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return mmdet_matrix_nms(*state)


# --- losses ---------------------------------------------------------------------------------


def _dfl_setup(boxes: int) -> Callable[[], dict[str, torch.Tensor]]:
    def setup() -> dict[str, torch.Tensor]:
        g = _gen()
        pred = torch.randn(boxes, 4, _BINS, generator=g).requires_grad_(True)
        target = torch.rand(boxes, 4, generator=g) * (_BINS - 1.01)  # bbox2dist's clamp
        weight = torch.rand(boxes, 1, generator=g)
        return {"pred": pred, "target": target, "weight": weight, "norm": weight.sum() + 1}

    return setup


def _ours_dfl(state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.losses import distribution_focal_loss

    loss = distribution_focal_loss(state["pred"], state["target"], weight=state["weight"],
                                   reduction="sum", normalizer=4 * state["norm"])  # fmt: skip
    return loss.detach(), torch.autograd.grad(loss, state["pred"])[0]


def _ultralytics_dfl(state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from ultralytics.utils.loss import DFLoss

    pred = state["pred"]
    loss = DFLoss(_BINS)(pred.view(-1, _BINS), state["target"]) * state["weight"]
    loss = loss.sum() / state["norm"]  # v8DetectionLoss / BboxLoss
    return loss.detach(), torch.autograd.grad(loss, pred)[0]


def _scores_setup(rows: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def setup() -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen()
        logits = (torch.randn(rows, _CLASSES, generator=g) * 2 - 4).requires_grad_(True)
        positive = torch.rand(rows, _CLASSES, generator=g) < 1 / _CLASSES
        return logits, torch.rand(rows, _CLASSES, generator=g) * positive

    return setup


def _ours_vfl(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.losses import varifocal_loss

    pred, target = state
    loss = varifocal_loss(pred, target, reduction="sum", normalizer=pred.shape[1])
    return loss.detach(), torch.autograd.grad(loss, pred)[0]


def _ultralytics_vfl(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from ultralytics.utils.loss import VarifocalLoss

    pred, target = state
    loss = VarifocalLoss()(pred, target, (target > 0).to(pred.dtype))
    return loss.detach(), torch.autograd.grad(loss, pred)[0]


def _ours_qfl(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    from visionblocks.losses import quality_focal_loss

    pred, target = state
    loss = quality_focal_loss(pred, target, reduction="sum", normalizer=pred.shape[0])
    return loss.detach(), torch.autograd.grad(loss, pred)[0]


def mmdet_qfl(pred: torch.Tensor, target: torch.Tensor, beta: float = 2.0) -> torch.Tensor:
    """mmdetection's ``quality_focal_loss_tensor_target`` (``mmdet/models/losses/
    gfocal_loss.py``, logits) with its ``weighted_loss`` mean over the samples."""
    pred_sigmoid = pred.sigmoid()
    target = target.type_as(pred)
    zerolabel = pred_sigmoid.new_zeros(pred.shape)
    loss = F.binary_cross_entropy_with_logits(pred, zerolabel, reduction="none") * pred_sigmoid.pow(
        beta
    )
    pos = target != 0
    scale = target[pos] - pred_sigmoid[pos]
    loss[pos] = F.binary_cross_entropy_with_logits(
        pred[pos], target[pos], reduction="none"
    ) * scale.abs().pow(beta)
    return loss.sum(dim=1).mean()


def _mmdet_qfl(state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    pred, target = state
    loss = mmdet_qfl(pred, target)
    return loss.detach(), torch.autograd.grad(loss, pred)[0]


# --- EMA ------------------------------------------------------------------------------------


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        return nn.Linear(16, 16)
    if kind == "convnet":
        layers: list[nn.Module] = []
        for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, 64)):
            layers += [nn.Conv2d(c_in, c_out, 3, bias=False), nn.BatchNorm2d(c_out), nn.SiLU()]
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(64, 10))
    import torchvision

    return torchvision.models.resnet18()


def _ema_setup(kind: str) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        from ultralytics.utils.torch_utils import ModelEMA as UltralyticsEMA

        from visionblocks.training import ModelEMA

        model = _model(kind)
        state = {"model": model, "ours": ModelEMA(model, 0.9999, tau=2000.0),
                 "peer": UltralyticsEMA(model, 0.9999, tau=2000)}  # fmt: skip
        with torch.no_grad():  # the model moved on from the copies
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        return state

    return setup


def _ours_ema(state: dict[str, Any]) -> None:
    state["ours"].update(state["model"])


def _ultralytics_ema(state: dict[str, Any]) -> None:
    state["peer"].update(state["model"])


def _ema_outputs(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    _ours_ema(state)
    _ultralytics_ema(state)
    ours = state["ours"].module.state_dict()
    peer = state["peer"].ema.state_dict()
    return ({k: v for k, v in ours.items() if v.is_floating_point()},
            {k: v for k, v in peer.items() if v.is_floating_point()})  # fmt: skip


# --- registration ---------------------------------------------------------------------------


def _point(op: str, size: str, elements: int, threads: int, setup: Callable[[], Any],
           small_setup: Callable[[], Any] | None, ours: Callable[[Any], Any],
           peer: Callable[[Any], Any], peer_name: str, what: str,
           check: Callable[[Any, Any], None],
           outputs: Callable[[Any], Any] | None = None) -> BenchCase:  # fmt: skip
    return register_case(
        BenchCase(
            name=f"sweep_{op}_{size}_t{threads}",
            setup=setup,
            ours=ours,
            peer=peer,
            peer_name=peer_name,
            description=f"{op} {size}, {what}, {threads} thread{'s' * (threads > 1)}",
            min_speedup=MIN_RATIO,
            min_busy_speedup=None,
            memory=False,
            threads=threads,
            check=check,
            outputs=outputs,
            small_setup=small_setup,
            group="sweep",
            params={"op": op, "size": size, "elements": elements},
            min_sample_ms=MIN_SAMPLE_MS,
            count_calls=True,
        )
    )


def _register() -> list[BenchCase]:
    exact = same_outputs(rtol=0.0, atol=0.0)
    close = same_outputs(rtol=1e-5, atol=1e-6)
    loss_check = same_outputs(rtol=1e-4, atol=1e-6)
    points: list[tuple[Any, ...]] = []
    for n in CODER_SIZES:
        small = n if n <= _CHECK_LIMIT else _CHECK_LIMIT
        for kind, peer, name in (
            ("decode_distances", _ultralytics_dist2bbox, "ultralytics"),
            ("encode_distances", _ultralytics_bbox2dist, "ultralytics"),
            ("decode_deltas", _torchvision_coder(True), "torchvision"),
            ("encode_deltas", _torchvision_coder(False), "torchvision"),
        ):
            if name == "ultralytics" and not HAS_ULTRALYTICS:
                continue
            points.append((kind, _decade(n), n, _coder_setup(kind, n),
                           None if small == n else _coder_setup(kind, small), _ours_coder(kind),
                           peer, name, "float32, forward", exact))  # fmt: skip
    for image in IMAGE_SIZES:
        if HAS_ULTRALYTICS:
            cells = sum(math.ceil(image / s) ** 2 for s in _POINT_STRIDES)
            points.append(("anchor_points", f"{image}px", cells, _points_setup(image), None,
                           _ours_points, _ultralytics_points, "ultralytics",
                           "strides 8-32", exact))  # fmt: skip
        cells = 9 * sum(math.ceil(image / s) ** 2 for s in _RETINA_STRIDES)
        points.append(("anchor_generator", f"{image}px", cells, _anchors_setup(image), None,
                       _ours_anchors, _torchvision_anchors, "torchvision",
                       "RetinaNet's 5 levels x 9, 2 images", exact))  # fmt: skip
    for n in NMS_SIZES:
        points.append(("nms", _decade(n), n, _nms_setup(n), None, _ours_nms, _torchvision_nms,
                       "torchvision", "IoU 0.5", exact))  # fmt: skip
        points.append(("batched_nms", _decade(n), n, _nms_setup(n), None, _ours_batched_nms,
                       _torchvision_batched_nms, "torchvision", "80 classes, IoU 0.5", exact))  # fmt: skip
    for n in SOFT_NMS_SIZES:
        for cluster, label, what in ((True, "soft_nms_cluster", "one cluster, linear"),
                                     (False, "soft_nms_spread", "spread boxes, gaussian")):  # fmt: skip
            points.append((label, _decade(n), n, _soft_nms_setup(n, cluster), None,
                           _ours_soft_nms, _numpy_soft_nms, "NumPy greedy loop", what,
                           close))  # fmt: skip
    for n in MATRIX_NMS_SIZES:
        points.append(("matrix_nms", _decade(n), n, _matrix_nms_setup(n), None, _ours_matrix_nms,
                       _mmdet_matrix_nms, "mmdet formula (torch)", "boxes, gaussian", close))  # fmt: skip
    for n in DFL_BOXES:
        if not HAS_ULTRALYTICS:
            break
        small = _dfl_setup(_CHECK_LIMIT // 64) if n * 64 > _CHECK_LIMIT else None
        points.append(("dfl", _decade(n), n * 4 * _BINS, _dfl_setup(n), small, _ours_dfl,
                       _ultralytics_dfl, "ultralytics", "16 bins, forward+backward",
                       loss_check))  # fmt: skip
    for rows in SCORE_ROWS:
        small = _scores_setup(_CHECK_LIMIT // _CLASSES) if rows * _CLASSES > _CHECK_LIMIT else None
        size = f"{rows}x{_CLASSES}"
        if HAS_ULTRALYTICS:
            points.append(("vfl", size, rows * _CLASSES, _scores_setup(rows), small, _ours_vfl,
                           _ultralytics_vfl, "ultralytics", "forward+backward", loss_check))  # fmt: skip
        points.append(("qfl", size, rows * _CLASSES, _scores_setup(rows), small, _ours_qfl,
                       _mmdet_qfl, "mmdet formula (torch)", "forward+backward", loss_check))  # fmt: skip
    for kind in ("linear", "convnet", "resnet18") if HAS_ULTRALYTICS else ():
        elements = sum(p.numel() for p in _model(kind).state_dict().values())
        points.append(("ema_update", kind, elements, _ema_setup(kind), None, _ours_ema,
                       _ultralytics_ema, "ultralytics", "float32", close, _ema_outputs))  # fmt: skip
    return [_point(*p[:3], t, *p[3:]) for p in points for t in THREADS]


MODERN_CASES = _register()
"""Every point, registered as ``sweep_<op>_<size>_t<threads>``."""
