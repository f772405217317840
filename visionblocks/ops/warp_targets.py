"""Warp what belongs to an image — points, boxes, masks — with its matrix.

Each function takes the forward matrices of `visionblocks.ops.warp` (``(..., 2, 3)``, or
their ``(3, 3)`` forms with the last row ``[0, 0, 1]``), so an augmentation
builds one matrix, warps the image with `warp_affine` and every target here, and they stay
aligned. `visionblocks.transforms.warp_sample` does all of it for one torchvision-style sample
(``warp_sample`` here is a deprecated alias of it).

Convention:
    - **Points** (`warp_points`, `warp_keypoints`, torchvision ``KeyPoints``) use the
      matrices' own convention, pixel centres on integers (``cv2.transform``): ``(j, i)``
      is the centre of pixel ``(row i, column j)`` and lands where `warp_affine` moves it.
    - **Inside the canvas**: a key point is inside an ``(H, W)`` canvas when
      ``-0.5 <= x < W - 0.5`` and ``-0.5 <= y < H - 0.5`` (half-open: neighbouring tiles
      share no point; NaN is outside); one outside gets visibility 0. torchvision's
      ``SanitizeKeyPoints`` and ``ClampKeyPoints`` agree on the points with integer coordinates.
    - **Boxes** (`warp_boxes`, ``BoundingBoxes``) and **polygons** use the edge convention
      of `visionblocks.ops.boxes`, torchvision and COCO: pixel ``j`` spans ``[j, j + 1)``.
      A corner or vertex ``p`` moves to ``M (p - 0.5) + 0.5``, so warped boxes cover exactly
      the warped pixels (a resize by ``s`` maps ``(x1, …)`` to ``(s·x1, …)``).
    - **Masks** are images: nearest sampling, pixels from outside the source are 0. The box of
      a mask is ``[min col, min row, max col + 1, max row + 1]`` of its nonzero pixels
      (torchvision's ``masks_to_boxes`` gives ``max col`` and ``max row``).
    - Every size is ``(H, W)``; ``torch.autocast`` changes nothing (element-wise products).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.deprecation import deprecated_attribute
from visionblocks._core.dispatch import assert_on_device, asserts_on_device, reads_values
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_last_dim,
    check_real,
    check_same_device,
    check_tensor,
    compute_dtype,
)
from visionblocks.ops._warp_sampling import check_matrix, check_size
from visionblocks.ops.keypoints import checked_pairs, permutation_list
from visionblocks.ops.warp import warp_checked

__all__ = ["warp_boxes", "warp_keypoints", "warp_masks", "warp_points"]
__dir__ = public_dir(__name__, __all__)


def _checked(
    name: str, x: Tensor, matrix: Tensor, k: int, what: str
) -> tuple[Tensor, Tensor, torch.dtype]:
    """Check ``x (..., N, k)`` and matrices whose leading dims broadcast with its own; both
    in the compute dtype, and the result dtype (the promoted floating one)."""
    check_real(name, x)
    matrix = check_matrix("matrix", matrix, batched=True, square=True)
    check_same_device(**{name: x, "matrix": matrix})
    if k == 2 and x.dim() >= 2 and x.shape[-1] == 3:
        raise ValueError(split_visibility(name, x))
    check_last_dim(name, x, k, what=what)
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., N, {k}), got {tuple(x.shape)}")
    if matrix.dim() > 2:
        try:
            torch.broadcast_shapes(x.shape[:-2], matrix.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"matrix of shape {tuple(matrix.shape)} does not broadcast with {name} of "
                f"shape {tuple(x.shape)}: the leading dims {tuple(matrix.shape[:-2])} and "
                f"{tuple(x.shape[:-2])} must broadcast (e.g. (B, 2, 3) matrices with (B, N, "
                f"{k}) {name})"
            ) from None
    dtype = torch.promote_types(x.dtype, matrix.dtype)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return x.to(compute_dtype(dtype)), matrix.to(compute_dtype(dtype)), dtype


def split_visibility(name: str, points: Tensor) -> str:
    """The error for ``(..., K, 3)`` key points: how to split COCO's ``(x, y, v)`` triples."""
    return (
        f"{name} must have shape (..., 2) (x, y), got {tuple(points.shape)}: for COCO's "
        f"(x, y, v) triples pass the coordinates {name}[..., :2] and the visibility "
        f"{name}[..., 2].long() apart (warp_keypoints' visibility=, or a target's "
        "'<key>_visibility' next to tv_tensors.KeyPoints(kp[..., :2], canvas_size=(H, W)))"
    )


def warp_points(points: Tensor, matrix: Tensor) -> Tensor:
    """Move points with forward affine matrices: ``p' = M @ [x, y, 1]`` (``cv2.transform``).

    Coordinates only: `warp_keypoints` also updates visibility and left/right names.

    Args:
        points (Tensor[..., N, 2]): ``(x, y)`` pixel coordinates (pixel centres on integers).
        matrix (Tensor[2, 3] or Tensor[..., 2, 3]): Forward matrices; leading dims broadcast with
            ``points``' leading dims (``(B, 2, 3)`` with ``(B, N, 2)`` warps each set with its
            own matrix).

    Returns:
        Tensor[..., N, 2]: Warped points in the promoted floating dtype of ``points`` and
        ``matrix`` (float16/bfloat16 computed in float32, rounded once); differentiable.

    Raises:
        TypeError: Not tensors, or a non-floating matrix.
        ValueError: ``points`` not ``(..., N, 2)``, ``matrix`` not ``(..., 2, 3)``, leading
            dims that do not broadcast, or tensors on different devices. A singular matrix is
            fine here: it maps the points onto a line or a point.

    Examples:
        >>> from visionblocks.ops.warp import affine_matrix
        >>> pts = torch.tensor([[0.0, 0.0], [4.0, 2.0]])
        >>> warp_points(pts, affine_matrix(scale=2.0, center=(2.0, 2.0)))
        tensor([[-2., -2.],
                [ 6.,  2.]])
    """
    points, matrix, dtype = _checked("points", points, matrix, 2, "(x, y)")
    # Element-wise, not `@`: torch.autocast would run a matmul in bfloat16/float16.
    col = matrix.unsqueeze(-3)  # (..., 1, 2, 3): columns broadcast against (..., N, 1)
    out = points[..., :1] * col[..., 0] + points[..., 1:] * col[..., 1] + col[..., 2]
    return out.to(dtype)


# ---------------------------------------------------------------------------- key points


def _determinant(matrix: Tensor) -> Tensor:
    """``a·d - b·c`` of ``(..., 2, 3)`` matrices: negative for a warp that mirrors."""
    return matrix[..., 0, 0] * matrix[..., 1, 1] - matrix[..., 0, 1] * matrix[..., 1, 0]


def refuse_mirroring(matrix: Tensor, num_keypoints: int) -> None:
    """Value check: with ``K > 1`` key points and no ``flip_pairs``, no matrix may mirror."""
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


def check_visibility(name: str, visibility: object, points_name: str, shape: torch.Size) -> Tensor:
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


def place_keypoints(
    points: Tensor,
    visibility: Tensor | None,
    matrix: Tensor,
    flip_pairs: Sequence[tuple[int, int]] | None,
    size: tuple[int, int],
) -> tuple[Tensor, Tensor]:
    """`warp_keypoints`' rules on warped ``points (..., K, 2)`` (in their output dtype)."""
    num_keypoints, perm = points.shape[-2], None
    if flip_pairs is None:
        refuse_mirroring(matrix, num_keypoints)
    else:
        pairs = checked_pairs("flip_pairs", flip_pairs, num_keypoints)
        perm = permutation_list(num_keypoints, pairs) if pairs else None
    if visibility is None:
        visibility = torch.ones((), dtype=torch.bool, device=points.device)
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

    The coordinates move as in `warp_points`. Where a matrix mirrors (negative determinant),
    the points of each pair in ``flip_pairs`` swap places along the ``K`` axis with their
    visibility, so the left wrist is named so again; ``flip_pairs=None`` with ``K > 1``
    refuses a mirroring matrix (it would silently train a mirrored model). Points outside
    ``size`` (the module's Convention) get visibility 0 (``False``); other values are kept.

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
        tuple: ``(points, visibility)`` with the broadcast leading dims of ``points`` and
        ``matrix``: the points of `warp_points`, pairs swapped where the matrix mirrors, and
        the flags in their dtype (bool when ``visibility`` is ``None``), 0 / False outside.

    Raises:
        TypeError: Not tensors, a non-floating matrix, a floating or complex ``visibility``,
            a bad ``size`` or ``flip_pairs`` type.
        ValueError: The shapes of `warp_points` (``(..., K, 3)`` points: the message says how
            to split off the visibility), a ``visibility`` of another shape than
            ``points.shape[:-1]``, tensors on different devices, a bad ``size``, a
            ``flip_pairs`` index outside ``[0, K)`` or in two pairs; or (a value check, see
            `visionblocks.set_value_checks`) a mirroring matrix with ``flip_pairs=None`` and
            ``K > 1``.

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
    """
    check_real("points", points)
    matrix = check_matrix("matrix", matrix, batched=True, square=True)
    if points.dim() >= 2 and points.shape[-1] == 3:
        raise ValueError(split_visibility("points", points))
    check_last_dim("points", points, 2, what="(x, y)")
    if points.dim() < 2:
        raise ValueError(f"points must have shape (..., K, 2), got {tuple(points.shape)}")
    if visibility is not None:
        check_visibility("visibility", visibility, "points", points.shape[:-1])
    check_same_device(points=points, matrix=matrix, visibility=visibility)
    out_size = check_size("size", size)
    return place_keypoints(warp_points(points, matrix), visibility, matrix, flip_pairs, out_size)


def warp_boxes(boxes: Tensor, matrix: Tensor, size: Sequence[int] | None = None) -> Tensor:
    """Warp ``xyxy`` boxes: the axis-aligned box enclosing each warped rectangle.

    Exact for translations, scales and flips; rotations and shears make the box larger than
    the object (`warp_sample` measures tight boxes on masks or polygons).

    Args:
        boxes (Tensor[..., N, 4]): ``(x1, y1, x2, y2)`` in the edge convention
            (`visionblocks.ops.boxes`).
        matrix (Tensor[2, 3] or Tensor[..., 2, 3]): Forward pixel matrices; leading dims
            broadcast with ``boxes``' leading dims.
        size: Destination ``(H, W)``: clip the boxes to ``[0, W] × [0, H]``. ``None`` (default)
            leaves them unclipped (they can extend beyond the image or lie outside it).

    Returns:
        Tensor[..., N, 4]: Warped boxes, dtype as `warp_points`; differentiable. A clipped box
        outside the image has zero width or height.

    Raises:
        TypeError: Not tensors, a non-floating matrix, or a bad ``size`` type.
        ValueError: ``boxes`` not ``(..., N, 4)``, ``matrix`` not ``(..., 2, 3)``, leading dims
            that do not broadcast, tensors on different devices, bad ``size``. A singular
            matrix is fine here (flat boxes).

    Examples:
        >>> from visionblocks.ops.warp import affine_matrix
        >>> boxes = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
        >>> resize2 = affine_matrix(scale=2.0, translate=(0.5, 0.5))  # x' = 2x + 0.5
        >>> warp_boxes(boxes, resize2)
        tensor([[20., 40., 60., 80.]])
        >>> flip = torch.tensor([[-1.0, 0.0, 63.0], [0.0, 1.0, 0.0]])  # width 64
        >>> warp_boxes(boxes, flip)
        tensor([[34., 20., 54., 40.]])
        >>> warp_boxes(boxes, affine_matrix(translate=(-25.0, 0.0)), size=(64, 64))
        tensor([[ 0., 20.,  5., 40.]])
    """
    boxes, matrix, dtype = _checked("boxes", boxes, matrix, 4, "(x1, y1, x2, y2)")
    out_size = None if size is None else check_size("size", size)
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

    ``warp_affine(masks, matrix, size, mode="nearest")``, each mask one channel.

    Args:
        masks (Tensor[N, H, W] or Tensor[B, N, H, W]): Masks of any dtype (``bool``, ``uint8``,
            integer labels, float).
        matrix (Tensor[2, 3] or Tensor[B, 2, 3]): Forward pixel matrices (``(2, 3)`` for
            unbatched masks).
        size: Destination ``(H_out, W_out)``; default the masks' ``(H, W)``.

    Returns:
        Tensor[N, H_out, W_out] or Tensor[B, N, H_out, W_out]: Same dtype as ``masks``; every
        value is copied from the source (or 0).

    Raises:
        TypeError: Not tensors or a non-floating matrix.
        ValueError: ``masks`` not 3-D/4-D, bad matrix shape or batch, tensors on different
            devices, bad ``size``, or (value check) a singular matrix (see `warp_affine`).

    Examples:
        >>> masks = torch.zeros(2, 4, 4, dtype=torch.bool)
        >>> masks[0, 1, 1] = masks[1, 2, 3] = True
        >>> from visionblocks.ops.warp import affine_matrix
        >>> out = warp_masks(masks, affine_matrix(translate=(-1.0, 1.0)), size=(4, 3))
        >>> out.nonzero().tolist()
        [[0, 2, 0], [1, 3, 2]]
    """
    check_tensor("masks", masks)
    if masks.dim() not in (3, 4):
        raise ValueError(
            f"masks must have shape (N, H, W) or (B, N, H, W), got {tuple(masks.shape)}"
        )
    return warp_checked(masks, matrix, size, "nearest", "zeros", 0.0, name="masks")[0]


_DEPRECATED = {"warp_sample": ("visionblocks.transforms.warp_sample", "0.3")}


def __getattr__(name: str) -> Any:
    return deprecated_attribute(__name__, globals(), _DEPRECATED, name)
