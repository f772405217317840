"""Conformance specs: `visionblocks.transforms` (`warp_sample` and the `RandomAffine` transform)."""

from __future__ import annotations

from typing import Any

import torch

from tests.conformance.framework import Arg, Spec
from tests.conformance.specs_ops_losses_init import _call, _image, _matrix, _sample, _signed
from visionblocks import transforms


def _warp_sample(**kwargs: Any) -> Any:
    return transforms.warp_sample(**kwargs)


def _affine() -> transforms.RandomAffine:
    return transforms.RandomAffine(
        15.0, (0.1, 0.1), (0.8, 1.2), 5.0, hflip=0.5, flip_pairs=[(1, 2)]
    )


def _forward() -> tuple[Any, dict[str, Any]]:
    """``RandomAffine()(image, target)``, seeded: the variants draw the same matrix."""
    module = _affine()

    def call(image: Any, target: Any) -> Any:
        torch.manual_seed(0)
        return module(image, target)

    return call, {"image": _image()[0], "target": _sample()}


SPECS: list[Spec] = [
    Spec(
        transforms.warp_sample,
        _call(
            _warp_sample,
            image=lambda: _image()[0],
            target=_sample,
            matrix=_matrix,
            size=(4, 5),
            mode="bilinear",
            fill=0.0,
            mask_fill=0,
            min_size=1.0,
            instance_keys=("labels",),
            flip_pairs=[(1, 2)],
        ),
        args=[
            Arg("image", "tensor", accept={"dtype"}),
            Arg("target", "mapping", optional=True),  # None: only the image
            Arg("matrix", "tensor"),
            Arg("size", "sequence", optional=True),
            Arg("mode", "choice"),
            _signed("fill"),
            Arg("mask_fill", "int"),
            Arg("min_size", "float", optional=True),  # None keeps every box
            Arg("instance_keys", "sequence", accept={"longer"}),  # a repeated key is harmless
            Arg("flip_pairs", "sequence", optional=True),  # None: a mirror is refused
        ],
        equivalences=("noncontiguous",),
    ),
    Spec(
        transforms.RandomAffine,
        _call(
            transforms.RandomAffine,
            degrees=15.0,
            translate=(0.1, 0.2),
            scale=(0.8, 1.2),
            shear=5.0,
            hflip=0.5,
            mode="bilinear",
            fill=0.0,
            mask_fill=0,
            min_size=None,
            flip_pairs=[(1, 2)],
            instance_keys=("labels",),
        ),
        args=[
            Arg("degrees", "float"),
            Arg("translate", "sequence", optional=True, aliases=("translation",)),
            Arg("scale", "sequence", optional=True),
            Arg("shear", "float", optional=True),
            Arg("hflip", "float"),
            Arg("mode", "choice"),
            _signed("fill"),
            Arg("mask_fill", "int", accept={"negative"}),  # fits integer masks of a sample
            Arg("min_size", "float", optional=True),
            Arg("flip_pairs", "sequence", optional=True),
            Arg("instance_keys", "sequence", accept={"longer"}),
        ],
    ),
    Spec(
        transforms.RandomAffine,
        _forward,
        args=[
            # any dtype (warped as warp_affine warps it); a batch (..., C, H, W) shares the draw
            Arg("image", "tensor", accept={"dtype", "rank_up"}),
            # the rest of a sample is anything torchvision passes through: no target is fine
            Arg("target", "mapping", accept={"str", "int", "list"}),
        ],
        forward=True,
        equivalences=("noncontiguous",),
    ),
]
