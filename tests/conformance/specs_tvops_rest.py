"""Conformance specs: the last blocks of torchvision.ops (`clip_boxes_to_image`,
`remove_small_boxes`, `DeformConv2d`, `ConvNormAct3d`, `Permute`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import nn, ops

_HALF = ("noncontiguous", "half", "bfloat16")


def _forward(module: Callable[[], Any], **kwargs: Any) -> Callable[[], tuple[Any, dict]]:
    return lambda: (module(), {k: v() if callable(v) else v for k, v in kwargs.items()})


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _boxes() -> torch.Tensor:  # multiples of 1/4: exact in half precision
    return torch.tensor([[1.0, -2.0, 9.5, 7.25], [0.0, 0.0, 0.5, 11.0], [3.25, 1.5, 14.0, 12.0]])


_INT = ("in_channels", "out_channels", "kernel_size", "stride", "dilation", "groups")

SPECS = [
    # Any real dtype, any leading dims; meta boxes give meta boxes.
    Spec(ops.clip_boxes_to_image, call(ops.clip_boxes_to_image, boxes=_boxes, size=(10, 12)),
         args=[Arg("boxes", "tensor", accept={"dtype", "rank_up", "meta"}),
               Arg("size", "sequence")],
         equivalences=_HALF),
    # A negative min_size is torchvision's too (it keeps every box with non-negative sides).
    Spec(ops.remove_small_boxes, call(ops.remove_small_boxes, boxes=_boxes, min_size=1.0),
         args=[Arg("boxes", "tensor", accept={"dtype"}),
               Arg("min_size", "float", accept={"negative"})],
         equivalences=_HALF),
    Spec(nn.DeformConv2d,
         call(nn.DeformConv2d, in_channels=4, out_channels=6, kernel_size=3, stride=1,
               padding=1, dilation=1, groups=2, bias=True),
         args=[*(Arg(n, "int") for n in _INT), Arg("padding", "int"), Arg("bias", "bool")]),
    Spec(nn.DeformConv2d,
         _forward(lambda: nn.DeformConv2d(4, 6, 3, padding=1), input=lambda: _x(2, 4, 6, 7),
                  offset=lambda: _x(2, 18, 6, 7, seed=1),
                  mask=lambda: torch.rand(2, 9, 6, 7, generator=torch.Generator().manual_seed(2))),
         args=[Arg("input", "tensor"), Arg("offset", "tensor"),
               Arg("mask", "tensor", optional=True)],
         forward=True, equivalences=_HALF, tolerance=(2e-2, 5e-2)),
    Spec(nn.ConvNormAct3d,
         call(nn.ConvNormAct3d, in_channels=4, out_channels=6, kernel_size=3, stride=1,
               padding=1, groups=2, norm_layer=lambda: torch.nn.BatchNorm3d,
               activation_layer=lambda: torch.nn.ReLU, dilation=1, inplace=True, bias=None),
         args=[*(Arg(n, "int") for n in _INT), Arg("padding", "int", optional=True),
               Arg("norm_layer", "callable", optional=True),
               Arg("activation_layer", "callable", optional=True),
               Arg("inplace", "bool", optional=True), Arg("bias", "bool", optional=True)]),
    Spec(nn.ConvNormAct3d,
         _forward(lambda: nn.ConvNormAct3d(4, 6, 3).eval(), input=lambda: _x(2, 4, 3, 5, 6)),
         args=[Arg("input", "tensor")], forward=True, equivalences=_HALF),
    Spec(nn.Permute, call(nn.Permute, dims=[0, 2, 3, 1]),
         args=[Arg("dims", "sequence")]),
    # Any dtype and device: a view.
    Spec(nn.Permute, _forward(lambda: nn.Permute([0, 2, 3, 1]), x=lambda: _x(2, 3, 4, 5)),
         args=[Arg("x", "tensor", accept={"dtype", "meta"})], forward=True,
         equivalences=("noncontiguous", "channels_last", "half", "bfloat16")),
]  # fmt: skip
