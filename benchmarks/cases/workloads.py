"""Workload benchmarks: what users run, quoted first in the reports (group ``workload``).

**torchvision's detectors with our losses** (``workload_tv_fcos_train_step``,
``workload_tv_retinanet_train_step``): torchvision's own ``fcos_resnet50_fpn`` and
``retinanet_resnet50_fpn`` (random weights: ``weights=None, weights_backbone=None``, so
trainable BatchNorm and every backbone stage trained; nothing is downloaded), one training
step (forward with targets, sum of the losses, backward, SGD step) on 2 images of 320×320
(``min_size=max_size=320``: torchvision's transform would otherwise resize them to 800) with
3 to 5 boxes each, 2 threads. The peer is torchvision as it is; ours is the same model with
visionblocks' ``sigmoid_focal_loss``, ``generalized_box_iou_loss`` and ``box_iou`` put where
the model code looks them up at call time (`TORCHVISION_LOOKUPS`, `visionblocks_in_torchvision`):
the names ``fcos.sigmoid_focal_loss`` and ``fcos.generalized_box_iou_loss`` (FCOS's loss),
``retinanet.sigmoid_focal_loss`` (RetinaNet's classification loss),
``torchvision.ops.boxes.box_iou`` (RetinaNet's anchor matching calls ``box_ops.box_iou``) and
``detection._utils.generalized_box_iou_loss`` (RetinaNet's ``_box_loss`` with the ``"giou"``
loss type, as in ``retinanet_resnet50_fpn_v2``; the v1 model regresses with smooth L1). FCOS
assigns targets by centre sampling, without IoUs. The swap lasts for ours' call only. Each
side trains its own copy of one model (the same initial weights). The run checks
(``verify``) that every loss term of one forward pass on the same weights and inputs agrees
within 1e-6 relative. The step is mostly the ResNet-50 backbone, whose run-to-run noise
(+-5 %) is larger than the losses' share; ``workload_tv_fcos_loss`` and
``workload_tv_retinanet_loss`` time the part the swap changes: the model's ``compute_loss``
(anchor matching, the classification and box losses) and its backward, on head outputs of one
forward pass of the same model and batch.

**Our detector** (``workload_demo_detector_train_step``): one training step of the demo's
model (`visionblocks.cli.demo.DEMO_MODEL`, AdamW as the demo's `make_optimizer`, weights and
images channels-last as the demo's on the CPU) on a batch of the demo's size (16 synthetic
COCO images of 128×128, loaded and collated as the demo's loader does), 2 threads. No peer: the time per step.

**Per-sample augmentation** (``workload_augment_<dtype>[_planar]_vs_<peer>``): one COCO-like sample,
a **pre-decoded** 640×640 RGB image (uint8, or float32 in ``[0, 1]``) with 5 boxes and 5
instance masks, warped with one random affine matrix (rotation ±15°, scale 0.8–1.2,
translation ±10 %; a new draw per call), one thread, as a data-loader worker runs (torch's and
OpenCV's: ``cv2.setNumThreads(1)`` around each side's call). Ours:
`visionblocks.transforms.warp_sample` on the ``tv_tensors`` (``min_size=None``: boxes kept, as
the peers keep them; the image and masks through ``cv2.warpAffine``); the sample has instance masks and every draw turns it, so its boxes are
the tight boxes of the warped masks (``[min col, min row, max col + 1, max row + 1]``), not
the warped corners, and each peer measures the warped masks too. Peer 1: torchvision
transforms v2 ``RandomAffine`` on the same tv_tensors (``Image``, ``BoundingBoxes``,
``Mask``), bilinear for the image (its default is nearest), then its boxes replaced by
``torchvision.ops.masks_to_boxes`` of the warped masks, one pixel added to the far sides of
the non-empty ones (its boxes end on the last pixel, ours after it, as COCO's): what a
torchvision pipeline that wants tight boxes does, as torchvision has no tight-box option.
Peer 2: OpenCV, on the arrays an OpenCV pipeline holds (``H×W×C`` image, ``H×W×5`` masks):
``cv2.warpAffine`` (``INTER_LINEAR`` image, ``INTER_NEAREST`` masks as one 5-channel array)
and the boxes of the warped masks with ``cv2.boundingRect`` (one call per mask). Each side
holds its image as its own decoder gives it: against OpenCV, ours is the ``(C, H, W)`` view of
the same ``H×W×C`` memory (``torch.from_numpy(cv2.imdecode(...)).permute(2, 0, 1)``, one
``cv2.warpAffine`` call); against torchvision, the ``(C, H, W)`` planes ``decode_jpeg`` gives.
The ``_planar`` rows put those planes against OpenCV's interleaved arrays: OpenCV warps planes
one call each, which for float32 reads memory less well than one interleaved call, so the
float32 planar row has no target. The checks compare one fixed draw: the image with OpenCV's
(and with torchvision's, whose ``angle`` turns the other way), the boxes, and the masks.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import assert_same

__all__ = [
    "AUGMENT_CASES",
    "DEMO_DETECTOR_TRAIN_STEP",
    "TORCHVISION_LOOKUPS",
    "TV_FCOS_LOSS",
    "TV_FCOS_TRAIN_STEP",
    "TV_RETINANET_LOSS",
    "TV_RETINANET_TRAIN_STEP",
    "visionblocks_in_torchvision",
]

TORCHVISION_LOOKUPS: dict[str, tuple[str, ...]] = {
    "torchvision.models.detection.fcos": ("sigmoid_focal_loss", "generalized_box_iou_loss"),
    "torchvision.models.detection.retinanet": ("sigmoid_focal_loss",),
    "torchvision.models.detection._utils": ("generalized_box_iou_loss",),
    "torchvision.ops.boxes": ("box_iou",),
}
"""Module → global names that torchvision's FCOS and RetinaNet code looks up at call time."""

LOSS_RTOL = 1e-6
"""Relative tolerance between the loss terms of the two sides (same weights and inputs)."""


def _ours_functions() -> dict[str, Callable[..., Any]]:
    from visionblocks.losses import sigmoid_focal_loss
    from visionblocks.ops import box_iou, generalized_box_iou_loss

    return {
        "sigmoid_focal_loss": sigmoid_focal_loss,
        "generalized_box_iou_loss": generalized_box_iou_loss,
        "box_iou": box_iou,
    }


def _counting(fn: Callable[..., Any], key: str, counts: dict[str, int]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] = counts.get(key, 0) + 1
        return fn(*args, **kwargs)

    return counted


@contextmanager
def visionblocks_in_torchvision(counts: dict[str, int] | None = None) -> Iterator[None]:
    """Within the block, torchvision's detection code calls visionblocks' losses and IoU.

    Sets the names of `TORCHVISION_LOOKUPS` to visionblocks' functions and puts the old
    values back on exit, whatever happens.

    Args:
        counts: If given, count the calls of each swapped function in it, under keys
            ``"<module>.<name>"`` (a test that the swap reaches the model code).

    Examples:
        >>> import torchvision.models.detection.fcos as fcos
        >>> before = fcos.sigmoid_focal_loss
        >>> with visionblocks_in_torchvision():
        ...     fcos.sigmoid_focal_loss.__module__.startswith("visionblocks.")
        True
        >>> fcos.sigmoid_focal_loss is before
        True
    """
    import importlib

    ours = _ours_functions()
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module_name, names in TORCHVISION_LOOKUPS.items():
            module = importlib.import_module(module_name)
            for name in names:
                fn = ours[name]
                if counts is not None:
                    fn = _counting(fn, f"{module_name}.{name}", counts)
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, fn)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


# ------------------------------------------------------------ torchvision detectors

_TV_IMAGES, _TV_SIZE, _TV_SMALL_SIZE = 2, 320, 64


def _tv_batch(size: int, generator: torch.Generator) -> tuple[list[torch.Tensor], list[dict]]:
    images, targets = [], []
    for _ in range(_TV_IMAGES):
        images.append(torch.rand(3, size, size, generator=generator))
        n = int(torch.randint(3, 6, (), generator=generator))
        xy = torch.rand(n, 2, generator=generator) * size * 0.6
        wh = (torch.rand(n, 2, generator=generator) * 0.3 + 0.1) * size
        boxes = torch.cat([xy, (xy + wh).clamp(max=size)], dim=1)
        labels = torch.randint(1, 91, (n,), generator=generator)
        targets.append({"boxes": boxes, "labels": labels})
    return images, targets


def _tv_setup(builder: str, size: int) -> dict[str, Any]:
    import torchvision.models.detection as detection

    torch.manual_seed(0)
    model = getattr(detection, builder)(
        weights=None, weights_backbone=None, min_size=size, max_size=size
    )
    model.train()
    images, targets = _tv_batch(size, torch.Generator().manual_seed(0))
    state: dict[str, Any] = {"model": model, "images": images, "targets": targets}
    # Each side trains its own copy (the same initial weights); the peer's is the original.
    for side, copy_ in (("ours", copy.deepcopy(model)), ("peer", model)):
        state[side] = (copy_, torch.optim.SGD(copy_.parameters(), lr=1e-4, momentum=0.9))
    return state


def _train_step(model: torch.nn.Module, optimizer: Any, images: Any, targets: Any) -> dict:
    losses = model(images, targets)
    loss = sum(losses.values())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {name: value.detach() for name, value in losses.items()}


def _tv_ours(state: dict[str, Any]) -> dict:
    with visionblocks_in_torchvision():
        return _train_step(*state["ours"], state["images"], state["targets"])


def _tv_peer(state: dict[str, Any]) -> dict:
    return _train_step(*state["peer"], state["images"], state["targets"])


def _tv_losses(state: dict[str, Any]) -> tuple[dict, dict]:
    """Loss terms of one forward pass of the same model on the same inputs, each side."""
    model = state["model"]  # untrained when the check runs (a fresh setup)
    with torch.no_grad():
        with visionblocks_in_torchvision():
            ours = model(state["images"], state["targets"])
        peer = model(state["images"], state["targets"])
    return ours, peer


def _check_losses(ours: Mapping[str, torch.Tensor], peer: Mapping[str, torch.Tensor]) -> None:
    assert_same(dict(ours), dict(peer), rtol=LOSS_RTOL, atol=0.0, where="losses")


def _tv_case(name: str, builder: str) -> BenchCase:
    def setup() -> dict[str, Any]:
        return _tv_setup(builder, _TV_SIZE)

    def small_setup() -> dict[str, Any]:
        return _tv_setup(builder, _TV_SMALL_SIZE)

    return register_case(
        BenchCase(
            name=name,
            setup=setup,
            ours=_tv_ours,
            peer=_tv_peer,
            peer_name="torchvision",
            description=f"torchvision {builder} (random weights) training step, 2 images "
            f"{_TV_SIZE}x{_TV_SIZE}, SGD; ours: visionblocks' sigmoid_focal_loss, "
            "generalized_box_iou_loss and box_iou swapped in; 2 threads",
            min_speedup=1.0,
            memory=False,
            check=_check_losses,
            outputs=_tv_losses,
            small_setup=small_setup,
            group="workload",
            verify=True,
        )
    )


TV_FCOS_TRAIN_STEP = _tv_case("workload_tv_fcos_train_step", "fcos_resnet50_fpn")
TV_RETINANET_TRAIN_STEP = _tv_case("workload_tv_retinanet_train_step", "retinanet_resnet50_fpn")


def _tv_loss_setup(builder: str, size: int) -> dict[str, Any]:
    """The model's loss inputs after one forward pass: head outputs (leaves that need
    gradients), anchors and the transformed targets."""
    state = _tv_setup(builder, size)
    model = state["model"]
    with torch.no_grad():
        images, targets = model.transform(state["images"], state["targets"])
        features = list(model.backbone(images.tensors).values())
        head = model.head(features)
        anchors = model.anchor_generator(images, features)
    args: tuple[Any, ...] = (targets, {k: v.requires_grad_() for k, v in head.items()}, anchors)
    if builder.startswith("fcos"):
        args += ([f.shape[-2] * f.shape[-1] for f in features],)
    return {"model": model, "args": args}


def _loss_step(state: dict[str, Any]) -> dict:
    losses = state["model"].compute_loss(*state["args"])
    sum(losses.values()).backward()
    for value in state["args"][1].values():
        value.grad = None
    return {name: value.detach() for name, value in losses.items()}


def _tv_loss_ours(state: dict[str, Any]) -> dict:
    with visionblocks_in_torchvision():
        return _loss_step(state)


def _tv_loss_case(name: str, builder: str) -> BenchCase:
    def outputs(state: dict[str, Any]) -> tuple[dict, dict]:
        return _tv_loss_ours(state), _loss_step(state)

    return register_case(
        BenchCase(
            name=name,
            setup=lambda: _tv_loss_setup(builder, _TV_SIZE),
            ours=_tv_loss_ours,
            peer=_loss_step,
            peer_name="torchvision",
            description=f"torchvision {builder}'s loss (compute_loss on fixed head outputs, "
            f"forward and backward), 2 images {_TV_SIZE}x{_TV_SIZE}; ours: visionblocks' "
            "sigmoid_focal_loss, generalized_box_iou_loss and box_iou swapped in; 2 threads",
            min_speedup=1.0,
            memory=False,
            check=_check_losses,
            outputs=outputs,
            small_setup=lambda: _tv_loss_setup(builder, _TV_SMALL_SIZE),
            group="workload",
            verify=True,
        )
    )


TV_FCOS_LOSS = _tv_loss_case("workload_tv_fcos_loss", "fcos_resnet50_fpn")
TV_RETINANET_LOSS = _tv_loss_case("workload_tv_retinanet_loss", "retinanet_resnet50_fpn")


# ------------------------------------------------------------ our detector (the demo's)

_DEMO_SMALL_BATCH = 2


def _demo_setup(batch: int | None = None) -> dict[str, Any]:
    from torchvision.transforms import v2

    from visionblocks.cli._demo_data import _DATA, BATCH_SIZE
    from visionblocks.cli._demo_train import make_optimizer, memory_format
    from visionblocks.cli.demo import DEMO_MODEL
    from visionblocks.data import CocoInstances, collate_detection, make_synthetic_coco
    from visionblocks.registry import MODELS

    batch = BATCH_SIZE if batch is None else batch
    with tempfile.TemporaryDirectory() as folder:
        ann = make_synthetic_coco(folder, num_images=batch, seed=0, progress=False, **_DATA)
        data = CocoInstances(ann.parent / "images", ann, transforms=v2.RandomHorizontalFlip())
        images, targets, sizes = collate_detection([data[i] for i in range(batch)])
    torch.manual_seed(0)
    layout = memory_format(images.device)  # the demo's: channels-last on the CPU
    model = MODELS.build(DEMO_MODEL).to(memory_format=layout)
    model.train()
    images = images.contiguous(memory_format=layout)
    targets = [{k: t[k] for k in ("boxes", "labels")} for t in targets]
    return {"model": model, "optimizer": make_optimizer(model), "batch": (images, targets, sizes)}


def _demo_small_setup() -> dict[str, Any]:
    return _demo_setup(_DEMO_SMALL_BATCH)


def _demo_step(state: dict[str, Any]) -> torch.Tensor:
    losses = state["model"](*state["batch"])
    state["optimizer"].zero_grad(set_to_none=True)
    losses["loss"].backward()
    state["optimizer"].step()
    return losses["loss"].detach()


DEMO_DETECTOR_TRAIN_STEP = register_case(
    BenchCase(
        name="workload_demo_detector_train_step",
        setup=_demo_setup,
        ours=_demo_step,
        description="the demo's Detector (vb_tiny + FPN + YOLOv8 head) training step, 16 "
        "synthetic COCO images 128x128, AdamW, channels-last; 2 threads",
        memory=False,
        small_setup=_demo_small_setup,
        group="workload",
    )
)


# ------------------------------------------------------------ per-sample augmentation

_AUG_SIZE, _AUG_SMALL_SIZE, _AUG_OBJECTS, _AUG_DRAWS = 640, 160, 5, 64
DEGREES, TRANSLATE, SCALE = 15.0, 0.1, (0.8, 1.2)
"""The random affine of the augmentation cases (``v2.RandomAffine``'s arguments)."""


class _Draws:
    """Pre-drawn ``(angle, (tx, ty), scale)``, taken in turn by each side."""

    def __init__(self, size: int, generator: torch.Generator) -> None:
        u = torch.rand(_AUG_DRAWS, 4, generator=generator, dtype=torch.float64).tolist()
        self.params = [
            (
                DEGREES * (2 * a - 1),
                (round(TRANSLATE * size * (2 * x - 1)), round(TRANSLATE * size * (2 * y - 1))),
                SCALE[0] + (SCALE[1] - SCALE[0]) * s,
            )
            for a, x, y, s in u
        ]
        self.turn = {"ours": 0, "peer": 0}

    def next(self, side: str) -> tuple[float, tuple[int, int], float]:
        i = self.turn[side]
        self.turn[side] = (i + 1) % len(self.params)
        return self.params[i]


def _aug_setup(
    dtype: torch.dtype, size: int = _AUG_SIZE, interleaved: bool = False
) -> dict[str, Any]:
    import numpy as np
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    gen = torch.Generator().manual_seed(0)
    # A smooth image (an upsampled random field), as photographs are, not white noise.
    field = torch.rand(1, 3, size // 16, size // 16, generator=gen)
    smooth = torch.nn.functional.interpolate(field, size=(size, size), mode="bilinear")[0]
    image = (smooth * 255).round().to(torch.uint8)
    if dtype.is_floating_point:
        image = image.to(dtype) / 255
    xy = torch.rand(_AUG_OBJECTS, 2, generator=gen) * size * 0.6 + size * 0.1
    wh = (torch.rand(_AUG_OBJECTS, 2, generator=gen) * 0.2 + 0.05) * size
    boxes = torch.cat([xy, xy + wh], dim=1)
    masks = torch.zeros(_AUG_OBJECTS, size, size, dtype=torch.uint8)
    rows, cols = torch.arange(size).view(-1, 1), torch.arange(size).view(1, -1)
    for k, (x1, y1, x2, y2) in enumerate(boxes.tolist()):  # the ellipse inscribed in the box
        cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        masks[k] = (((cols + 0.5 - cx) / rx) ** 2 + ((rows + 0.5 - cy) / ry) ** 2 <= 1).to(
            torch.uint8
        )
    target = {
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(size, size)),
        "masks": tv_tensors.Mask(masks),
        "labels": torch.arange(1, _AUG_OBJECTS + 1),
    }
    np_image = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
    if interleaved:  # the (C, H, W) view of OpenCV's H x W x C memory
        image = torch.from_numpy(np_image).permute(2, 0, 1)
    return {
        "size": size,
        "image": tv_tensors.Image(image),
        "target": target,
        "draws": _Draws(size, gen),
        # Bilinear for the image (its default is nearest); masks are always nearest.
        "random_affine": v2.RandomAffine(
            degrees=DEGREES,
            translate=(TRANSLATE, TRANSLATE),
            scale=SCALE,
            interpolation=v2.InterpolationMode.BILINEAR,
        ),
        # What an OpenCV pipeline holds: H x W x C arrays.
        "np_image": np_image,
        "np_masks": np.ascontiguousarray(masks.permute(1, 2, 0).numpy()),
        "np_boxes": boxes.numpy().astype(np.float64),
    }


def _ours_warp(state: dict[str, Any], params: tuple[float, tuple[int, int], float]) -> Any:
    from visionblocks.ops import affine_matrix
    from visionblocks.transforms import warp_sample

    angle, translate, scale = params
    centre = (state["size"] - 1) / 2
    matrix = affine_matrix(angle=angle, translate=translate, scale=scale, center=(centre, centre))
    return warp_sample(state["image"], state["target"], matrix, min_size=None)


@contextmanager
def _opencv_threads(count: int) -> Iterator[None]:
    """``cv2.setNumThreads(count)`` inside the block (OpenCV's own threads; torch's are the
    case's ``threads``)."""
    import cv2

    before = cv2.getNumThreads()
    cv2.setNumThreads(count)
    try:
        yield
    finally:
        cv2.setNumThreads(before)


def _ours_augment(state: dict[str, Any]) -> Any:
    with _opencv_threads(1):
        return _ours_warp(state, state["draws"].next("ours"))


def _tv_tight_boxes(boxes: Any, masks: torch.Tensor) -> Any:
    """torchvision's ``masks_to_boxes`` of the warped masks, in the edge convention."""
    from torchvision import tv_tensors
    from torchvision.ops import masks_to_boxes

    plain = masks.as_subclass(torch.Tensor)
    found = plain.flatten(1).any(1, keepdim=True)
    tight = masks_to_boxes(plain) + torch.tensor([0.0, 0.0, 1.0, 1.0]) * found
    return tv_tensors.wrap(tight.to(boxes.dtype), like=boxes)


def _torchvision_augment(state: dict[str, Any]) -> Any:
    image, target = state["random_affine"](state["image"], state["target"])
    return image, {**target, "boxes": _tv_tight_boxes(target["boxes"], target["masks"])}


def _opencv_warp(state: dict[str, Any], params: tuple[float, tuple[int, int], float]) -> Any:
    import cv2
    import numpy as np

    angle, (tx, ty), scale = params
    size = state["size"]
    centre = (size - 1) / 2
    with _opencv_threads(1):
        m = cv2.getRotationMatrix2D((centre, centre), angle, scale)
        m[:, 2] += (tx, ty)
        image = cv2.warpAffine(state["np_image"], m, (size, size), flags=cv2.INTER_LINEAR)
        masks = cv2.warpAffine(state["np_masks"], m, (size, size), flags=cv2.INTER_NEAREST)
    # The boxes of the warped masks: cv2.boundingRect of each (H x W) mask, what an OpenCV
    # pipeline calls (C++, ten times NumPy's any/argmax); an empty mask gives (0, 0, 0, 0).
    boxes = np.array(
        [cv2.boundingRect(np.ascontiguousarray(masks[..., i])) for i in range(masks.shape[-1])],
        dtype=np.float64,
    ).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]
    return image, masks, boxes


def _opencv_augment(state: dict[str, Any]) -> Any:
    return _opencv_warp(state, state["draws"].next("peer"))


_CHECK_DRAW = (12.0, (20, -15), 1.1)


def _outputs_vs_opencv(state: dict[str, Any]) -> tuple[dict, dict]:
    image, target = _ours_warp(state, _CHECK_DRAW)
    np_image, np_masks, np_boxes = _opencv_warp(state, _CHECK_DRAW)
    ours = {"image": image, "boxes": target["boxes"], "masks": target["masks"]}
    peer = {
        "image": torch.from_numpy(np_image).permute(2, 0, 1),
        "boxes": torch.from_numpy(np_boxes),
        "masks": torch.from_numpy(np_masks).permute(2, 0, 1),
    }
    return ours, peer


def _outputs_vs_torchvision(state: dict[str, Any]) -> tuple[dict, dict]:
    from torchvision.transforms.v2 import functional as F

    image, target = _ours_warp(state, _CHECK_DRAW)
    angle, translate, scale = _CHECK_DRAW
    # torchvision's angle turns clockwise on screen; ours and OpenCV's counter-clockwise.
    options = {"angle": -angle, "translate": list(translate), "scale": scale, "shear": [0.0, 0.0]}
    ours = {"image": image, "boxes": target["boxes"], "masks": target["masks"]}
    masks = F.affine(state["target"]["masks"], **options)
    peer = {
        "image": F.affine(state["image"], interpolation=F.InterpolationMode.BILINEAR, **options),
        "boxes": _tv_tight_boxes(state["target"]["boxes"], masks),
        "masks": masks,
    }
    return ours, peer


def _check_sample(ours: Mapping[str, torch.Tensor], peer: Mapping[str, torch.Tensor]) -> None:
    """Images within a grey level (uint8) or 1e-4 (float); at most 0.1 % of the mask pixels
    differ (nearest sampling on a grid point can go either way); boxes, the boxes of those
    masks, within 1e-3 px where an instance's masks agree, within a pixel where they do not
    (a differing pixel on an object's edge moves its box by one)."""
    image, peer_image = ours["image"].as_subclass(torch.Tensor), peer["image"]
    atol = 1.0 if image.dtype == torch.uint8 else 1e-4
    assert_same(image.float(), peer_image.float(), rtol=0.0, atol=atol, where="image")
    masks, peer_masks = ours["masks"].as_subclass(torch.Tensor), peer["masks"]
    assert masks.shape == peer_masks.shape, f"masks: {masks.shape} vs {peer_masks.shape}"
    share = (masks != peer_masks).float().mean().item()
    assert share <= 1e-3, f"masks: {share:.3%} of the pixels differ (at most 0.1 % allowed)"
    boxes, peer_boxes = ours["boxes"].as_subclass(torch.Tensor).double(), peer["boxes"].double()
    same = (masks == peer_masks).flatten(1).all(1)
    assert_same(boxes[same], peer_boxes[same], rtol=0.0, atol=1e-3, where="boxes")
    assert_same(boxes[~same], peer_boxes[~same], rtol=0.0, atol=1.0, where="boxes")


def _augment_case(dtype: torch.dtype, peer: str, planar: bool = False) -> BenchCase:
    kind = str(dtype).removeprefix("torch.")
    interleaved = peer == "opencv" and not planar

    def setup() -> dict[str, Any]:
        return _aug_setup(dtype, interleaved=interleaved)

    def small_setup() -> dict[str, Any]:
        return _aug_setup(dtype, _AUG_SMALL_SIZE, interleaved)

    target: float | None
    if peer == "opencv":
        run_peer, outputs, peer_name = _opencv_augment, _outputs_vs_opencv, "OpenCV"
        target = None if planar and dtype.is_floating_point else 0.95
    else:
        run_peer, outputs = _torchvision_augment, _outputs_vs_torchvision
        peer_name, target = "torchvision v2 RandomAffine", 3.0
    layout = "planes" if not interleaved else "interleaved"
    return register_case(
        BenchCase(
            name=f"workload_augment_{kind}{'_planar' if planar else ''}_vs_{peer}",
            setup=setup,
            ours=_ours_augment,
            peer=run_peer,
            peer_name=peer_name,
            description=f"per-sample random affine of a pre-decoded 640x640 {kind} image "
            f"({layout}), 5 boxes and 5 masks; ours: warp_sample; 1 thread",
            min_speedup=target,
            min_busy_speedup=None if target is None else min(target, 1.0),
            memory=False,
            threads=1,
            check=_check_sample,
            outputs=outputs,
            small_setup=small_setup,
            group="workload",
            verify=True,
        )
    )


AUGMENT_CASES = [
    _augment_case(dtype, peer, planar)
    for dtype in (torch.uint8, torch.float32)
    for peer, planar in (("opencv", False), ("opencv", True), ("torchvision", False))
]
"""``workload_augment_{uint8,float32}[_planar]_vs_{opencv,torchvision}``."""
