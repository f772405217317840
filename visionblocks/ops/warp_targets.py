"""Warp what belongs to an image — points, boxes, masks, whole detection samples — with its matrix.

Each function takes the forward matrices of `visionblocks.ops.warp` (``(2, 3)`` or ``(B, 2, 3)``,
source → destination, pixel coordinates), so an augmentation builds one matrix, warps the
image with `warp_affine` and every target with the functions here, and they stay aligned.
`warp_sample` does all of it for one torchvision-style sample.

Convention:
    - **Points** (`warp_points`, torchvision ``KeyPoints``) are pixel coordinates with pixel
      centres on integers, the matrices' own convention (``cv2.transform``): the point
      ``(j, i)`` is the centre of pixel ``(row i, column j)`` and lands where `warp_affine`
      moves that pixel.
    - **Boxes** (`warp_boxes`, ``BoundingBoxes``) use the edge convention of
      `visionblocks.ops.boxes`, torchvision and COCO: pixel ``j`` spans ``[j, j + 1)``, so the
      box ``(0, 0, 2, 2)`` covers 2×2 pixels and a pixel centre sits at ``j + 0.5``. A corner
      ``p`` therefore moves to ``M (p - 0.5) + 0.5``: warped boxes cover exactly the warped
      pixels, also under scaling. (Applying ``M`` to box corners directly would shift them by
      ``(1 - scale) / 2`` pixel.) A pure resize by ``s`` is thus
      ``x' = s·x + (s - 1) / 2`` in pixel coordinates, and maps the box ``(x1, …)`` to
      ``(s·x1, …)``.
    - **Masks** are images: nearest sampling, pixels from outside the source are 0.
    - Every size is ``(H, W)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from visionblocks._core.namespace import public_dir
from visionblocks._core.reduce import compute_dtype
from visionblocks._core.tensor_checks import (
    check_last_dim,
    check_real,
    check_same_device,
    check_tensor,
)
from visionblocks.ops._warp_sampling import (
    check_batch,
    check_matrix,
    check_sample_options,
    check_size,
    drop_instances,
    promoted_dtype,
    tv_tensors_module,
)
from visionblocks.ops.warp import warp_affine, warp_checked

__all__ = ["warp_boxes", "warp_masks", "warp_points", "warp_sample"]
__dir__ = public_dir(__name__, __all__)


def warp_points(points: Tensor, matrix: Tensor) -> Tensor:
    """Move points with forward affine matrices: ``p' = M @ [x, y, 1]`` (``cv2.transform``).

    Args:
        points (Tensor[..., N, 2]): ``(x, y)`` pixel coordinates (pixel centres on integers).
        matrix (Tensor[2, 3] or Tensor[..., 2, 3]): Forward matrices; leading dims broadcast with
            ``points``' leading dims (``(B, 2, 3)`` with ``(B, N, 2)`` warps each set with its
            own matrix).

    Returns:
        Tensor[..., N, 2]: Warped points, in the promoted floating dtype of ``points`` and
        ``matrix`` (integer points give floats); differentiable with respect to both.
        float16/bfloat16 are computed in float32 and rounded once. Under ``torch.autocast``:
        the same (element-wise products, no matmul for autocast to lower).

    Raises:
        TypeError: Not tensors, or a non-floating matrix.
        ValueError: ``points`` not ``(..., N, 2)``, ``matrix`` not ``(..., 2, 3)``, leading
            dims that do not broadcast, or tensors on different devices. A singular matrix is
            fine here: it maps the points onto a line or a point.

    Convention:
        Pixel centres on integers, forward matrices; see the module docstring.

    Examples:
        >>> from visionblocks.ops.warp import affine_matrix
        >>> pts = torch.tensor([[0.0, 0.0], [4.0, 2.0]])
        >>> warp_points(pts, affine_matrix(scale=2.0, center=(2.0, 2.0)))
        tensor([[-2., -2.],
                [ 6.,  2.]])
        >>> warp_points(pts.expand(3, 2, 2), affine_matrix(translate=torch.rand(3, 2))).shape
        torch.Size([3, 2, 2])
    """
    check_real("points", points)
    check_matrix("matrix", matrix, batched=True)
    check_same_device(points=points, matrix=matrix)
    check_last_dim("points", points, 2, what="(x, y)")
    if points.dim() < 2:
        raise ValueError(f"points must have shape (..., N, 2), got {tuple(points.shape)}")
    check_batch("points", points, matrix)
    dtype = promoted_dtype(points, matrix)
    points, matrix = points.to(compute_dtype(dtype)), matrix.to(compute_dtype(dtype))
    # Element-wise, not `@`: torch.autocast would run a matmul in bfloat16/float16.
    col = matrix.unsqueeze(-3)  # (..., 1, 2, 3): columns broadcast against (..., N, 1)
    out = points[..., :1] * col[..., 0] + points[..., 1:] * col[..., 1] + col[..., 2]
    return out.to(dtype)


def warp_boxes(boxes: Tensor, matrix: Tensor, size: Sequence[int] | None = None) -> Tensor:
    """Warp ``xyxy`` boxes: the axis-aligned box enclosing each warped rectangle.

    For translations, scales and flips the result is exact; rotations and shears make the
    enclosing box larger than the object (warp a mask and take its bounding box for a tight
    box). Computed in closed form: the extremes of ``a·x + b·y + c`` over a rectangle are
    reached at its corners, so only ``min/max(a·x1, a·x2)`` and ``min/max(b·y1, b·y2)`` are
    needed.

    Args:
        boxes (Tensor[..., N, 4]): ``(x1, y1, x2, y2)`` in the edge convention
            (`visionblocks.ops.boxes`).
        matrix (Tensor[2, 3] or Tensor[..., 2, 3]): Forward pixel matrices; leading dims
            broadcast with ``boxes``' leading dims.
        size: Destination ``(H, W)``: clip the boxes to ``[0, W] × [0, H]``. ``None`` (default)
            leaves them unclipped (they can extend beyond the image or lie outside it).

    Returns:
        Tensor[..., N, 4]: Warped ``xyxy`` boxes in the promoted floating dtype of ``boxes``
        and ``matrix`` (float16/bfloat16: computed in float32, rounded once; the same under
        ``torch.autocast``); differentiable with respect to both. A clipped box outside the
        image has zero width or height.

    Raises:
        TypeError: Not tensors, a non-floating matrix, or a bad ``size`` type.
        ValueError: ``boxes`` not ``(..., N, 4)``, ``matrix`` not ``(..., 2, 3)``, leading dims
            that do not broadcast, tensors on different devices, bad ``size``. A singular
            matrix is fine here (flat boxes).

    Convention:
        Box corners are moved as ``M (p - 0.5) + 0.5`` (pixel centres at ``j + 0.5``); see the
        module docstring.

    Examples:
        >>> from visionblocks.ops.warp import affine_matrix
        >>> boxes = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
        >>> warp_boxes(boxes, affine_matrix(translate=(5.0, -5.0)))
        tensor([[15., 15., 35., 35.]])
        >>> resize2 = affine_matrix(scale=2.0, translate=(0.5, 0.5))  # x' = 2x + 0.5
        >>> warp_boxes(boxes, resize2)
        tensor([[20., 40., 60., 80.]])
        >>> flip = torch.tensor([[-1.0, 0.0, 63.0], [0.0, 1.0, 0.0]])  # width 64
        >>> warp_boxes(boxes, flip)
        tensor([[34., 20., 54., 40.]])
        >>> warp_boxes(boxes, affine_matrix(translate=(-25.0, 0.0)), size=(64, 64))
        tensor([[ 0., 20.,  5., 40.]])
    """
    check_real("boxes", boxes)
    check_matrix("matrix", matrix, batched=True)
    check_same_device(boxes=boxes, matrix=matrix)
    check_last_dim("boxes", boxes, 4, what="(x1, y1, x2, y2)")
    if boxes.dim() < 2:
        raise ValueError(f"boxes must have shape (..., N, 4), got {tuple(boxes.shape)}")
    check_batch("boxes", boxes, matrix)
    out_size = None if size is None else check_size("size", size)
    dtype = promoted_dtype(boxes, matrix)
    boxes, matrix = boxes.to(compute_dtype(dtype)), matrix.to(compute_dtype(dtype))
    # Every product a·x1, a·x2, b·y1, b·y2 (and d·x.., e·y..) in one tensor (..., N, 2, 2, 2):
    # the linear part (..., 1, 2, 2, 1) against [[x1, x2], [y1, y2]] (..., N, 1, 2, 2).
    corners = boxes.unflatten(-1, (2, 2)).mT.unsqueeze(-3)
    products = matrix[..., :2].unsqueeze(-3).unsqueeze(-1) * corners
    # Edge convention: p -> M (p - 0.5) + 0.5, i.e. the offsets gain 0.5 (1 - a - b).
    offset = (matrix[..., 2] + 0.5 * (1 - matrix[..., 0] - matrix[..., 1])).unsqueeze(-2)
    low = offset + products.amin(-1).sum(-1)
    high = offset + products.amax(-1).sum(-1)
    out = torch.cat((low, high), dim=-1)
    if out_size is not None:
        h, w = out_size
        limit = torch.tensor([w, h, w, h], dtype=out.dtype, device=out.device)
        out = torch.minimum(out.clamp(min=0), limit)
    return out.to(dtype)


def warp_masks(masks: Tensor, matrix: Tensor, size: Sequence[int] | None = None) -> Tensor:
    """Warp instance masks (or label maps) with nearest sampling, keeping their dtype.

    ``warp_affine(masks, matrix, size, mode="nearest")``: each mask is one channel, so a
    ``(N, H, W)`` stack is warped as one unbatched image. Pixels from outside the source are
    0 (``False``).

    Args:
        masks (Tensor[N, H, W] or Tensor[B, N, H, W]): Masks of any dtype (``bool``, ``uint8``,
            integer labels, float).
        matrix (Tensor[2, 3] or Tensor[B, 2, 3]): Forward pixel matrices (``(2, 3)`` for
            unbatched masks).
        size: Destination ``(H_out, W_out)``; default the masks' ``(H, W)``.

    Returns:
        Tensor[N, H_out, W_out] or Tensor[B, N, H_out, W_out]: Same dtype as ``masks``; every
        value is copied from the source (or 0). Under ``torch.autocast``: the same.

    Raises:
        TypeError: Not tensors or a non-floating matrix.
        ValueError: ``masks`` not 3-D/4-D, bad matrix shape or batch, tensors on different
            devices, bad ``size``, or (value check) a singular matrix (see `warp_affine`).

    Convention:
        Pixel centres on integers, as `warp_affine`; ties round half to even.

    Examples:
        >>> masks = torch.zeros(2, 4, 4, dtype=torch.bool)
        >>> masks[0, 1, 1] = masks[1, 2, 3] = True
        >>> from visionblocks.ops.warp import affine_matrix
        >>> out = warp_masks(masks, affine_matrix(translate=(-1.0, 1.0)), size=(4, 3))
        >>> out.dtype, out.shape
        (torch.bool, torch.Size([2, 4, 3]))
        >>> out.nonzero().tolist()
        [[0, 2, 0], [1, 3, 2]]
    """
    check_tensor("masks", masks)
    if masks.dim() not in (3, 4):
        raise ValueError(
            f"masks must have shape (N, H, W) or (B, N, H, W), got {tuple(masks.shape)}"
        )
    check_matrix("matrix", matrix)
    check_same_device(masks=masks, matrix=matrix)
    return warp_affine(masks, matrix, size, mode="nearest")


# ---------------------------------------------------------------------------- samples


def _warp_box_tensor(
    boxes: Any, matrix: Tensor, size: tuple[int, int], min_size: float | None
) -> tuple[Any, Tensor | None]:
    """Warp a ``BoundingBoxes`` in its own format; return it and the boxes to keep (or None)."""
    from torchvision.transforms.v2.functional import convert_bounding_box_format

    tv = tv_tensors_module()
    fmt = boxes.format
    plain = boxes.as_subclass(Tensor)
    work = plain if plain.is_floating_point() else plain.to(torch.get_default_dtype())
    rotated = fmt.name not in ("XYXY", "XYWH", "CXCYWH")
    if rotated:  # warp the four corners; the result is re-expressed in the original format
        corners = convert_bounding_box_format(work, old_format=fmt, new_format="XYXYXYXY")
        corners = corners.unflatten(-1, (4, 2))
        moved = warp_points(corners - 0.5, matrix) + 0.5
        enclosing = torch.cat((moved.amin(-2), moved.amax(-2)), dim=-1)
        extent = warp_boxes(enclosing, torch.eye(2, 3, dtype=moved.dtype), size)
        out = convert_bounding_box_format(moved.flatten(-2), old_format="XYXYXYXY", new_format=fmt)
    else:
        xyxy = convert_bounding_box_format(work, old_format=fmt, new_format="XYXY")
        extent = warp_boxes(xyxy, matrix, size)
        out = convert_bounding_box_format(extent, old_format="XYXY", new_format=fmt)
    if not plain.is_floating_point():
        out = out.round()
    out = tv.wrap(out.to(plain.dtype), like=boxes, canvas_size=size)
    if min_size is None:
        return out, None
    sides = extent[..., 2:] - extent[..., :2]  # width and height
    keep = (sides >= min_size if min_size > 0 else sides > 0).all(-1)
    return out, keep


def _check_target_sizes(target: Mapping[str, Any], image_size: tuple, tv: Any) -> None:
    """Every mask covers the image, and every box or key-point set lives on its canvas."""
    key_points = getattr(tv, "KeyPoints", None)  # torchvision >= 0.23
    canvases = (tv.BoundingBoxes,) if key_points is None else (tv.BoundingBoxes, key_points)
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
) -> tuple[Tensor, dict[str, Any] | None]:
    """Warp one detection sample — image, boxes, masks, key points — with one matrix.

    The image goes through `warp_affine`; in ``target`` (a torchvision-style dict), every
    ``tv_tensors.BoundingBoxes`` through `warp_boxes` in its own format, every ``Mask``
    through `warp_masks` and every ``KeyPoints`` through `warp_points`, with
    ``canvas_size`` set to ``size``. Other entries are copied unchanged.

    **Boxes that leave the image are dropped**, together with their instances: after
    clipping to the new canvas, a box narrower or lower than ``min_size`` pixels (or empty) is
    removed from the ``BoundingBoxes``, from every ``Mask`` of shape ``(N, H, W)``, from every
    ``KeyPoints`` of shape ``(N, ..., 2)`` with ``ndim >= 3``, and from the tensors under
    ``instance_keys`` (``labels``...), where ``N`` is the number of boxes. ``min_size=None``
    keeps every box. Values such as ``area`` are filtered, not recomputed. How many boxes
    remain depends on their values: with boxes and ``min_size`` set, that is read on the host
    (a sync on CUDA; a graph break under ``torch.compile``); ``min_size=None`` reads nothing.

    Axis-aligned formats (XYXY, XYWH, CXCYWH) are clipped to the canvas; rotated formats
    (XYWHR, CXCYWHR, XYXYXYXY) are warped corner by corner and not clipped (XYXYXYXY exactly;
    under shear or anisotropic scale, the other two keep torchvision's rectangle fit of the
    warped parallelogram). Key points are not clipped either.

    Args:
        image (Tensor[C, H, W]): The image (a ``tv_tensors.Image`` stays one).
        target: Dict of tv_tensors and other values, or ``None``.
        matrix (Tensor[2, 3]): Forward pixel matrix.
        size: Output ``(H_out, W_out)``; default the image's.
        mode: Image interpolation, ``"bilinear"`` or ``"nearest"``.
        fill: Image value outside the source (scalar or per channel).
        mask_fill: ``Mask`` value outside the source (0; e.g. 255 for an "ignore" label).
        min_size: Smallest kept box width and height, in pixels; ``None`` keeps every box.
        instance_keys: Plain tensors with one row per box, filtered with the boxes.

    Returns:
        tuple: ``(image, target)`` — the warped image (same type and dtype) and a new dict
        (``None`` if ``target`` was). Under ``torch.autocast``: the same (see `warp_affine`,
        `warp_boxes`).

    Raises:
        TypeError: ``image`` not a tensor, ``target`` not a mapping, an option of the wrong
            type (``instance_keys`` must be a sequence of str).
        ValueError: Bad image/matrix shapes or size; ``image`` and ``matrix`` on different
            devices; a ``Mask`` whose size, or ``BoundingBoxes``/``KeyPoints`` whose
            ``canvas_size``, differs from the image's; a non-finite ``fill``, a negative ``min_size``, a ``mask_fill`` that
            does not fit the masks' dtype; several ``BoundingBoxes`` in ``target`` with
            ``min_size`` set; an ``instance_keys`` tensor whose length differs from the number
            of boxes; or (value check) a singular matrix (see `warp_affine`).

    Convention:
        One matrix for everything: forward, pixel centres on integers; boxes in the edge
        convention (see the module docstring).

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
        >>> type(out_image).__name__, tuple(out_image.shape)
        ('Image', (3, 24, 16))
        >>> out["boxes"], out["labels"]
        (BoundingBoxes([[ 0,  4, 16, 12]], format=BoundingBoxFormat.XYWH, canvas_size=(24, 16), clamping_mode=soft), tensor([2]))
    """
    tv = tv_tensors_module()
    check_tensor("image", image)
    if image.dim() != 3:
        raise ValueError(f"image must have shape (C, H, W), got {tuple(image.shape)}")
    check_matrix("matrix", matrix)
    if matrix.dim() != 2:
        raise ValueError(
            f"warp_sample takes one (2, 3) matrix, got matrix of shape {tuple(matrix.shape)}"
        )
    check_same_device(image=image, matrix=matrix)
    if target is not None and not isinstance(target, Mapping):
        raise TypeError(f"target must be a dict or None, got {type(target).__name__}")
    check_sample_options(target, mode, fill, mask_fill, min_size, instance_keys)
    out_size = tuple(image.shape[-2:]) if size is None else check_size("size", size)
    padding = "zeros" if isinstance(fill, (int, float)) and fill == 0 else "fill"
    # A plain tensor as it is: torch.compile cannot trace as_subclass.
    plain_image = image if type(image) is Tensor else image.as_subclass(Tensor)
    warped, inverse = warp_checked(plain_image, matrix, out_size, mode, padding, fill)
    if isinstance(image, tv.TVTensor):
        warped = tv.wrap(warped, like=image)
    if target is None:
        return warped, None

    key_points = getattr(tv, "KeyPoints", None)  # torchvision >= 0.23
    _check_target_sizes(target, tuple(image.shape[-2:]), tv)
    out: dict[str, Any] = {}
    keep: Tensor | None = None
    num_boxes = 0
    for key, value in target.items():
        if isinstance(value, tv.BoundingBoxes):
            if keep is not None:
                raise ValueError("target holds several BoundingBoxes; pass min_size=None")
            out[key], keep = _warp_box_tensor(value, matrix, out_size, min_size)
            num_boxes = value.shape[0]
        elif isinstance(value, tv.Mask):
            plain = value.as_subclass(Tensor)
            flat = plain.unsqueeze(0) if plain.dim() == 2 else plain.flatten(0, -3)
            pad = "zeros" if mask_fill == 0 else "fill"
            moved, _ = warp_checked(flat, matrix, out_size, "nearest", pad, mask_fill, inverse)
            out[key] = tv.wrap(moved.reshape(*plain.shape[:-2], *out_size), like=value)
        elif key_points is not None and isinstance(value, key_points):
            plain = value.as_subclass(Tensor)
            moved = warp_points(plain if plain.dim() >= 2 else plain[None], matrix)
            if not plain.is_floating_point():
                moved = moved.round()
            moved = moved.reshape(plain.shape).to(plain.dtype)
            out[key] = tv.wrap(moved, like=value, canvas_size=out_size)
        else:
            out[key] = value
    if keep is None:
        return warped, out
    drop_instances(out, keep, num_boxes, instance_keys)
    return warped, out
