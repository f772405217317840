"""`RandomAffine`: torchvision's ``v2.RandomAffine`` arguments, visionblocks' sample warp.

A ``torchvision.transforms.v2.Transform`` for ``v2.Compose``: it takes what torchvision's
transforms take and warps the whole sample through `visionblocks.transforms.warp_sample`.

Convention:
    torchvision's parameters, torchvision's geometry: ``degrees`` turn clockwise on screen
    about the image centre, ``translate`` is a fraction of the size, shears are in degrees;
    the forward matrix equals ``v2.functional.affine``'s. Matrices follow
    `visionblocks.ops.warp` (pixel centres on integers, forward, sizes ``(H, W)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors as tv
from torchvision.transforms import v2

from visionblocks._core.checks import check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks.ops.keypoints import checked_pairs
from visionblocks.ops.warp import warp_checked
from visionblocks.transforms.sample import check_sample_options, is_plain_keypoints, warp_target

__all__ = ["RandomAffine"]
__dir__ = public_dir(__name__, __all__)

_TARGETS = tuple(t for t in (tv.BoundingBoxes, tv.Mask, getattr(tv, "KeyPoints", None)) if t)


def torchvision_matrix(
    size: tuple[int, int],
    angle: float,
    translate: Sequence[float],
    scale: float,
    shear: Sequence[float],
) -> Tensor:
    """The float64 forward pixel matrix of ``v2.functional.affine`` about the image centre
    (torchvision's ``_get_inverse_affine_matrix``, not inverted)."""
    h, w = size
    rot, sx, sy = (math.radians(v) for v in (angle, shear[0], shear[1]))
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    a, b, c, d = (scale * v for v in (a, b, c, d))
    cx, cy = (w - 1) / 2, (h - 1) / 2
    rows = [
        [a, b, cx + translate[0] - a * cx - b * cy],
        [c, d, cy + translate[1] - c * cx - d * cy],
    ]
    return torch.tensor(rows, dtype=torch.float64)


def _first_image(sample: Any) -> Tensor:
    """torchvision's rule: the first ``tv_tensors.Image``, else the first plain tensor."""
    found: list[Tensor] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)
        elif isinstance(node, (tv.Image, tv.Video)) or type(node) is Tensor:
            found.append(node)
        elif type(node).__module__.startswith("PIL."):
            raise TypeError(
                "RandomAffine warps tensors; convert PIL images first (v2.ToImage() in the "
                "Compose before it)"
            )

    walk(sample)
    images = [x for x in found if isinstance(x, (tv.Image, tv.Video))] or found
    if not images:
        raise TypeError(
            "RandomAffine needs an image in the sample (a tv_tensors.Image or a tensor)"
        )
    if isinstance(images[0], tv.Video) or images[0].dim() < 3:
        raise TypeError(
            f"RandomAffine warps one image (C, H, W) or a batch (..., C, H, W), got "
            f"{type(images[0]).__name__} of shape {tuple(images[0].shape)}"
        )
    return images[0]


class RandomAffine(v2.Transform):
    """A random affine warp of whole samples: ``v2.RandomAffine``'s arguments, exact warping.

    Draws ``angle``, ``translate``, ``scale`` and ``shear`` as ``v2.RandomAffine`` does (the
    same calls on torch's global generator: one seed gives both the same parameters), then a
    horizontal flip with probability ``hflip``, and warps the sample with one matrix:

    - the image (a ``tv_tensors.Image`` or the first plain tensor; a batch
      ``(..., C, H, W)`` shares one matrix) with `visionblocks.ops.warp_affine`;
    - every dict holding ``BoundingBoxes``, ``Mask`` or ``KeyPoints`` as a `warp_sample`
      target (tight boxes, key-point visibility and ``flip_pairs``, and with ``min_size``
      the instances that leave the image dropped); key points as a plain tensor are refused,
      as there;
    - ``tv_tensors`` outside a dict (``(image, boxes, masks)``) together, never dropped;
      other values pass through.

    Args:
        degrees: Range of the angle in degrees, ``d`` for ``(-d, d)`` or ``(min, max)``;
            clockwise on screen, as torchvision's.
        translate: Largest shifts ``(a, b)`` as fractions of the width and height.
        scale: Range ``(min, max)`` of the scale factor.
        shear: Shear in degrees: ``s`` for x in ``(-s, s)``, ``(min, max)`` for x, or four
            values for the x and y ranges.
        hflip: Probability of also mirroring the sample left to right.
        mode: Image interpolation, ``"bilinear"`` (default; torchvision's is nearest) or
            ``"nearest"``. Masks are always sampled at the nearest pixel.
        fill: Image value outside the source (one value or one per channel).
        mask_fill: ``Mask`` value outside the source.
        min_size: Smallest kept box side in pixels; ``None`` (default) keeps every box, as
            ``v2.RandomAffine`` does (``v2.SanitizeBoundingBoxes`` can follow).
        flip_pairs: Left/right key-point index pairs (`visionblocks.ops.keypoint_flip_pairs`);
            needed when ``hflip > 0`` and the key points have sides, ``[]`` when none does.
        instance_keys: Plain tensors of a target with one row per box, dropped with it.

    Raises:
        TypeError: An argument of the wrong type; at call time, no image in the sample, a
            PIL image or a video.
        ValueError: Ranges that ``v2.RandomAffine`` refuses, a probability outside ``[0, 1]``,
            a negative ``min_size``, bad ``flip_pairs``; at call time, the errors of
            `visionblocks.transforms.warp_sample` and ``min_size`` with boxes outside a dict.

    Examples:
        >>> import torch
        >>> from torchvision import tv_tensors
        >>> from torchvision.transforms import v2
        >>> augment = v2.Compose([
        ...     RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2), hflip=0.5),
        ...     v2.ToDtype(torch.float32, scale=True),
        ... ])
        >>> image = tv_tensors.Image(torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8))
        >>> masks = torch.zeros(2, 64, 80, dtype=torch.uint8)
        >>> masks[0, 10:30, 10:40] = masks[1, 35:60, 50:75] = 1
        >>> target = {
        ...     "boxes": tv_tensors.BoundingBoxes(
        ...         [[10, 10, 40, 30], [50, 35, 75, 60]], format="XYXY", canvas_size=(64, 80)
        ...     ),
        ...     "masks": tv_tensors.Mask(masks),
        ...     "labels": torch.tensor([3, 7]),
        ... }
        >>> _ = torch.manual_seed(0)
        >>> out_image, out = augment(image, target)
        >>> out_image.dtype, tuple(out_image.shape), out["labels"].tolist()
        (torch.float32, (3, 64, 80), [3, 7])
        >>> tight = torch.tensor([[m.any(0).nonzero().min(), m.any(1).nonzero().min()]
        ...                       for m in out["masks"]])  # each warped mask's left and top
        >>> torch.equal(out["boxes"][:, :2], tight)
        True
    """

    def __init__(
        self,
        degrees: float | Sequence[float],
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        *,
        hflip: float = 0.0,
        mode: str = "bilinear",
        fill: float | Sequence[float] = 0.0,
        mask_fill: int = 0,
        min_size: float | None = None,
        flip_pairs: Sequence[tuple[int, int]] | None = None,
        instance_keys: Sequence[str] = ("labels", "iscrowd", "area"),
    ) -> None:
        super().__init__()
        ranges = v2.RandomAffine(degrees, translate, scale, shear)  # torchvision's checks
        self.degrees = list(ranges.degrees)
        self.translate = None if ranges.translate is None else list(ranges.translate)
        self.scale = None if ranges.scale is None else list(ranges.scale)
        self.shear = None if ranges.shear is None else list(ranges.shear)
        for name in ("degrees", "translate", "scale", "shear"):
            values = getattr(self, name) or []
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"{name} must hold finite numbers, got {values}")
        check_type("hflip", hflip, (int, float))
        check_range("hflip", hflip, 0.0, 1.0)
        check_sample_options(None, mode, fill, mask_fill, min_size, instance_keys)
        self.hflip, self.mode, self.fill, self.mask_fill = float(hflip), mode, fill, mask_fill
        self.min_size = min_size
        self.flip_pairs = None if flip_pairs is None else checked_pairs("flip_pairs", flip_pairs)
        self.instance_keys = tuple(instance_keys)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        """Draw ``v2.RandomAffine``'s parameters for the image ``flat_inputs[0]`` (then the
        flip, when ``hflip > 0``) and build its matrix."""
        height, width = flat_inputs[0].shape[-2:]
        angle = torch.empty(1).uniform_(self.degrees[0], self.degrees[1]).item()
        translate = (0, 0)
        if self.translate is not None:
            dx, dy = float(self.translate[0] * width), float(self.translate[1] * height)
            tx = round(torch.empty(1).uniform_(-dx, dx).item())
            ty = round(torch.empty(1).uniform_(-dy, dy).item())
            translate = (tx, ty)
        scale = 1.0
        if self.scale is not None:
            scale = torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
        shear = [0.0, 0.0]
        if self.shear is not None:
            shear[0] = torch.empty(1).uniform_(self.shear[0], self.shear[1]).item()
            if len(self.shear) == 4:
                shear[1] = torch.empty(1).uniform_(self.shear[2], self.shear[3]).item()
        flip = self.hflip > 0 and bool(torch.rand(1) < self.hflip)
        matrix = torchvision_matrix((height, width), angle, translate, scale, shear)
        if flip:  # x -> W - 1 - x after the affine
            matrix[0] = -matrix[0]
            matrix[0, 2] += width - 1
        return dict(
            angle=angle,
            translate=translate,
            scale=scale,
            shear=tuple(shear),
            flip=flip,
            matrix=matrix,
        )

    _get_params = make_params  # the hook's name before torchvision 0.21

    def forward(self, *inputs: Any) -> Any:
        """Warp the sample ``inputs`` (one structure, or several as a tuple) with one draw."""
        sample = inputs if len(inputs) > 1 else inputs[0]
        return self.transform(sample, self.make_params([_first_image(sample)]))

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        """Warp the whole sample ``inpt`` with ``params["matrix"]``."""
        image = _first_image(inpt)
        matrix = params["matrix"].to(image.device)
        plain = image.as_subclass(Tensor)
        batch = plain.reshape(-1, *plain.shape[-3:]) if plain.dim() > 3 else plain
        padding = "zeros" if isinstance(self.fill, (int, float)) and self.fill == 0 else "fill"
        warped, inverse = warp_checked(batch, matrix, None, self.mode, padding, self.fill)
        warped = warped.view(plain.shape)
        if isinstance(image, tv.TVTensor):
            warped = tv.wrap(warped, like=image)
        size = tuple(plain.shape[-2:])

        def targets(entries: dict[str, Any], min_size: float | None, keys: Sequence[str]) -> dict:
            pairs = self.flip_pairs
            return warp_target(
                entries, batch, matrix, size, inverse, self.mask_fill, min_size, keys, pairs
            )

        def rebuild(node: Any) -> Any:
            if node is image:
                return warped
            if isinstance(node, Mapping):
                out = {k: v for k, v in node.items() if v is not image}
                if "polygons" in out or any(
                    isinstance(v, _TARGETS) or is_plain_keypoints(k, v) for k, v in out.items()
                ):  # plain-tensor key points: refused by warp_target
                    out = targets(out, self.min_size, self.instance_keys)
                return {k: rebuild(out[k]) if k in out else warped for k in node}
            if isinstance(node, (list, tuple)):
                loose = {str(i): v for i, v in enumerate(node) if isinstance(v, _TARGETS)}
                boxes = any(isinstance(v, tv.BoundingBoxes) for v in loose.values())
                if boxes and self.min_size is not None:
                    raise ValueError(
                        "min_size drops boxes with their instances, which needs the boxes in a "
                        "dict with their labels (under instance_keys); these are loose in a "
                        f"{type(node).__name__}: pass min_size=None"
                    )
                loose = targets(loose, None, ()) if loose else loose
                items = [
                    loose.get(str(i)) if str(i) in loose else rebuild(v) for i, v in enumerate(node)
                ]
                return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)
            return node

        return rebuild(inpt)

    _transform = transform  # the hook's name before torchvision 0.21
