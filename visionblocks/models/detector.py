"""A dense detector composed from registered parts: `Detector` and `build_detector`."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._check import check_type
from visionblocks.registry import BACKBONES, HEADS, MODELS, NECKS

__all__ = ["Detector", "build_detector", "build_parts", "normalize_images"]

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def normalize_images(
    images: Tensor | Sequence[Tensor],
    mean: Tensor,
    std: Tensor,
    image_sizes: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, list[tuple[int, int]]]:
    """A float batch ``(images - mean) / std`` and the image sizes.

    ``images`` is a ``(B, C, H, W)`` tensor (any dtype, values in ``[0, 255]``, e.g. a
    `visionblocks.data.collate_detection` batch) or a list of ``(C, H, W)`` tensors, which
    are padded bottom/right into one batch (their sizes become ``image_sizes``).
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
    if len(image_sizes) != batch.shape[0]:
        raise ValueError(f"{batch.shape[0]} images but {len(image_sizes)} image_sizes")
    batch = batch.as_subclass(Tensor).to(dtype=mean.dtype)
    return (batch - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1), [
        (int(h), int(w)) for h, w in image_sizes
    ]


class Detector(nn.Module):
    """Backbone -> neck -> dense head, with pixel normalisation; losses or detections.

    ``forward(images, targets=None, image_sizes=None)``:

    - in training mode with ``targets``: the head's loss dict, plus ``loss`` (their sum);
    - otherwise: one dict per image, ``{"boxes" (XYXY, input pixels), "scores", "labels"}``.

    Images are ``(B, 3, H, W)`` in ``[0, 255]`` (uint8 or float; a
    `visionblocks.data.collate_detection` batch with its ``image_sizes``) or a list of
    ``(3, H, W)`` tensors. They are normalised with ``pixel_mean`` / ``pixel_std`` (ImageNet
    statistics in 0-255 units by default) inside the model, so data pipelines can stay in
    uint8. Targets are the dataset's: ``boxes`` XYXY and ``labels`` in ``[0, num_classes)``.

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
        for method in ("loss", "predict"):
            if not callable(getattr(head, method, None)):
                raise TypeError(f"head must have a {method}() method, got {type(head).__name__}")
        self.backbone, self.neck, self.head = backbone, neck, head
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32))
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32))

    def forward(
        self,
        images: Tensor | Sequence[Tensor],
        targets: Sequence[Mapping[str, Tensor]] | None = None,
        image_sizes: Sequence[tuple[int, int]] | None = None,
    ) -> dict[str, Tensor] | list[dict[str, Tensor]]:
        batch, sizes = normalize_images(images, self.pixel_mean, self.pixel_std, image_sizes)
        outputs = self.head(self.neck(self.backbone(batch)))
        if self.training and targets is not None:
            losses = self.head.loss(outputs, targets)
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
