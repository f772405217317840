"""Affine matrices and affine image warping, in OpenCV's pixel convention.

`affine_matrix` builds forward matrices, `compose_affine` chains them, `warp_affine`
resamples images with them, `invert_affine` inverts them, and `matrix_to_theta` /
`theta_to_matrix` convert to the ``theta`` of ``F.affine_grid``. Boxes, masks and key points follow the same matrices in
`visionblocks.ops.warp_targets`.

Convention:
    - A matrix ``M`` is a ``(2, 3)`` (or batched ``(B, 2, 3)``) floating tensor that maps a
      **source** pixel ``(x, y)`` **forward** to its destination: ``[x', y'] = M @ [x, y, 1]``.
      `warp_affine` computes ``dst(x', y') = src(M⁻¹ [x', y', 1])``, as
      ``cv2.warpAffine(src, M, (W_out, H_out))`` does without ``WARP_INVERSE_MAP``. The warps
      (here and in `visionblocks.ops.warp_targets`) and `compose_affine` also take the
      ``(3, 3)`` form ``[[a, b, c], [d, e, f], [0, 0, 1]]``; a projective last row is refused.
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
    after,
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
    "compose_affine",
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
    hflip: bool | Tensor = False,
    vflip: bool | Tensor = False,
) -> Tensor:
    """Forward affine matrix from flips, rotation, scale, shear and translation, in pixels.

    ``p`` goes to ``center + translate + scale · R(angle) · Sh(shear) · F · (p - center)``:
    the flips ``F`` first (``x ← 2 cx - x``, ``y ← 2 cy - y``), then shear (``x ← x +
    tan(shear[0]) · y``, then ``y ← y + tan(shear[1]) · x``), rotation and isotropic scale
    about ``center``, translation last. Without flips, shear and translation it equals
    ``cv2.getRotationMatrix2D(center, angle, scale)``; with ``center`` the image centre, a flip
    is ``cv2.flip`` (``hflip``: ``x ← W - 1 - x``) before that.

    Args:
        angle (float or Tensor[...]): Rotation in degrees, counter-clockwise on screen.
        translate (pair or Tensor[..., 2]): ``(tx, ty)`` in pixels, applied last.
        scale (float or Tensor[...]): Isotropic scale factor.
        shear (pair or Tensor[..., 2]): ``(shear_x, shear_y)`` in degrees.
        center (pair or Tensor[..., 2]): ``(cx, cy)``, the fixed point of flips, rotation,
            scale and shear (``((W - 1) / 2, (H - 1) / 2)`` for the image centre).
        hflip (bool or bool Tensor[...]): Mirror left to right first (a tensor: per sample).
        vflip (bool or bool Tensor[...]): Mirror top to bottom first.

    Returns:
        Tensor[2, 3] or Tensor[..., 2, 3]: Forward matrix, batched over the broadcast
        leading dims of tensor arguments, in their promoted floating dtype (default dtype if
        none) and differentiable with respect to them.

    Raises:
        TypeError: An argument is not a number, a sequence of numbers or a tensor; a flip
            that is not a bool or a bool tensor.
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
        >>> affine_matrix(hflip=True, center=((8 - 1) / 2, (6 - 1) / 2))  # W = 8: x -> 7 - x
        tensor([[-1.,  0.,  7.],
                [ 0.,  1.,  0.]])
    """
    args = dict(angle=angle, translate=translate, scale=scale, shear=shear, center=center)
    tensors = [v for v in args.values() if isinstance(v, Tensor)]
    if type(hflip) is not bool or type(vflip) is not bool:
        for key, flag in (("hflip", hflip), ("vflip", vflip)):
            if isinstance(flag, Tensor) and flag.dtype == torch.bool:
                tensors.append(flag)
            elif type(flag) is not bool:
                got = f"a tensor of dtype {flag.dtype}" if isinstance(flag, Tensor) else repr(flag)
                raise TypeError(f"{key} must be a bool or a bool tensor, got {got}")
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    for other in floats[1:]:
        dtype = torch.promote_types(dtype, other)
    device = tensors[0].device if tensors else torch.device("cpu")
    plain = None if tensors else _floats(args)
    if plain is not None:  # numbers only (a data loader's call): float64, rounded once
        fx, fy = -1.0 if hflip else 1.0, -1.0 if vflip else 1.0
        fns = (math.radians, math.cos, math.sin, math.tan)
        rows = _entries(*plain["angle"], *plain["scale"], *plain["shear"], *plain["center"],
                        *plain["translate"], fx, fy, *fns)  # fmt: skip
        return torch.tensor(rows, dtype=dtype, device=device).view(2, 3)
    vals = {k: as_float(k, v, compute_dtype(dtype), device) for k, v in args.items()}
    for k in ("translate", "shear", "center"):
        if vals[k].dim() == 0 or vals[k].shape[-1] != 2:
            raise ValueError(f"{k} must be a pair or have shape (..., 2), got {vals[k].shape}")
    signs = {  # -1 where flipped; a bool is a number, a bool tensor follows the others' device
        k: (-1.0 if v else 1.0) if isinstance(v, bool) else 1.0 - 2.0 * v.to(vals["angle"])
        for k, v in (("hflip", hflip), ("vflip", vflip))
    }
    flip_shapes = [v.shape for v in signs.values() if isinstance(v, Tensor)]
    try:
        batch = torch.broadcast_shapes(
            vals["angle"].shape,
            vals["scale"].shape,
            *(vals[k].shape[:-1] for k in ("translate", "shear", "center")),
            *flip_shapes,
        )
    except RuntimeError as err:
        shapes = {k: tuple(v.shape) for k, v in (*vals.items(), *signs.items())
                  if isinstance(v, Tensor)}  # fmt: skip
        raise ValueError(f"affine_matrix arguments do not broadcast: {shapes}") from err

    angle, scale = vals["angle"], vals["scale"]
    shear, center, translate = (vals[k].unbind(-1) for k in ("shear", "center", "translate"))
    fns = (torch.deg2rad, torch.cos, torch.sin, torch.tan)
    entries = _entries(angle, scale, *shear, *center, *translate, *signs.values(), *fns)
    rows = [torch.broadcast_to(v, batch) for v in entries]
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
    fx: Any,
    fy: Any,
    rad: Any,
    cos: Any,
    sin: Any,
    tan: Any,
) -> list[Any]:
    """``[a, b, e, c, d, f]`` of `affine_matrix`, for Python floats (``math``) or tensors;
    ``fx``, ``fy`` are the flips' signs (``±1``)."""
    theta = rad(angle)
    cos_s, sin_s = cos(theta) * scale, sin(theta) * scale
    shx, shy = tan(rad(shx)), tan(rad(shy))
    # A = (scale · R) @ Sh @ F, with R = [[cos, sin], [-sin, cos]],
    # Sh = [[1, shx], [shy, 1 + shx·shy]] and F = diag(fx, fy): F scales A's columns
    # (`+ 0.0`: a flipped zero is 0, not -0).
    a = (cos_s + sin_s * shy) * fx + 0.0
    b = (cos_s * shx + sin_s * (1 + shx * shy)) * fy + 0.0
    c = (-sin_s + cos_s * shy) * fx + 0.0
    d = (-sin_s * shx + cos_s * (1 + shx * shy)) * fy + 0.0
    return [a, b, cx + tx - a * cx - b * cy, c, d, cy + ty - c * cx - d * cy]


def compose_affine(*matrices: Tensor) -> Tensor:
    """One forward matrix for several warps applied in turn, the first given first.

    ``compose_affine(a, b)`` moves a point by ``a``, then by ``b``: ``b @ a`` of the
    ``(3, 3)`` forms, computed element-wise (``torch.autocast`` changes nothing), so
    ``warp_affine(warp_affine(img, a), b)`` equals ``warp_affine(img, compose_affine(a, b))``
    up to the resampling of the first warp.

    Args:
        *matrices (Tensor[..., 2, 3] or Tensor[..., 3, 3]): Forward matrices in the order they
            apply; leading dims broadcast (a ``(2, 3)`` one with ``(B, 2, 3)`` ones).

    Returns:
        Tensor[..., 2, 3]: The composed forward matrix, in the promoted floating dtype
        (float16/bfloat16 computed in float32); differentiable.

    Raises:
        TypeError: A matrix that is not a floating tensor.
        ValueError: No matrix, a shape other than ``(..., 2, 3)`` / ``(..., 3, 3)``, leading
            dims that do not broadcast, tensors on different devices, or (a value check) a
            ``(3, 3)`` matrix whose last row is not ``[0, 0, 1]``.

    Examples:
        >>> zoom, shift = affine_matrix(scale=2.0), affine_matrix(translate=(1.0, 0.0))
        >>> compose_affine(zoom, shift)  # x -> 2x, then x -> x + 1
        tensor([[2., 0., 1.],
                [0., 2., 0.]])
        >>> compose_affine(shift, zoom)  # x -> x + 1, then x -> 2x
        tensor([[2., 0., 2.],
                [0., 2., 0.]])
        >>> flip = affine_matrix(hflip=True, center=(1.5, 1.5))
        >>> compose_affine(flip, flip)
        tensor([[1., 0., 0.],
                [0., 1., 0.]])
    """
    if not matrices:
        raise ValueError("compose_affine needs at least one matrix, got none")
    checked = [
        check_matrix(f"matrices[{i}]", m, batched=True, square=True) for i, m in enumerate(matrices)
    ]
    check_same_device(**{f"matrices[{i}]": m for i, m in enumerate(checked)})
    try:
        torch.broadcast_shapes(*(m.shape[:-2] for m in checked))
    except RuntimeError:
        shapes = [tuple(m.shape) for m in matrices]
        raise ValueError(f"matrices' leading dims do not broadcast: shapes {shapes}") from None
    dtype = checked[0].dtype
    for m in checked[1:]:
        dtype = torch.promote_types(dtype, m.dtype)
    work = compute_dtype(dtype)
    out = checked[0].to(work)
    for m in checked[1:]:
        out = after(m.to(work), out)  # m ∘ out: out first
    return out.to(dtype)


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
        img (Tensor[B, C, H, W] or Tensor[C, H, W]): Images, any real dtype (``bool`` only
            with ``mode="nearest"``; complex is refused).
        matrix (Tensor[2, 3] or Tensor[B, 2, 3]): Forward (source → destination) matrices in
            pixel coordinates, or their ``(3, 3)`` forms; ``(2, 3)`` and ``(1, 2, 3)`` are shared
            by the whole batch.
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
        TypeError: ``img``/``matrix`` not tensors, a complex image, a non-floating matrix, a
            ``bool`` image with bilinear sampling, or a bad ``fill`` type.
        ValueError: Bad shapes (image not 3-D/4-D or empty, matrix not ``(2, 3)``/``(B, 2, 3)``
            or their ``(3, 3)`` forms, batch mismatch), ``img`` and ``matrix`` on different
            devices, unknown ``mode``/``padding_mode``, bad or absurdly large ``size``, a
            non-finite ``fill`` or a nonzero one without ``padding_mode="fill"``, or (value
            checks, see `invert_affine`) a singular or non-finite ``matrix``, a ``(3, 3)`` one
            whose last row is not ``[0, 0, 1]``.

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
    name: str = "img",
) -> tuple[Tensor, Tensor | None]:
    """`warp_affine`, also returning the inverse matrices the torch path sampled with (or
    ``inverse`` as given, after OpenCV). Passing that back for the same ``matrix`` skips the
    inversion: `warp_sample` inverts once for the image and its masks. Errors about the
    image name it ``name``."""
    check_tensor(name, img)
    if img.is_complex():
        raise TypeError(
            f"{name} must be a real tensor (an image of numbers, or bool masks), got dtype "
            f"{img.dtype}; warp its real and imaginary parts (torch.view_as_real) separately"
        )
    matrix = check_matrix("matrix", matrix, square=True)
    check_same_device(**{name: img, "matrix": matrix})
    check_type("mode", mode, str)
    check_choice("mode", mode, _MODES)
    check_type("padding_mode", padding_mode, str)
    check_choice("padding_mode", padding_mode, _PADDING_MODES)
    check_fill("fill", fill, padding_mode == "fill")
    if img.dim() not in (3, 4):
        raise ValueError(
            f"{name} must have shape (B, C, H, W) or (C, H, W), got {tuple(img.shape)}"
        )
    unbatched = img.dim() == 3
    batch = img[None] if unbatched else img
    b, c, h, w = batch.shape
    if h == 0 or w == 0:
        raise ValueError(f"{name} must have a non-empty (H, W), got {tuple(img.shape)}")
    out_size = (h, w) if size is None else check_size("size", size)
    check_allocation("the warped img", (b, c, *out_size), torch.float64)
    mats = matrix if matrix.dim() == 3 else matrix[None]
    if mats.shape[0] != 1 and (unbatched or mats.shape[0] != b):
        what = f"an unbatched {name}" if unbatched else f"{name} with batch {b}"
        raise ValueError(
            f"matrix batch {mats.shape[0]} does not match {what}; pass (2, 3) to share one matrix"
        )
    if mode == "bilinear" and batch.dtype == torch.bool:
        raise TypeError(f"bilinear warping needs a numeric {name}, got dtype torch.bool")
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
