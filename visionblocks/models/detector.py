"""A dense detector composed from registered parts: `Detector` and `build_detector`."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._check import check_type
from visionblocks.registry import BACKBONES, HEADS, MODELS, NECKS

__all__ = ["Detector", "build_detector", "normalize_images", "training_targets"]

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def normalize_images(
    images: Tensor | Sequence[Tensor],
    mean: Tensor,
    std: Tensor,
    image_sizes: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, list[tuple[int, int]]]:
    """A float batch ``(images - mean) / std`` and the sizes of the images in it.

    Args:
        images: A ``(B, C, H, W)`` tensor (any dtype, values in ``[0, 255]``, e.g. a
            `visionblocks.data.collate_detection` batch) or a list of ``(C, H, W)`` tensors,
            padded bottom/right into one batch whose sides are multiples of 32.
        mean (Tensor[C]): Per-channel mean, in the images' units.
        std (Tensor[C]): Per-channel standard deviation.
        image_sizes: ``(H, W)`` of each image of a tensor batch before padding; default: the
            batch's ``(H, W)``. Ignored for a list (its own sizes are used).

    Returns:
        tuple: ``Tensor[B, C, H, W]`` in ``mean``'s dtype, and the ``(H, W)`` of each image.

    Raises:
        TypeError: ``images`` is neither a tensor nor a list of tensors.
        ValueError: Not 4-D, another number of channels than ``mean``, or as many
            ``image_sizes`` as images.

    Examples:
        >>> import torch
        >>> mean, std = torch.tensor([100.0, 100.0, 100.0]), torch.tensor([50.0, 50.0, 50.0])
        >>> batch, sizes = normalize_images([torch.full((3, 20, 40), 150, dtype=torch.uint8)], mean, std)
        >>> batch.shape, sizes, batch[0, 0, 0, 0].item(), batch[0, 0, 31, 63].item()
        (torch.Size([1, 3, 32, 64]), [(20, 40)], 1.0, -2.0)
    """
    if isinstance(images, Tensor):
        if images.dim() != 4:
            raise ValueError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
        batch = images
        if image_sizes is None:
            image_sizes = [tuple(images.shape[-2:])] * images.shape[0]
    elif isinstance(images, Sequence) and images and all(isinstance(i, Tensor) for i in images):
        from visionblocks.data.collate import collate_detection

        padded = collate_detection([(image, None) for image in images], size_divisible=32)
        batch, image_sizes = padded.images, padded.image_sizes
    else:
        raise TypeError(
            f"images must be a (B, C, H, W) tensor or a list of (C, H, W) tensors, got "
            f"{type(images).__name__}"
        )
    if batch.shape[1] != mean.numel():
        raise ValueError(
            f"images have {batch.shape[1]} channels, but the model normalises {mean.numel()} "
            f"(pixel_mean has {mean.numel()} values)"
        )
    if len(image_sizes) != batch.shape[0]:
        raise ValueError(f"{batch.shape[0]} images but {len(image_sizes)} image_sizes")
    batch = batch.as_subclass(Tensor).to(dtype=mean.dtype)
    return (batch - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1), [
        (int(h), int(w)) for h, w in image_sizes
    ]


def training_targets(targets: Sequence[Mapping[str, Any]]) -> list[dict[str, Tensor]]:
    """``boxes`` (XYXY) and ``labels`` of every target, crowd rows left out.

    ``tv_tensors.BoundingBoxes`` in another format are converted to XYXY; rows whose
    ``iscrowd`` is 1 are dropped (a crowd region is neither an object to find nor a mistake
    to punish, and a dense head has no ignore class: its locations become background).

    Examples:
        >>> import torch
        >>> from torchvision import tv_tensors
        >>> boxes = tv_tensors.BoundingBoxes([[10.0, 10.0, 4.0, 2.0], [5.0, 5.0, 2.0, 2.0]],
        ...                                  format="CXCYWH", canvas_size=(20, 20))
        >>> t = training_targets([{"boxes": boxes, "labels": torch.tensor([0, 1]), "iscrowd": torch.tensor([0, 1])}])
        >>> t[0]["boxes"].tolist(), t[0]["labels"].tolist()
        ([[8.0, 9.0, 12.0, 11.0]], [0])
    """
    out = []
    for i, target in enumerate(targets):
        if not isinstance(target, Mapping) or "boxes" not in target or "labels" not in target:
            raise TypeError(f"targets[{i}] must be a dict with 'boxes' and 'labels'")
        boxes, labels = target["boxes"], target["labels"]
        fmt = getattr(boxes, "format", None)
        if fmt is not None and getattr(fmt, "name", fmt) != "XYXY":
            from torchvision.ops import box_convert

            name = getattr(fmt, "name", str(fmt)).lower()
            boxes = box_convert(boxes.as_subclass(Tensor), name, "xyxy")
        boxes = boxes.as_subclass(Tensor).reshape(-1, 4)
        labels = torch.as_tensor(labels).reshape(-1)
        crowd = target.get("iscrowd")
        if isinstance(crowd, Tensor) and crowd.numel() == len(boxes) and bool(crowd.any()):
            keep = crowd.reshape(-1) == 0
            boxes, labels = boxes[keep], labels[keep]
        out.append({"boxes": boxes, "labels": labels})
    return out


class ComposedModel(nn.Module):
    """Backbone, neck and head, with the pixel statistics the model normalises with.

    The shared part of `Detector` and `visionblocks.models.Segmenter`; ``head_methods``
    names what the head must provide besides ``forward``.
    """

    head_methods: tuple[str, ...] = ()

    def __init__(
        self,
        backbone: nn.Module,
        neck: nn.Module,
        head: nn.Module,
        *,
        pixel_mean: Sequence[float] = IMAGENET_MEAN,
        pixel_std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        for name, part in (("backbone", backbone), ("neck", neck), ("head", head)):
            check_type(name, part, nn.Module)
        for method in self.head_methods:
            if not callable(getattr(head, method, None)):
                raise TypeError(f"head must have a {method}() method, got {type(head).__name__}")
        self.backbone, self.neck, self.head = backbone, neck, head
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32))
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32))


class Detector(ComposedModel):
    """Backbone -> neck -> dense head, with pixel normalisation; losses or detections.

    ``forward(images, targets=None, image_sizes=None)``:

    - in training mode: the head's loss dict, plus ``loss`` (their sum); ``targets`` are
      required (a training-mode call without them raises);
    - in eval mode: one dict per image, ``{"boxes" (XYXY, input pixels), "scores",
      "labels"}``; ``targets`` are not used.

    Images are ``(B, 3, H, W)`` in ``[0, 255]`` (uint8 or float; a
    `visionblocks.data.collate_detection` batch with its ``image_sizes``) or a list of
    ``(3, H, W)`` tensors. They are normalised with ``pixel_mean`` / ``pixel_std`` (ImageNet
    statistics in 0-255 units by default) inside the model, so data pipelines can stay in
    uint8. Targets are the dataset's: ``boxes`` (XYXY, or ``tv_tensors.BoundingBoxes`` in
    any format) and ``labels`` in ``[0, num_classes)``; rows with ``iscrowd`` 1 are left
    out (`training_targets`).

    The eval path ends in data-dependent NMS: ``torch.compile`` works, ``torch.jit``
    tracing and ``torch.export`` do not.

    Args:
        backbone: Returns a dict of feature maps (a `visionblocks.backbones.Backbone`).
        neck: Maps that dict to the head's levels (`visionblocks.models.FPN`).
        head: Has ``forward(features)``, ``loss(outputs, targets)`` and
            ``predict(outputs, image_sizes)`` (`visionblocks.models.FCOSHead`).
        pixel_mean: Per-channel mean, 0-255 units.
        pixel_std: Per-channel standard deviation, 0-255 units.

    Examples:
        >>> import torch
        >>> model = build_detector({
        ...     "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
        ...     "neck": {"type": "fpn", "out_channels": 32},
        ...     "head": {"type": "fcos", "num_classes": 3, "num_convs": 1},
        ... })
        >>> images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8)
        >>> targets = [{"boxes": torch.tensor([[8.0, 8.0, 40.0, 30.0]]), "labels": torch.tensor([2])}] * 2
        >>> sorted(model(images, targets))
        ['loss', 'loss_box', 'loss_centerness', 'loss_cls']
        >>> detections = model.eval()(images)
        >>> sorted(detections[0])
        ['boxes', 'labels', 'scores']
    """

    head_methods = ("loss", "predict")

    def forward(
        self,
        images: Tensor | Sequence[Tensor],
        targets: Sequence[Mapping[str, Tensor]] | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> dict[str, Tensor] | list[dict[str, Tensor]]:
        if self.training and targets is None:
            raise ValueError(
                "the detector is in training mode and needs targets for its losses; call "
                "model.eval() for detections"
            )
        batch, sizes = normalize_images(images, self.pixel_mean, self.pixel_std, image_sizes)
        outputs = self.head(self.neck(self.backbone(batch)))
        if self.training:
            losses = self.head.loss(outputs, training_targets(targets))
            losses["loss"] = sum(losses.values())
            return losses
        return self.head.predict(outputs, sizes)


def _part(registry: Any, cfg: Any, what: str, **defaults: Any) -> nn.Module:
    if isinstance(cfg, nn.Module):
        return cfg
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(
            f"{what} must be a module, a registered name or a dict with 'type', got {cfg!r}"
        )
    options = {**defaults, **{k: v for k, v in cfg.items() if k != "type"}}
    return registry.build(cfg["type"], **options)


def build_parts(
    cfg: Mapping[str, Any] | None, entries: Mapping[str, Any]
) -> tuple[nn.Module, nn.Module, nn.Module, dict[str, Any]]:
    """Backbone, neck and head from config entries, and the other model options.

    The neck gets ``in_channels``/``strides`` from the backbone's ``feature_info``, the head
    ``in_channels``/``strides`` from the neck's, unless the config sets them. The config is
    not modified (ready modules in it are used as they are).

    Raises:
        TypeError: ``cfg`` or a part has the wrong type.
        ValueError: Missing or unknown keys.
    """
    if cfg is not None:
        check_type("cfg", cfg, Mapping)
    cfg = {**(cfg or {}), **entries}
    unknown = set(cfg) - {"backbone", "neck", "head", "pixel_mean", "pixel_std"}
    if unknown or not {"backbone", "neck", "head"} <= set(cfg):
        raise ValueError(
            "cfg needs 'backbone', 'neck' and 'head' (optional: 'pixel_mean', 'pixel_std'); "
            f"got keys {sorted(cfg)}"
        )
    cfg = {k: v if isinstance(v, nn.Module) else copy.deepcopy(v) for k, v in cfg.items()}
    backbone = _part(BACKBONES, cfg["backbone"], "backbone")
    info = backbone.feature_info
    neck = _part(
        NECKS, cfg["neck"], "neck",
        in_channels=[f["channels"] for f in info], strides=[f["stride"] for f in info],
    )  # fmt: skip
    levels = getattr(neck, "feature_info", info)
    head = _part(
        HEADS, cfg["head"], "head",
        in_channels=levels[0]["channels"], strides=[f["stride"] for f in levels],
    )  # fmt: skip
    extras = {k: cfg[k] for k in ("pixel_mean", "pixel_std") if k in cfg}
    return backbone, neck, head, extras


@MODELS.register(name="detector")
def build_detector(cfg: Mapping[str, Any] | None = None, **entries: Any) -> Detector:
    """Build a `Detector` from a config dict, through the registries.

    ``cfg`` (or keyword arguments, which update it) has ``backbone`` (``BACKBONES``), ``neck``
    (``NECKS``) and ``head`` (``HEADS``), each a ``{"type": name, **options}`` dict (or a
    name, or a ready module), and optional ``pixel_mean`` / ``pixel_std``. The neck gets
    ``in_channels`` and ``strides`` from the backbone's ``feature_info`` and the head gets
    ``in_channels`` and ``strides`` from the neck's, unless the config sets them. The config
    is not modified. Registered in ``MODELS`` as ``"detector"``:
    ``MODELS.build({"type": "detector", "backbone": ..., "neck": ..., "head": ...})``.

    Returns:
        Detector: The assembled model.

    Raises:
        TypeError: ``cfg`` or one of its parts has the wrong type.
        KeyError: An unknown registered name (the message suggests close names).
        ValueError: Options the parts reject.

    Examples:
        >>> model = build_detector({
        ...     "backbone": {"type": "resnet18", "out_indices": [1, 2, 3]},
        ...     "neck": {"type": "fpn", "out_channels": 64, "extra_levels": 2},
        ...     "head": {"type": "fcos", "num_classes": 80},
        ... })
        >>> model.head.strides
        [8, 16, 32, 64, 128]
    """
    backbone, neck, head, extras = build_parts(cfg, entries)
    return Detector(backbone, neck, head, **extras)
