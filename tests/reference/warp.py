"""Affine warping as OpenCV defines it (``cv2.warpAffine``), written out in float64.

Each output pixel centre ``(x', y')`` (pixel centres on integers) is mapped back to the source
with the inverse matrix, ``(x, y) = M⁻¹ (x', y', 1)``, and sampled there:

- bilinear: ``x0 = floor(x)``, ``y0 = floor(y)``, ``fx = x - x0``, ``fy = y - y0``; the four
  neighbours weigh ``(1-fx)(1-fy)``, ``fx(1-fy)``, ``(1-fx)fy`` and ``fx fy``;
- nearest: the neighbour at ``(round(x), round(y))``, ties to even.

A neighbour outside the image takes the value of the border mode: ``"zeros"`` 0
(``BORDER_CONSTANT``), ``"fill"`` the fill value (``BORDER_CONSTANT`` with ``borderValue``),
``"border"`` the nearest edge pixel (``BORDER_REPLICATE``), ``"reflection"`` the mirror image
``fedcba|abcdef|fedcba`` (``BORDER_REFLECT``). The inverse comes from ``torch.linalg.inv`` of
the 3×3 matrix, independent of the library's closed form.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reflect(i: Tensor, n: int) -> Tensor:
    """``BORDER_REFLECT`` on integer indices: ``... 1 0 | 0 1 ... n-1 | n-1 n-2 ...``."""
    i = torch.remainder(i, 2 * n)
    return torch.where(i >= n, 2 * n - 1 - i, i)


def warp_affine(
    img: Tensor,
    matrix: Tensor,
    size: tuple[int, int],
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    fill: float | tuple[float, ...] = 0.0,
) -> Tensor:
    """Warp ``img (C, H, W)`` with the forward ``matrix (2, 3)``; float64 ``(C, H_out, W_out)``."""
    img = img.double()
    c, h, w = img.shape
    forward = torch.cat((matrix.double(), torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)))
    inv = torch.linalg.inv(forward)
    yy, xx = torch.meshgrid(
        torch.arange(size[0], dtype=torch.float64),
        torch.arange(size[1], dtype=torch.float64),
        indexing="ij",
    )
    x = inv[0, 0] * xx + inv[0, 1] * yy + inv[0, 2]
    y = inv[1, 0] * xx + inv[1, 1] * yy + inv[1, 2]
    fill_value = torch.as_tensor(fill, dtype=torch.float64).expand(c)[:, None, None]

    def pixel(iy: Tensor, ix: Tensor) -> Tensor:
        """Source pixels ``(C, H_out, W_out)`` at integer positions, padded by the border mode."""
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
        if padding_mode == "reflection":
            ix, iy = reflect(ix, w), reflect(iy, h)
        values = img[:, iy.clamp(0, h - 1), ix.clamp(0, w - 1)]  # "border": clamped
        if padding_mode == "zeros":
            return torch.where(inside, values, 0.0)
        if padding_mode == "fill":
            return torch.where(inside, values, fill_value)
        return values

    if mode == "nearest":
        return pixel(torch.round(y).long(), torch.round(x).long())
    x0, y0 = torch.floor(x), torch.floor(y)
    fx, fy = x - x0, y - y0
    x0, y0 = x0.long(), y0.long()
    return (
        (1 - fx) * (1 - fy) * pixel(y0, x0)
        + fx * (1 - fy) * pixel(y0, x0 + 1)
        + (1 - fx) * fy * pixel(y0 + 1, x0)
        + fx * fy * pixel(y0 + 1, x0 + 1)
    )
