"""Affine matrices and affine image warping, in OpenCV's pixel convention.

`affine_matrix` builds forward matrices, `warp_affine` resamples images with them,
`invert_affine` inverts them, and `matrix_to_theta` / `theta_to_matrix` convert to the
``theta`` of ``F.affine_grid``. Boxes, masks and key points follow the same matrices in
`visionblocks.ops.warp_targets`.

Convention:
    - A matrix ``M`` is a ``(2, 3)`` (or batched ``(B, 2, 3)``) floating tensor that maps a
      **source** pixel ``(x, y)`` **forward** to its destination: ``[x', y'] = M @ [x, y, 1]``.
      `warp_affine` computes ``dst(x', y') = src(M⁻¹ [x', y', 1])``, as
      ``cv2.warpAffine(src, M, (W_out, H_out))`` does without ``WARP_INVERSE_MAP``.
    - x grows to the right, y downwards, and **pixel centres sit on integers**: pixel
      ``(row i, column j)`` is the point ``(x=j, y=i)`` and covers ``[j - 0.5, j + 0.5] ×
      [i - 0.5, i + 0.5]``: OpenCV's convention, and ``F.affine_grid``/``F.grid_sample``'s
      with ``align_corners=False`` once coordinates are normalised (`matrix_to_theta`).
    - Every size is ``(H, W)``, as in tensor shapes; OpenCV's ``dsize`` is ``(W, H)``.
    - Angles are in degrees; a positive angle turns the picture counter-clockwise on screen
      (``cv2.getRotationMatrix2D``).

Paths:
    On CPU with OpenCV 5 (``pip install visionblocks[opencv]``) `warp_affine` calls
    ``cv2.warpAffine`` on every channel and gives its results exactly, on OpenCV's threads
    (``cv2.setNumThreads``). Tensors that need a gradient, CUDA tensors, ``torch.compile``, tracing
    and export, bilinear ``float64`` images and machines without OpenCV 5 take the torch path:
    ``F.grid_sample(..., align_corners=False)`` on the grid of ``M⁻¹``, differentiable with respect
    to ``img``, ``matrix`` and a tensor ``fill``; nearest sampling gathers pixels by index (gradient
    to ``img`` only). It agrees with OpenCV 5 up to float rounding, borders included (``uint8``: at
    most one level, where the exact value is within rounding of a half level; nearest ties round
    half to even). OpenCV 4 rounds sample positions to 1/32 pixel (up to about 6 ``uint8`` levels
    away). kornia's ``warp_affine`` agrees, except that ``"reflection"`` is ``BORDER_REFLECT``
    (``cba|abc``) here and ``BORDER_REFLECT_101`` (``dcb|abc``) in kornia.

Dtypes:
    Matrices must be floating point; float16/bfloat16 matrices (and `affine_matrix`
    arguments) are computed in float32 and returned in their dtype. `warp_affine` samples
    bilinearly in float32 (float64 for float64 images) and returns the image's dtype,
    integers rounded half to even and clamped, as OpenCV 5; ``mode="nearest"`` copies pixels
    of any dtype (``bool`` too). ``torch.autocast`` changes nothing: matrices are combined
    element-wise, never with ``@`` (which autocast would run in half precision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_same_device,
    check_tensor,
    compute_dtype,
)
from visionblocks.ops._warp_opencv import warp_opencv
from visionblocks.ops._warp_sampling import (
    as_float,
    check_fill,
    check_matrix,
    check_size,
    invert_checked,
    warp_bilinear,
    warp_nearest,
)

__all__ = [
    "affine_matrix",
    "invert_affine",
    "matrix_to_theta",
    "theta_to_matrix",
    "warp_affine",
]
__dir__ = public_dir(__name__, __all__)

InterpolationMode = Literal["bilinear", "nearest"]
PaddingMode = Literal["zeros", "border", "reflection", "fill"]
_MODES = ("bilinear", "nearest")
_PADDING_MODES = ("zeros", "border", "reflection", "fill")


# ---------------------------------------------------------------------------- matrices


def affine_matrix(
    angle: float | Tensor = 0.0,
    translate: Sequence[float] | Tensor = (0.0, 0.0),
    scale: float | Tensor = 1.0,
    shear: Sequence[float] | Tensor = (0.0, 0.0),
    center: Sequence[float] | Tensor = (0.0, 0.0),
) -> Tensor:
    """Forward affine matrix from rotation, scale, shear and translation, in pixel coordinates.

    ``p`` goes to ``center + translate + scale · R(angle) · Sh(shear) · (p - center)``: shear
    first (``x ← x + tan(shear[0]) · y``, then ``y ← y + tan(shear[1]) · x``), then rotation
    and isotropic scale about ``center``, translation last. Without shear and translation
    it equals ``cv2.getRotationMatrix2D(center, angle, scale)``.

    Args:
        angle (float or Tensor[...]): Rotation in degrees, counter-clockwise on screen.
        translate (pair or Tensor[..., 2]): ``(tx, ty)`` in pixels, applied last.
        scale (float or Tensor[...]): Isotropic scale factor.
        shear (pair or Tensor[..., 2]): ``(shear_x, shear_y)`` in degrees.
        center (pair or Tensor[..., 2]): ``(cx, cy)``, the fixed point of rotation, scale and
            shear (e.g. ``((W - 1) / 2, (H - 1) / 2)`` for the image centre).

    Returns:
        Tensor[2, 3] or Tensor[..., 2, 3]: Forward matrix, batched over the broadcast
        leading dims of tensor arguments, in their promoted floating dtype (default dtype if
        none) and differentiable with respect to them.

    Raises:
        TypeError: An argument is not a number, a sequence of numbers or a tensor.
        ValueError: A number that is not finite, a pair argument that does not end in 2, or
            batch dims that do not broadcast.

    Examples:
        >>> import cv2
        >>> m = affine_matrix(angle=30.0, scale=0.5, center=(3.5, 2.0))
        >>> ref = cv2.getRotationMatrix2D((3.5, 2.0), 30.0, 0.5)
        >>> torch.allclose(m, torch.from_numpy(ref).float())
        True
        >>> affine_matrix(translate=(2.0, 1.0))
        tensor([[1., 0., 2.],
                [0., 1., 1.]])
    """
    args = dict(angle=angle, translate=translate, scale=scale, shear=shear, center=center)
    tensors = [v for v in args.values() if isinstance(v, Tensor)]
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    for other in floats[1:]:
        dtype = torch.promote_types(dtype, other)
    device = tensors[0].device if tensors else torch.device("cpu")
    plain = None if tensors else _floats(args)
    if plain is not None:  # numbers only (a data loader's call): float64, rounded once
        fns = (math.radians, math.cos, math.sin, math.tan)
        rows = _entries(*plain["angle"], *plain["scale"], *plain["shear"], *plain["center"],
                        *plain["translate"], *fns)  # fmt: skip
        return torch.tensor(rows, dtype=dtype, device=device).view(2, 3)
    vals = {k: as_float(k, v, compute_dtype(dtype), device) for k, v in args.items()}
    for k in ("translate", "shear", "center"):
        if vals[k].dim() == 0 or vals[k].shape[-1] != 2:
            raise ValueError(f"{k} must be a pair or have shape (..., 2), got {vals[k].shape}")
    try:
        batch = torch.broadcast_shapes(
            vals["angle"].shape,
            vals["scale"].shape,
            *(vals[k].shape[:-1] for k in ("translate", "shear", "center")),
        )
    except RuntimeError as err:
        shapes = {k: tuple(v.shape) for k, v in vals.items()}
        raise ValueError(f"affine_matrix arguments do not broadcast: {shapes}") from err

    angle, scale = vals["angle"], vals["scale"]
    shear, center, translate = (vals[k].unbind(-1) for k in ("shear", "center", "translate"))
    fns = (torch.deg2rad, torch.cos, torch.sin, torch.tan)
    a, b, e, c, d, f = _entries(angle, scale, *shear, *center, *translate, *fns)
    rows = [torch.broadcast_to(v, batch) for v in (a, b, e, c, d, f)]
    return torch.stack(rows, dim=-1).unflatten(-1, (2, 3)).to(dtype)


def _floats(args: dict[str, Any]) -> dict[str, list[float]] | None:
    """`affine_matrix`'s arguments as lists of Python floats, or ``None`` unless every one is
    a finite number (``angle``, ``scale``) or a pair of them (the tensor path then says why)."""
    out = {}
    for key, value in args.items():
        pair = key not in ("angle", "scale")
        if pair and (not isinstance(value, (tuple, list)) or len(value) != 2):
            return None
        items = value if pair else [value]
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) for v in items)
        if not all(ok) or not all(math.isfinite(v) for v in items):
            return None
        out[key] = [float(v) for v in items]
    return out


def _entries(
    angle: Any,
    scale: Any,
    shx: Any,
    shy: Any,
    cx: Any,
    cy: Any,
    tx: Any,
    ty: Any,
    rad: Any,
    cos: Any,
    sin: Any,
    tan: Any,
) -> list[Any]:
    """``[a, b, e, c, d, f]`` of `affine_matrix`, for Python floats (``math``) or tensors."""
    theta = rad(angle)
    cos_s, sin_s = cos(theta) * scale, sin(theta) * scale
    shx, shy = tan(rad(shx)), tan(rad(shy))
    # A = (scale · R) @ Sh, with R = [[cos, sin], [-sin, cos]] and Sh = [[1, shx], [shy, 1 + shx·shy]].
    a = cos_s + sin_s * shy
    b = cos_s * shx + sin_s * (1 + shx * shy)
    c = -sin_s + cos_s * shy
    d = -sin_s * shx + cos_s * (1 + shx * shy)
    return [a, b, cx + tx - a * cx - b * cy, c, d, cy + ty - c * cx - d * cy]


def invert_affine(matrix: Tensor) -> Tensor:
    """Inverse of affine matrices, in closed form (``cv2.invertAffineTransform``, batched).

    Args:
        matrix (Tensor[..., 2, 3]): Floating affine matrices, any leading dims.

    Returns:
        Tensor[..., 2, 3]: ``M⁻¹`` (``M⁻¹ @ [M @ [p, 1], 1] = p``), same dtype; differentiable.

    Raises:
        TypeError: ``matrix`` is not a floating tensor.
        ValueError: ``matrix`` not of shape ``(..., 2, 3)``, or (a value check: one read on CPU,
            a device-side assert on CUDA) singular or not finite; with value checks off such a
            matrix gives ``inf``/``nan`` entries.

    Examples:
        >>> invert_affine(torch.tensor([[2.0, 0.0, 4.0], [0.0, 4.0, 8.0]]))
        tensor([[ 0.5000,  0.0000, -2.0000],
                [ 0.0000,  0.2500, -2.0000]])
    """
    check_matrix("matrix", matrix, batched=True)
    return invert_checked("matrix", matrix)


def matrix_to_theta(matrix: Tensor, src_size: Sequence[int], dst_size: Sequence[int]) -> Tensor:
    """Forward pixel matrix → ``theta`` for ``F.affine_grid(theta, ..., align_corners=False)``.

    ``theta = N_src ∘ M⁻¹ ∘ N_dst⁻¹`` (``N(x) = (2x + 1) / W - 1`` per axis), so
    ``F.grid_sample(img, F.affine_grid(theta, (B, C, *dst_size)))`` (``align_corners=False``)
    equals ``warp_affine(img, matrix, dst_size)``.

    Args:
        matrix (Tensor[..., 2, 3]): Forward matrices in pixel coordinates.
        src_size: ``(H, W)`` of the source image.
        dst_size: ``(H, W)`` of the destination image.

    Returns:
        Tensor[..., 2, 3]: ``theta``, same dtype; differentiable with respect to ``matrix``.

    Raises:
        TypeError: ``matrix`` is not a floating tensor or a size is not a tuple.
        ValueError: Bad matrix shape, sizes that are not two positive ints, or (value check)
            a singular or non-finite ``matrix`` (as `invert_affine`).

    Examples:
        >>> matrix_to_theta(torch.eye(2, 3), (4, 6), (4, 6))
        tensor([[1., 0., 0.],
                [0., 1., 0.]])
        >>> matrix_to_theta(torch.eye(2, 3), (4, 4), (2, 2))  # a top-left crop
        tensor([[ 0.5000,  0.0000, -0.5000],
                [ 0.0000,  0.5000, -0.5000]])
    """
    check_matrix("matrix", matrix, batched=True)
    src = check_size("src_size", src_size)
    dst = check_size("dst_size", dst_size)
    (hs, ws), (hd, wd) = src, dst
    work = compute_dtype(matrix.dtype)
    a, b, c, d, e, f = invert_checked("matrix", matrix.to(work)).flatten(-2).unbind(-1)
    # Closed form of N_src ∘ M⁻¹ ∘ N_dst⁻¹ (exact for identity-like matrices).
    tx = (a * (wd - 1) + b * (hd - 1) + 2 * c + 1) / ws - 1
    ty = (d * (wd - 1) + e * (hd - 1) + 2 * f + 1) / hs - 1
    theta = (a * (wd / ws), b * (hd / ws), tx, d * (wd / hs), e * (hd / hs), ty)
    return torch.stack(theta, dim=-1).unflatten(-1, (2, 3)).to(matrix.dtype)


def theta_to_matrix(theta: Tensor, src_size: Sequence[int], dst_size: Sequence[int]) -> Tensor:
    """``F.affine_grid`` ``theta`` (``align_corners=False``) → forward pixel matrix.

    The inverse of `matrix_to_theta`: ``M = (N_src⁻¹ ∘ theta ∘ N_dst)⁻¹``.

    Args:
        theta (Tensor[..., 2, 3]): Normalised destination → source matrices.
        src_size: ``(H, W)`` of the source image.
        dst_size: ``(H, W)`` of the destination image.

    Returns:
        Tensor[..., 2, 3]: Forward pixel matrices, same dtype.

    Raises:
        TypeError: ``theta`` is not a floating tensor or a size is not a tuple.
        ValueError: Bad shape, sizes that are not two positive ints, or (value check) a
            singular or non-finite ``theta`` (as `invert_affine`).

    Examples:
        >>> theta = torch.tensor([[0.5, 0.0, -0.5], [0.0, 0.5, -0.5]])
        >>> theta_to_matrix(theta, (4, 4), (2, 2))
        tensor([[1., 0., 0.],
                [0., 1., 0.]])
    """
    check_matrix("theta", theta, batched=True)
    src = check_size("src_size", src_size)
    dst = check_size("dst_size", dst_size)
    (hs, ws), (hd, wd) = src, dst
    t0, t1, t2, t3, t4, t5 = theta.to(compute_dtype(theta.dtype)).flatten(-2).unbind(-1)
    a, b, d, e = t0 * (ws / wd), t1 * (ws / hd), t3 * (hs / wd), t4 * (hs / hd)
    c = ((t2 + 1) * ws - 1 - a * (wd - 1) - b * (hd - 1)) / 2
    f = ((t5 + 1) * hs - 1 - d * (wd - 1) - e * (hd - 1)) / 2
    inverse = invert_checked("theta", torch.stack((a, b, c, d, e, f), dim=-1).unflatten(-1, (2, 3)))
    return inverse.to(theta.dtype)


def warp_affine(
    img: Tensor,
    matrix: Tensor,
    size: Sequence[int] | None = None,
    mode: InterpolationMode = "bilinear",
    padding_mode: PaddingMode = "zeros",
    fill: float | Sequence[float] | Tensor = 0.0,
) -> Tensor:
    """Warp images with forward affine matrices: ``cv2.warpAffine`` for tensors, batched.

    ``out[..., y', x'] = img[..., M⁻¹ (x', y')]``, sampled bilinearly or at the nearest pixel:
    OpenCV's own warp on CPU, ``F.grid_sample`` elsewhere (see the module's Paths).

    Args:
        img (Tensor[B, C, H, W] or Tensor[C, H, W]): Images, any dtype (``bool`` only with
            ``mode="nearest"``).
        matrix (Tensor[2, 3] or Tensor[B, 2, 3]): Forward (source → destination) matrices in
            pixel coordinates; ``(2, 3)`` and ``(1, 2, 3)`` are shared by the whole batch.
        size: Output ``(H_out, W_out)``; default the input's ``(H, W)``.
        mode: ``"bilinear"`` (``cv2.INTER_LINEAR``) or ``"nearest"`` (``cv2.INTER_NEAREST``).
        padding_mode: Value of samples outside the image: ``"zeros"`` (``BORDER_CONSTANT``, 0),
            ``"border"`` (``BORDER_REPLICATE``), ``"reflection"`` (``BORDER_REFLECT``,
            ``fedcba|abcdef``) or ``"fill"`` (``BORDER_CONSTANT`` with ``fill``).
        fill (float, sequence or Tensor[C]): Constant for ``padding_mode="fill"``, one value or
            one per channel. Must stay 0 with the other padding modes.

    Returns:
        Tensor[B, C, H_out, W_out] (or Tensor[C, H_out, W_out] for an unbatched input): The
        warped images in ``img``'s dtype (see the module's Dtypes).

    Raises:
        TypeError: ``img``/``matrix`` not tensors, a non-floating matrix, a ``bool`` image with
            bilinear sampling, or a bad ``fill`` type.
        ValueError: Bad shapes (image not 3-D/4-D or empty, matrix not ``(2, 3)``/``(B, 2, 3)``,
            batch mismatch), ``img`` and ``matrix`` on different devices, unknown
            ``mode``/``padding_mode``, bad or absurdly large ``size``, a non-finite ``fill``
            or a nonzero one without ``padding_mode="fill"``, or (a value check, see
            `invert_affine`) a singular or non-finite ``matrix``.

    Examples:
        >>> img = torch.arange(12.0).view(1, 3, 4)
        >>> warp_affine(img, affine_matrix(translate=(1.0, 0.0)))  # one pixel to the right
        tensor([[[ 0.,  0.,  1.,  2.],
                 [ 0.,  4.,  5.,  6.],
                 [ 0.,  8.,  9., 10.]]])
        >>> flip = torch.tensor([[-1.0, 0.0, 3.0], [0.0, 1.0, 0.0]])  # x' = 3 - x
        >>> warp_affine(img, flip, size=(2, 4), mode="nearest")
        tensor([[[3., 2., 1., 0.],
                 [7., 6., 5., 4.]]])
        >>> u8 = torch.full((3, 4, 4), 200, dtype=torch.uint8)
        >>> warp_affine(u8, affine_matrix(translate=(0.5, 0.0)))[0, 0]
        tensor([100, 200, 200, 200], dtype=torch.uint8)
    """
    return warp_checked(img, matrix, size, mode, padding_mode, fill)[0]


def warp_checked(
    img: Tensor,
    matrix: Tensor,
    size: Sequence[int] | None,
    mode: str,
    padding_mode: str,
    fill: object,
    inverse: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`warp_affine`, also returning the inverse matrices the torch path sampled with (or
    ``inverse`` as given, after OpenCV). Passing that back for the same ``matrix`` skips the
    inversion: `warp_sample` inverts once for the image and its masks."""
    check_tensor("img", img)
    check_matrix("matrix", matrix)
    check_same_device(img=img, matrix=matrix)
    check_type("mode", mode, str)
    check_choice("mode", mode, _MODES)
    check_type("padding_mode", padding_mode, str)
    check_choice("padding_mode", padding_mode, _PADDING_MODES)
    check_fill("fill", fill, padding_mode == "fill")
    if img.dim() not in (3, 4):
        raise ValueError(f"img must have shape (B, C, H, W) or (C, H, W), got {tuple(img.shape)}")
    unbatched = img.dim() == 3
    batch = img[None] if unbatched else img
    b, c, h, w = batch.shape
    if h == 0 or w == 0:
        raise ValueError(f"img must have a non-empty (H, W), got {tuple(img.shape)}")
    out_size = (h, w) if size is None else check_size("size", size)
    check_allocation("the warped img", (b, c, *out_size), torch.float64)
    mats = matrix if matrix.dim() == 3 else matrix[None]
    if mats.shape[0] != 1 and (unbatched or mats.shape[0] != b):
        what = "an unbatched img" if unbatched else f"img with batch {b}"
        raise ValueError(
            f"matrix batch {mats.shape[0]} does not match {what}; pass (2, 3) to share one matrix"
        )
    if mode == "bilinear" and batch.dtype == torch.bool:
        raise TypeError("bilinear warping needs a numeric img, got dtype torch.bool")
    out = warp_opencv(batch, mats, out_size, mode, padding_mode, fill)
    if out is not None:
        return (out[0] if unbatched else out), inverse
    coord_dtype = torch.promote_types(mats.dtype, torch.float32)
    if batch.device.type == "cpu" and mode == "nearest":
        coord_dtype = torch.float64  # rounded as OpenCV rounds its double coordinates
    inv = inverse
    if inv is None or inv.dtype != coord_dtype or inv.shape[0] != mats.shape[0]:
        inv = invert_checked("matrix", mats.to(coord_dtype))
    if mode == "nearest":
        out = warp_nearest(batch, inv, out_size, padding_mode, fill)
    else:
        out = warp_bilinear(batch, inv, out_size, padding_mode, fill)
    return (out[0] if unbatched else out), inv
