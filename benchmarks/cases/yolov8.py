"""ultralytics' YOLOv8n training with visionblocks' blocks swapped in (group ``workload``).

The model is ultralytics' own: ``DetectionModel("yolov8n.yaml", nc=80)`` from the yaml in its
package (random weights; nothing is downloaded; ``YOLO_OFFLINE=1``), its loss
``v8DetectionLoss`` (the trainer's: ``tal_topk=10``, gains ``box=7.5, cls=0.5, dfl=1.5`` of
its default config). The peer is ultralytics as it is; ours is the same model while
`visionblocks_in_ultralytics` has put visionblocks' blocks where the loss looks its helpers
up at call time (`ULTRALYTICS_LOOKUPS`):

- ``TaskAlignedAssigner.forward`` → `visionblocks.ops.task_aligned_assign` (with the
  assigner's ``topk``, ``topk2``, ``alpha``, ``beta``, ``eps`` and ultralytics 8.4's minimum
  side ``stride[1]``; its subclasses, which score masks, keypoints or rotated boxes, keep
  their own);
- ``DFLoss.__call__`` → `visionblocks.losses.distribution_focal_loss` (per distance, then
  ultralytics' mean over the 4 sides of a box);
- the loss module's ``bbox_iou`` (``BboxLoss``'s ``xywh=False, CIoU=True`` call) →
  `visionblocks.ops.complete_box_iou` (``aligned=True``);
- its ``make_anchors`` → `visionblocks.ops.make_anchor_points`;
- its ``dist2bbox`` / ``bbox2dist`` → `visionblocks.ops.decode_distances` /
  `visionblocks.ops.encode_distances`.

Calls the adapters do not cover (other box formats and IoU flags, a tensor of grid sizes,
half-precision feature maps, the assigner's subclasses) go to ultralytics' own functions. The swap lasts for ours' call only.

Cases (registered only where ultralytics is installed: a test and benchmark dependency):

- ``workload_yolov8n_train_step`` / ``workload_yolov8n_crowded_train_step``: one training step
  (forward, ``v8DetectionLoss``, backward, SGD step) of 8 images of 320x320 (2 CPU cores:
  640 takes seconds per step), 2 to 12 objects per image (one image without any), or 100 to
  160 per image (crowded). Each side trains its own copy of the model (same initial weights).
- ``workload_yolov8n_loss`` / ``workload_yolov8n_crowded_loss``: the loss alone, forward and
  backward, on fixed head outputs of one forward pass of the same batches: the part the swap
  changes.

The check (``verify``) compares the three loss terms (box, cls, dfl) of one pass on the same
weights and inputs within 1e-6 relative, and for the loss cases the gradients of the head
outputs.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import assert_same

__all__ = ["ULTRALYTICS_LOOKUPS", "YOLO_CASES", "visionblocks_in_ultralytics", "yolov8n"]

ULTRALYTICS_LOOKUPS: tuple[tuple[str, str], ...] = (
    ("ultralytics.utils.tal", "TaskAlignedAssigner.forward"),
    ("ultralytics.utils.loss", "DFLoss.__call__"),
    ("ultralytics.utils.loss", "bbox_iou"),
    ("ultralytics.utils.loss", "make_anchors"),
    ("ultralytics.utils.loss", "dist2bbox"),
    ("ultralytics.utils.loss", "bbox2dist"),
)
"""``(module, name)`` that ultralytics' detection loss looks up at call time: module globals,
or ``Class.method`` (looked up on the class by every instance, those built before the swap
included)."""

LOSS_RTOL = 1e-6
"""Relative tolerance between the two sides' loss terms and gradients."""


# ------------------------------------------------------------ the adapters


def _assign(original: Callable[..., Any]) -> Callable[..., Any]:
    from ultralytics.utils.tal import TaskAlignedAssigner

    from visionblocks.ops import task_aligned_assign

    @torch.no_grad()
    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        if type(self) is not TaskAlignedAssigner or extra:
            args = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
            return original(self, *args, **extra)
        return tuple(
            task_aligned_assign(
                pd_scores,
                pd_bboxes,
                anc_points,
                gt_labels,
                gt_bboxes,
                mask_gt,
                topk=self.topk,
                alpha=self.alpha,
                beta=self.beta,
                eps=self.eps,
                topk2=self.topk2,
                min_side=self.stride_val,
            )
        )

    forward.covers = lambda self, *args, **extra: type(self) is TaskAlignedAssigner and not extra
    return forward


def _dfl(original: Callable[..., Any]) -> Callable[..., Any]:
    from visionblocks.losses import distribution_focal_loss

    def __call__(self, pred_dist: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # ultralytics: pred (P * 4, reg_max) logits, target (P, 4) clamped below the last bin;
        # the loss of a box is the mean of its 4 sides.
        target = target.clamp(0, self.reg_max - 1 - 0.01)
        pred = pred_dist.view(*target.shape, self.reg_max)
        return distribution_focal_loss(pred, target, reduction="none").mean(-1, keepdim=True)

    return __call__


def _bbox_iou(original: Callable[..., Any]) -> Callable[..., Any]:
    from visionblocks.ops import complete_box_iou

    def bbox_iou(box1, box2, xywh=True, GIoU=False, DIoU=False, CIoU=False, eps=1e-7):
        if not _bbox_iou_covers(box1, box2, xywh, GIoU, DIoU, CIoU):
            return original(box1, box2, xywh, GIoU, DIoU, CIoU, eps)
        return complete_box_iou(box1, box2, aligned=True, eps=eps).unsqueeze(-1)

    bbox_iou.covers = _bbox_iou_covers
    return bbox_iou


def _bbox_iou_covers(box1, box2, xywh=True, GIoU=False, DIoU=False, CIoU=False, eps=1e-7):
    return CIoU and not xywh and box1.shape == box2.shape


def _make_anchors(original: Callable[..., Any]) -> Callable[..., Any]:
    from visionblocks.ops import make_anchor_points

    def make_anchors(feats, strides, grid_cell_offset=0.5):
        if not _make_anchors_covers(feats):
            return original(feats, strides, grid_cell_offset)
        return make_anchor_points(feats, strides, grid_cell_offset)

    make_anchors.covers = _make_anchors_covers
    return make_anchors


def _make_anchors_covers(feats, *args, **kwargs):
    return isinstance(feats, list) and feats[0].dtype == torch.float32


def _dist2bbox(original: Callable[..., Any]) -> Callable[..., Any]:
    from visionblocks.ops import decode_distances

    def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
        if not _dist2bbox_covers(distance, anchor_points, xywh, dim):
            return original(distance, anchor_points, xywh, dim)
        return decode_distances(anchor_points, distance, "cxcywh" if xywh else "xyxy")

    dist2bbox.covers = _dist2bbox_covers
    return dist2bbox


def _dist2bbox_covers(distance, anchor_points, xywh=True, dim=-1):
    return dim in (-1, distance.dim() - 1)


def _bbox2dist(original: Callable[..., Any]) -> Callable[..., Any]:
    from visionblocks.ops import encode_distances

    def bbox2dist(anchor_points, bbox, reg_max=None):
        return encode_distances(anchor_points, bbox, reg_max)

    return bbox2dist


_ADAPTERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "TaskAlignedAssigner.forward": _assign,
    "DFLoss.__call__": _dfl,
    "bbox_iou": _bbox_iou,
    "make_anchors": _make_anchors,
    "dist2bbox": _dist2bbox,
    "bbox2dist": _bbox2dist,
}


def _counting(fn: Callable[..., Any], key: str, counts: dict[str, int]) -> Callable[..., Any]:
    """``fn`` counting in ``counts[key]`` the calls that reach visionblocks (not those an
    adapter hands back to ultralytics)."""
    covers = getattr(fn, "covers", None)

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        if covers is None or covers(*args, **kwargs):
            counts[key] = counts.get(key, 0) + 1
        return fn(*args, **kwargs)

    return counted


@contextmanager
def visionblocks_in_ultralytics(counts: dict[str, int] | None = None) -> Iterator[None]:
    """Within the block, ultralytics' detection loss calls visionblocks' blocks.

    Sets the names of `ULTRALYTICS_LOOKUPS` to adapters with ultralytics' signatures that call
    visionblocks' functions, and puts the old values back on exit, whatever happens.

    Args:
        counts: If given, count in it the calls that reach visionblocks, under keys
            ``"<module>.<name>"`` (a test that the swap reaches the loss code).

    Examples:
        >>> import pytest
        >>> loss = pytest.importorskip("ultralytics.utils.loss")
        >>> before = loss.bbox_iou
        >>> with visionblocks_in_ultralytics():
        ...     loss.bbox_iou is before
        False
        >>> loss.bbox_iou is before
        True
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module_name, path in ULTRALYTICS_LOOKUPS:
            owner: Any = importlib.import_module(module_name)
            *classes, name = path.split(".")
            for part in classes:
                owner = getattr(owner, part)
            original = owner.__dict__[name] if classes else getattr(owner, name)
            fn = _ADAPTERS[path](original)
            if counts is not None:
                fn = _counting(fn, f"{module_name}.{path}", counts)
            saved.append((owner, name, original))
            setattr(owner, name, fn)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


# ------------------------------------------------------------ the cases

_BATCH, _STEP_SIZE, _LOSS_SIZE, _SMALL_SIZE, _SMALL_BATCH = 8, 320, 640, 128, 2
_OBJECTS = {"": (2, 12), "crowded_": (100, 160)}
"""Objects per image (inclusive bounds) of the usual and the crowded batches; the usual batch's
first image has none."""
_SIDES = {"": (0.03, 0.5), "crowded_": (0.02, 0.12)}
"""Box sides as fractions of the image (log-uniform)."""


def _batch(size: int, images: int, kind: str, nc: int, generator: torch.Generator) -> dict:
    """A batch as ultralytics' data loader gives it: images in ``[0, 1]``, and per object its
    image index, class and normalized ``(cx, cy, w, h)``, sorted by image."""
    low, high = _OBJECTS[kind]
    counts = torch.randint(low, high + 1, (images,), generator=generator)
    if not kind:
        counts[0] = 0
    n = int(counts.sum())
    lo, hi = (torch.tensor(v).log() for v in _SIDES[kind])
    wh = (lo + (hi - lo) * torch.rand(n, 2, generator=generator)).exp()
    centre = wh / 2 + (1 - wh) * torch.rand(n, 2, generator=generator)
    return {
        "img": torch.rand(images, 3, size, size, generator=generator),
        "batch_idx": torch.repeat_interleave(torch.arange(images), counts).float(),
        "cls": torch.randint(0, nc, (n, 1), generator=generator).float(),
        "bboxes": torch.cat([centre, wh], 1),
    }


def yolov8n(nc: int = 80) -> torch.nn.Module:
    """ultralytics' YOLOv8n from its bundled ``yolov8n.yaml`` (random weights, nothing
    downloaded), in training mode, with the default config's loss gains as ``model.args``."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=nc, verbose=False)
    model.args = get_cfg()
    return model.train()


def _step_setup(kind: str, size: int, images: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = yolov8n()
    state: dict[str, Any] = {
        "model": model,
        "batch": _batch(size, images, kind, 80, torch.Generator().manual_seed(0)),
    }
    # Each side trains its own copy (the same initial weights); the peer's is the original.
    for side, copy_ in (("ours", copy.deepcopy(model)), ("peer", model)):
        optimizer = torch.optim.SGD(copy_.parameters(), lr=0.01, momentum=0.937, nesterov=True)
        state[side] = (copy_, optimizer)
    return state


def _train_step(model: torch.nn.Module, optimizer: Any, batch: dict) -> dict:
    loss, items = model.loss(batch)  # forward, then v8DetectionLoss (built on first use)
    optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()
    optimizer.step()
    return dict(items)


def _step_ours(state: dict[str, Any]) -> dict:
    with visionblocks_in_ultralytics():
        return _train_step(*state["ours"], state["batch"])


def _step_peer(state: dict[str, Any]) -> dict:
    return _train_step(*state["peer"], state["batch"])


def _step_outputs(state: dict[str, Any]) -> tuple[dict, dict]:
    """Loss terms of one forward pass of the same model on the same batch, each side (and
    the calls that reached visionblocks)."""
    model, batch = state["model"], state["batch"]  # untrained when the check runs
    calls: dict[str, int] = {}
    with torch.no_grad():
        with visionblocks_in_ultralytics(calls):
            ours = dict(model.loss(batch)[1])
        peer = dict(model.loss(batch)[1])
    return {**ours, "calls": calls}, peer


def _loss_setup(kind: str, size: int, images: int) -> dict[str, Any]:
    """The loss's inputs after one forward pass: head outputs (leaves that need gradients)."""
    from ultralytics.utils.loss import v8DetectionLoss

    torch.manual_seed(0)
    model = yolov8n()
    batch = _batch(size, images, kind, 80, torch.Generator().manual_seed(0))
    with torch.no_grad():
        preds = model(batch.pop("img"))
    preds = {k: v if k == "feats" else v.requires_grad_() for k, v in preds.items()}
    return {"criterion": v8DetectionLoss(model), "preds": preds, "batch": batch}


def _loss_step(state: dict[str, Any]) -> dict:
    loss, items = state["criterion"](state["preds"], state["batch"])
    loss.sum().backward()
    grads = {}
    for key in ("boxes", "scores"):
        grads[key], state["preds"][key].grad = state["preds"][key].grad, None
    return {**items, "grad": grads}


def _loss_ours(state: dict[str, Any]) -> dict:
    with visionblocks_in_ultralytics():
        return _loss_step(state)


def _loss_outputs(state: dict[str, Any]) -> tuple[dict, dict]:
    calls: dict[str, int] = {}
    with visionblocks_in_ultralytics(calls):
        ours = _loss_step(state)
    return {**ours, "calls": calls}, _loss_step(state)


def _check(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> None:
    """Every swapped function reached; loss terms within `LOSS_RTOL`; gradients (of the loss
    cases) within `LOSS_RTOL` of the largest one, element by element."""
    ours = dict(ours)
    calls = ours.pop("calls", {})
    missing = [f"{m}.{n}" for m, n in ULTRALYTICS_LOOKUPS if not calls.get(f"{m}.{n}")]
    assert not missing, f"visionblocks never called in place of {', '.join(missing)}"
    grads, peer_grads = ours.pop("grad", {}), dict(peer).pop("grad", {})
    assert_same(ours, {k: v for k, v in peer.items() if k != "grad"}, rtol=LOSS_RTOL, atol=0.0)
    for key, grad in peer_grads.items():
        atol = LOSS_RTOL * float(grad.abs().max())
        assert_same(grads[key], grad, rtol=0.0, atol=atol, where=f"grad[{key!r}]")


def _cases() -> list[BenchCase]:
    cases = []
    for kind in _OBJECTS:
        low, high = _OBJECTS[kind]
        objects = f"{low} to {high} objects per image" + ("" if kind else " (one image none)")
        cases.append(
            BenchCase(
                name=f"workload_yolov8n_{kind}train_step",
                setup=functools.partial(_step_setup, kind, _STEP_SIZE, _BATCH),
                ours=_step_ours,
                peer=_step_peer,
                peer_name="ultralytics",
                description=f"ultralytics YOLOv8n (random weights) training step, {_BATCH} "
                f"images {_STEP_SIZE}x{_STEP_SIZE}, {objects}, v8DetectionLoss, SGD; ours: "
                "visionblocks' assigner, DFL, CIoU, anchor points and distance coders "
                "swapped in; 2 threads",
                min_speedup=1.0,
                memory=False,
                check=_check,
                outputs=_step_outputs,
                small_setup=functools.partial(_step_setup, kind, _SMALL_SIZE, _SMALL_BATCH),
                group="workload",
                verify=True,
            )
        )
        cases.append(
            BenchCase(
                name=f"workload_yolov8n_{kind}loss",
                setup=functools.partial(_loss_setup, kind, _LOSS_SIZE, _BATCH),
                ours=_loss_ours,
                peer=_loss_step,
                peer_name="ultralytics",
                description=f"ultralytics v8DetectionLoss on fixed YOLOv8n head outputs "
                f"(forward and backward), {_BATCH} images {_LOSS_SIZE}x{_LOSS_SIZE} (8400 "
                f"anchors, 80 classes), {objects}; ours: visionblocks' blocks swapped in; "
                "2 threads",
                min_speedup=1.0,
                memory=False,
                check=_check,
                outputs=_loss_outputs,
                small_setup=functools.partial(_loss_setup, kind, _SMALL_SIZE, _SMALL_BATCH),
                group="workload",
                verify=True,
            )
        )
    return cases


YOLO_CASES: list[BenchCase] = (
    [register_case(case) for case in _cases()] if importlib.util.find_spec("ultralytics") else []
)
"""``workload_yolov8n_[crowded_]{train_step,loss}``; none where ultralytics is not installed."""
