"""A dense detector composed from registered parts: `Detector` and `build_detector`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.checks import check_int
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import MODELS
from visionblocks._core.tensor_checks import check_device, check_floating
from visionblocks.models._compose import ComposedModel, build_parts
from visionblocks.models._targets import prepare_targets

__all__ = ["Detector", "build_detector", "normalize_images", "training_targets"]
__dir__ = public_dir(__name__, __all__)


def _check_image_sizes(image_sizes: Any, batch: Tensor) -> list[tuple[int, int]]:
    """``(H, W)`` of every image: ints in ``[1, padded size]``, one pair per image."""
    if isinstance(image_sizes, (str, bytes)) or not isinstance(image_sizes, Sequence):
        raise TypeError(
            f"image_sizes must be a list of (H, W) pairs, one per image, got "
            f"{type(image_sizes).__name__}"
        )
    if len(image_sizes) != batch.shape[0]:
        raise ValueError(
            f"image_sizes must hold one (H, W) per image: images has {batch.shape[0]} images "
            f"but image_sizes has {len(image_sizes)} entries"
        )
    height, width = batch.shape[-2:]
    sizes = []
    for i, size in enumerate(image_sizes):
        ok = isinstance(size, Sequence) and len(size) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in size
        )  # fmt: skip
        if not ok or not (1 <= size[0] <= height and 1 <= size[1] <= width):
            raise ValueError(
                f"image_sizes[{i}] must be a pair of ints (H, W) within the batch's "
                f"({height}, {width}), got {size!r}"
            )
        sizes.append((size[0], size[1]))
    return sizes


def _sizes_tensor(sizes: list[tuple[int, int]] | None, batch: Tensor) -> Tensor:
    """``(B, 2)`` int64 ``(H, W)`` of every image; ``None``: the batch's size (symbolic)."""
    if sizes is not None:
        return torch.tensor(sizes, dtype=torch.long, device=batch.device)
    h, w = batch.shape[-2:]
    size = torch.stack([torch.full((), h), torch.full((), w)]).to(batch.device)
    return size.expand(batch.shape[0], 2)


def _check_image(name: str, image: Any, dims: int, device: torch.device) -> Tensor:
    if not isinstance(image, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(image).__name__}")
    if not (image.is_floating_point() or image.dtype == torch.uint8):
        raise TypeError(f"{name} must be uint8 or floating point (0-255 values), got {image.dtype}")
    if image.dim() != dims or any(side < 1 for side in image.shape[-2:]):  # no min(): symbolic
        shape = "(B, C, H, W)" if dims == 4 else "(C, H, W)"
        hint = (
            " (one image? add the batch dimension: images.unsqueeze(0))" if image.dim() == 3 else ""
        )
        raise ValueError(
            f"{name} must have shape {shape} with H, W >= 1, got {tuple(image.shape)}{hint}"
        )
    check_device(name, image, device, "the model's pixel_mean/pixel_std (mean, std)")
    return image


def normalize_images(
    images: Tensor | Sequence[Tensor],
    mean: Tensor,
    std: Tensor,
    image_sizes: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, list[tuple[int, int]]]:
    """A float batch ``(images - mean) / std`` and the sizes of the images in it.

    Args:
        images: A ``(B, C, H, W)`` tensor (uint8 or floating point, values in ``[0, 255]``)
            or a list of ``(C, H, W)`` tensors, padded into one batch (sides multiples of 32).
        mean (Tensor[C]): Per-channel mean, in the images' units; floating point.
        std (Tensor[C]): Per-channel standard deviation, positive.
        image_sizes: ``(H, W)`` of each image of a tensor batch before padding (default:
            the batch's); for a list, if given, the images' own sizes.

    Returns:
        tuple: ``Tensor[B, C, H, W]`` in ``mean``'s dtype, and the ``(H, W)`` of each image.

    Raises:
        TypeError: ``images`` is not a tensor or list of tensors of uint8 or floating point;
            ``mean``/``std`` are not floating-point tensors.
        ValueError: Not 4-D (3-D for list items), another number of channels than ``mean``,
            tensors on different devices, ``image_sizes`` not one ``(H, W)`` within the batch
            per image; with value checks on (on CUDA a device-side assert), a non-finite
            ``mean``, a ``std`` not positive and finite, or NaN or inf pixels.

    Examples:
        >>> import torch
        >>> mean, std = torch.tensor([100.0, 100.0, 100.0]), torch.tensor([50.0, 50.0, 50.0])
        >>> batch, sizes = normalize_images([torch.full((3, 20, 40), 150, dtype=torch.uint8)], mean, std)
        >>> batch.shape, sizes, batch[0, 0, 0, 0].item(), batch[0, 0, 31, 63].item()
        (torch.Size([1, 3, 32, 64]), [(20, 40)], 1.0, -2.0)
    """
    _check_stats(mean, std)
    if isinstance(images, Tensor):
        batch = _check_image("images", images, 4, mean.device)
        if image_sizes is None and torch.compiler.is_exporting():
            sizes = None  # the whole batch: a list would fix the (symbolic) batch size
        elif image_sizes is None:
            sizes = [(images.shape[-2], images.shape[-1])] * images.shape[0]
        else:
            sizes = _check_image_sizes(image_sizes, batch)
    elif isinstance(images, (list, tuple)) and images:
        for i, image in enumerate(images):
            _check_image(f"images[{i}]", image, 3, mean.device)
        from visionblocks.data.collate import collate_detection

        padded = collate_detection([(image, None) for image in images], size_divisible=32)
        batch, sizes = padded.images, [(int(h), int(w)) for h, w in padded.image_sizes]
        if image_sizes is not None and _check_image_sizes(image_sizes, batch) != sizes:
            raise ValueError(
                f"image_sizes {list(image_sizes)} differ from the sizes of the images in the "
                f"list, {sizes}; leave image_sizes out for a list"
            )
    else:
        raise TypeError(
            f"images must be a (B, C, H, W) tensor or a non-empty list of (C, H, W) tensors, "
            f"got {type(images).__name__}"
        )
    if batch.shape[1] != mean.numel():
        raise ValueError(
            f"images have {batch.shape[1]} channels, but the model normalises {mean.numel()} "
            f"(mean / pixel_mean has {mean.numel()} values)"
        )
    if not torch.compiler.is_exporting():  # as_subclass of an export input becomes a constant
        batch = batch.as_subclass(Tensor)
    if batch.is_floating_point() and reads_values(batch):
        if not bool(torch.isfinite(batch).all()):
            raise ValueError("images must be finite (0-255 values), got NaN or inf pixels")
    elif batch.is_floating_point() and asserts_on_device(batch):
        assert_on_device(torch.isfinite(batch), "images must be finite (0-255 values)")
    batch = batch.to(dtype=mean.dtype)
    return (batch - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1), sizes


def _check_stats(mean: Any, std: Any) -> None:
    check_floating("mean", mean)
    check_floating("std", std)
    if mean.dim() != 1 or std.shape != mean.shape or mean.numel() == 0:
        raise ValueError(
            f"mean and std must be 1-D with one value per channel, got shapes "
            f"{tuple(mean.shape)} and {tuple(std.shape)}"
        )
    check_device("std", std, mean.device, "mean")
    on_host = reads_values(mean, std)
    if on_host or asserts_on_device(mean, std):
        ok = torch.isfinite(mean).all() & torch.isfinite(std).all() & (std > 0).all()
        if not on_host:
            assert_on_device(ok, "mean must be finite and std positive and finite")
        elif not bool(ok):
            raise ValueError(
                f"mean must be finite and std positive and finite, got mean={mean.tolist()}, "
                f"std={std.tolist()}"
            )


def training_targets(
    targets: Sequence[Mapping[str, Any]], *, num_classes: int | None = None
) -> list[dict[str, Tensor]]:
    """Checked ``boxes`` (XYXY) and ``labels`` of every target, crowd rows left out.

    ``tv_tensors.BoundingBoxes`` in another format are converted to XYXY; rows whose
    ``iscrowd`` is 1 are dropped (a dense head has no ignore class; one host sync on CUDA).
    Always checked: ``boxes`` a floating-point ``Tensor[N, 4]``, ``labels`` an integer
    ``Tensor[N]``, ``iscrowd`` (optional) an integer or bool ``Tensor[N]``, all on one
    device. With value checks on (the default; a device-side assert on CUDA): boxes finite
    with ``x2 > x1`` and ``y2 > y1`` (**zero-size boxes are rejected**: no location lies
    inside them), labels in ``[0, num_classes)`` (``>= 0`` without it), ``iscrowd`` 0 or 1.

    Args:
        targets: One dict per image with ``boxes``, ``labels`` and optionally ``iscrowd``.
        num_classes: The model's number of classes.

    Returns:
        list[dict[str, Tensor]]: ``{"boxes": Tensor[M, 4] (XYXY), "labels": Tensor[M]}``.

    Raises:
        TypeError: ``targets`` is not a list of dicts; a field of the wrong type or dtype.
        ValueError: A missing field, wrong shapes or lengths, tensors on different devices;
            bad values (see above). Messages name the field (``targets[1]["boxes"][0]``).

    Examples:
        >>> import torch
        >>> from torchvision import tv_tensors
        >>> boxes = tv_tensors.BoundingBoxes([[10.0, 10.0, 4.0, 2.0], [5.0, 5.0, 2.0, 2.0]],
        ...                                  format="CXCYWH", canvas_size=(20, 20))
        >>> t = training_targets([{"boxes": boxes, "labels": torch.tensor([0, 1]), "iscrowd": torch.tensor([0, 1])}])
        >>> t[0]["boxes"].tolist(), t[0]["labels"].tolist()
        ([[8.0, 9.0, 12.0, 11.0]], [0])
    """
    if num_classes is not None:
        check_int("num_classes", num_classes, 1)
    return prepare_targets(targets, num_classes=num_classes)


class Detector(ComposedModel):
    """Backbone -> neck -> dense head, with pixel normalisation; losses or detections.

    ``forward(images, targets=None, image_sizes=None)``: in training mode the head's loss
    dict plus ``loss`` (their sum; ``targets`` required); in eval mode one dict per image,
    ``{"boxes" (XYXY, input pixels), "scores", "labels"}``.

    Images are ``(B, 3, H, W)`` in ``[0, 255]`` (uint8 or float; a
    `visionblocks.data.collate_detection` batch with its ``image_sizes``) or a list of
    ``(3, H, W)`` tensors, normalised inside the model with ``pixel_mean`` / ``pixel_std``
    (ImageNet statistics in 0-255 units by default); targets are the dataset's, checked
    before anything runs (`normalize_images`, `training_targets`).

    ``forward(images, padded=True)`` (eval mode) gives the export form instead of the list:
    ``{"boxes" (B, K, 4), "scores" (B, K), "labels" (B, K), "num_detections" (B,)}``,
    ``K`` the head's ``max_detections``, rows past ``num_detections[b]`` padding (labels
    -1; `visionblocks.models.postprocess.postprocess_padded`).

    Export (eval mode, a tensor batch): ``torch.export.export`` strict and non-strict,
    post-processing included; with ``padded=True``, batch size and ``H``, ``W`` (multiples
    of the largest stride) may be dynamic, and ``torch.onnx.export(model, (x,),
    kwargs={"padded": True}, dynamo=True)`` gives the dict's four values in order (NMS as
    ONNX ``NonMaxSuppression``). ``torch.jit`` tracing does not work (data-dependent NMS).

    Args:
        backbone: Returns a dict of feature maps (a `visionblocks.backbones.Backbone`).
        neck: Maps that dict to the head's levels (`visionblocks.models.FPN`).
        head: Has ``forward(features)``, ``loss(outputs, targets)`` and
            ``predict(outputs, image_sizes)`` (`visionblocks.models.FCOSHead`).
        pixel_mean: Per-channel mean, 0-255 units, one finite value per input channel.
        pixel_std: Per-channel standard deviation, 0-255 units, positive and finite.

    Raises:
        TypeError: A part is not a module, the head lacks ``loss``/``predict``, bad pixel
            statistics; in ``forward``, inputs of the wrong type or dtype.
        ValueError: Bad pixel statistics (not finite, not positive, another length than
            the input channels); in ``forward``, training without targets, bad inputs.

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
        *,
        padded: bool = False,
    ) -> dict[str, Tensor] | list[dict[str, Tensor]]:
        if self.training and targets is None:
            raise ValueError(
                "the detector is in training mode and needs targets for its losses; call "
                "model.eval() for detections"
            )
        if padded and not callable(getattr(self.head, "predict_padded", None)):
            raise TypeError(
                f"padded=True needs a head with predict_padded(), got {type(self.head).__name__}"
            )
        batch, sizes = normalize_images(images, self.pixel_mean, self.pixel_std, image_sizes)
        if self.training:  # checked before the forward: a mistake fails fast
            num_classes = getattr(self.head, "num_classes", None)
            checked = prepare_targets(
                targets,
                batch_size=batch.shape[0],
                num_classes=num_classes if isinstance(num_classes, int) else None,
                device=batch.device,
            )
        outputs = self.head(self.neck(self.backbone(batch)))
        if self.training:
            losses = self.head.loss(outputs, checked)
            losses["loss"] = sum(losses.values())
            return losses
        if padded:
            return self.head.predict_padded(outputs, _sizes_tensor(sizes, batch))
        return self.head.predict(
            outputs, sizes if sizes is not None else _sizes_tensor(sizes, batch)
        )


@MODELS.register(name="detector")
def build_detector(cfg: Mapping[str, Any] | None = None, **entries: Any) -> Detector:
    """Build a `Detector` from a config dict, through the registries.

    ``cfg`` (or keyword arguments, which update it) has ``backbone`` (``BACKBONES``), ``neck``
    (``NECKS``) and ``head`` (``HEADS``), each a ``{"type": name, **options}`` dict (or a
    name, or a ready module), and optional ``pixel_mean`` / ``pixel_std``. The neck gets
    ``in_channels`` and ``strides`` from the backbone's ``feature_info``, the head from the
    neck's, unless the config sets them; the config is not modified.

    Args:
        cfg: The config dict (or None: the keyword arguments alone).
        **entries: Entries that update ``cfg`` (``backbone=...``, ``head=...``).

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
