"""Warp what belongs to an image — points, boxes, masks, whole detection samples — with its matrix.

Each function takes the forward matrices of `visionblocks.ops.warp` (``(2, 3)`` or ``(B, 2, 3)``,
source → destination, pixel coordinates), so an augmentation builds one matrix, warps the
image with `warp_affine` and every target with the functions here, and they stay aligned.
`warp_keypoints` adds what key points need beyond their coordinates (visibility, left/right
names under a mirroring warp); `warp_sample` does all of it for one torchvision-style sample.

Convention:
    - **Points** (`warp_points`, `warp_keypoints`, torchvision ``KeyPoints``) are pixel
      coordinates with pixel centres on integers, the matrices' own convention
      (``cv2.transform``): the point ``(j, i)`` is the centre of pixel ``(row i, column j)``
      and lands where `warp_affine` moves that pixel.
    - **Inside the canvas**: a key point is inside an ``(H, W)`` canvas when it lies on one of
      its pixels, ``-0.5 <= x < W - 0.5`` and ``-0.5 <= y < H - 0.5`` (pixel ``j`` spans
      ``[j - 0.5, j + 0.5)``: half-open, so that neighbouring tiles share no point; NaN is
      outside). A point outside gets visibility 0. torchvision's ``SanitizeKeyPoints`` keeps
      ``0 <= x < W`` and ``ClampKeyPoints`` clamps to ``[0, W - 1]``: the three agree on which
      points with integer coordinates are inside.
    - **Boxes** (`warp_boxes`, ``BoundingBoxes``) use the edge convention of
      `visionblocks.ops.boxes`, torchvision and COCO: pixel ``j`` spans ``[j, j + 1)``, so the
      box ``(0, 0, 2, 2)`` covers 2×2 pixels and a pixel centre sits at ``j + 0.5``. A corner
      ``p`` therefore moves to ``M (p - 0.5) + 0.5``: warped boxes cover exactly the warped
      pixels, also under scaling. (Applying ``M`` to box corners directly would shift them by
      ``(1 - scale) / 2`` pixel.) A pure resize by ``s`` is thus
      ``x' = s·x + (s - 1) / 2`` in pixel coordinates, and maps the box ``(x1, …)`` to
      ``(s·x1, …)``. Rotated boxes (torchvision's ``XYWHR``, ``CXCYWHR``, ``XYXYXYXY``;
      degrees, counter-clockwise on screen) have their corners moved the same way and stay
      rotated (see `warp_sample`).
    - **Polygons** (``target["polygons"]`` of `warp_sample`) are COCO's continuous
      coordinates, the boxes' edge convention: a vertex moves like a box corner.
    - **Masks** are images: nearest sampling, pixels from outside the source are 0. The box of
      a mask is ``[min col, min row, max col + 1, max row + 1]`` of its nonzero pixels (edge
      convention; torchvision's ``masks_to_boxes`` gives ``max col`` and ``max row``).
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
    assert_on_device,
    asserts_on_device,
    check_last_dim,
    check_real,
    check_same_device,
    check_tensor,
    reads_values,
)
from visionblocks.ops._object_boxes import (
    check_polygons,
    maps_axes_to_axes,
    object_boxes,
    polygon_boxes,
    warp_polygons,
    warp_rotated_boxes,
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
from visionblocks.ops.keypoints import checked_pairs, permutation_list
from visionblocks.ops.warp import warp_affine, warp_checked

__all__ = ["warp_boxes", "warp_keypoints", "warp_masks", "warp_points", "warp_sample"]
__dir__ = public_dir(__name__, __all__)


def warp_points(points: Tensor, matrix: Tensor) -> Tensor:
    """Move points with forward affine matrices: ``p' = M @ [x, y, 1]`` (``cv2.transform``).

    Coordinates only: `warp_keypoints` also updates visibility (points that leave the canvas)
    and swaps left/right key points under a mirroring warp.

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


# ---------------------------------------------------------------------------- key points


def _determinant(matrix: Tensor) -> Tensor:
    """``a·d - b·c`` of ``(..., 2, 3)`` matrices: negative for a warp that mirrors."""
    return matrix[..., 0, 0] * matrix[..., 1, 1] - matrix[..., 0, 1] * matrix[..., 1, 0]


def _refuse_mirroring(matrix: Tensor, num_keypoints: int) -> None:
    """Value check: with ``K > 1`` key points and no ``flip_pairs``, no matrix may mirror.

    One read of the determinant for a CPU matrix, a device-side assert on CUDA, nothing when
    value checks are off or under ``torch.compile`` (`visionblocks.value_checks_enabled`).
    """
    if num_keypoints < 2:
        return
    message = (
        "matrix mirrors the image (negative determinant, e.g. a horizontal flip) but "
        f"flip_pairs is None: the {num_keypoints} key points would keep their left/right "
        "names and train a mirrored model; pass flip_pairs (keypoint_flip_pairs(names), or a "
        "dataset's flip_pairs), or flip_pairs=[] if no key point has a side"
    )
    if reads_values(matrix):
        if bool((_determinant(matrix.detach()) < 0).any()):
            raise ValueError(message)
    elif asserts_on_device(matrix):
        assert_on_device(~(_determinant(matrix.detach()) < 0), message)


def _check_visibility(name: str, visibility: object, points_name: str, shape: torch.Size) -> Tensor:
    """An integer or bool tensor of the key points' shape without the last dim."""
    check_tensor(name, visibility)
    assert isinstance(visibility, Tensor)
    if visibility.is_floating_point() or visibility.is_complex():
        raise TypeError(
            f"{name} must be an integer or bool tensor (COCO's 0/1/2 flags), got dtype "
            f"{visibility.dtype}"
        )
    if visibility.shape != shape:
        raise ValueError(
            f"{name} must have the shape of {points_name} without its last dim, "
            f"{tuple(shape)}, got {tuple(visibility.shape)}"
        )
    return visibility


def _place_keypoints(
    points: Tensor,
    visibility: Tensor,
    matrix: Tensor,
    perm: list[int] | None,
    size: tuple[int, int],
) -> tuple[Tensor, Tensor]:
    """Warped ``points (..., K, 2)`` (in their output dtype): swap the pairs of ``perm`` where
    the matrix mirrors (`torch.where`, nothing read) and hide the points outside ``size``."""
    visibility = visibility.expand(points.shape[:-1])
    if perm is not None:
        index = torch.tensor(perm, dtype=torch.int64, device=points.device)
        mirrored = (_determinant(matrix.detach()) < 0).unsqueeze(-1)  # (..., 1)
        points = torch.where(mirrored.unsqueeze(-1), points[..., index, :], points)
        visibility = torch.where(mirrored, visibility[..., index], visibility)
    h, w = size
    x, y = points[..., 0], points[..., 1]
    inside = (x >= -0.5) & (x < w - 0.5) & (y >= -0.5) & (y < h - 0.5)
    return points, visibility.masked_fill(~inside, 0)


def warp_keypoints(
    points: Tensor,
    matrix: Tensor,
    size: Sequence[int],
    visibility: Tensor | None = None,
    flip_pairs: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, Tensor]:
    """Warp key points and keep them right: visibility follows the canvas, names the mirror.

    The coordinates move as in `warp_points`. Then:

    - **Mirroring swaps left and right.** Where a matrix mirrors (its 2 × 2 part has a
      negative determinant: a horizontal or vertical flip, a negative scale on one axis), the
      key points of each pair in ``flip_pairs`` swap places along the ``K`` axis, their
      visibility with them: the point that was the left wrist is now where a right wrist is,
      and is named so. Selected with `torch.where` on the determinant: nothing is read on the
      host. ``flip_pairs=None`` with ``K > 1`` refuses a mirroring matrix (a value check; see
      Raises), as a flip without pairs would silently train a mirrored model; ``[]`` says
      that no point has a side.
    - **Points that leave the canvas become invisible:** visibility 0 (``False``) for every
      point outside ``size`` (see Convention); an invisible point (0) stays invisible, other
      values are kept. Invisible points are warped too (their coordinates are meaningless
      but harmless).

    Args:
        points (Tensor[..., K, 2]): ``(x, y)`` pixel coordinates (pixel centres on integers),
            e.g. ``(N, K, 2)`` for ``N`` people of ``K`` key points.
        matrix (Tensor[2, 3] or Tensor[..., 2, 3]): Forward matrices; leading dims broadcast
            with ``points``' leading dims, as in `warp_points`.
        size: The destination canvas ``(H, W)``.
        visibility (Tensor[..., K], optional): Integer (COCO's 0 / 1 / 2) or bool flags of
            ``points.shape[:-1]``. ``None``: every point counts as visible.
        flip_pairs: ``(i, j)`` index pairs of left/right key points (`keypoint_flip_pairs`
            of the names, or a dataset's ``flip_pairs``); ``[]``: no pairs.

    Returns:
        tuple: ``(points, visibility)``. ``points`` (Tensor[..., K, 2]) as `warp_points`
        returns them (the promoted floating dtype; differentiable), pairs swapped where the
        matrix mirrors. ``visibility`` (Tensor[..., K]): the given flags in their dtype, or a
        bool tensor (True: inside the canvas) when ``visibility`` is ``None``; 0 / ``False``
        for the points outside. Both have the broadcast leading dims of ``points`` and
        ``matrix``.

    Raises:
        TypeError: Not tensors, a non-floating matrix, a floating or complex ``visibility``,
            a bad ``size`` or ``flip_pairs`` type.
        ValueError: The shapes of `warp_points`, a ``visibility`` of another shape than
            ``points.shape[:-1]``, tensors on different devices, a bad ``size``, a
            ``flip_pairs`` index outside ``[0, K)`` or in two pairs; or (a value check, see
            `visionblocks.set_value_checks`: one read of the determinants of CPU matrices, a
            device-side assert on CUDA, nothing under ``torch.compile``) a mirroring matrix
            with ``flip_pairs=None`` and ``K > 1``.

    Convention:
        Pixel centres on integers; a point is inside when ``-0.5 <= x < W - 0.5`` and
        ``-0.5 <= y < H - 0.5`` (see the module docstring).

    Examples:
        >>> from visionblocks.ops.keypoints import keypoint_flip_pairs
        >>> pairs = keypoint_flip_pairs(["nose", "left_eye", "right_eye"])
        >>> person = torch.tensor([[[20.0, 10.0], [24.0, 8.0], [16.0, 8.0]]])  # (1, 3, 2)
        >>> visible = torch.tensor([[2, 2, 0]])  # the right eye is not labelled
        >>> hflip = torch.tensor([[-1.0, 0.0, 31.0], [0.0, 1.0, 0.0]])  # width 32
        >>> points, flags = warp_keypoints(person, hflip, (24, 32), visible, pairs)
        >>> points  # the left eye (x 24 -> 7) is now at index 2, the right eye's place
        tensor([[[11., 10.],
                 [15.,  8.],
                 [ 7.,  8.]]])
        >>> flags
        tensor([[2, 0, 2]])
        >>> shift = torch.tensor([[1.0, 0.0, 10.0], [0.0, 1.0, 0.0]])
        >>> warp_keypoints(person, shift, (24, 32), visible, pairs)[1]  # x 24 -> 34: outside
        tensor([[2, 0, 0]])
        >>> warp_keypoints(person, shift, (24, 32))[1]
        tensor([[ True, False,  True]])
    """
    check_real("points", points)
    check_matrix("matrix", matrix, batched=True)
    check_last_dim("points", points, 2, what="(x, y)")
    if points.dim() < 2:
        raise ValueError(f"points must have shape (..., K, 2), got {tuple(points.shape)}")
    if visibility is not None:
        _check_visibility("visibility", visibility, "points", points.shape[:-1])
    check_same_device(points=points, matrix=matrix, visibility=visibility)
    out_size = check_size("size", size)
    num_keypoints = points.shape[-2]
    perm = None
    if flip_pairs is None:
        _refuse_mirroring(matrix, num_keypoints)
    else:
        pairs = checked_pairs("flip_pairs", flip_pairs, num_keypoints)
        perm = permutation_list(num_keypoints, pairs) if pairs else None
    moved = warp_points(points, matrix)
    if visibility is None:
        visibility = torch.ones((), dtype=torch.bool, device=points.device)
    return _place_keypoints(moved, visibility, matrix, perm, out_size)


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

_AXIS_FORMATS = ("XYXY", "XYWH", "CXCYWH")


def _warp_box_tensor(
    boxes: Any,
    matrix: Tensor,
    size: tuple[int, int],
    min_size: float | None,
    objects: tuple[Tensor, Tensor] | None = None,
) -> tuple[Any, Tensor | None]:
    """Warp a ``BoundingBoxes`` in its own format; return it and the boxes to keep (or None).

    ``objects``: ``(boxes (N, 4) xyxy, found (N,))`` of the warped objects; where ``found``,
    they replace the warped corners unless the matrix maps axes to axes.
    """
    from torchvision.transforms.v2.functional import convert_bounding_box_format

    tv = tv_tensors_module()
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


def _warp_keypoint_entry(
    value: Any,
    visibility: Tensor | None,
    matrix: Tensor,
    size: tuple[int, int],
    pairs: list[tuple[int, int]] | None,
) -> tuple[Tensor, Tensor]:
    """A ``KeyPoints`` ``(..., K, 2)`` of `warp_sample` warped in its dtype (integers
    rounded), with its visibility (all True if None): see `warp_keypoints`."""
    plain = value.as_subclass(Tensor)
    moved = warp_points(plain, matrix)
    if not plain.is_floating_point():
        moved = moved.round()
    moved = moved.to(plain.dtype)
    num_keypoints = plain.shape[-2]
    perm = None
    if pairs is None:
        _refuse_mirroring(matrix, num_keypoints)
    elif pairs:
        checked = checked_pairs("flip_pairs", pairs, num_keypoints)
        perm = permutation_list(num_keypoints, checked)
    if visibility is None:
        visibility = torch.ones((), dtype=torch.bool, device=plain.device)
    return _place_keypoints(moved, visibility, matrix, perm, size)


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
    flip_pairs: Sequence[tuple[int, int]] | None = None,
) -> tuple[Tensor, dict[str, Any] | None]:
    """Warp one detection sample — image, boxes, masks, polygons, key points — with one matrix.

    The image goes through `warp_affine`; in ``target`` (a torchvision-style dict), every
    ``tv_tensors.BoundingBoxes`` through `warp_boxes` in its own format, every ``Mask``
    through `warp_masks`, every ``KeyPoints`` through `warp_keypoints` (with its visibility)
    and the polygons under ``"polygons"`` vertex by vertex, with ``canvas_size`` set to
    ``size``. Other entries are copied unchanged.

    **Tight boxes.** With polygons or instance masks in the sample, each box is recomputed
    from its warped object, not from the four warped box corners, which enclose a rotated or
    sheared object loosely (a disk of 81 px turned by 45°: corners 114.6 px wide, object
    81 px):

    - an instance with polygons: the min/max of its warped vertices, clipped to the canvas
      (the box of the whole object, clipped: for an object that crosses the border it can be
      larger than the box of the part inside);
    - else, with a ``Mask`` of shape ``(N, H, W)`` (N the number of boxes, the first such
      mask): the box of the warped mask's pixels, ``[min col, min row, max col + 1,
      max row + 1]``; a mask emptied by the warp gives an empty box (which ``min_size``
      drops); an instance whose source mask is empty keeps the corner method;
    - else the corner method.

    For warps that map axes to axes (no rotation or shear: translations, scales, flips and
    90° turns) the corner method is exact and keeps sub-pixel precision, so it is kept there
    (selected with `torch.where`, nothing read). Samples with boxes only use the corner
    method, and rotated box formats always follow the rule below. The two on one rotated
    disk (``d`` = 81 px, its box ``(20, 20, 101, 101)``)::

        warp_sample(image, {"boxes": boxes}, rot45)                 # corners: 114.6 px wide
        warp_sample(image, {"boxes": boxes, "masks": disk}, rot45)  # mask: 81 px wide

    **Key points.** A ``KeyPoints`` under key ``k`` may have its visibility under
    ``f"{k}_visibility"`` (``keypoints_visibility``), integer (COCO's 0 / 1 / 2) or bool, of
    the key points' shape without the last dim (``(N, K)``): points warped outside the
    canvas get 0, invisible ones stay 0, other values are kept. A mirroring matrix (negative
    determinant) swaps the ``flip_pairs`` along the ``K`` axis (``shape[-2]``), visibility
    included; with ``flip_pairs=None``, ``K > 1`` key points and a mirroring matrix, a value
    check raises (see Raises): pass the pairs, or ``[]`` for none.

    **Polygons** (``target["polygons"]``): a list with one entry per box, each a list of
    floating ``(P, 2)`` tensors in COCO's continuous coordinates (the boxes' edge convention);
    an entry may be empty (a crowd RLE instance). Warped polygons are returned on the
    matrix's device, not clipped.

    **Boxes that leave the image are dropped**, together with their instances: after
    clipping to the new canvas, a box narrower or lower than ``min_size`` pixels (or empty) is
    removed from the ``BoundingBoxes``, from every ``Mask`` of shape ``(N, H, W)``, from every
    ``KeyPoints`` of shape ``(N, ..., 2)`` with ``ndim >= 3`` and its visibility, from the
    polygons and from the tensors under ``instance_keys`` (``labels``...), where ``N`` is the
    number of boxes. ``min_size=None`` keeps every box. Values such as ``area`` are filtered,
    not recomputed. How many boxes remain depends on their values: with boxes and
    ``min_size`` set, that is read on the host (a sync on CUDA; a graph break under
    ``torch.compile``); ``min_size=None`` reads nothing.

    **Rotated boxes stay rotated** (torchvision's ``XYWHR``, ``CXCYWHR``, ``XYXYXYXY``, whose
    angle convention they keep: degrees, counter-clockwise on screen), from their corners
    (masks and polygons are not used for them):

    - ``XYWHR`` and ``CXCYWHR`` become the minimum-area rectangle enclosing the warped box.
      Under a similarity (rotation, uniform scale, translation, flips) that is the warped
      box itself, exactly: centre warped, width and height times the scale, the rotation
      added to the angle; a mirror mirrors the angle as torchvision's flips do (``-r`` for
      a horizontal flip, ``180 - r`` for a vertical one, modulo 360), the width side
      keeping its role. Under shear or anisotropic scale the warped box is a parallelogram,
      and the rectangle has one side along its longer side (``cv2.minAreaRect`` of the
      four corners, up to the corner labelling): it encloses the object, like the corner
      method's boxes. torchvision's ``affine`` (0.29) gives the same rectangle in most
      cases, but a larger one for a rhombus (equal sides) and, where the angle between the
      sides wraps around, one smaller than the parallelogram that does not enclose it.
    - ``XYXYXYXY`` keeps the four warped corners exactly (a parallelogram under shear),
      reordered ``p2, p1, p4, p3`` under a mirroring matrix as torchvision's flips do, so
      that ``p1 → p2`` stays the width side.

    Angles come out in ``(-180, 180]``. Nothing is read on the host for them.
    Axis-aligned formats (XYXY, XYWH, CXCYWH) are clipped to the canvas; rotated ones are
    not (their ``min_size`` test uses the warped corners' extent inside the canvas). Key
    points are not clipped either (they turn invisible).

    Args:
        image (Tensor[C, H, W]): The image (a ``tv_tensors.Image`` stays one).
        target: Dict of tv_tensors and other values, or ``None``.
        matrix (Tensor[2, 3]): Forward pixel matrix.
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
        (``None`` if ``target`` was), in ``target``'s key order. Under ``torch.autocast``:
        the same (see `warp_affine`, `warp_boxes`).

    Raises:
        TypeError: ``image`` not a tensor, ``target`` not a mapping, an option of the wrong
            type (``instance_keys`` must be a sequence of str, ``flip_pairs`` of int pairs),
            a visibility that is not an integer or bool tensor, polygons not in the format
            above.
        ValueError: Bad image/matrix shapes or size; ``image`` and ``matrix`` on different
            devices; a ``Mask`` whose size, or ``BoundingBoxes``/``KeyPoints`` whose
            ``canvas_size``, differs from the image's; a non-finite ``fill``, a negative
            ``min_size``, a ``mask_fill`` that does not fit the masks' dtype; several
            ``BoundingBoxes`` in ``target`` with ``min_size`` set; an ``instance_keys``
            tensor whose length, or polygons whose number, differs from the number of
            boxes; a visibility of another shape than its key points'; a ``flip_pairs``
            index outside ``[0, K)`` or in two pairs; or (value checks) a singular matrix
            (see `warp_affine`), or a mirroring one with ``flip_pairs=None`` and ``K > 1``
            key points (see `warp_keypoints`).

    Convention:
        One matrix for everything: forward, pixel centres on integers for the image and key
        points; boxes and polygons in the edge convention (see the module docstring).

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

        Rotated boxes stay rotated: a quarter turn (counter-clockwise on screen) adds 90° to
        the angle, a horizontal flip mirrors it.

        >>> box = tv_tensors.BoundingBoxes(
        ...     [[14.0, 22.0, 8.0, 4.0, 30.0]], format="CXCYWHR", canvas_size=(64, 64)
        ... )
        >>> quarter = torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 63.0]], dtype=torch.float64)
        >>> warp_sample(torch.zeros(3, 64, 64), {"boxes": box}, quarter)[1]["boxes"].tolist()
        [[22.0, 50.0, 8.0, 4.0, 120.0]]
        >>> flip = torch.tensor([[-1.0, 0.0, 63.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
        >>> warp_sample(torch.zeros(3, 64, 64), {"boxes": box}, flip)[1]["boxes"].tolist()
        [[50.0, 22.0, 8.0, 4.0, -30.0]]
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
    pairs = None if flip_pairs is None else checked_pairs("flip_pairs", flip_pairs)
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
    box_keys = [key for key, value in target.items() if isinstance(value, tv.BoundingBoxes)]
    if len(box_keys) > 1 and min_size is not None:
        raise ValueError("target holds several BoundingBoxes; pass min_size=None")
    visibility_of = {
        key: f"{key}_visibility"
        for key, value in target.items()
        if key_points is not None
        and isinstance(value, key_points)
        and f"{key}_visibility" in target
    }
    for key, vis_key in visibility_of.items():
        shape = target[key].shape[:-1]
        _check_visibility(f"target[{vis_key!r}]", target[vis_key], f"target[{key!r}]", shape)
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
            moved, _ = warp_checked(flat, matrix, out_size, "nearest", pad, mask_fill, inverse)
            moved = moved.reshape(*plain.shape[:-2], *out_size)
            if plain.dim() == 3 and box_keys:
                instance_masks.append((moved, plain))
            out[key] = tv.wrap(moved, like=value)
        elif key_points is not None and isinstance(value, key_points):
            vis_key = visibility_of.get(key)
            given = None if vis_key is None else target[vis_key]
            visibility = None if given is None else given.as_subclass(Tensor)
            moved, visibility = _warp_keypoint_entry(value, visibility, matrix, out_size, pairs)
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
    if keep is None:
        return warped, out
    drop_instances(out, keep, num_boxes, instance_keys)
    return warped, out
