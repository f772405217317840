"""Conformance specs: detection priors and box coders (`visionblocks.ops.priors`,
`visionblocks.ops.box_coders`)."""

from __future__ import annotations

import torch

from tests.conformance.framework import Arg, Spec
from visionblocks import ops

_HALF = ("noncontiguous", "half", "bfloat16")
# Coded tensors broadcast (more leading dims are fine) and integers are computed in float32.
_CODED = frozenset({"rank_up", "dtype"})


def _boxes(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(5, 2, generator=g) * 10
    return torch.cat((xy, xy + 1 + torch.rand(5, 2, generator=g) * 10), -1)


def _points() -> torch.Tensor:
    return _boxes(0)[:, :2] + 1


def _feats() -> list[torch.Tensor]:
    return [torch.zeros(1, 2, 4, 6), torch.zeros(1, 2, 2, 3)]


def _generator() -> ops.AnchorGenerator:
    return ops.AnchorGenerator(((32,), (64,)), ((0.5, 1.0), (1.0,)))


_SIZES = [Arg("sizes", "sequence"), Arg("aspect_ratios", "sequence")]

# fmt: off
SPECS = [
    Spec(ops.make_anchor_points, lambda: (ops.make_anchor_points, {
            "feature_sizes": _feats(), "strides": [8, 16], "grid_cell_offset": 0.5}),
         args=[Arg("feature_sizes", "sequence"), Arg("strides", "sequence"),
               # any offset in cells is a grid (0: the corners); only NaN/inf are refused
               Arg("grid_cell_offset", "float", accept={"negative"})]),
    Spec(ops.make_anchor_boxes, lambda: (ops.make_anchor_boxes, {
            "feature_sizes": _feats(), "strides": [8, (16, 12)], "sizes": ((32,), (64,)),
            "aspect_ratios": ((0.5, 1.0), (1.0,))}),
         args=[Arg("feature_sizes", "sequence"), Arg("strides", "sequence"), *_SIZES]),
    Spec(ops.AnchorGenerator, lambda: (ops.AnchorGenerator, {
            "sizes": ((32,), (64,)), "aspect_ratios": ((0.5, 1.0), (1.0,))}),
         args=_SIZES),
    # only the images' (H, W) is read: any dtype, more leading dims and any device are fine
    Spec(ops.AnchorGenerator, lambda: (_generator(), {
            "image_list": torch.zeros(1, 3, 32, 48), "feature_maps": _feats()}),
         args=[Arg("image_list", "tensor", accept={"dtype", "rank_up", "meta"}),
               Arg("feature_maps", "sequence")], forward=True),
    Spec(ops.encode_distances, lambda: (ops.encode_distances, {
            "points": _points(), "boxes": _boxes(1), "reg_max": 15}),
         args=[Arg("points", "tensor", accept=_CODED), Arg("boxes", "tensor", accept=_CODED),
               Arg("reg_max", "int", optional=True)],
         equivalences=_HALF),
    Spec(ops.decode_distances, lambda: (ops.decode_distances, {
            "points": _points(), "distances": _boxes(1), "fmt": "cxcywh"}),
         args=[Arg("points", "tensor", accept=_CODED), Arg("distances", "tensor", accept=_CODED),
               Arg("fmt", "choice")],
         equivalences=_HALF),
    Spec(ops.encode_deltas, lambda: (ops.encode_deltas, {
            "anchors": _boxes(0), "boxes": _boxes(1), "weights": (1.0, 1.0, 2.0, 2.0)}),
         args=[Arg("anchors", "tensor", accept=_CODED), Arg("boxes", "tensor", accept=_CODED),
               Arg("weights", "sequence")],
         equivalences=_HALF),
    Spec(ops.decode_deltas, lambda: (ops.decode_deltas, {
            "anchors": _boxes(0), "deltas": torch.randn(5, 4, generator=torch.Generator().manual_seed(2)),
            "weights": (10.0, 10.0, 5.0, 5.0), "bbox_xform_clip": 4.0}),
         args=[Arg("anchors", "tensor", accept=_CODED), Arg("deltas", "tensor", accept=_CODED),
               Arg("weights", "sequence"),
               Arg("bbox_xform_clip", "float")],  # inf: no clamp (accepted)
         equivalences=_HALF),
]
# fmt: on
