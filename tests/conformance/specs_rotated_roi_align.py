"""Conformance specs: `rotated_roi_align` and `RotatedRoIAlign`. RoI coordinates and angles
are exact in float16 and bfloat16 (the angles' sines and cosines are computed from them)."""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import ops

_ALL = ("noncontiguous", "channels_last", "half", "bfloat16")


def _input() -> torch.Tensor:
    return torch.randn(2, 3, 8, 9, generator=torch.Generator().manual_seed(0))


def _rois() -> torch.Tensor:
    return torch.tensor(
        [[0.0, 4.0, 3.5, 5.0, 3.0, 30.0], [1.0, 6.25, 5.0, 4.0, 6.5, -120.0],
         [1.0, 8.0, 1.0, 3.0, 2.0, 0.0]]
    )  # fmt: skip


_OPTIONS = [
    Arg("output_size", "int"),
    Arg("spatial_scale", "float"),
    Arg("sampling_ratio", "int", accept={"negative"}),  # <= 0: adaptive
]
_TENSORS = [Arg("input", "tensor"), Arg("rois", "tensor")]

SPECS: list[Spec] = [
    Spec(
        ops.rotated_roi_align,
        call(
            ops.rotated_roi_align,
            input=_input,
            rois=_rois,
            output_size=3,
            spatial_scale=1.0,
            sampling_ratio=2,
        ),
        args=[*_TENSORS, *_OPTIONS],
        equivalences=_ALL,
    ),
    Spec(
        ops.RotatedRoIAlign,
        call(ops.RotatedRoIAlign, output_size=(2, 3), spatial_scale=0.5, sampling_ratio=-1),
        args=_OPTIONS,
    ),
    Spec(
        ops.RotatedRoIAlign,
        lambda: (ops.RotatedRoIAlign(2, 1.0, -1), {"input": _input(), "rois": _rois()}),
        args=_TENSORS,
        forward=True,
        equivalences=_ALL,
    ),
]
