"""RoI pooling: `roi_align`, `roi_pool`, `ps_roi_align` and `ps_roi_pool` (FPN levels:
`visionblocks.ops.multiscale_roi_align`).

Each function takes torchvision's arguments in torchvision's order and runs its compiled
kernels (``torch.ops.torchvision``, loaded on first use) after checking the arguments with
errors that name them. half and bfloat16 inputs are computed in float32 (torchvision's
autocast rule; its kernels have no bfloat16) and returned in the input's dtype; boxes are
cast to that compute dtype. Box values are not read on the host except by the CPU value
check (`visionblocks.set_value_checks`) that refuses what torchvision's CPU kernels would read
out of bounds on or answer silently: batch indices out of range or fractional (truncated
there), NaN or infinite coordinates (a crash there), and, with adaptive sampling, boxes
that would take more than 1024 samples per bin side (an allocation error there). Empty
feature maps (``H`` or ``W`` 0, a crash there) are refused by shape.

Deterministic backward: torchvision's CUDA backward kernels add with atomics, so under
``torch.use_deterministic_algorithms(True)`` they raise (its ``roi_align`` switches to a
``torch.compile``'d formula instead). Here, with ``impl="auto"``, a CUDA call made while
deterministic algorithms are enabled (a host flag, read when the forward runs) keeps
torchvision's forward and takes a Triton backward that gathers instead of scattering
(`visionblocks.kernels.roi_align`): bitwise reproducible, equal to torchvision's gradients to
float rounding. Without deterministic mode torchvision's backward runs on CUDA. On CPU,
`roi_align` with a fixed ``sampling_ratio > 0`` and enough work (a rule on shapes) computes
the input gradient as a gather over a channels-last table instead of torchvision's backward
(also deterministic, equal to it to float rounding), and with more work the forward too
(equal to torchvision's kernel to float rounding), reading a channels-last copy of the
feature map; other CPU calls run torchvision's kernels. ``impl="triton"`` forces the Triton
backward (on CPU tensors with ``TRITON_INTERPRET=1``); ``impl="torch"`` takes torchvision's
kernels, or that CPU gather.

Convention:
    Boxes are ``"xyxy"`` in continuous coordinates (`visionblocks.ops.boxes`): pixel ``i``
    covers ``[i, i + 1)`` and its centre is ``i + 0.5``. torchvision samples the feature map
    at continuous coordinates where pixel ``i``'s value sits at ``i``, after mapping a box
    coordinate ``u`` to ``u * spatial_scale - offset``: ``aligned=True`` (``offset = 0.5``,
    Detectron2's RoIAlign) is exactly our convention; ``aligned=False`` (torchvision's
    default, the original Mask R-CNN) samples half a pixel down and right of it and
    stretches boxes smaller than one feature pixel to one. ``ps_roi_align`` always takes
    ``offset = 0.5``. ``roi_pool`` and ``ps_roi_pool`` round box coordinates to whole pixels
    (``roi_pool`` counts the end pixel in, ``+ 1``). ``rois`` are ``(K, 5)`` rows
    ``(batch index, x1, y1, x2, y2)``, or one ``(L, 4)`` tensor of boxes per image.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Literal

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_finite, check_int, check_number, check_type
from visionblocks._core.dispatch import forced_triton, reads_values, use_triton
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import (
    check_allocation,
    check_floating,
    check_real,
    compute_dtype,
)

__all__ = [
    "PSRoIAlign",
    "PSRoIPool",
    "RoIAlign",
    "RoIPool",
    "ps_roi_align",
    "ps_roi_pool",
    "roi_align",
    "roi_pool",
]
__dir__ = public_dir(__name__, __all__)

Impl = Literal["auto", "torch", "triton"]


def _pair(output_size: Any) -> tuple[int, int]:
    """``output_size`` as ``(height, width)`` of positive ints."""
    if type(output_size) is int and output_size > 0:  # the usual call
        return output_size, output_size
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        output_size = (output_size, output_size)
    if (
        not isinstance(output_size, (tuple, list))
        or len(output_size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in output_size)
    ):
        raise TypeError(f"output_size must be an int or a pair of ints, got {output_size!r}")
    if min(output_size) < 1:
        raise ValueError(f"output_size must be positive, got {tuple(output_size)}")
    return int(output_size[0]), int(output_size[1])


def _rois(
    input: Tensor, boxes: Any, dtype: torch.dtype, sides: tuple[float, float] | None = None
) -> Tensor:
    """``boxes`` as checked ``(K, 5)`` rois of ``dtype`` on ``input``'s device; ``sides``:
    the largest box width and height adaptive sampling takes (`_adaptive_sides`)."""
    if isinstance(boxes, Tensor):
        if boxes.dtype != dtype:
            boxes = check_real("boxes", boxes).to(dtype)
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ValueError(
                "boxes must be a Tensor[K, 5] of (batch index, x1, y1, x2, y2) or a list of "
                f"Tensor[L, 4], got a tensor of shape {tuple(boxes.shape)}"
            )
        if not (boxes.is_cpu and input.is_cpu) and boxes.device != input.device:
            raise ValueError(f"boxes are on {boxes.device} but input is on {input.device}")
        if boxes.shape[0] and reads_values(boxes):
            _check_values(boxes, input.shape[0], sides)
        return boxes
    if not isinstance(boxes, (list, tuple)):
        raise TypeError(
            f"boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes).__name__}"
        )
    for i, b in enumerate(boxes):
        check_real(f"boxes[{i}]", b)
        if b.dim() != 2 or b.shape[1] != 4:
            raise ValueError(f"boxes[{i}] must be a Tensor[L, 4], got shape {tuple(b.shape)}")
        if b.device != input.device:
            raise ValueError(f"boxes[{i}] is on {b.device} but input is on {input.device}")
    if len(boxes) > input.shape[0]:
        raise ValueError(f"boxes has {len(boxes)} tensors but input has {input.shape[0]} images")
    if not boxes:
        return input.new_zeros((0, 5), dtype=dtype)
    index = [
        torch.full((b.shape[0], 1), i, dtype=dtype, device=b.device) for i, b in enumerate(boxes)
    ]
    rois = torch.cat([torch.cat(index), torch.cat(list(boxes)).to(dtype)], 1)
    if rois.shape[0] and reads_values(rois):
        _check_values(rois, input.shape[0], sides)
    return rois


def _check_values(rois: Tensor, images: int, sides: tuple[float, float] | None) -> None:
    """Refuse what torchvision's CPU kernels read out of bounds on: a batch index out of
    range, a NaN or infinite coordinate (a crash, or an allocation error far from its cause);
    a fractional batch index (truncated there); with ``sides``, a box wider or taller than
    adaptive sampling allows (`_adaptive_sides`)."""
    if rois.shape[0] <= 64:  # few boxes: a list read (cheaper than reductions)
        values = rois.reshape(-1).tolist()
        index = values[::5]
        low, high, total = min(index), max(index), sum(values)
        whole = all(map(float.is_integer, index))  # False for NaN and inf: tested after
        width = height = 0.0
        if sides is not None:  # the largest side first; each axis only past the lower limit
            ends, starts = values[3::5] + values[4::5], values[1::5] + values[2::5]
            if max(map(operator.sub, ends, starts)) > min(sides):
                width = max(map(operator.sub, values[3::5], values[1::5]))
                height = max(map(operator.sub, values[4::5], values[2::5]))
    else:
        column = rois.select(1, 0)
        low, high = (v.item() for v in column.aminmax())
        total = rois.sum(dtype=torch.float64).item()  # no float32 box overflows it
        whole = torch.equal(column, column.trunc())
        width = height = 0.0
        if sides is not None and math.isfinite(total):
            width, height = (rois[:, 3:5] - rois[:, 1:3]).amax(0).tolist()
    if not math.isfinite(total):  # some value is NaN or infinite
        bad = ~torch.isfinite(rois)
        raise ValueError(
            f"boxes must hold finite values, got {rois[bad.any(1)][:3].tolist()} (rows with "
            "NaN or inf, as (batch index, x1, y1, x2, y2))"
        )
    if not (whole and 0 <= low <= high < images):
        column = rois.select(1, 0)
        bad = column[(column != column.trunc()) | (column < 0) | (column >= images)]
        raise ValueError(
            f"boxes[:, 0] must hold integer batch indices of input, in [0, {images - 1}], got "
            f"{bad[:3].tolist()}"
        )
    if sides is not None and (width > sides[0] or height > sides[1]):
        raise ValueError(
            f"boxes up to {width:g} wide and {height:g} tall take more than {_MAX_SAMPLES} "
            "samples per bin side with sampling_ratio <= 0 (ceil(side * spatial_scale / "
            f"bins)); at most {sides[0]:g} wide and {sides[1]:g} tall here: give a "
            f"sampling_ratio in [1, {_MAX_SAMPLES}]"
        )


def _check_map(name: str, input: Tensor) -> None:
    """Shapes only: ``(N, C, H, W)`` with ``H, W >= 1`` (torchvision's kernels crash on an
    empty map)."""
    if input.dim() != 4 or not (input.shape[2] and input.shape[3]):
        raise ValueError(
            f"{name} must have shape (N, C, H, W) with H, W >= 1, got {tuple(input.shape)}"
        )


_MAX_SAMPLES = 1024
"""Samples per bin axis, given (``sampling_ratio``) or adaptive: a million per bin at most,
so no call runs for hours or sizes torchvision's sampling tables past any memory."""


def _adaptive_sides(size: tuple[int, int], scale: float) -> tuple[float, float]:
    """The largest box width and height (box units) whose adaptive sampling
    (``sampling_ratio <= 0``: ``ceil(side * scale / bins)`` per bin axis) stays within
    `_MAX_SAMPLES`."""
    return _MAX_SAMPLES * size[1] / scale, _MAX_SAMPLES * size[0] / scale


def _prepare(
    input: Any, boxes: Any, output_size: Any, spatial_scale: Any, sampling_ratio: int = 1
) -> tuple[Tensor, Tensor, tuple[int, int], float, torch.dtype]:
    """Checked input in its compute dtype, ``(K, 5)`` rois, ``(PH, PW)``, the scale and
    the input's dtype."""
    if type(input) is not Tensor or not input.is_floating_point():  # a plain float tensor: ok
        check_floating("input", input)
    if input.dim() != 4 or (not input.numel() and not (input.shape[2] and input.shape[3])):
        _check_map("input", input)
    size = _pair(output_size)
    if type(spatial_scale) is not float or not 0 < spatial_scale < math.inf:
        scale = check_number("spatial_scale", spatial_scale, 0.0, low_inclusive=False)
        spatial_scale = check_finite("spatial_scale", scale)
    dtype = input.dtype
    if dtype is not torch.float32 and dtype is not torch.float64:
        dtype = compute_dtype(dtype)
    sides = None if sampling_ratio > 0 else _adaptive_sides(size, spatial_scale)
    rois = _rois(input, boxes, dtype, sides)
    if size[0] * size[1] > 2**16:  # beyond any real use: before torchvision allocates
        check_allocation(f"output_size={size}", (rois.shape[0], input.shape[1], *size), dtype)
    x = input if input.dtype == dtype else input.to(dtype)
    return x, rois, size, spatial_scale, input.dtype


def _sampling(sampling_ratio: Any) -> int:
    """An int, at most `_MAX_SAMPLES`."""
    if type(sampling_ratio) is int and sampling_ratio <= _MAX_SAMPLES:  # the usual call
        return sampling_ratio
    return check_int("sampling_ratio", sampling_ratio, None, _MAX_SAMPLES)


def _check_ps(input: Tensor, size: tuple[int, int]) -> None:
    if input.shape[1] % (size[0] * size[1]):
        raise ValueError(
            f"input's channels ({input.shape[1]}) must be a multiple of output_size[0] * "
            f"output_size[1] = {size[0] * size[1]}"
        )


_GATHER_MIN_WORK = {"one thread": 400_000, "threads": 10_000_000}
"""CPU `roi_align` with ``sampling_ratio > 0`` whose input gradient is needed takes the
gather backward (`_roi_align_gather`) from this much work, ``K * C * PH * PW *
sampling_ratio ** 2`` (a rule on shapes only): on one thread, or on more (or while
compiling, the thread count unknown: its parallel regions stall on a busy machine, where
torchvision's kernel is serial). torchvision's backward below."""
_GATHER_FORWARD_MIN_WORK = {"one thread": 1_600_000, "threads": 10_000_000}
"""From this much work a call whose backward gathers gathers its forward too (equal to
torchvision's to float rounding), the samples found once for both passes. Without a
gradient the forward is torchvision's kernel: on its own the gather is slower on small maps."""


def _gathers(input: Tensor, rois: Tensor, ph: int, pw: int, sr: int) -> tuple[bool, bool]:
    """Whether the backward, and whether the forward, take the gather."""
    work = rois.shape[0] * input.shape[1] * ph * pw * sr * sr
    one = (
        "one thread"
        if not torch.compiler.is_compiling() and torch.get_num_threads() == 1
        else "threads"
    )
    backward = input.requires_grad and torch.is_grad_enabled() and work >= _GATHER_MIN_WORK[one]
    return backward, backward and work >= _GATHER_FORWARD_MIN_WORK[one]


def _run(op: str, dtype: torch.dtype, impl: str, input: Tensor, rois: Tensor, *args: Any) -> Tensor:
    """torchvision's op, with the Triton backward or the CPU gathers where dispatch picks."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    if use_triton(op, impl, input, rois, auto=deterministic):
        from visionblocks.kernels.roi_align import roi_pool_triton

        out = roi_pool_triton(op, input, rois, *args, forced=forced_triton(impl))
    elif (
        op == "roi_align"
        and input.is_cpu
        and args[3] > 0
        and (gathers := _gathers(input, rois, *args[1:4]))[0]
    ):
        from visionblocks.ops._roi_align_gather import roi_align_gather

        out = roi_align_gather(input, rois, *args, forward=gathers[1])
    else:
        import torchvision.ops  # registers torch.ops.torchvision

        if deterministic and input.is_cuda and op == "roi_align":  # its deterministic formula
            out = torchvision.ops.roi_align(input, rois, args[1:3], args[0], *args[3:])
        else:
            out = getattr(torch.ops.torchvision, op)(input, rois, *args)
            out = out if op == "roi_align" else out[0]
    return out if out.dtype == dtype else out.to(dtype)


def roi_align(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    *,
    impl: Impl = "auto",
) -> Tensor:
    """RoI Align (Mask R-CNN): the average of bilinear samples in each bin of each box.

    Args:
        input (Tensor[N, C, H, W]): Feature maps, floating point.
        boxes (Tensor[K, 5] or list[Tensor[L, 4]]): ``(batch index, x1, y1, x2, y2)`` rows,
            or one tensor of ``"xyxy"`` boxes per image; on ``input``'s device.
        output_size: Bins per box, ``int`` or ``(height, width)``.
        spatial_scale: Feature-map pixels per box unit (``1/16`` for stride 16); ``> 0``.
        sampling_ratio: Samples per bin along each axis (at most 1024); ``<= 0``:
            ``ceil(box size / bins)`` (at most 1024 too: CPU value check).
        aligned: True: pixel centres at ``+ 0.5`` (our convention, see the module notes).
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``: the backward (module notes).

    Returns:
        Tensor[K, C, output_size[0], output_size[1]]: In ``input``'s dtype.

    Raises:
        TypeError: A non-floating ``input``, boxes that are not a tensor or a list of
            tensors, a non-int ``output_size``/``sampling_ratio``, a non-bool ``aligned``.
        ValueError: Shapes other than the above (``H`` or ``W`` 0 too), boxes on another
            device, batch indices out of range or not integers (CPU), ``spatial_scale <= 0``
            or non-finite, ``sampling_ratio > 1024`` (or adaptive sampling past it, CPU),
            an output too large to allocate, an unknown ``impl``.

    Examples:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> roi_align(x, [torch.tensor([[0.0, 0.0, 2.0, 2.0]])], 1, aligned=True)
        tensor([[[[2.5000]]]])
    """
    _sampling(sampling_ratio)
    input, rois, (ph, pw), scale, dtype = _prepare(
        input, boxes, output_size, spatial_scale, sampling_ratio
    )
    if aligned is not False and aligned is not True:
        check_type("aligned", aligned, bool)
    return _run("roi_align", dtype, impl, input, rois, scale, ph, pw, sampling_ratio, aligned)


def roi_pool(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int],
    spatial_scale: float = 1.0,
    *,
    impl: Impl = "auto",
) -> Tensor:
    """RoI max pooling (Fast R-CNN) over boxes rounded to whole feature pixels.

    Args:
        input (Tensor[N, C, H, W]): Feature maps, floating point.
        boxes (Tensor[K, 5] or list[Tensor[L, 4]]): As `roi_align`.
        output_size: Bins per box, ``int`` or ``(height, width)``.
        spatial_scale: Feature-map pixels per box unit; ``> 0``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``: the backward (module notes).

    Returns:
        Tensor[K, C, output_size[0], output_size[1]]: The maxima (0 for an empty bin).

    Raises:
        TypeError, ValueError: As `roi_align`.

    Examples:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> roi_pool(x, torch.tensor([[0.0, 0.0, 0.0, 3.0, 3.0]]), 2)
        tensor([[[[ 5.,  7.],
                  [13., 15.]]]])
    """
    input, rois, (ph, pw), scale, dtype = _prepare(input, boxes, output_size, spatial_scale)
    return _run("roi_pool", dtype, impl, input, rois, scale, ph, pw)


def ps_roi_align(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    *,
    impl: Impl = "auto",
) -> Tensor:
    """Position-sensitive RoI Align (R-FCN): bin ``(i, j)`` of output channel ``c`` samples
    input channel ``(c * PH + i) * PW + j``.

    Args:
        input (Tensor[N, C, H, W]): Feature maps; ``C`` a multiple of ``PH * PW``.
        boxes (Tensor[K, 5] or list[Tensor[L, 4]]): As `roi_align`.
        output_size: ``(PH, PW)`` bins per box, or one int.
        spatial_scale: Feature-map pixels per box unit; ``> 0``.
        sampling_ratio: As `roi_align`.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``: the backward (module notes).

    Returns:
        Tensor[K, C / (PH * PW), PH, PW]: In ``input``'s dtype.

    Raises:
        TypeError, ValueError: As `roi_align`, or ``C`` not a multiple of ``PH * PW``.

    Examples:
        >>> x = torch.ones(1, 8, 5, 5)
        >>> ps_roi_align(x, torch.tensor([[0.0, 1.0, 1.0, 3.0, 3.0]]), 2).shape
        torch.Size([1, 2, 2, 2])
    """
    _sampling(sampling_ratio)
    input, rois, (ph, pw), scale, dtype = _prepare(
        input, boxes, output_size, spatial_scale, sampling_ratio
    )
    _check_ps(input, (ph, pw))
    return _run("ps_roi_align", dtype, impl, input, rois, scale, ph, pw, sampling_ratio)


def ps_roi_pool(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int],
    spatial_scale: float = 1.0,
    *,
    impl: Impl = "auto",
) -> Tensor:
    """Position-sensitive RoI average pooling (R-FCN) over boxes rounded to whole pixels.

    Args:
        input (Tensor[N, C, H, W]): Feature maps; ``C`` a multiple of ``PH * PW``.
        boxes (Tensor[K, 5] or list[Tensor[L, 4]]): As `roi_align`.
        output_size: ``(PH, PW)`` bins per box, or one int.
        spatial_scale: Feature-map pixels per box unit; ``> 0``.
        impl: ``"auto"`` | ``"torch"`` | ``"triton"``: the backward (module notes).

    Returns:
        Tensor[K, C / (PH * PW), PH, PW]: In ``input``'s dtype.

    Raises:
        TypeError, ValueError: As `ps_roi_align`.

    Examples:
        >>> x = torch.ones(1, 4, 5, 5)
        >>> ps_roi_pool(x, torch.tensor([[0.0, 0.0, 0.0, 4.0, 4.0]]), 2)
        tensor([[[[1., 1.],
                  [1., 1.]]]])
    """
    input, rois, (ph, pw), scale, dtype = _prepare(input, boxes, output_size, spatial_scale)
    _check_ps(input, (ph, pw))
    return _run("ps_roi_pool", dtype, impl, input, rois, scale, ph, pw)


class _RoIModule(nn.Module):
    """The options of one RoI pooling function, checked once; ``forward(input, boxes)``."""

    _fn: Any
    _options: tuple[str, ...] = ("output_size", "spatial_scale")

    def __init__(self, output_size: int | tuple[int, int], spatial_scale: float, **options: Any):
        super().__init__()
        self.output_size = _pair(
            tuple(output_size) if isinstance(output_size, list) else output_size
        )
        check_finite(
            "spatial_scale", check_number("spatial_scale", spatial_scale, 0.0, low_inclusive=False)
        )
        self.spatial_scale = float(spatial_scale)
        if "sampling_ratio" in options:
            options["sampling_ratio"] = _sampling(options["sampling_ratio"])
        if "aligned" in options:
            check_type("aligned", options["aligned"], bool)
        self.options = options

    def forward(self, input: Tensor, boxes: Tensor | list[Tensor]) -> Tensor:
        """Pool ``boxes`` (``(K, 5)`` rows or a list of ``(L, 4)``) from ``input``."""
        return type(self)._fn(input, boxes, self.output_size, self.spatial_scale, **self.options)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.options.items())
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}{extra}"


class RoIAlign(_RoIModule):
    """Module form of `roi_align` (torchvision's ``RoIAlign``, the same arguments).

    Examples:
        >>> layer = RoIAlign(2, spatial_scale=0.5, sampling_ratio=2, aligned=True)
        >>> layer(torch.rand(1, 3, 8, 8), torch.tensor([[0.0, 0.0, 0.0, 8.0, 8.0]])).shape
        torch.Size([1, 3, 2, 2])
    """

    _fn = staticmethod(roi_align)

    def __init__(
        self,
        output_size: int | tuple[int, int],
        spatial_scale: float,
        sampling_ratio: int,
        aligned: bool = False,
    ) -> None:
        super().__init__(output_size, spatial_scale, sampling_ratio=sampling_ratio, aligned=aligned)


class RoIPool(_RoIModule):
    """Module form of `roi_pool` (torchvision's ``RoIPool``).

    Examples:
        >>> layer = RoIPool(2, spatial_scale=1.0)
        >>> layer(torch.rand(1, 3, 8, 8), [torch.tensor([[0.0, 0.0, 4.0, 4.0]])]).shape
        torch.Size([1, 3, 2, 2])
    """

    _fn = staticmethod(roi_pool)

    def __init__(self, output_size: int | tuple[int, int], spatial_scale: float) -> None:
        super().__init__(output_size, spatial_scale)


class PSRoIAlign(_RoIModule):
    """Module form of `ps_roi_align` (torchvision's ``PSRoIAlign``).

    Examples:
        >>> layer = PSRoIAlign(2, spatial_scale=1.0, sampling_ratio=2)
        >>> layer(torch.rand(1, 8, 8, 8), [torch.tensor([[0.0, 0.0, 4.0, 4.0]])]).shape
        torch.Size([1, 2, 2, 2])
    """

    _fn = staticmethod(ps_roi_align)

    def __init__(
        self, output_size: int | tuple[int, int], spatial_scale: float, sampling_ratio: int
    ) -> None:
        super().__init__(output_size, spatial_scale, sampling_ratio=sampling_ratio)


class PSRoIPool(_RoIModule):
    """Module form of `ps_roi_pool` (torchvision's ``PSRoIPool``).

    Examples:
        >>> layer = PSRoIPool(2, spatial_scale=1.0)
        >>> layer(torch.rand(1, 8, 8, 8), [torch.tensor([[0.0, 0.0, 4.0, 4.0]])]).shape
        torch.Size([1, 2, 2, 2])
    """

    _fn = staticmethod(ps_roi_pool)

    def __init__(self, output_size: int | tuple[int, int], spatial_scale: float) -> None:
        super().__init__(output_size, spatial_scale)
