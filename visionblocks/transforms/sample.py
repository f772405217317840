"""Warp a whole detection sample — image, boxes, masks, polygons, key points — with one matrix.

`warp_sample` applies `visionblocks.ops.warp_affine` to the image and the functions of
`visionblocks.ops.warp_targets` to every ``tv_tensors`` entry of a torchvision-style target,
measures tight boxes on the warped objects and drops the instances that leave the image;
`visionblocks.transforms.RandomAffine` draws the matrices inside ``v2.Compose``.

Convention:
    The conventions of `visionblocks.ops.warp_targets`: one forward matrix, pixel centres on
    integers for the image and key points, boxes and polygons in the edge convention (pixel
    ``j`` spans ``[j, j + 1)``), masks sampled at the nearest pixel; sizes are ``(H, W)``.

Tight boxes:
    Warped box corners enclose a rotated or sheared object loosely. With polygons or instance masks
    in the sample, each axis-aligned box is measured on its warped object instead: the min/max of
    its warped polygon vertices, clipped to the canvas; else the box of its warped mask pixels in
    the first ``Mask`` of shape ``(N, H, W)``, ``[min col, min row, max col + 1, max row + 1]``,
    empty for a mask the warp emptied; else (no object, or an empty source mask) the warped corners.
    Warps that map axes to axes (translations, scales, flips, 90° turns) keep the exact corners.

Key points:
    A ``KeyPoints`` under key ``k`` may have its visibility under ``f"{k}_visibility"``
    (integer COCO flags or bool, of shape ``(N, K)``): as in `visionblocks.ops.warp_keypoints`,
    points warped outside the canvas get 0 and a mirroring matrix swaps the ``flip_pairs``
    along the ``K`` axis (``flip_pairs=None`` refuses it for ``K > 1``). They are not clipped.
    A plain tensor of key points (at least 2-D, under a key ending in ``keypoints``:
    ``"keypoints"``, ``"gt_keypoints"``...) is refused: torchvision's v2 transforms pass plain
    tensors through, so it would stay where it was while the image moves; the error says how to
    wrap it in ``KeyPoints`` (and how to split off COCO's visibility from ``(x, y, v)``).

Polygons:
    ``target["polygons"]``: one entry per box, each a (possibly empty, e.g. a crowd RLE)
    list of floating ``(P, 2)`` tensors in COCO's continuous coordinates; returned on the
    matrix's device, not clipped.

Dropped instances:
    After clipping, a box narrower or lower than ``min_size`` pixels (or empty) is removed
    with its instance: from the ``BoundingBoxes``, every ``Mask`` of shape ``(N, H, W)``,
    every ``KeyPoints`` of shape ``(N, ..., 2)`` with ``ndim >= 3`` and its visibility, the
    polygons and the tensors under ``instance_keys`` (``area`` is filtered, not recomputed).
    How many remain is read on the host (a sync on CUDA, a graph break under
    ``torch.compile``); ``min_size=None`` keeps every box and reads nothing.

Rotated boxes:
    torchvision's ``XYWHR``, ``CXCYWHR`` and ``XYXYXYXY`` stay rotated (degrees,
    counter-clockwise on screen), from their corners only, not clipped (``min_size`` tests
    the warped corners' extent inside the canvas). ``XYXYXYXY`` keeps the four warped
    corners, reordered ``p2, p1, p4, p3`` under a mirroring matrix as torchvision's flips do.
    ``XYWHR``/``CXCYWHR`` become the minimum-area rectangle enclosing the warped box: the
    warped box itself under a similarity (the rotation added to the angle; a horizontal flip
    gives ``-r``, a vertical one ``180 - r``), ``cv2.minAreaRect`` of the corners under shear
    or anisotropic scale, where torchvision's ``affine`` (0.29) can give a larger rectangle
    or one that does not enclose the parallelogram. Angles come out in ``(-180, 180]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torchvision import tv_tensors as tv
from torchvision.transforms.v2.functional import convert_bounding_box_format

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_same_device, check_tensor
from visionblocks.ops._object_boxes import (
    check_polygons,
    maps_axes_to_axes,
    object_boxes,
    polygon_boxes,
    warp_polygons,
    warp_rotated_boxes,
)
from visionblocks.ops._warp_sampling import check_fill, check_matrix, check_size
from visionblocks.ops.keypoints import checked_pairs
from visionblocks.ops.warp import warp_checked
from visionblocks.ops.warp_targets import (
    check_visibility,
    place_keypoints,
    warp_boxes,
    warp_points,
)

__all__ = ["warp_sample"]
__dir__ = public_dir(__name__, __all__)

_KEY_POINTS = getattr(tv, "KeyPoints", None)  # torchvision >= 0.23


def check_sample_options(
    target: object, mode: object, fill: object, mask_fill: object, min_size: object, keys: object
) -> None:
    """Type and range checks of `warp_sample`'s options (``mask_fill`` must fit every
    integer ``Mask``), before anything is warped."""
    check_type("mode", mode, str)
    check_choice("mode", mode, ("bilinear", "nearest"))
    check_fill("fill", fill, nonzero_ok=True)
    check_type("mask_fill", mask_fill, int)
    masks = {k: v for k, v in (target or {}).items() if isinstance(v, tv.Mask)}
    for key, mask in masks.items():
        if mask.is_complex():
            raise TypeError(f"target[{key!r}] must be a real tensor, got dtype {mask.dtype}")
        if mask.is_floating_point():
            continue
        info = None if mask.dtype == torch.bool else torch.iinfo(mask.dtype)
        low, high = (0, 1) if info is None else (info.min, info.max)
        if not low <= mask_fill <= high:
            raise ValueError(
                f"mask_fill={mask_fill} does not fit the masks' dtype {mask.dtype} "
                f"([{low}, {high}])"
            )
    if min_size is not None:
        check_type("min_size", min_size, (int, float))
        check_range("min_size", min_size, 0.0)
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(
            f"instance_keys must be a sequence of target keys (a tuple of str), got "
            f"{type(keys).__name__} ({keys!r})"
        )
    for i, key in enumerate(keys):
        check_type(f"instance_keys[{i}]", key, str)


def drop_instances(
    out: dict[str, Any], keep: Tensor, num_boxes: int, instance_keys: Sequence[str]
) -> None:
    """Filter, in place, the per-box entries of a warped target by ``keep`` (see Dropped
    instances); ``instance_keys`` tensors must have ``num_boxes`` rows."""
    for key in instance_keys:
        value = out.get(key)
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] != num_boxes:
            raise ValueError(
                f"target[{key!r}] has {value.shape[0]} rows but there are {num_boxes} boxes"
            )
    if bool(keep.all()):
        return

    def take(value: Tensor) -> Tensor:
        kept = value.as_subclass(Tensor)[keep]
        return tv.wrap(kept, like=value) if isinstance(value, tv.TVTensor) else kept

    snapshot = dict(out)
    done: set[str] = set()
    for key, value in snapshot.items():
        if key in done:
            continue
        if key == "polygons" and isinstance(value, list) and len(value) == num_boxes:
            out[key] = [entry for entry, k in zip(value, keep.tolist(), strict=True) if k]
            continue
        if not isinstance(value, Tensor) or value.dim() == 0:
            continue
        per_box = value.shape[0] == num_boxes
        if isinstance(value, tv.TVTensor):
            is_points = _KEY_POINTS is not None and isinstance(value, _KEY_POINTS)
            is_instance = isinstance(value, tv.BoundingBoxes) or (
                per_box
                and (
                    (isinstance(value, tv.Mask) and value.dim() == 3)
                    or (is_points and value.dim() >= 3)
                )
            )
            if is_instance:
                out[key] = take(value)
                visibility = snapshot.get(f"{key}_visibility")
                if is_points and isinstance(visibility, Tensor):
                    out[f"{key}_visibility"] = take(visibility)  # (N, K) as the points
                    done.add(f"{key}_visibility")
        elif key in instance_keys:
            out[key] = value[keep]
        done.add(key)


_AXIS_FORMATS = ("XYXY", "XYWH", "CXCYWH")


def _warp_box_tensor(
    boxes: Any,
    matrix: Tensor,
    size: tuple[int, int],
    min_size: float | None,
    objects: tuple[Tensor, Tensor] | None = None,
) -> tuple[Any, Tensor | None]:
    """A ``BoundingBoxes`` warped in its own format, and the boxes to keep (or None);
    ``objects`` is ``(xyxy (N, 4), found (N,))`` of the warped objects (see Tight boxes)."""
    fmt = boxes.format
    plain = boxes.as_subclass(Tensor)
    work = plain if plain.is_floating_point() else plain.to(torch.get_default_dtype())
    rotated = fmt.name not in _AXIS_FORMATS
    if rotated:  # kept rotated: exact corners, or the enclosing rectangle (see the helper)
        out, moved = warp_rotated_boxes(work, fmt.name, matrix)
        enclosing = torch.cat((moved.amin(-2), moved.amax(-2)), dim=-1)
        identity = torch.eye(2, 3, dtype=moved.dtype, device=moved.device)
        extent = warp_boxes(enclosing, identity, size)
    else:
        xyxy = convert_bounding_box_format(work, old_format=fmt, new_format="XYXY")
        extent = warp_boxes(xyxy, matrix, size)
        if objects is not None:
            tight, found = objects
            tight = torch.where(found.unsqueeze(-1), tight.to(extent.dtype), extent)
            extent = torch.where(maps_axes_to_axes(matrix), extent, tight)
        out = convert_bounding_box_format(extent, old_format="XYXY", new_format=fmt)
    if not plain.is_floating_point():
        out = out.round()
    out = tv.wrap(out.to(plain.dtype), like=boxes, canvas_size=size)
    if min_size is None:
        return out, None
    sides = extent[..., 2:] - extent[..., :2]  # width and height
    keep = (sides >= min_size if min_size > 0 else sides > 0).all(-1)
    return out, keep


def is_plain_keypoints(key: object, value: object) -> bool:
    """Whether ``value`` looks like key points given as a plain tensor: not a ``TVTensor``, at
    least 2-D, under a key ending in ``keypoints`` (``"keypoints"``, ``"gt_keypoints"``...)."""
    if not isinstance(value, Tensor) or isinstance(value, tv.TVTensor) or value.dim() < 2:
        return False
    flat = str(key).lower().replace("_", "").replace("-", "")
    return flat.endswith(("keypoints", "keypoint"))


def plain_keypoints_error(key: object, value: Tensor, size: tuple) -> str:
    """Why plain-tensor key points are refused, and how to wrap them (and split COCO's
    ``(x, y, v)`` triples)."""
    canvas = f"canvas_size={size}"
    fix = f"tv_tensors.KeyPoints(points, {canvas})"
    if value.shape[-1] == 3:
        fix = (
            f"COCO's (x, y, v) triples split in two: tv_tensors.KeyPoints(kp[..., :2], {canvas}) "
            f"and target['{key}_visibility'] = kp[..., 2].long()"
        )
    if _KEY_POINTS is None:
        fix = "visionblocks.ops.warp_keypoints, or torchvision >= 0.23 for tv_tensors.KeyPoints"
    return (
        f"target[{key!r}] holds key points as a plain tensor of shape {tuple(value.shape)}: "
        "warp_sample, like torchvision's v2 transforms, moves only tv_tensors.KeyPoints and "
        "would pass it through unwarped (a skeleton off its image, unswapped under a flip); "
        f"use {fix}"
    )


def _check_target_sizes(target: Mapping[str, Any], image_size: tuple) -> None:
    """Every mask covers the image, and every box or key-point set lives on its canvas."""
    canvases = (tv.BoundingBoxes,) if _KEY_POINTS is None else (tv.BoundingBoxes, _KEY_POINTS)
    for key, value in target.items():
        if isinstance(value, tv.Mask) and tuple(value.shape[-2:]) != image_size:
            raise ValueError(
                f"target[{key!r}] is a mask of size {tuple(value.shape[-2:])} but the image "
                f"is {image_size}; masks must cover the image pixel for pixel"
            )
        if isinstance(value, canvases) and tuple(value.canvas_size) != image_size:
            raise ValueError(
                f"target[{key!r}] has canvas_size {tuple(value.canvas_size)} but the image is "
                f"{image_size}; set canvas_size to the image's (H, W)"
            )


def warp_sample(
    image: Tensor,
    target: Mapping[str, Any] | None,
    matrix: Tensor,
    size: Sequence[int] | None = None,
    *,
    mode: Literal["bilinear", "nearest"] = "bilinear",
    fill: float | Sequence[float] = 0.0,
    mask_fill: int = 0,
    min_size: float | None = 1.0,
    instance_keys: Sequence[str] = ("labels", "iscrowd", "area"),
    flip_pairs: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, dict[str, Any] | None]:
    """Warp one detection sample — image, boxes, masks, polygons, key points — with one matrix.

    The image goes through `warp_affine`; in ``target`` (a torchvision-style dict) every
    ``BoundingBoxes`` (in its own format), ``Mask``, ``KeyPoints`` (with its visibility) and
    the ``"polygons"`` through `visionblocks.ops.warp_targets`, with ``canvas_size`` set to
    ``size``; other entries are copied. Tight boxes, dropped instances: the module's sections.

    Args:
        image (Tensor[C, H, W]): The image (a ``tv_tensors.Image`` stays one).
        target: Dict of tv_tensors and other values, or ``None``.
        matrix (Tensor[2, 3] or Tensor[3, 3]): Forward pixel matrix (the ``(3, 3)`` form's
            last row must be ``[0, 0, 1]``).
        size: Output ``(H_out, W_out)``; default the image's.
        mode: Image interpolation, ``"bilinear"`` or ``"nearest"``.
        fill: Image value outside the source (scalar or per channel).
        mask_fill: ``Mask`` value outside the source (0; e.g. 255 for an "ignore" label). A
            nonzero value counts as background for the boxes of the masks.
        min_size: Smallest kept box width and height, in pixels; ``None`` keeps every box.
        instance_keys: Plain tensors with one row per box, filtered with the boxes.
        flip_pairs: ``(i, j)`` left/right key point pairs (`keypoint_flip_pairs` of the
            names, or a dataset's ``flip_pairs``), swapped when the matrix mirrors; ``[]``:
            none. ``None`` refuses a mirroring matrix for ``K > 1`` key points.

    Returns:
        tuple: ``(image, target)`` — the warped image (same type and dtype) and a new dict
        (``None`` if ``target`` was), in ``target``'s key order.

    Raises:
        TypeError: ``image`` not a tensor or complex, ``target`` not a mapping, an option of
            the wrong type (``instance_keys`` must be a sequence of str, ``flip_pairs`` of int
            pairs), a visibility not an integer or bool tensor, polygons not in the format
            above, key points as a plain tensor (see Key points).
        ValueError: Bad image/matrix shapes or size; ``image`` and ``matrix`` on different devices;
            a ``Mask`` whose size, or ``BoundingBoxes``/``KeyPoints`` whose ``canvas_size``, differs
            from the image's; a non-finite ``fill``, a negative ``min_size``, a ``mask_fill`` that
            does not fit the masks' dtype; several ``BoundingBoxes`` with ``min_size`` set; an
            ``instance_keys`` tensor or polygons whose number differs from the boxes'; a visibility
            of another shape than its key points'; a bad ``flip_pairs`` index; or (value checks) a
            singular matrix, a projective ``(3, 3)`` one, or a mirroring one with
            ``flip_pairs=None`` and ``K > 1`` key points.

    Examples:
        >>> from torchvision import tv_tensors
        >>> from visionblocks.ops.warp import affine_matrix
        >>> image = tv_tensors.Image(torch.rand(3, 32, 32))
        >>> boxes = tv_tensors.BoundingBoxes(
        ...     [[2, 2, 10, 10], [20, 4, 30, 12]], format="XYWH", canvas_size=(32, 32)
        ... )
        >>> target = {"boxes": boxes, "labels": torch.tensor([1, 2])}
        >>> matrix = affine_matrix(translate=(-20.0, 0.0))  # the first box leaves the image
        >>> out_image, out = warp_sample(image, target, matrix, size=(24, 16))
        >>> out["boxes"], out["labels"]
        (BoundingBoxes([[ 0,  4, 16, 12]], format=BoundingBoxFormat.XYWH, canvas_size=(24, 16), clamping_mode=soft), tensor([2]))

        Tight boxes: a disk of diameter 81 px, turned by 45° about its centre.

        >>> rows, cols = torch.meshgrid(torch.arange(128.0), torch.arange(128.0), indexing="ij")
        >>> disk = ((cols + 0.5 - 60.5) ** 2 + (rows + 0.5 - 60.5) ** 2 <= 40.5**2)[None]
        >>> sample = {"boxes": tv_tensors.BoundingBoxes([[20.0, 20.0, 101.0, 101.0]],
        ...           format="XYXY", canvas_size=(128, 128)), "masks": tv_tensors.Mask(disk)}
        >>> rot45 = affine_matrix(angle=45.0, center=(60.0, 60.0))
        >>> image = torch.zeros(3, 128, 128)
        >>> corners = warp_sample(image, {"boxes": sample["boxes"]}, rot45)[1]["boxes"]
        >>> round(float(corners[0, 2] - corners[0, 0]), 1)  # the corner method
        114.6
        >>> tight = warp_sample(image, sample, rot45)[1]["boxes"]
        >>> float(tight[0, 2] - tight[0, 0])  # the box of the warped mask
        81.0

        Key points with visibility and a horizontal flip:

        >>> people = {"keypoints": tv_tensors.KeyPoints([[[10.0, 5.0], [12.0, 5.0]]],
        ...           canvas_size=(32, 32)), "keypoints_visibility": torch.tensor([[2, 1]])}
        >>> hflip = torch.tensor([[-1.0, 0.0, 31.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
        >>> _, out = warp_sample(torch.zeros(3, 32, 32), people, hflip, flip_pairs=[(0, 1)])
        >>> out["keypoints"].tolist(), out["keypoints_visibility"].tolist()
        ([[[19.0, 5.0], [21.0, 5.0]]], [[1, 2]])

        Rotated boxes stay rotated: a quarter turn (counter-clockwise on screen) adds 90°.

        >>> box = tv_tensors.BoundingBoxes(
        ...     [[14.0, 22.0, 8.0, 4.0, 30.0]], format="CXCYWHR", canvas_size=(64, 64)
        ... )
        >>> quarter = torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 63.0]], dtype=torch.float64)
        >>> warp_sample(torch.zeros(3, 64, 64), {"boxes": box}, quarter)[1]["boxes"].tolist()
        [[22.0, 50.0, 8.0, 4.0, 120.0]]
    """
    check_tensor("image", image)
    if image.dim() != 3:
        raise ValueError(f"image must have shape (C, H, W), got {tuple(image.shape)}")
    matrix = check_matrix("matrix", matrix, square=True)
    if matrix.dim() != 2:
        raise ValueError(
            f"warp_sample takes one (2, 3) or (3, 3) matrix, got matrix of shape "
            f"{tuple(matrix.shape)}"
        )
    check_same_device(image=image, matrix=matrix)
    if target is not None and not isinstance(target, Mapping):
        raise TypeError(f"target must be a dict or None, got {type(target).__name__}")
    check_sample_options(target, mode, fill, mask_fill, min_size, instance_keys)
    pairs = None if flip_pairs is None else checked_pairs("flip_pairs", flip_pairs)
    out_size = tuple(image.shape[-2:]) if size is None else check_size("size", size)
    padding = "zeros" if isinstance(fill, (int, float)) and fill == 0 else "fill"
    # A plain tensor as it is: torch.compile cannot trace as_subclass.
    plain_image = image if type(image) is Tensor else image.as_subclass(Tensor)
    warped, inverse = warp_checked(plain_image, matrix, out_size, mode, padding, fill, name="image")
    if isinstance(image, tv.TVTensor):
        warped = tv.wrap(warped, like=image)
    if target is None:
        return warped, None
    options = (mask_fill, min_size, instance_keys, pairs)
    return warped, warp_target(target, image, matrix, out_size, inverse, *options)


def warp_target(
    target: Mapping[str, Any],
    image: Tensor,
    matrix: Tensor,
    out_size: tuple[int, int],
    inverse: Tensor | None,
    mask_fill: int,
    min_size: float | None,
    instance_keys: Sequence[str],
    pairs: list[tuple[int, int]] | None,
) -> dict[str, Any]:
    """The target part of `warp_sample`, its options checked: ``image`` is the source image
    (sizes and devices are checked against it), ``inverse`` what `warp_checked` returned."""
    _check_target_sizes(target, tuple(image.shape[-2:]))
    for key, value in target.items():
        if is_plain_keypoints(key, value):
            raise TypeError(plain_keypoints_error(key, value, tuple(image.shape[-2:])))
    box_keys = [key for key, value in target.items() if isinstance(value, tv.BoundingBoxes)]
    if len(box_keys) > 1 and min_size is not None:
        raise ValueError("target holds several BoundingBoxes; pass min_size=None")
    visibility_of = {
        key: f"{key}_visibility"
        for key, value in target.items()
        if _KEY_POINTS is not None
        and isinstance(value, _KEY_POINTS)
        and f"{key}_visibility" in target
    }
    for key, vis_key in visibility_of.items():
        shape = target[key].shape[:-1]
        check_visibility(f"target[{vis_key!r}]", target[vis_key], f"target[{key!r}]", shape)
        check_same_device(**{"image": image, f"target[{vis_key!r}]": target[vis_key]})
    polygons = None
    if "polygons" in target:
        polygons = check_polygons(target["polygons"])
        if box_keys and len(polygons) != target[box_keys[0]].shape[0]:
            raise ValueError(
                f"target['polygons'] has {len(polygons)} entries but there are "
                f"{target[box_keys[0]].shape[0]} boxes; give one (possibly empty) list of "
                "polygons per box"
            )

    out: dict[str, Any] = dict.fromkeys(target)  # the input's key order
    instance_masks: list[tuple[Tensor, Tensor]] = []  # (warped, source) of (N, H, W) masks
    polygon_parts = None
    produced = set(visibility_of.values())
    for key, value in target.items():
        if isinstance(value, tv.BoundingBoxes):
            continue  # after the masks and polygons, which tight boxes are measured on
        if isinstance(value, tv.Mask):
            plain = value.as_subclass(Tensor)
            flat = plain.unsqueeze(0) if plain.dim() == 2 else plain.flatten(0, -3)
            pad = "zeros" if mask_fill == 0 else "fill"
            where = f"target[{key!r}]"
            moved, _ = warp_checked(
                flat, matrix, out_size, "nearest", pad, mask_fill, inverse, where
            )
            moved = moved.reshape(*plain.shape[:-2], *out_size)
            if plain.dim() == 3 and box_keys:
                instance_masks.append((moved, plain))
            out[key] = tv.wrap(moved, like=value)
        elif _KEY_POINTS is not None and isinstance(value, _KEY_POINTS):
            vis_key = visibility_of.get(key)
            given = None if vis_key is None else target[vis_key]
            visibility = None if given is None else given.as_subclass(Tensor)
            plain = value.as_subclass(Tensor)
            moved = warp_points(plain, matrix)  # integer key points: rounded
            moved = (moved if plain.is_floating_point() else moved.round()).to(plain.dtype)
            moved, visibility = place_keypoints(moved, visibility, matrix, pairs, out_size)
            out[key] = tv.wrap(moved, like=value, canvas_size=out_size)
            if vis_key is not None:
                tv_like = isinstance(given, tv.TVTensor)
                out[vis_key] = tv.wrap(visibility, like=given) if tv_like else visibility
        elif key == "polygons" and polygons is not None:
            out[key], vertices, counts = warp_polygons(polygons, matrix)
            if vertices is not None and box_keys:
                polygon_parts = polygon_boxes(vertices, counts, out_size)
        elif key not in produced:
            out[key] = value

    keep: Tensor | None = None
    num_boxes = 0
    for key in box_keys:
        value = target[key]
        objects = None
        if value.format.name in _AXIS_FORMATS and (polygon_parts or instance_masks):
            objects = object_boxes(value.shape[0], polygon_parts, instance_masks, mask_fill)
        out[key], keep = _warp_box_tensor(value, matrix, out_size, min_size, objects)
        num_boxes = value.shape[0]
    if keep is not None:
        drop_instances(out, keep, num_boxes, instance_keys)
    return out
