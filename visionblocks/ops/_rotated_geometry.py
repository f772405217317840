"""Rotated-box formats: parsing a ``fmt``, conversion to ``"cxcywhr"``, the canonical form and
the check for radians given as degrees.

Private helpers of `visionblocks.ops.rotated` (whose module docstring holds the convention);
element-wise torch, no host reads but `warn_radians`'s (CPU only). The canonical form (`canonical`, also computed by the
Triton kernel) has non-negative sides and an angle in ``[-45, 45)`` degrees, reached by whole
quarter turns with the sides swapped on odd ones, so equal rectangles written differently get
equal parameters (bitwise for angles differing by exact multiples of 90): their IoU is 1. No
step of the reduction rounds (`quarter_turns`), so it costs no accuracy in float64 either.
"""

from __future__ import annotations

import math
import warnings
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from visionblocks._core.dispatch import reads_values

__all__ = [
    "DEG",
    "ROTATED_FORMATS",
    "canonical",
    "canonical_backward",
    "parse_rotated_format",
    "plain",
    "quarter_turns",
    "to_cxcywhr",
    "warn_radians",
]

DEG = math.pi / 180.0
"""Radians per degree."""

ROTATED_FORMATS: dict[str, int] = {"cxcywhr": 5, "xywhr": 5, "xyxyxyxy": 8, "cxcywhr_rad_cw": 5}
"""Rotated formats (lower case, as ``fmt`` strings) and the size of their last dim."""

_UNROTATED = ("xyxy", "xywh", "cxcywh")


def parse_rotated_format(fmt: Any, name: str = "fmt") -> str:
    """``fmt`` as a lower-case format name; a ``str`` (any case) or torchvision's
    ``BoundingBoxFormat`` member.

    Raises:
        TypeError: ``fmt`` is neither.
        ValueError: An unknown or unrotated format.

    Examples:
        >>> parse_rotated_format("CXCYWHR")
        'cxcywhr'
        >>> parse_rotated_format("xyxy")
        Traceback (most recent call last):
        ...
        ValueError: fmt must be a rotated box format, one of 'cxcywhr', 'xywhr', 'xyxyxyxy', 'cxcywhr_rad_cw'; got 'xyxy' (an axis-aligned format: use box_iou and torchvision's nms for those)
    """
    if isinstance(fmt, Enum):
        fmt = fmt.value
    if not isinstance(fmt, str):
        raise TypeError(
            f"{name} must be a str or a torchvision BoundingBoxFormat, got "
            f"{type(fmt).__name__} ({fmt!r})"
        )
    low = fmt.lower()
    if low not in ROTATED_FORMATS:
        allowed = ", ".join(repr(f) for f in ROTATED_FORMATS)
        hint = (
            " (an axis-aligned format: use box_iou and torchvision's nms for those)"
            if low in _UNROTATED
            else ""
        )
        raise ValueError(
            f"{name} must be a rotated box format, one of {allowed}; got {fmt!r}{hint}"
        )
    return low


def plain(boxes: Tensor, fmt: str, name: str) -> Tensor:
    """``boxes`` as a plain tensor; a torchvision ``BoundingBoxes`` must carry ``fmt``."""
    own = getattr(boxes, "format", None)
    if own is not None and type(boxes) is not Tensor:
        own_name = getattr(own, "value", own)
        if isinstance(own_name, str) and own_name.lower() != fmt:
            raise ValueError(
                f"{name} is a BoundingBoxes in format {own_name!r} but fmt is {fmt!r}; "
                f"pass fmt={own_name.lower()!r}"
            )
        boxes = boxes.as_subclass(Tensor)
    return boxes


def warn_radians(fn: str, fmt: str, *boxes: Tensor, stacklevel: int = 3) -> None:
    """Warn where every angle of floating ``boxes`` in a degree format is in ``[0, pi/2]``
    and one is above 0.1: the range of ultralytics' ``xywhr`` angles, in radians (a value
    check: CPU tensors only, off with `visionblocks.value_checks`)."""
    if fmt not in ("cxcywhr", "xywhr") or not all(b.is_floating_point() for b in boxes):
        return
    if not reads_values(*boxes):
        return
    hi = 0.0
    for b in boxes:
        if b.numel():
            lo_hi = torch.aminmax(b[..., 4].detach())
            lo, top = float(lo_hi[0]), float(lo_hi[1])
            if not (lo >= 0 and top <= math.pi / 2):  # also for NaN
                return
            hi = max(hi, top)
    if hi > 0.1:
        warnings.warn(
            f"{fn}: every angle is in [0, pi/2], as ultralytics' xywhr angles in radians, "
            f"but fmt={fmt!r} reads degrees turning counter-clockwise on screen "
            "(torchvision's). Radians turning clockwise on screen (ultralytics' xywhr, "
            "mmrotate's boxes) are fmt='cxcywhr_rad_cw'; if these are degrees, "
            "visionblocks.value_checks(False) skips this check.",
            stacklevel=stacklevel,
        )


def _nonneg(x: Tensor) -> Tensor:
    """``|x|`` with gradient 1 at 0 (``abs``'s 0 would freeze a zero-width predicted box)."""
    return torch.where(x < 0, -x, x)


def _safe_norm(x: Tensor, y: Tensor) -> Tensor:
    """``hypot(x, y)`` with a zero (not NaN) gradient at ``(0, 0)``."""
    sq = x * x + y * y
    pos = sq > 0
    return torch.sqrt(torch.where(pos, sq, torch.ones_like(sq))) * pos


def _safe_atan2(y: Tensor, x: Tensor) -> Tensor:
    """``atan2(y, x)``: 0 with a zero gradient at ``(0, 0)``."""
    zero = (x == 0) & (y == 0)
    return torch.atan2(y, torch.where(zero, torch.ones_like(x), x)).masked_fill(zero, 0.0)


def to_cxcywhr(boxes: Tensor, fmt: str) -> Tensor:
    """``(..., K)`` boxes in ``fmt`` as ``(..., 5)`` ``(cx, cy, w, h, r)``, differentiable
    (the conversions of `visionblocks.ops.rotated`'s Convention)."""
    if fmt == "cxcywhr":
        return boxes
    if fmt == "cxcywhr_rad_cw":  # radians turning clockwise on screen: r = -t * 180 / pi
        return torch.cat((boxes[..., :4], boxes[..., 4:] * (-180.0 / math.pi)), -1)
    if fmt == "xywhr":
        x, y, w, h, r = boxes.unbind(-1)
        rad = torch.fmod(r, 360.0) * DEG  # fmod is exact: large angles keep their accuracy
        c, s = torch.cos(rad), torch.sin(rad)
        hw, hh = 0.5 * _nonneg(w), 0.5 * _nonneg(h)
        return torch.stack((x + hw * c + hh * s, y - hw * s + hh * c, w, h, r), dim=-1)
    pts = boxes.unflatten(-1, (4, 2))
    centre = pts.mean(-2)
    e1 = pts[..., 1, :] - pts[..., 0, :]
    e2 = pts[..., 2, :] - pts[..., 1, :]
    w = _safe_norm(e1[..., 0], e1[..., 1])
    h = _safe_norm(e2[..., 0], e2[..., 1])
    r = _safe_atan2(-e1[..., 1], e1[..., 0]) * (180.0 / math.pi)
    return torch.stack((centre[..., 0], centre[..., 1], w, h, r), dim=-1)


def quarter_turns(r: Tensor) -> tuple[Tensor, Tensor]:
    """Angles ``r`` (degrees) reduced to ``[-45, 45)`` by whole quarter turns, and whether
    their number is odd. Exact: ``fmod`` is, and each later step takes 90 or 180 from a number
    within a factor two of it (Sterbenz), so angles that differ by exact multiples of 90 reduce
    to the same number (``r + 45`` would round to the ulp of ``r``).
    """
    t = torch.fmod(r, 180.0)  # (-180, 180)
    t = torch.where(t >= 135.0, t - 180.0, torch.where(t < -135.0, t + 180.0, t))
    up, down = t >= 45.0, t < -45.0
    return torch.where(up, t - 90.0, torch.where(down, t + 90.0, t)), up | down


def canonical(boxes: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Canonical ``(cx, cy, w, h, r)`` columns of ``(..., 5)`` cxcywhr boxes (module notes).

    Examples:
        >>> import torch
        >>> a = canonical(torch.tensor([[0.0, 0.0, 4.0, 2.0, 100.0]]))
        >>> b = canonical(torch.tensor([[0.0, 0.0, 2.0, 4.0, 10.0]]))
        >>> [x.item() for x in a] == [x.item() for x in b]
        True
    """
    cx, cy, w, h, r = boxes.unbind(-1)
    w, h = _nonneg(w), _nonneg(h)
    r, odd = quarter_turns(r)  # an odd number of quarter turns: the sides swap
    return cx, cy, torch.where(odd, h, w), torch.where(odd, w, h), r


def canonical_backward(boxes: Tensor, grad: Tensor) -> Tensor:
    """The gradient with respect to ``boxes (..., 5)`` of a function of `canonical` (boxes),
    given its gradient ``grad (..., 5)`` with respect to the canonical parameters."""
    w, h = boxes[..., 2], boxes[..., 3]
    odd = quarter_turns(boxes[..., 4])[1]
    gw, gh = grad[..., 2], grad[..., 3]
    gw, gh = torch.where(odd, gh, gw), torch.where(odd, gw, gh)
    gw = torch.where(w < 0, -gw, gw)
    gh = torch.where(h < 0, -gh, gh)
    return torch.stack((grad[..., 0], grad[..., 1], gw, gh, grad[..., 4]), dim=-1)
