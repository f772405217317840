"""Conformance specs: building blocks (``visionblocks.nn``), backbones, feature extraction and
the reference models (``visionblocks.models``), their ``forward`` and the detector's targets.

Every module is tiny (a few channels, 8 to 32 pixels) so the whole file runs in seconds. A
module's ``forward`` is spec'd by returning the module itself as the call, so the half
precision equivalences cast its parameters too; forwards that take a list of levels get a
second spec through `_Levels`, a wrapper module whose arguments are the levels' tensors. The
spec tables are kept one spec per few lines (``fmt: off``): they are data.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import Tensor, nn

from tests.conformance.framework import Arg, Spec
from tests.conformance.specs_data_core import _folder
from visionblocks.backbones import (
    Backbone,
    TinyNet,
    backbone_from_model,
    build_backbone,
    timm_backbone,
    torchvision_backbone,
    vb_tiny,
)
from visionblocks.deploy import (
    ExportError,
    ExportResult,
    export_kwargs,
    export_model,
    load_for_export,
    max_stride,
)
from visionblocks.features import IntermediateLayerGetter, feature_info
from visionblocks.models import (
    FPN,
    Detector,
    FCOSHead,
    FPNSegHead,
    Segmenter,
    build_detector,
    build_segmenter,
    decode_ltrb,
    postprocess_detections,
)
from visionblocks.models.detector import normalize_images, training_targets
from visionblocks.models.postprocess import postprocess_padded
from visionblocks.nn import (
    ChannelShuffle,
    ConvNormAct,
    DepthwiseConv2d,
    DepthwiseSeparableConv2d,
    Involution2d,
    LayerNorm2d,
    LocalAttention2d,
    LocalFilter2d,
    channel_shuffle,
    find_conv_bn_pairs,
    fuse_conv_bn,
    fuse_modules,
    make_activation,
    make_norm,
)
from visionblocks.nn.layers import group_norm_groups

ALL = ("noncontiguous", "channels_last", "half", "bfloat16")
TINY = {"widths": (8, 8, 8, 8), "depths": (1, 1, 1, 1)}
MEAN, STD = [120.0, 115.0, 100.0], [60.0, 57.0, 57.0]


def _x(channels: int = 8, size: int = 8, batch: int = 2) -> Tensor:
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(0))


def _images(batch: int = 2) -> Tensor:
    return torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 255


def _ints(*names: str, **kw: Any) -> list[Arg]:
    return [Arg(name, "int", **kw) for name in names]


def _bools(*names: str) -> list[Arg]:
    return [Arg(name, "bool") for name in names]


def _choices(*names: str) -> list[Arg]:
    """``norm``/``act``-like arguments: a name, a factory or None."""
    return [Arg(name, "choice", optional=True) for name in names]


def _forward(module: Any, **kwargs: Any) -> Any:
    """A build function for ``module(**kwargs)`` (the module built anew each time)."""
    return lambda: (module(), {k: v() if callable(v) else v for k, v in kwargs.items()})


class _Levels(nn.Module):
    """Calls ``module([x0, x1], **extra)``: the levels of a neck or head as tensor arguments."""

    def __init__(self, module: nn.Module, **extra: Any) -> None:
        super().__init__()
        self.module, self.extra = module, extra

    def forward(self, x0: Tensor, x1: Tensor) -> Any:
        return self.module([x0, x1], **self.extra)


LEVELS = [
    Arg("x0", "tensor", aliases=("features[0]",)),
    Arg("x1", "tensor", aliases=("features[1]",)),
]


# --------------------------------------------------------------------------- builders
def _local_filter_kernels() -> tuple[Any, dict[str, Any]]:
    kernels = torch.rand(2, 2 * 9, 8, 8, generator=torch.Generator().manual_seed(1))
    return LocalFilter2d(8, kernel_size=3, groups=2), {"x": _x(), "kernels": kernels}


def _fusable() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()


def _tiny() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet(**TINY)


def _getter() -> IntermediateLayerGetter:
    return IntermediateLayerGetter(_tiny(), {"stage3": "a", "stage4": "b"}, input_size=(3, 32, 32))


def _detector(train: bool = True) -> Detector:
    torch.manual_seed(0)
    return build_detector(
        backbone={"type": "vb_tiny", "out_indices": [2, 3], **TINY},
        neck={"type": "fpn", "out_channels": 8},
        head={"type": "fcos", "num_classes": 3, "num_convs": 1},
    ).train(train)


def _segmenter() -> Segmenter:
    torch.manual_seed(0)
    return build_segmenter(
        backbone={"type": "vb_tiny", "out_indices": [1, 2], **TINY},
        neck={"type": "fpn", "out_channels": 8},
        head={"type": "fpn_seg", "num_classes": 3, "channels": 8},
    )


def _target(n: int = 2) -> dict[str, Tensor]:
    boxes = torch.tensor([[2.0, 3.0, 20.0, 24.0], [8.0, 6.0, 30.0, 15.0]])[:n]
    return {
        "boxes": boxes,
        "labels": torch.tensor([1, 2])[:n],
        "iscrowd": torch.zeros(n, dtype=torch.long),
    }


def _train_on_targets() -> tuple[Any, dict[str, Any]]:
    """The detector in training mode called with ``targets[0]``'s fields as arguments."""
    model, images = _detector(), _images()

    def call(boxes: Any, labels: Any, iscrowd: Any) -> Any:
        return model(images, [{"boxes": boxes, "labels": labels, "iscrowd": iscrowd}, _target(1)])

    return call, _target()


def _parts(head: nn.Module) -> dict[str, Any]:
    neck = FPN([8, 8], [16, 32], out_channels=8)
    backbone = vb_tiny(out_indices=[2, 3], **TINY)
    return {"backbone": backbone, "neck": neck, "head": head, "pixel_mean": MEAN, "pixel_std": STD}


def _builder(build: Any, head: dict[str, Any]) -> Any:
    backbone = {"type": "vb_tiny", "out_indices": [2, 3], **TINY}
    return lambda: (build, {"cfg": None, "backbone": backbone, "neck": {"type": "fpn", "out_channels": 8},
                            "head": head, "pixel_mean": MEAN, "pixel_std": STD})  # fmt: skip


BUILDER_ARGS = [
    Arg("cfg", "mapping"),
    # a string is a registered name: an unknown one is the registry's KeyError ("heads registry")
    *(Arg(n, "mapping", aliases=(f"{n}s registry",)) for n in ("backbone", "neck", "head")),
    Arg("pixel_mean", "sequence"),
    Arg("pixel_std", "sequence"),
]
PARTS_ARGS = [*(Arg(n, "module") for n in ("backbone", "neck", "head")),
              Arg("pixel_mean", "sequence"), Arg("pixel_std", "sequence")]  # fmt: skip


def _fcos_head() -> FCOSHead:
    torch.manual_seed(0)
    return FCOSHead(8, 3, [8, 16], num_convs=1)


def _seg_head() -> FPNSegHead:
    torch.manual_seed(0)
    return FPNSegHead(8, 3, [4, 8], channels=8)


def _one_level(s0: Tensor, b0: Tensor) -> dict[str, Tensor]:
    return postprocess_detections([s0], [b0], (32, 32))


def _level_scores() -> tuple[Any, dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    corners = torch.rand(6, 2, generator=g) * 16
    return _one_level, {
        "s0": torch.rand(6, 3, generator=g),
        "b0": torch.cat([corners, corners + 8], 1),
    }


def _postprocess() -> tuple[Any, dict[str, Any]]:
    s0, b0 = _level_scores()[1].values()
    return postprocess_detections, {
        "scores": [s0, s0[:2]],
        "boxes": [b0, b0[:2]],
        "image_size": (32, 32),
        "score_thresh": 0.05,
        "topk_candidates": 100,
        "nms_thresh": 0.6,
        "max_detections": 10,
    }


def _options(**extra: Any) -> dict[str, Any]:
    """The options every backbone builder takes."""
    return {
        "pretrained": None,
        "out_indices": [2, 3],
        "in_channels": 3,
        "frozen_stages": 1,
        "norm_eval": False,
        "grad_checkpointing": [2, 3],
        **extra,
    }


OPTIONS = [
    Arg("pretrained", "path", optional=True),
    Arg("out_indices", "sequence", optional=True),
    *_ints("in_channels", "frozen_stages"),
    *_bools("norm_eval"),
    # a repeated stage is a ValueError; True and False are legitimate values too
    Arg("grad_checkpointing", "sequence"),
]


# --------------------------------------------------------------------------- specs
# fmt: off
NN_SPECS: list[Spec] = [
    Spec(ConvNormAct, lambda: (ConvNormAct, {
            "in_channels": 4, "out_channels": 8, "kernel_size": 3, "stride": 1, "padding": None,
            "dilation": 1, "groups": 1, "norm": "bn", "act": "relu", "bias": None, "inplace": True}),
         args=[*_ints("in_channels", "out_channels", "kernel_size", "stride"),
               *_ints("padding", optional=True), *_ints("dilation", "groups"), *_choices("norm", "act"),
               Arg("bias", "bool", optional=True), *_bools("inplace")]),
    Spec(ConvNormAct, _forward(lambda: ConvNormAct(4, 8, stride=2, act="silu").eval(), x=lambda: _x(4)),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(DepthwiseConv2d, lambda: (DepthwiseConv2d, {
            "channels": 4, "kernel_size": 3, "stride": 1, "padding": None, "dilation": 1,
            "multiplier": 2, "bias": False}),
         args=[*_ints("channels", "kernel_size", "stride"), *_ints("padding", optional=True),
               *_ints("dilation", "multiplier"), *_bools("bias")]),
    Spec(DepthwiseConv2d, _forward(lambda: DepthwiseConv2d(4, 5, multiplier=2), x=lambda: _x(4)),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(DepthwiseSeparableConv2d, lambda: (DepthwiseSeparableConv2d, {
            "in_channels": 4, "out_channels": 8, "kernel_size": 3, "stride": 2, "dilation": 1,
            "norm": "bn", "act": "relu6"}),
         args=[*_ints("in_channels", "out_channels", "kernel_size", "stride", "dilation"),
               *_choices("norm", "act")]),
    Spec(DepthwiseSeparableConv2d, _forward(lambda: DepthwiseSeparableConv2d(4, 8).eval(), x=lambda: _x(4)),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    # huge groups fail at call time (they divide the channels of no input)
    Spec(ChannelShuffle, lambda: (ChannelShuffle, {"groups": 2}), args=_ints("groups")),
    # a pure reindexing: any dtype, any trailing dims and any device (meta too) are fine
    Spec(ChannelShuffle, _forward(lambda: ChannelShuffle(2), x=lambda: _x(4)),
         args=[Arg("x", "tensor", accept={"dtype", "rank_up", "meta"})], forward=True, equivalences=ALL),
    Spec(channel_shuffle, lambda: (channel_shuffle, {"x": _x(4), "groups": 2}),
         args=[Arg("x", "tensor", accept={"dtype", "rank_up", "meta"}), *_ints("groups")],
         equivalences=ALL),
    Spec(LayerNorm2d, lambda: (LayerNorm2d, {"num_channels": 8, "eps": 1e-6, "elementwise_affine": True}),
         args=[*_ints("num_channels"), Arg("eps", "float"), *_bools("elementwise_affine")]),
    Spec(LayerNorm2d, _forward(lambda: LayerNorm2d(8), x=_x),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(group_norm_groups, lambda: (group_norm_groups, {"num_channels": 48, "max_groups": 32}),
         args=_ints("num_channels", "max_groups")),
    Spec(make_activation, lambda: (make_activation, {"act": "silu", "inplace": False}),
         args=[*_choices("act"), *_bools("inplace")]),
    Spec(make_norm, lambda: (make_norm, {"norm": "gn", "num_channels": 16}),
         args=[*_choices("norm"), *_ints("num_channels")]),
    Spec(Involution2d, lambda: (Involution2d, {
            "channels": 8, "kernel_size": 3, "stride": 1, "groups": 2, "reduction": 2,
            "grad_checkpointing": False}),
         args=[*_ints("channels", "kernel_size", "stride", "groups", "reduction"),
               *_bools("grad_checkpointing")]),
    Spec(Involution2d, _forward(lambda: Involution2d(8, kernel_size=3, stride=2, groups=2).eval(), x=_x),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(LocalFilter2d, lambda: (LocalFilter2d, {
            "channels": 8, "kernel_size": 3, "dilation": 1, "groups": 2, "normalize": "softmax",
            "predict": True, "grad_checkpointing": False}),
         args=[*_ints("channels", "kernel_size", "dilation", "groups"), Arg("normalize", "choice"),
               *_bools("predict", "grad_checkpointing")]),
    Spec(LocalFilter2d, _forward(lambda: LocalFilter2d(8, kernel_size=3, groups=2), x=_x),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    # kernels=None: predicted from x
    Spec(LocalFilter2d, _local_filter_kernels,
         args=[Arg("x", "tensor"), Arg("kernels", "tensor", optional=True)],
         forward=True, equivalences=ALL, label="kernels"),
    Spec(LocalAttention2d, lambda: (LocalAttention2d, {
            "channels": 8, "kernel_size": 3, "num_heads": 2, "dilation": 1, "qkv_bias": True,
            "grad_checkpointing": False}),
         args=[*_ints("channels", "kernel_size", "num_heads", "dilation"),
               *_bools("qkv_bias", "grad_checkpointing")]),
    Spec(LocalAttention2d, _forward(lambda: LocalAttention2d(8, kernel_size=3, num_heads=2), x=_x),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(find_conv_bn_pairs, lambda: (find_conv_bn_pairs, {"model": _fusable()}),
         args=[Arg("model", "module")]),
    Spec(fuse_conv_bn, lambda: (fuse_conv_bn, {"conv": nn.Conv2d(3, 4, 3), "bn": nn.BatchNorm2d(4).eval()}),
         args=[Arg("conv", "module"), Arg("bn", "module")]),
    Spec(fuse_modules, lambda: (fuse_modules, {"model": _fusable(), "inplace": False}),
         args=[Arg("model", "module"), *_bools("inplace")]),
]

MODEL_SPECS: list[Spec] = [
    Spec(FPN, lambda: (FPN, {"in_channels": [8, 16], "strides": [8, 16], "out_channels": 8,
                             "extra_levels": 1, "extra_from": "output", "norm": None}),
         args=[Arg("in_channels", "sequence"), Arg("strides", "sequence"),
               *_ints("out_channels", "extra_levels"), Arg("extra_from", "choice"), *_choices("norm")]),
    Spec(FPN, _forward(lambda: FPN([8, 16], [8, 16], 8, extra_levels=1), features=lambda: [_x(8, 8), _x(16, 4)]),
         args=[Arg("features", "sequence")], forward=True),
    Spec(FPN, _forward(lambda: _Levels(FPN([8, 16], [8, 16], 8)), x0=lambda: _x(8, 8), x1=lambda: _x(16, 4)),
         args=LEVELS, forward=True, equivalences=ALL, label="levels"),
    Spec(FCOSHead, lambda: (FCOSHead, {
            "in_channels": 8, "num_classes": 3, "strides": [8, 16], "num_convs": 1, "norm": "gn",
            "prior_prob": 0.01, "center_sampling_radius": 1.5, "size_ranges": [(0, 64), (64, 1e8)],
            "focal_alpha": 0.25, "focal_gamma": 2.0, "score_thresh": 0.05, "nms_thresh": 0.6,
            "topk_candidates": 100, "max_detections": 10, "grad_checkpointing": False}),
         args=[*_ints("in_channels", "num_classes"), Arg("strides", "sequence"), *_ints("num_convs"),
               *_choices("norm"), Arg("prior_prob", "float"), Arg("center_sampling_radius", "float"),
               Arg("size_ranges", "sequence", optional=True),
               *(Arg(n, "float") for n in ("focal_alpha", "focal_gamma", "score_thresh", "nms_thresh")),
               # an absurd number of candidates or detections means "keep them all"
               *_ints("topk_candidates", "max_detections"), *_bools("grad_checkpointing")]),
    Spec(FCOSHead, _forward(_fcos_head, features=lambda: [_x(8, 8), _x(8, 4)]),
         args=[Arg("features", "sequence")], forward=True),
    Spec(FCOSHead, _forward(lambda: _Levels(_fcos_head()), x0=lambda: _x(8, 8), x1=lambda: _x(8, 4)),
         args=LEVELS, forward=True, equivalences=ALL, label="levels"),
    Spec(FPNSegHead, lambda: (FPNSegHead, {
            "in_channels": 8, "num_classes": 3, "strides": [4, 8], "channels": 8, "norm": "gn",
            "loss": "ce", "ignore_index": 255, "top_k": None, "gamma": 2.0, "label_smoothing": 0.1}),
         args=[*_ints("in_channels", "num_classes"), Arg("strides", "sequence"), *_ints("channels"),
               *_choices("norm"), Arg("loss", "choice"),
               # any int is a legitimate ignore_index (-1 and 255 are both common)
               *_ints("ignore_index", accept={"negative", "huge"}),
               Arg("top_k", "float", optional=True), Arg("gamma", "float"), Arg("label_smoothing", "float")]),
    Spec(FPNSegHead, _forward(_seg_head, features=lambda: [_x(8, 8), _x(8, 4)], size=(16, 16)),
         args=[Arg("features", "sequence"), Arg("size", "sequence")], forward=True),
    Spec(FPNSegHead, _forward(lambda: _Levels(_seg_head(), size=(16, 16)), x0=lambda: _x(8, 8), x1=lambda: _x(8, 4)),
         args=LEVELS, forward=True, equivalences=ALL, label="levels"),
    Spec(Detector, lambda: (Detector, _parts(FCOSHead(8, 3, [16, 32], num_convs=1))), args=PARTS_ARGS),
    Spec(Detector, _forward(_detector, images=_images, targets=lambda: [_target(), _target(1)],
                            image_sizes=[(32, 32), (30, 28)]),
         args=[Arg("images", "tensor"), Arg("targets", "sequence"),
               Arg("image_sizes", "sequence", optional=True)],
         forward=True, equivalences=("noncontiguous",)),
    Spec(Detector, _forward(lambda: _detector(train=False), images=_images, image_sizes=[(32, 32), (30, 28)]),
         args=[Arg("images", "tensor"), Arg("image_sizes", "sequence", optional=True)],
         forward=True, equivalences=("noncontiguous",), label="eval"),
    Spec(Detector, _train_on_targets, forward=True, label="targets",
         args=[Arg("boxes", "tensor", aliases=('targets[0]["boxes"]',)),
               Arg("labels", "int_tensor", aliases=('targets[0]["labels"]',)),
               Arg("iscrowd", "int_tensor", optional=True, aliases=('targets[0]["iscrowd"]',))]),
    Spec(build_detector, _builder(build_detector, {"type": "fcos", "num_classes": 3, "num_convs": 1}),
         args=BUILDER_ARGS, errors=(KeyError,)),
    Spec(Segmenter, lambda: (Segmenter, _parts(FPNSegHead(8, 3, [16, 32], channels=8))), args=PARTS_ARGS),
    Spec(Segmenter, _forward(_segmenter, images=_images, targets=lambda: torch.randint(0, 3, (2, 32, 32))),
         args=[Arg("images", "tensor"), Arg("targets", "int_tensor")],
         forward=True, equivalences=("noncontiguous",)),
    Spec(build_segmenter, _builder(build_segmenter, {"type": "fpn_seg", "num_classes": 3, "channels": 8}),
         args=BUILDER_ARGS, errors=(KeyError,)),
    Spec(decode_ltrb, lambda: (decode_ltrb, {"points": torch.rand(5, 2) * 32, "distances": torch.rand(5, 4) * 8}),
         args=[Arg("points", "tensor"), Arg("distances", "tensor")],
         equivalences=("noncontiguous", "half", "bfloat16")),
    # bfloat16 keeps 8 bits: 0-255 pixel values round by up to 1 (0.02 after dividing by std)
    Spec(normalize_images, lambda: (normalize_images, {
            "images": _images(), "mean": torch.tensor(MEAN), "std": torch.tensor(STD),
            "image_sizes": [(32, 32), (30, 28)]}),
         args=[Arg("images", "tensor"), Arg("mean", "tensor"), Arg("std", "tensor"),
               Arg("image_sizes", "sequence", optional=True)],
         equivalences=("noncontiguous", "channels_last", "half")),
    # no batch to match here: one more target is one more image
    Spec(training_targets, lambda: (training_targets, {"targets": [_target(), _target(1)], "num_classes": 3}),
         args=[Arg("targets", "sequence", accept={"longer"}), *_ints("num_classes", optional=True)]),
    Spec(postprocess_detections, _postprocess,
         args=[Arg("scores", "sequence"), Arg("boxes", "sequence"), Arg("image_size", "sequence"),
               Arg("score_thresh", "float"), Arg("nms_thresh", "float"),
               # an absurd number of candidates or detections means "keep them all"
               *_ints("topk_candidates", "max_detections")]),
    Spec(postprocess_detections, _level_scores, label="levels",
         args=[Arg("s0", "tensor", aliases=("scores[0]",)), Arg("b0", "tensor", aliases=("boxes[0]",))]),
]

BACKBONE_SPECS: list[Spec] = [
    Spec(Backbone, lambda: (Backbone, {
            "body": _getter(), "names": ["a", "b"], "input_size": (3, 32, 32), "positions": [0, 1],
            "frozen_parameters": [], "norm_eval": False, "out_indices": [2, 3], "num_stages": 4,
            "model": None, "channels_last_outputs": False}),
         args=[Arg("body", "module"), Arg("names", "sequence"), Arg("input_size", "sequence"),
               Arg("positions", "sequence", optional=True),
               # one more (repeated) parameter to freeze changes nothing
               Arg("frozen_parameters", "sequence", accept={"longer"}), *_bools("norm_eval"),
               Arg("out_indices", "sequence", optional=True), *_ints("num_stages", optional=True),
               Arg("model", "module", optional=True), *_bools("channels_last_outputs")]),
    Spec(Backbone, _forward(lambda: vb_tiny(**TINY).eval(), x=lambda: _images() / 255),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(TinyNet, lambda: (TinyNet, {"in_channels": 3, "norm": "bn", "act": "relu", **TINY}),
         args=[*_ints("in_channels"), Arg("widths", "sequence"), Arg("depths", "sequence"),
               *_choices("norm", "act")]),
    Spec(TinyNet, _forward(lambda: _tiny().eval(), x=lambda: _images() / 255),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(backbone_from_model, lambda: (backbone_from_model, {
            "model": _tiny(), "stages": ["stage1", "stage2", "stage3", "stage4"], "name": "tiny",
            **_options(in_channels=None), "input_size": 32}),
         args=[Arg("model", "module"), Arg("stages", "sequence"),
               Arg("name", "choice", optional=True, accept={"unknown"}),  # any name is a name
               *OPTIONS[:2], *_ints("in_channels", optional=True), *OPTIONS[3:], *_ints("input_size")],
         errors=(FileNotFoundError,)),
    # an unknown name is the registry's KeyError, which suggests close names
    Spec(build_backbone, lambda: (build_backbone, {"name": "vb_tiny", **_options(), **TINY}),
         args=[Arg("name", "choice", aliases=("backbones registry",)), *OPTIONS],
         errors=(FileNotFoundError, KeyError)),
    Spec(vb_tiny, lambda: (vb_tiny, {**_options(), **TINY}), args=OPTIONS, errors=(FileNotFoundError,)),
    Spec(torchvision_backbone, lambda: (torchvision_backbone, {"arch": "mobilenet_v3_small", **_options()}),
         args=[Arg("arch", "choice"), *OPTIONS], errors=(FileNotFoundError, KeyError)),
    Spec(timm_backbone, lambda: (timm_backbone, {"model_name": "test_resnet", **_options()}),
         args=[Arg("model_name", "choice"), *OPTIONS], errors=(FileNotFoundError, KeyError)),
    # a list of return_layers is a list of module names: [1, 2] names none of the model's
    Spec(IntermediateLayerGetter, lambda: (IntermediateLayerGetter, {
            "model": _tiny(), "return_layers": {"stage2": "c3", "stage3": "c4"}, "example_input": None,
            "input_size": (3, 32, 32)}),
         args=[Arg("model", "module"), Arg("return_layers", "mapping"),
               Arg("input_size", "sequence", optional=True)]),
    # the dry run's input: one the model rejects is a ValueError naming example_input
    Spec(IntermediateLayerGetter, lambda: (IntermediateLayerGetter, {
            "model": _tiny(), "return_layers": ["stage2"], "example_input": _images(1) / 255}),
         args=[Arg("example_input", "tensor", optional=True)], label="example_input"),
    # the model's own checks (TinyNet's stem) name x
    Spec(IntermediateLayerGetter, _forward(lambda: _getter().eval(), x=lambda: _images() / 255),
         args=[Arg("x", "tensor")], forward=True, equivalences=ALL),
    Spec(feature_info, lambda: (feature_info, {
            "model": _tiny(), "input_size": (3, 32, 32), "layers": ["stage1", "stage2"]}),
         args=[Arg("model", "module"), Arg("input_size", "sequence"),
               Arg("layers", "sequence", optional=True)]),
]
# fmt: on


def _padded() -> tuple[Any, dict[str, Any]]:
    s0, b0 = _level_scores()[1].values()
    return postprocess_padded, {
        "scores": [s0[None], s0[None, :2]],
        "boxes": [b0[None], b0[None, :2]],
        "image_sizes": torch.tensor([[32, 32]]),
        "score_thresh": 0.05,
        "topk_candidates": 100,
        "nms_thresh": 0.6,
        "max_detections": 10,
    }


def _detector_config(tmp: str) -> str:
    path = os.path.join(tmp, "detector.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "type": "detector",
                "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
                "neck": {"type": "fpn", "out_channels": 16},
                "head": {"type": "fcos", "num_classes": 3, "num_convs": 1},
            },
            f,
        )
    return path


# fmt: off
DEPLOY_SPECS: list[Spec] = [
    Spec(postprocess_padded, _padded,
         args=[Arg("scores", "sequence"), Arg("boxes", "sequence"),
               Arg("image_sizes", "int_tensor", accept={"negative"}),
               Arg("score_thresh", "float"), Arg("nms_thresh", "float"),
               *_ints("topk_candidates", "max_detections")]),
    Spec(export_model, lambda: (export_model, {
            "model": nn.Sequential(ConvNormAct(3, 4, 3)).eval(),
            "example": torch.rand(2, 3, 64, 64),
            "path": os.path.join(_folder(), "m.pt2"),
            "format": "pt2", "dynamic_hw": True, "stride": 32}),
         args=[Arg("model", "module"),
               # NaN/inf pixels export like any others: an accepted mutation runs an export
               Arg("example", "tensor", skip={"nan", "inf"}),
               Arg("path", "path", skip={"missing"}),  # the file to write
               Arg("format", "choice"), *_bools("dynamic_hw"),
               Arg("stride", "int", skip={"huge"})]),
    Spec(load_for_export, lambda: (load_for_export, {
            "source": _detector_config(_folder()), "weights": None}),
         args=[Arg("source", "path"), Arg("weights", "path", optional=True)],
         errors=(FileNotFoundError,)),
    Spec(max_stride, lambda: (max_stride, {"model": nn.Conv2d(3, 3, 1)}),
         args=[Arg("model", "module")]),
    Spec(export_kwargs, lambda: (export_kwargs, {"model": nn.Conv2d(3, 3, 1)}),
         args=[Arg("model", "module")]),
]
# fmt: on

SPECS: list[Spec] = [*NN_SPECS, *MODEL_SPECS, *BACKBONE_SPECS, *DEPLOY_SPECS]

EXEMPT: dict[object, str] = {
    ExportError: "an exception that export_model raises; users do not build it",
    ExportResult: "the record export_model returns; users do not build it",
}
