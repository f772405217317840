"""Detection priors on the feature grids: anchor points and anchor boxes.

- `make_anchor_points`: one point per feature-map cell, as ultralytics' ``make_anchors``
  (YOLOv8-11, TOOD and the other anchor-free heads);
- `make_anchor_boxes` and its module `AnchorGenerator`: ``len(sizes) x len(aspect_ratios)``
  boxes per cell, as torchvision's ``AnchorGenerator`` (RetinaNet, Faster R-CNN). The module
  is a drop-in for torchvision's in its detection models.

Every level is given by its feature map (a tensor ``(..., H, W)``) or its size ``(H, W)``;
the priors of all levels are concatenated, finest first as given, cells row-major. No values
are read on the host; everything compiles with ``torch.compile(fullgraph=True)``.

Convention:
    Points are ``(x, y)`` and boxes ``"xyxy"`` (`visionblocks.ops.boxes`). The cell ``(i, j)``
    (row ``i``, column ``j``) of a level with stride ``s`` has its anchor point at ``(j +
    grid_cell_offset, i + grid_cell_offset)`` in grid units (multiply by the stride tensor for
    pixels, as ultralytics does); its anchor boxes are centred on the pixel ``(j s, i s)``
    (torchvision's grid: the cell's top-left corner, not its centre).

Dtypes:
    Priors are float32 whatever the features' dtype: their values (integers, half-integers and
    torchvision's rounded anchors) are exact in float32 up to ``2**23``, where float16 and
    bfloat16 are not (ultralytics and torchvision follow the features' dtype: a float16 point
    ``1024.5`` reads ``1024``). Float32 values equal ultralytics' and torchvision's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_tensor

__all__ = ["AnchorGenerator", "make_anchor_boxes", "make_anchor_points"]
__dir__ = public_dir(__name__, __all__)

_INT = (int, torch.SymInt)


def _grid_sizes(name: str, feature_sizes: Any) -> tuple[list[tuple[Any, Any]], torch.device]:
    """``(H, W)`` of every level and the device of the first feature map (CPU if none)."""
    if isinstance(feature_sizes, (str, Tensor)) or not isinstance(feature_sizes, Sequence):
        raise TypeError(
            f"{name} must be a list of feature maps (..., H, W) or of (H, W) sizes, got "
            f"{type(feature_sizes).__name__}"
        )
    sizes, device = [], None
    for i, item in enumerate(feature_sizes):
        where = f"{name}[{i}]"
        if isinstance(item, Tensor):
            if item.dim() < 2:
                raise ValueError(
                    f"{where} must be a feature map (..., H, W), got {tuple(item.shape)}"
                )
            device = item.device if device is None else device
            if item.device != device:
                raise ValueError(f"{where} is on {item.device} but the first map is on {device}")
            sizes.append(tuple(item.shape[-2:]))
            continue
        if isinstance(item, str) or not isinstance(item, Sequence) or len(item) != 2:
            raise TypeError(f"{where} must be a feature map or an (H, W) pair, got {item!r}")
        for side in item:
            check_type(where, side, _INT)
            if isinstance(side, int) and side < 0:
                raise ValueError(f"{where} must be non-negative sizes, got {tuple(item)}")
        sizes.append(tuple(item))
    return sizes, torch.device("cpu") if device is None else device


def _check_strides(name: str, strides: Any, levels: int, pairs: bool) -> list[Any] | Tensor:
    """Positive strides, one per level: numbers (``pairs``: also ``(sh, sw)``), or a 1-D
    tensor of them (whose values are not read)."""
    if isinstance(strides, Tensor):
        if pairs or strides.dim() != 1 or strides.shape[0] != levels or strides.is_complex():
            raise ValueError(
                f"{name} must have one stride per level of feature_sizes ({levels}), got a "
                f"tensor of shape {tuple(strides.shape)}"
            )
        return strides
    if isinstance(strides, str) or not isinstance(strides, Sequence) or len(strides) != levels:
        raise ValueError(
            f"{name} must have one stride per level of feature_sizes ({levels}), got {strides!r}"
        )
    out = []
    for i, stride in enumerate(strides):
        where = f"{name}[{i}]"
        if pairs:
            values = stride if isinstance(stride, Sequence) and len(stride) == 2 else (stride,)
            for value in values:
                check_type(where, value, _INT)
                if isinstance(value, int) and value < 1:
                    raise ValueError(f"{where} must be positive, got {stride!r}")
            out.append(tuple(values) * (3 - len(values)))
        else:
            out.append(check_number(where, stride, 0.0, low_inclusive=False))
    return out


def make_anchor_points(
    feature_sizes: Sequence[Tensor | Sequence[int]],
    strides: Sequence[float] | Tensor,
    grid_cell_offset: float = 0.5,
    *,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Anchor points of every feature-map cell and their strides: ultralytics' ``make_anchors``.

    Equal to ``ultralytics.utils.tal.make_anchors(feats, strides, grid_cell_offset)`` (float32
    always, see the module's Dtypes). Points are in grid units; ``points * stride_tensor``
    gives pixels.

    Args:
        feature_sizes: One entry per level: its feature map ``(..., H, W)`` or its ``(H, W)``.
        strides: The stride of each level (numbers > 0, or a 1-D tensor, such as a YOLO
            model's ``stride``).
        grid_cell_offset: Offset of the point in its cell, in cells (0.5: the centre).
        device: Device of the result when ``feature_sizes`` holds no tensor (default CPU);
            otherwise the first feature map's.

    Returns:
        tuple[Tensor, Tensor]: ``points (A, 2)`` ``(x, y)`` and ``stride_tensor (A, 1)``, both
        float32, ``A = sum(H * W)``.

    Raises:
        TypeError: ``feature_sizes`` not a list of tensors or ``(H, W)`` pairs; a stride or
            ``grid_cell_offset`` not a number.
        ValueError: A feature map with fewer than 2 dims, a negative size, feature maps on
            several devices, strides not one positive number per level, a non-finite
            ``grid_cell_offset``.

    Examples:
        >>> points, strides = make_anchor_points([(1, 2), (1, 1)], [8, 16])
        >>> points
        tensor([[0.5000, 0.5000],
                [1.5000, 0.5000],
                [0.5000, 0.5000]])
        >>> strides.flatten()
        tensor([ 8.,  8., 16.])
    """
    sizes, found = _grid_sizes("feature_sizes", feature_sizes)
    steps = _check_strides("strides", strides, len(sizes), pairs=False)
    offset = check_number("grid_cell_offset", grid_cell_offset)
    if offset - offset != 0:
        raise ValueError(f"grid_cell_offset must be a finite number, got {grid_cell_offset!r}")
    if device is not None and not any(isinstance(f, Tensor) for f in feature_sizes):
        found = torch.device(device)
    if isinstance(steps, Tensor):
        steps = steps.to(device=found, dtype=torch.float32)
    points, stride_tensor = [], []
    for level, (h, w) in enumerate(sizes):
        sx = torch.arange(w, dtype=torch.float32, device=found) + offset
        sy = torch.arange(h, dtype=torch.float32, device=found) + offset
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride = steps[level]
        if isinstance(stride, Tensor):
            stride_tensor.append(stride.expand(h * w, 1))
        else:
            stride_tensor.append(torch.full((h * w, 1), stride, dtype=torch.float32, device=found))
    if not points:
        return torch.zeros(0, 2, device=found), torch.zeros(0, 1, device=found)
    return torch.cat(points), torch.cat(stride_tensor)


def _per_level(sizes: Any, aspect_ratios: Any) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """torchvision's conventions: a flat ``sizes`` is one size per level, flat
    ``aspect_ratios`` the same ratios on every level; both checked positive and finite."""

    def nested(name: str, value: Any) -> bool:
        if isinstance(value, (str, Tensor)) or not isinstance(value, Sequence) or not value:
            raise TypeError(
                f"{name} must be a non-empty list of numbers or of lists, got {value!r}"
            )
        return isinstance(value[0], Sequence)

    if not nested("sizes", sizes):
        sizes = tuple((s,) for s in sizes)
    if not nested("aspect_ratios", aspect_ratios):
        aspect_ratios = (aspect_ratios,) * len(sizes)
    if len(sizes) != len(aspect_ratios):
        raise ValueError(
            f"sizes and aspect_ratios must have one entry per level, got {len(sizes)} and "
            f"{len(aspect_ratios)}"
        )
    out = []
    for name, per_level in (("sizes", sizes), ("aspect_ratios", aspect_ratios)):
        levels = []
        for i, values in enumerate(per_level):
            where = f"{name}[{i}]"
            if isinstance(values, str) or not isinstance(values, Sequence) or not values:
                raise TypeError(f"{where} must be a non-empty list of numbers, got {values!r}")
            for value in values:
                check_number(where, value, 0.0, low_inclusive=False)
                if value - value != 0:
                    raise ValueError(f"{where} must be finite, got {value!r}")
            levels.append(tuple(float(v) for v in values))
        out.append(tuple(levels))
    return tuple(zip(*out))


def _cell_anchors(sizes: tuple[float, ...], ratios: tuple[float, ...]) -> Tensor:
    """torchvision's zero-centred cell anchors ``(R * S, 4)``, ratio-major, on the CPU in
    float32 (its ``generate_anchors``, step for step: the rounding depends on it)."""
    scales = torch.tensor(sizes, dtype=torch.float32)
    h_ratios = torch.sqrt(torch.tensor(ratios, dtype=torch.float32))
    w_ratios = 1 / h_ratios
    ws = (w_ratios[:, None] * scales[None, :]).view(-1)
    hs = (h_ratios[:, None] * scales[None, :]).view(-1)
    return (torch.stack([-ws, -hs, ws, hs], dim=1) / 2).round()


def _grid_anchors(
    grid_sizes: Sequence[tuple[Any, Any]],
    strides: Sequence[tuple[Any, Any]],
    cell_anchors: Sequence[Tensor],
    device: torch.device,
) -> Tensor:
    """Cell anchors shifted to every cell of every level, concatenated ``(A * K, 4)``."""
    anchors = []
    for (h, w), (sh, sw), cell in zip(grid_sizes, strides, cell_anchors):
        shifts_x = torch.arange(w, dtype=torch.float32, device=device) * sw
        shifts_y = torch.arange(h, dtype=torch.float32, device=device) * sh
        shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x, indexing="ij")
        shift_x, shift_y = shift_x.reshape(-1), shift_y.reshape(-1)
        shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=1)
        anchors.append((shifts.view(-1, 1, 4) + cell.to(device).view(1, -1, 4)).reshape(-1, 4))
    return torch.cat(anchors) if anchors else torch.zeros(0, 4, device=device)


def make_anchor_boxes(
    feature_sizes: Sequence[Tensor | Sequence[int]],
    strides: Sequence[int | Sequence[int]],
    sizes: Sequence[float] | Sequence[Sequence[float]],
    aspect_ratios: Sequence[float] | Sequence[Sequence[float]],
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """Anchor boxes of every cell of every level, as torchvision's ``AnchorGenerator``.

    Each level gets ``len(sizes[i]) * len(aspect_ratios[i])`` anchors per cell, of area
    ``size**2`` and height / width ``aspect_ratio``, corners rounded to integers (torchvision's
    ``generate_anchors``), ordered per cell ratio-major, then size. torchvision's shorthands
    hold: flat ``sizes`` give one size per level, flat ``aspect_ratios`` the same ratios on
    every level. Equal to torchvision's anchors of one image (float32 always, see the
    module's Dtypes); its strides are ``image_size // feature_size`` per level (`AnchorGenerator`
    computes them so).

    Args:
        feature_sizes: One entry per level: its feature map ``(..., H, W)`` or its ``(H, W)``.
        strides: Each level's stride in pixels: an int or ``(stride_h, stride_w)``.
        sizes: Anchor sizes (square root of the area, pixels) per level.
        aspect_ratios: Anchor height / width ratios per level.
        device: Device of the result when ``feature_sizes`` holds no tensor (default CPU);
            otherwise the first feature map's.

    Returns:
        Tensor[A, 4]: float32 ``"xyxy"`` anchors, ``A = sum(H * W * len(sizes[i]) *
        len(aspect_ratios[i]))``.

    Raises:
        TypeError: An argument of the wrong type (see `make_anchor_points`), a size or ratio
            not a number.
        ValueError: Strides not one positive int (or pair) per level; ``sizes`` and
            ``aspect_ratios`` not one entry per level; a size or ratio not positive and finite;
            a feature map with fewer than 2 dims or a negative size.

    Examples:
        >>> make_anchor_boxes([(1, 2)], [16], sizes=[32], aspect_ratios=[0.5, 1.0])
        tensor([[-23., -11.,  23.,  11.],
                [-16., -16.,  16.,  16.],
                [ -7., -11.,  39.,  11.],
                [  0., -16.,  32.,  16.]])
    """
    grid, found = _grid_sizes("feature_sizes", feature_sizes)
    levels = _per_level(sizes, aspect_ratios)
    if len(levels) != len(grid):
        raise ValueError(
            f"sizes and aspect_ratios must have one entry per level of feature_sizes "
            f"({len(grid)}), got {len(levels)}"
        )
    steps = _check_strides("strides", strides, len(grid), pairs=True)
    if device is not None and not any(isinstance(f, Tensor) for f in feature_sizes):
        found = torch.device(device)
    cells = [_cell_anchors(s, r) for s, r in levels]
    return _grid_anchors(grid, steps, cells, found)


class AnchorGenerator(nn.Module):
    """torchvision's ``AnchorGenerator``: `make_anchor_boxes` for a batch of images.

    A drop-in for torchvision's in its detection models (``RetinaNet(...,
    anchor_generator=...)``, ``FasterRCNN``'s RPN): same arguments, ``forward(image_list,
    feature_maps)`` and ``num_anchors_per_location()``, no state-dict entries. Each level's
    stride is ``image_size // feature_size``, ``image_size`` the padded batch's ``(H, W)``.

    Args:
        sizes: Anchor sizes per level (a flat tuple: one size per level).
        aspect_ratios: Height / width ratios per level (a flat tuple: the same on every level).

    Raises:
        TypeError, ValueError: As `make_anchor_boxes`, for the arguments and for the
            feature maps given to ``forward`` (one per level, ``(..., H, W)``, and the images
            a tensor ``(..., H, W)`` or an ``ImageList``).

    Examples:
        >>> gen = AnchorGenerator(sizes=((32,), (64,)), aspect_ratios=((1.0,),) * 2)
        >>> images = torch.zeros(2, 3, 64, 64)
        >>> feats = [torch.zeros(2, 8, 2, 2), torch.zeros(2, 8, 1, 1)]
        >>> anchors = gen(images, feats)
        >>> len(anchors), anchors[0].shape, gen.num_anchors_per_location()
        (2, torch.Size([5, 4]), [1, 1])
    """

    def __init__(
        self,
        sizes: Sequence[float] | Sequence[Sequence[float]] = ((128, 256, 512),),
        aspect_ratios: Sequence[float] | Sequence[Sequence[float]] = ((0.5, 1.0, 2.0),),
    ) -> None:
        super().__init__()
        levels = _per_level(sizes, aspect_ratios)
        self.sizes = tuple(s for s, _ in levels)
        self.aspect_ratios = tuple(r for _, r in levels)
        self.cell_anchors = [_cell_anchors(s, r) for s, r in levels]

    def num_anchors_per_location(self) -> list[int]:
        """Anchors per cell of each level: ``len(sizes[i]) * len(aspect_ratios[i])``."""
        return [len(s) * len(r) for s, r in zip(self.sizes, self.aspect_ratios)]

    def forward(self, image_list: Any, feature_maps: Sequence[Tensor]) -> list[Tensor]:
        """Anchors of every image.

        Args:
            image_list: The padded batch: a tensor ``(B, C, H, W)`` or torchvision's
                ``ImageList`` (its ``tensors`` and ``image_sizes``).
            feature_maps: One feature map ``(B, C, H_i, W_i)`` per level, on one device.

        Returns:
            list[Tensor]: For every image, the float32 ``(A, 4)`` anchors (the same tensor).
        """
        images = getattr(image_list, "tensors", image_list)
        check_tensor("image_list", images)
        if images.dim() < 2:
            raise ValueError(f"image_list must be images (..., H, W), got {tuple(images.shape)}")
        grid, device = _grid_sizes("feature_maps", feature_maps)
        if len(grid) != len(self.cell_anchors):
            raise ValueError(
                f"feature_maps must have one map per level ({len(self.cell_anchors)}), got "
                f"{len(grid)}"
            )
        height, width = images.shape[-2:]
        for i, (h, w) in enumerate(grid):
            if (
                isinstance(h, int)
                and isinstance(w, int)
                and not (0 < h <= height and 0 < w <= width)
            ):
                raise ValueError(
                    f"feature_maps[{i}] must be at most the images' size {(height, width)} and "
                    f"not empty, got {(h, w)}"
                )
        strides = [(height // h, width // w) for h, w in grid]
        anchors = _grid_anchors(grid, strides, self.cell_anchors, device)
        batch = (
            len(image_list.image_sizes) if hasattr(image_list, "image_sizes") else images.shape[0]
        )
        return [anchors] * batch

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, aspect_ratios={self.aspect_ratios}"
