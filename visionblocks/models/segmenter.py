"""Semantic segmentation from the blocks: `FPNSegHead` (``HEADS``: ``fpn_seg``),
`Segmenter` and `build_segmenter` (``MODELS``: ``segmenter``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_int, check_number, check_type
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import HEADS, LOSSES, MODELS
from visionblocks._core.tensor_checks import check_device
from visionblocks.init import kaiming_init, normal_init
from visionblocks.losses.ce import cross_entropy
from visionblocks.losses.softmax_focal import softmax_focal_loss
from visionblocks.models._compose import ComposedModel, build_parts
from visionblocks.models._levels import (
    check_levels,
    check_measured_strides,
    check_size,
    check_strides,
)
from visionblocks.models.detector import normalize_images
from visionblocks.nn._limits import MAX_CHANNELS, check_channels
from visionblocks.nn.conv import ConvNormAct
from visionblocks.nn.layers import NormSpec

__all__ = ["FPNSegHead", "Segmenter", "build_segmenter"]
__dir__ = public_dir(__name__, __all__)


def check_label_maps(
    name: str, labels: Any, shape: tuple[int, ...], device: torch.device, head: nn.Module
) -> None:
    """``labels``: an integer ``shape`` tensor on ``device`` with labels the head knows."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a (B, H, W) integer tensor, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(
            f"{name} must be an integer tensor of class indices, got {labels.dtype} (floats "
            "would be truncated)"
        )
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape (B, H, W) = {tuple(shape)} (one label per pixel of the "
            f"images), got {tuple(labels.shape)}"
        )
    check_device(name, labels, device, "the images")
    num_classes, ignore = getattr(head, "num_classes", None), getattr(head, "ignore_index", None)
    on_host = reads_values(labels)
    if isinstance(num_classes, int) and (on_host or asserts_on_device(labels)) and labels.numel():
        bad = (labels < 0) | (labels >= num_classes)
        if isinstance(ignore, int):
            bad &= labels != ignore
        rule = f"{name} must hold classes in [0, {num_classes}) or ignore_index={ignore}"
        if not on_host:  # CUDA: a device-side assert, no host sync
            assert_on_device(~bad, rule)
        elif bool(bad.any()):
            raise ValueError(f"{rule}, got {labels[bad][0].item()}")


_SEG_LOSSES = ("ce", "softmax_focal", "dice", "jaccard", "tversky", "lovasz")


def _loss_names(loss: Any) -> list[str]:
    """``loss`` (a name or a sequence of distinct names of ``_SEG_LOSSES``) as a list."""
    if isinstance(loss, str) or not isinstance(loss, Sequence):
        check_choice("loss", loss, _SEG_LOSSES)
        return [loss]
    if not loss:
        raise ValueError(f"loss must be a name or a non-empty sequence of names of {_SEG_LOSSES}")
    for i, name in enumerate(loss):
        check_choice(f"loss[{i}]", name, _SEG_LOSSES)
    if len(set(loss)) < len(loss):
        raise ValueError(f"loss must name each loss once, got {tuple(loss)}")
    return list(loss)


@HEADS.register(name="fpn_seg")
class FPNSegHead(nn.Module):
    """Semantic FPN head (Kirillov et al., 2019): every level brought to the finest stride,
    summed, classified per pixel; a loss on the labels at input resolution.

    A level of stride ``s`` goes through ``log2(s / s_0)`` blocks of 3x3 ``ConvNormAct`` +
    2x bilinear upsampling (one without upsampling for the finest level); the sums feed a
    1x1 classifier, whose logits are upsampled to the input size. The loss is one of
    `visionblocks.losses.cross_entropy` (``"ce"``), `visionblocks.losses.softmax_focal_loss`
    (``"softmax_focal"``) and the ``LOSSES`` entries ``"dice"``, ``"jaccard"``, ``"tversky"``
    and ``"lovasz"`` (built in ``"multiclass"`` mode with the head's ``ignore_index``), or
    the sum of several; pixels equal to ``ignore_index`` are skipped.

    Args:
        in_channels: Channels of every input level (an FPN's ``out_channels``).
        num_classes: Classes, background included.
        strides: Strides of the input levels, finest first (powers of two).
        channels: Width of the upsampling branches.
        norm: Norm of the branch convolutions.
        loss: One of the names above (the loss dict's entry is ``loss_seg``), or a sequence
            of distinct names whose losses are summed (one entry ``loss_<name>`` each), such
            as ``("ce", "dice")``.
        ignore_index: Label of pixels the loss skips.
        top_k: For ``"ce"``: the hardest fraction of pixels (OHEM), or ``None`` for all.
        gamma: For ``"softmax_focal"``: the focusing parameter.
        label_smoothing: For ``"ce"``, in ``[0, 1)``.

    Raises:
        TypeError: An option of the wrong type; in ``forward``, ``features`` that is not a
            dict or list of floating-point tensors.
        ValueError: An option out of range, an unknown loss name (or one given twice),
            ``top_k`` or ``label_smoothing`` without ``"ce"``; in ``forward``, levels that
            do not match ``strides`` and ``in_channels``, a bad ``size``.

    Examples:
        >>> import torch
        >>> head = FPNSegHead(16, num_classes=4, strides=[4, 8], channels=8)
        >>> logits = head([torch.randn(2, 16, 8, 8), torch.randn(2, 16, 4, 4)], size=(32, 32))
        >>> logits.shape
        torch.Size([2, 4, 32, 32])
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        strides: Sequence[int],
        *,
        channels: int = 128,
        norm: NormSpec = "gn",
        loss: str | Sequence[str] = "ce",
        ignore_index: int = 255,
        top_k: float | None = None,
        gamma: float = 2.0,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        check_channels("in_channels", in_channels)
        check_int("num_classes", num_classes, 1, MAX_CHANNELS)
        check_channels("channels", channels)
        names = _loss_names(loss)
        check_type("ignore_index", ignore_index, int)
        if top_k is not None:
            check_number("top_k", top_k, 0.0, 1.0, low_inclusive=False)
        check_number("gamma", gamma, 0.0, math.inf, high_inclusive=False)
        check_number("label_smoothing", label_smoothing, 0.0, 1.0, high_inclusive=False)
        if "ce" not in names and (top_k is not None or label_smoothing):
            raise ValueError(f"top_k and label_smoothing apply to loss='ce', not {loss!r}")
        strides = check_strides(strides, powers_of_two=True)
        base = strides[0]
        self.num_classes, self.strides = num_classes, strides
        self.loss_type = loss if isinstance(loss, str) else tuple(names)
        # Region losses from the registry, in a plain dict: no state, not submodules.
        self._region_losses = {
            name: LOSSES.build({"type": name, "mode": "multiclass", "ignore_index": ignore_index})
            for name in names
            if name not in ("ce", "softmax_focal")
        }
        self.ignore_index, self.top_k, self.gamma = ignore_index, top_k, gamma
        self.label_smoothing = label_smoothing
        self.branches = nn.ModuleList()
        for s in strides:
            steps = max(1, (s // base).bit_length() - 1)
            layers: list[nn.Module] = []
            for i in range(steps):
                layers.append(
                    ConvNormAct(in_channels if i == 0 else channels, channels, 3, norm=norm)
                )
                if s > base:
                    layers.append(
                        nn.Upsample(scale_factor=2.0, mode="bilinear", align_corners=False)
                    )
            self.branches.append(nn.Sequential(*layers))
        self.classifier = nn.Conv2d(channels, num_classes, 1)
        for module in self.branches.modules():
            if isinstance(module, nn.Conv2d):
                kaiming_init(module, mode="fan_out", nonlinearity="relu")
        normal_init(self.classifier, std=0.01, bias=0.0)

    def forward(
        self, features: Mapping[str, Tensor] | Sequence[Tensor], size: tuple[int, int]
    ) -> Tensor:
        """Logits ``(B, num_classes, *size)`` from the levels (finest first).

        Args:
            features: A dict or list of ``Tensor[B, in_channels, H_l, W_l]``, one per
                stride, finest first.
            size: ``(H, W)`` of the logits (the input images' size).
        """
        channels = self.branches[0][0].conv.in_channels
        levels = check_levels(
            "features", features, [channels] * len(self.branches), self.classifier
        )
        check_measured_strides(features, levels, self.strides)
        size = check_size("size", size)
        fused = self.branches[0](levels[0])
        for branch, x in zip(self.branches[1:], levels[1:]):
            up = branch(x)
            if up.shape[-2:] != fused.shape[-2:]:  # odd input sizes round differently
                up = F.interpolate(up, size=fused.shape[-2:], mode="bilinear", align_corners=False)
            fused = fused + up
        logits = self.classifier(fused)
        return F.interpolate(logits, size=tuple(size), mode="bilinear", align_corners=False)

    def loss(self, logits: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """The losses of ``logits (B, K, H, W)`` against ``labels (B, H, W)``: ``{"loss_seg":
        ...}`` for one loss name, ``{"loss_<name>": ...}`` for each of a sequence.

        Examples:
            >>> import torch
            >>> head = FPNSegHead(8, num_classes=2, strides=[4], loss="ce")
            >>> labels = torch.tensor([[[0, 1], [1, 255]]])
            >>> round(head.loss(torch.zeros(1, 2, 2, 2), labels)["loss_seg"].item(), 4)  # log 2
            0.6931
            >>> both = FPNSegHead(8, num_classes=2, strides=[4], loss=("ce", "dice"))
            >>> sorted(both.loss(torch.zeros(1, 2, 2, 2), labels))
            ['loss_ce', 'loss_dice']
        """
        check_label_maps(
            "labels", labels, (logits.shape[0], *logits.shape[-2:]), logits.device, self
        )
        labels, logits = labels.as_subclass(Tensor).long(), logits.float()
        values = {}
        for name in _loss_names(self.loss_type):
            if name == "softmax_focal":
                value = softmax_focal_loss(
                    logits, labels, gamma=self.gamma, ignore_index=self.ignore_index
                )
            elif name == "ce":
                # top_k=1.0 (every valid pixel) rather than None: a batch with every pixel
                # ignored gives a zero loss, where F.cross_entropy's "mean" gives NaN.
                value = cross_entropy(
                    logits, labels, ignore_index=self.ignore_index,
                    top_k=1.0 if self.top_k is None else self.top_k,
                    label_smoothing=self.label_smoothing,
                )  # fmt: skip
            else:
                value = self._region_losses[name](logits, labels)
            values["loss_seg" if isinstance(self.loss_type, str) else f"loss_{name}"] = value
        return values

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, strides={self.strides}, loss={self.loss_type!r}"


class Segmenter(ComposedModel):
    """Backbone -> neck -> `FPNSegHead`: per-pixel class logits, losses or label maps.

    ``forward(images, targets=None)``: in training mode, the loss dict with ``loss``
    (``targets`` required: ``(B, H, W)`` integer labels on the images' device, such as
    stacked `visionblocks.data.CocoSegmentation` masks, each in ``[0, num_classes)`` or the
    head's ``ignore_index``); in eval mode, logits ``(B, K, H, W)`` at the input size;
    `predict` gives label maps. Images as in `visionblocks.models.Detector`. Exports
    (``torch.export``, ``torch.onnx.export(..., dynamo=True)``) with dynamic batch size and
    ``H``, ``W`` (multiples of the largest stride).

    Raises:
        TypeError: As `visionblocks.models.Detector`; ``targets`` not an integer tensor.
        ValueError: As `visionblocks.models.Detector`; ``targets`` of another shape or
            device than the images, or with labels out of range.

    Examples:
        >>> import torch
        >>> model = build_segmenter({
        ...     "backbone": {"type": "vb_tiny"},
        ...     "neck": {"type": "fpn", "out_channels": 16},
        ...     "head": {"type": "fpn_seg", "num_classes": 4, "channels": 16},
        ... })
        >>> images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8)
        >>> model(images, torch.randint(0, 4, (2, 64, 64)))["loss"].shape
        torch.Size([])
    """

    head_methods = ("loss",)

    def forward(self, images: Tensor, targets: Tensor | None = None) -> Tensor | dict[str, Tensor]:
        if not isinstance(images, Tensor):
            raise TypeError(
                "images must be a (B, C, H, W) tensor (label maps must match its size), got "
                f"{type(images).__name__}"
            )
        if self.training and targets is None:
            raise ValueError(
                "the segmenter is in training mode and needs targets for its loss; call "
                "model.eval() for logits"
            )
        batch, _ = normalize_images(images, self.pixel_mean, self.pixel_std)
        if self.training:  # checked before the forward: a mistake fails fast
            shape = (batch.shape[0], *batch.shape[-2:])
            check_label_maps("targets", targets, shape, batch.device, self.head)
        logits = self.head(self.neck(self.backbone(batch)), size=tuple(batch.shape[-2:]))
        if self.training:
            losses = self.head.loss(logits, targets)
            losses["loss"] = sum(losses.values())
            return losses
        return logits

    @torch.no_grad()
    def predict(self, images: Tensor) -> Tensor:
        """Label maps ``(B, H, W)`` int64: the arg-max class of every pixel (in eval mode).

        Examples:
            >>> import torch
            >>> model = build_segmenter(backbone="vb_tiny", neck="fpn",
            ...                         head={"type": "fpn_seg", "num_classes": 3})
            >>> model.predict(torch.zeros(1, 3, 40, 56, dtype=torch.uint8)).shape
            torch.Size([1, 40, 56])
        """
        was_training = self.training
        self.eval()
        try:
            return self(images).argmax(dim=1)
        finally:
            self.train(was_training)


@MODELS.register(name="segmenter")
def build_segmenter(cfg: Mapping[str, Any] | None = None, **entries: Any) -> Segmenter:
    """Build a `Segmenter` from config entries, as `visionblocks.models.build_detector`.

    Examples:
        >>> model = build_segmenter(
        ...     backbone={"type": "vb_tiny"}, neck="fpn", head={"type": "fpn_seg", "num_classes": 3}
        ... )
        >>> model.head.strides
        [4, 8, 16, 32]
    """
    backbone, neck, head, extras = build_parts(cfg, entries)
    return Segmenter(backbone, neck, head, **extras)
