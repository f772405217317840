"""Conformance specs: `roi_align`, `roi_pool`, `ps_roi_align`, `ps_roi_pool` and
`MultiScaleRoIAlign`. Box coordinates are exact in float16 and bfloat16. ``featmap_names``
and the forward's box list have no generic mutation kind: tests/ops/test_roi_align.py checks
them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tests.conformance.framework import Arg, Spec, call
from visionblocks import ops

_ALL = ("noncontiguous", "channels_last", "half", "bfloat16")


def _input(channels: int = 4) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(2, channels, 8, 9, generator=torch.Generator().manual_seed(0))


def _boxes() -> torch.Tensor:
    return torch.tensor(
        [[0.0, 1.0, 0.5, 6.0, 5.0], [1.0, 2.25, 3.0, 8.0, 7.5], [1.0, 0.0, 0.0, 2.0, 1.5]]
    )


_TENSORS = [Arg("input", "tensor"), Arg("boxes", "tensor", accept={"dtype"})]  # integer boxes
_SIZE = [Arg("output_size", "int"), Arg("spatial_scale", "float")]
_SAMPLING = Arg("sampling_ratio", "int", accept={"negative"})  # <= 0: adaptive

SPECS: list[Spec] = [
    Spec(
        ops.roi_align,
        call(
            ops.roi_align,
            input=_input(),
            boxes=_boxes,
            output_size=2,
            spatial_scale=0.5,
            sampling_ratio=2,
            aligned=True,
        ),
        args=[*_TENSORS, *_SIZE, _SAMPLING, Arg("aligned", "bool")],
        equivalences=_ALL,
    ),
    Spec(
        ops.ps_roi_align,
        call(
            ops.ps_roi_align,
            input=_input(8),
            boxes=_boxes,
            output_size=2,
            spatial_scale=1.0,
            sampling_ratio=-1,
        ),
        args=[*_TENSORS, *_SIZE, _SAMPLING],
        equivalences=_ALL,
    ),
    Spec(
        ops.roi_pool,
        call(ops.roi_pool, input=_input(), boxes=_boxes, output_size=3, spatial_scale=1.0),
        args=[*_TENSORS, *_SIZE],
        equivalences=_ALL,
    ),
    Spec(
        ops.ps_roi_pool,
        call(ops.ps_roi_pool, input=_input(8), boxes=_boxes, output_size=2, spatial_scale=1.0),
        args=[*_TENSORS, *_SIZE],
        equivalences=_ALL,
    ),
    *(
        spec
        for module, options, channels, extra in (
            (
                ops.RoIAlign,
                {"sampling_ratio": 2, "aligned": True},
                4,
                [_SAMPLING, Arg("aligned", "bool")],
            ),
            (ops.RoIPool, {}, 4, []),
            (ops.PSRoIAlign, {"sampling_ratio": -1}, 8, [_SAMPLING]),
            (ops.PSRoIPool, {}, 8, []),
        )
        for spec in (
            Spec(
                module,
                call(module, output_size=2, spatial_scale=0.5, **options),
                args=[*_SIZE, *extra],
            ),
            Spec(
                module,
                lambda module=module, options=options, channels=channels: (
                    module(2, 0.5, **options),
                    {"input": _input(channels)(), "boxes": _boxes()},
                ),
                args=_TENSORS,
                forward=True,
                equivalences=_ALL,
            ),
        )
    ),
    Spec(
        ops.MultiScaleRoIAlign,
        call(ops.MultiScaleRoIAlign, featmap_names=["p2", "p3"], output_size=3, sampling_ratio=2),
        args=[Arg("output_size", "int"), _SAMPLING],
    ),
    Spec(
        ops.MultiScaleRoIAlign,
        lambda: (
            ops.MultiScaleRoIAlign(["p2", "p3"], 3, 2),
            {
                "x": {"p2": _input()(), "p3": _input()()[..., ::2, ::2]},
                "boxes": [_boxes()[:2, 1:] * 4, _boxes()[2:, 1:] * 4],
                "image_shapes": [(32, 36), (30, 36)],
            },
        ),
        args=[Arg("x", "mapping")],
        forward=True,
    ),
]


def _kernel_entry() -> dict[object, str]:
    from visionblocks.kernels import roi_align

    return {
        roi_align.roi_pool_triton: "the Triton backward's entry point, reached through the ops' "
        "impl= dispatch, which validates every argument first (the ops are spec'd)"
    }


EXEMPT: dict[object, str] = _kernel_entry()
