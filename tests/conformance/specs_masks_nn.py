"""Conformance specs: the mask ops (`paste_masks`, `crop_masks`, `mask_iou`, `masks_to_boxes`)
and the torchvision.ops blocks of `visionblocks.nn`. Box coordinates are multiples of 1/4
(exact in float16 and bfloat16)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import nn, ops

_HALF = ("noncontiguous", "half", "bfloat16")


def _boxes() -> torch.Tensor:
    return torch.tensor([[1.0, 2.0, 9.5, 7.25], [0.0, 0.0, 4.0, 11.0], [3.25, 1.5, 11.0, 12.0]])


def _soft() -> torch.Tensor:
    return torch.rand(3, 6, 6, generator=torch.Generator().manual_seed(0))


def _binary() -> torch.Tensor:
    return _soft().round()


# Masks of any real dtype: the dtype mutation (int64) is a legitimate input; bool masks too.
_ANY_MASKS = {"dtype"}
_MASK_SPECS = [
    Spec(ops.paste_masks,
         call(ops.paste_masks, masks=_soft, boxes=_boxes, image_size=(12, 13), padding=1),
         args=[Arg("masks", "tensor"), Arg("boxes", "tensor", accept={"dtype"}),
               Arg("image_size", "sequence"), Arg("padding", "int")],
         equivalences=_HALF),
    Spec(ops.crop_masks, call(ops.crop_masks, masks=_soft, boxes=_boxes),
         args=[Arg("masks", "tensor", accept=_ANY_MASKS), Arg("boxes", "tensor", accept={"dtype"})],
         equivalences=_HALF),
    Spec(ops.mask_iou, call(ops.mask_iou, masks1=_binary, masks2=lambda: _binary()[:2]),
         args=[Arg("masks1", "tensor", accept=_ANY_MASKS),
               Arg("masks2", "tensor", accept=_ANY_MASKS)],
         equivalences=_HALF),
    # One tensor: any device (meta gives meta boxes) and any real dtype.
    Spec(ops.masks_to_boxes, call(ops.masks_to_boxes, masks=_binary),
         args=[Arg("masks", "tensor", accept={"dtype", "meta"})], equivalences=_HALF),
]  # fmt: skip

# deform_conv2d: every tensor floating and of the input's dtype; bias and mask optional.
_DEFORM = {
    "input": lambda: torch.randn(2, 4, 6, 7, generator=torch.Generator().manual_seed(1)),
    "offset": lambda: torch.randn(2, 18, 6, 7, generator=torch.Generator().manual_seed(2)),
    "weight": lambda: torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(3)),
    "bias": lambda: torch.randn(4, generator=torch.Generator().manual_seed(4)),
    "mask": lambda: torch.rand(2, 9, 6, 7, generator=torch.Generator().manual_seed(5)),
}
_MASK_SPECS.append(
    Spec(ops.deform_conv2d, call(ops.deform_conv2d, **_DEFORM, stride=1, padding=1, dilation=1),
         args=[*(Arg(n, "tensor") for n in ("input", "offset", "weight")),
               *(Arg(n, "tensor", optional=True) for n in ("bias", "mask")),
               *(Arg(n, "int") for n in ("stride", "dilation")),
               Arg("padding", "int")],
         equivalences=_HALF, tolerance=(2e-2, 5e-2))
)  # fmt: skip

# ------------------------------------------------------------------------------------ nn
# Factories are given as lambdas returning them (`_call` calls callables). Random blocks: modules in eval mode (their checks run in both modes); functions with p=1,
# whose result does not depend on the draws (DropBlock's all-dropped scale overflows in half
# precision, as torchvision's: no half equivalence there).


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _forward(module: Callable[[], Any], **kwargs: Any) -> Callable[[], tuple[Any, dict]]:
    return lambda: (module(), {k: v() if callable(v) else v for k, v in kwargs.items()})


_ALL = ("noncontiguous", "channels_last", "half", "bfloat16")
_P = Arg("p", "float")
_DROP_BLOCK_OPTIONS = [_P, Arg("block_size", "int"), Arg("inplace", "bool"), Arg("eps", "float")]
_NN_SPECS = [
    Spec(nn.StochasticDepth, call(nn.StochasticDepth, p=0.2, mode="row"),
         args=[_P, Arg("mode", "choice")]),
    Spec(nn.StochasticDepth, _forward(lambda: nn.StochasticDepth(0.2).eval(), input=lambda: _x(4, 3, 5, 5)),
         args=[Arg("input", "tensor", accept={"rank_up", "rank_down", "meta"})], forward=True,
         equivalences=_ALL),
    Spec(nn.drop_path,
         call(nn.drop_path, input=lambda: _x(4, 3, 5, 5), p=1.0, mode="batch", training=True),
         args=[Arg("input", "tensor", accept={"rank_up", "rank_down", "meta"}), _P,
               Arg("mode", "choice"), Arg("training", "bool")],
         equivalences=_ALL),
    *(Spec(cls, call(cls, p=0.2, block_size=3, inplace=False, eps=1e-6), args=_DROP_BLOCK_OPTIONS)
      for cls in (nn.DropBlock2d, nn.DropBlock3d)),
    Spec(nn.DropBlock2d, _forward(lambda: nn.DropBlock2d(0.2, 3).eval(), input=lambda: _x(2, 3, 6, 6)),
         args=[Arg("input", "tensor", accept={"meta"})], forward=True, equivalences=_ALL),
    Spec(nn.DropBlock3d, _forward(lambda: nn.DropBlock3d(0.2, 3).eval(), input=lambda: _x(2, 3, 4, 6, 6)),
         args=[Arg("input", "tensor", accept={"meta"})], forward=True, equivalences=_HALF),
    *(Spec(fn, call(fn, input=lambda s=shape: _x(*s), p=1.0, block_size=1, inplace=False, eps=1e-6,
                     training=True),
           args=[Arg("input", "tensor", accept={"meta"}), *_DROP_BLOCK_OPTIONS,
                 Arg("training", "bool")],
           equivalences=("noncontiguous",))
      for fn, shape in ((nn.drop_block2d, (2, 3, 6, 6)), (nn.drop_block3d, (2, 3, 4, 6, 6)))),
    Spec(nn.FrozenBatchNorm2d, call(nn.FrozenBatchNorm2d, num_features=8, eps=1e-5),
         args=[Arg("num_features", "int"), Arg("eps", "float")]),
    Spec(nn.FrozenBatchNorm2d, _forward(lambda: nn.FrozenBatchNorm2d(8), x=lambda: _x(2, 8, 5, 5)),
         args=[Arg("x", "tensor")], forward=True, equivalences=_ALL),
    Spec(nn.SqueezeExcitation,
         call(nn.SqueezeExcitation, input_channels=8, squeeze_channels=2, activation="relu",
               scale_activation=lambda: torch.nn.Sigmoid),
         args=[Arg("input_channels", "int"), Arg("squeeze_channels", "int"),
               Arg("activation", "choice", optional=True),
               Arg("scale_activation", "choice", optional=True)]),
    Spec(nn.SqueezeExcitation, _forward(lambda: nn.SqueezeExcitation(8, 2), input=lambda: _x(2, 8, 5, 5)),
         args=[Arg("input", "tensor")], forward=True, equivalences=_ALL),
    Spec(nn.MLP,
         call(nn.MLP, in_channels=16, hidden_channels=[32, 8], norm_layer=lambda: torch.nn.LayerNorm,
               activation_layer=lambda: torch.nn.ReLU, inplace=None, bias=True, dropout=0.1),
         args=[Arg("in_channels", "int"), Arg("hidden_channels", "sequence", accept={"longer"}),
               Arg("norm_layer", "callable", optional=True),
               Arg("activation_layer", "callable", optional=True),
               Arg("inplace", "bool", optional=True), Arg("bias", "bool"), Arg("dropout", "float")]),
    Spec(nn.MLP, _forward(lambda: nn.MLP(16, [32, 8]).eval(), input=lambda: _x(4, 16)),
         args=[Arg("input", "tensor", accept={"rank_up"})], forward=True, equivalences=_HALF),
]  # fmt: skip

SPECS = [*_MASK_SPECS, *_NN_SPECS]
