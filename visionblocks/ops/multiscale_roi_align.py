"""`MultiScaleRoIAlign`: `roi_align` of each box on the FPN level of its size, as torchvision's,
without waiting for the GPU.

Convention:
    `visionblocks.ops.roi_align`'s: ``"xyxy"`` boxes in image coordinates, ``aligned=False``
    (torchvision's) sampling; a level's scale is the power of two nearest its size over the
    largest image's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_number, check_type
from visionblocks._core.dispatch import recording
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_floating, compute_dtype
from visionblocks.ops.roi_align import (  # the RoI ops' checks and kernel call
    _adaptive_sides,
    _check_map,
    _pair,
    _rois,
    _run,
    _sampling,
    roi_align,
)

__all__ = ["MultiScaleRoIAlign"]
__dir__ = public_dir(__name__, __all__)


def _level_scale(feature: Tensor, image_size: tuple[int, int]) -> float:
    """torchvision's ``_infer_scale``: the power of two nearest the feature/image ratio."""
    return 2.0 ** round(math.log2(float(feature.shape[-2]) / float(image_size[0])))


def _image_size(image_shapes: Any, images: int) -> tuple[int, int]:
    """The largest height and width of ``image_shapes``, checked: one ``(height, width)``
    pair of ints ``>= 1`` per image."""
    if not (
        isinstance(image_shapes, (list, tuple))
        and len(image_shapes) == images
        and all(
            isinstance(s, (list, tuple))
            and len(s) == 2
            and all(isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) for v in s)
            and min(s) >= 1
            for s in image_shapes
        )
    ):
        raise ValueError(
            "image_shapes must be a list of (height, width) pairs of ints >= 1, one per image "
            f"of x ({images}), got {image_shapes!r:.200}"
        )
    return max(s[0] for s in image_shapes), max(s[1] for s in image_shapes)


class MultiScaleRoIAlign(nn.Module):
    """torchvision's ``MultiScaleRoIAlign``: `roi_align` of each box on the FPN level of
    its size (Lin et al., 2017, eq. 1), without waiting for the GPU.

    A box of area ``w * h`` goes to level ``floor(canonical_level + log2(sqrt(w * h) /
    canonical_scale) + 1e-6)``, clamped to the levels given, as torchvision's
    ``LevelMapper``; the scale of each level is the power of two nearest its size over the
    largest image's. torchvision indexes the boxes of each level (``torch.where(levels ==
    level)``, a device-to-host wait on CUDA); here, on CUDA and while tracing, every level
    pools every box, the boxes of other levels moved far outside the map (where a bin is
    one sample, read as 0), and the levels are merged with ``torch.where``: the same values,
    no wait. Eager CPU calls index the levels as torchvision. ``aligned`` is False, as there.
    The levels are taken finest first, whatever the order of ``x`` (torchvision takes ``x``'s
    order, and pools zeros when it lists a coarser level first) and whether
    ``featmap_names`` lists them finest or coarsest first; their strides must double from one
    to the next, as the level mapping assumes.

    Args:
        featmap_names: Names of the feature maps (keys of ``x``) to pool from.
        output_size: Bins per box, ``int`` or ``(height, width)``.
        sampling_ratio: As `roi_align`.
        canonical_scale: The box size that maps to ``canonical_level``.
        canonical_level: The level of a ``canonical_scale`` box (``k0`` in the paper).

    Examples:
        >>> pool = MultiScaleRoIAlign(["p2", "p3"], 7, 2)
        >>> x = {"p2": torch.rand(1, 8, 64, 64), "p3": torch.rand(1, 8, 32, 32)}
        >>> pool(x, [torch.tensor([[0.0, 0.0, 100.0, 100.0]])], [(256, 256)]).shape
        torch.Size([1, 8, 7, 7])
    """

    def __init__(
        self,
        featmap_names: list[str],
        output_size: int | tuple[int, int] | list[int],
        sampling_ratio: int,
        *,
        canonical_scale: int = 224,
        canonical_level: int = 4,
    ) -> None:
        super().__init__()
        if isinstance(featmap_names, str) or not isinstance(featmap_names, (list, tuple)):
            raise TypeError(f"featmap_names must be a list of str, got {featmap_names!r}")
        if not featmap_names or not all(isinstance(n, str) for n in featmap_names):
            raise ValueError(
                f"featmap_names must be a non-empty list of str, got {featmap_names!r}"
            )
        self.featmap_names = list(featmap_names)
        self.output_size = _pair(
            tuple(output_size) if isinstance(output_size, list) else output_size
        )
        self.sampling_ratio = _sampling(sampling_ratio)
        self.canonical_scale = check_number(
            "canonical_scale", canonical_scale, 0.0, low_inclusive=False
        )
        check_type("canonical_level", canonical_level, int)
        self.canonical_level = canonical_level

    def forward(
        self,
        x: dict[str, Tensor],
        boxes: list[Tensor],
        image_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """Pool ``boxes`` (image coordinates, one ``(L, 4)`` tensor per image) from ``x``.

        Args:
            x: Feature maps by name, all with the same channels.
            boxes: ``"xyxy"`` boxes per image, in the coordinates of ``image_shapes``.
            image_shapes: ``(height, width)`` of each image before the backbone.

        Returns:
            Tensor[K, C, PH, PW]: One row per box, in the order of ``boxes``.

        Raises:
            TypeError, ValueError: ``x`` not a dict holding the feature maps named (floating
                ``(N, C, H, W)`` maps, ``H, W >= 1``, with the same ``N`` and ``C``, on one
                device), levels whose strides do not double from one to the next (the
                level mapping indexes them so), ``image_shapes`` not one ``(height, width)``
                pair of ints ``>= 1`` per image, or the arguments `roi_align` refuses.
        """
        if not isinstance(x, dict):
            raise TypeError(f"x must be a dict of feature maps, got {type(x).__name__}")
        named = [(k, x[k]) for k in self.featmap_names if k in x]  # not x's order
        if not named:
            raise ValueError(f"x holds none of featmap_names {self.featmap_names}; keys: {list(x)}")
        if not isinstance(boxes, (list, tuple)):
            raise TypeError(f"boxes must be a list of Tensor[L, 4], got {type(boxes).__name__}")
        first = named[0][1]
        for name, feature in named:  # checked once here: the levels' calls skip the checks
            check_floating(f"x[{name!r}]", feature)
            _check_map(f"x[{name!r}]", feature)
            if feature.shape[:2] != first.shape[:2] or feature.device != first.device:
                raise ValueError(
                    f"x must hold maps with the same N and C on one device, got x[{name!r}] of "
                    f"shape {tuple(feature.shape)} on {feature.device} beside "
                    f"{tuple(first.shape)} on {first.device}"
                )
        original = _image_size(image_shapes, first.shape[0])
        # Finest first whatever x's order (torchvision takes x's: coarse first pools zeros) and
        # featmap_names' (no sort: a comparison of two scales compiles, a sort on them not).
        levels = [(_level_scale(v, original), k, v) for k, v in named]
        if levels[0][0] < levels[-1][0]:
            levels.reverse()
        scales, features = [s for s, _, _ in levels], [v for _, _, v in levels]
        if len(features) == 1:
            return roi_align(features[0], boxes, self.output_size, scales[0], self.sampling_ratio)
        if any(a != 2 * b for a, b in itertools.pairwise(scales)):
            strides = {k: 1 / s for s, k, _ in levels}
            raise ValueError(
                "featmap_names must name feature maps whose strides double from one level to "
                f"the next (FPN levels, as the level mapping indexes them), got strides {strides}"
            )
        sides = None if self.sampling_ratio > 0 else _adaptive_sides(self.output_size, scales[0])
        rois = _rois(features[0], boxes, compute_dtype(features[0].dtype), sides)
        k_min, k_max = round(-math.log2(scales[0])), round(-math.log2(scales[-1]))
        levels = self._levels(rois[:, 1:], k_min, k_max)
        if features[0].is_cuda or recording():
            return self._merge_masked(features, scales, rois, levels)
        return self._merge_indexed(features, scales, rois, levels)

    def _merge_masked(
        self, features: list[Tensor], scales: list[float], rois: Tensor, levels: Tensor
    ) -> Tensor:
        """Every level pools every box, other levels' boxes moved far away: no host wait."""
        out = None
        for level, (feature, scale) in enumerate(zip(features, scales)):
            mine = levels == level
            far = torch.where(mine[:, None], rois[:, 1:], -1e6)  # others: one sample, read as 0
            rows = torch.cat([rois[:, :1], far], 1)
            pooled = self._pool(feature, rows, scale).to(features[0].dtype)
            out = pooled if out is None else torch.where(mine[:, None, None, None], pooled, out)
        return out

    def _merge_indexed(
        self, features: list[Tensor], scales: list[float], rois: Tensor, levels: Tensor
    ) -> Tensor:
        """torchvision's merge: each level pools its own boxes (``torch.where`` indexing)."""
        first = features[0]
        out = first.new_zeros((rois.shape[0], first.shape[1], *self.output_size))
        for level, (feature, scale) in enumerate(zip(features, scales)):
            index = torch.where(levels == level)[0]
            out[index] = self._pool(feature, rois[index], scale).to(out.dtype)
        return out

    def _pool(self, feature: Tensor, rois: Tensor, scale: float) -> Tensor:
        """`roi_align` of one checked level and the rois `_rois` built (their batch indices
        are valid by construction: no second check, no host read)."""
        dtype = compute_dtype(feature.dtype)
        x = feature if feature.dtype == dtype else feature.to(dtype)
        ph, pw = self.output_size
        args = (scale, ph, pw, self.sampling_ratio, False)
        return _run("roi_align", feature.dtype, "auto", x, rois.to(dtype), *args)

    def _levels(self, boxes: Tensor, k_min: int, k_max: int) -> Tensor:
        """torchvision's ``LevelMapper``: the level of each box, from 0 (``k_min``)."""
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        s = torch.sqrt(area)
        eps = torch.tensor(1e-6, dtype=s.dtype)  # a CPU scalar: no copy to the device
        level = torch.floor(self.canonical_level + torch.log2(s / self.canonical_scale) + eps)
        return torch.clamp(level, min=k_min, max=k_max).to(torch.int64) - k_min

    def extra_repr(self) -> str:
        return (
            f"featmap_names={self.featmap_names}, output_size={self.output_size}, "
            f"sampling_ratio={self.sampling_ratio}"
        )
