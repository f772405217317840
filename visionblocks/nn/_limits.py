"""Upper bounds on layer sizes (private): absurd sizes fail fast instead of allocating.

A typo such as ``extra_levels=10**9`` or ``in_channels=10**9`` would otherwise allocate
gigabytes or loop for hours before anything fails. The bounds are far above any real network:

- `MAX_CHANNELS` (65,536): channels of any layer, classes of a head, widths of a backbone;
- `MAX_KERNEL_SIZE` (1,024): convolution kernel side, stride, dilation and padding;
- `MAX_WINDOW` (63): the window side of the local (unfold-based) layers, whose memory grows
  with its square per pixel;
- `MAX_LAYER_WEIGHTS` (2**31, 8 GiB in float32): weights of one convolution;
- `MAX_REPEATS` (64): repeated blocks (tower convolutions, blocks per stage);
- `MAX_EXTRA_LEVELS` (8): pyramid levels added on top of a backbone;
- `MAX_STRIDE` (2**16): feature strides;
- `MAX_SIDE` (16,384): the side of dry-run inputs and output sizes.
"""

from __future__ import annotations

from visionblocks._core.checks import check_int

__all__ = [
    "MAX_CHANNELS",
    "MAX_EXTRA_LEVELS",
    "MAX_KERNEL_SIZE",
    "MAX_LAYER_WEIGHTS",
    "MAX_REPEATS",
    "MAX_SIDE",
    "MAX_STRIDE",
    "MAX_WINDOW",
    "check_channels",
    "check_conv_weights",
]

MAX_CHANNELS = 2**16
MAX_KERNEL_SIZE = 1024
MAX_WINDOW = 63
MAX_LAYER_WEIGHTS = 2**31
MAX_REPEATS = 64
MAX_EXTRA_LEVELS = 8
MAX_STRIDE = 2**16
MAX_SIDE = 16384


def check_channels(name: str, value: object) -> int:
    """A channel count: an int in ``[1, MAX_CHANNELS]``."""
    return check_int(name, value, 1, MAX_CHANNELS)


def check_conv_weights(
    in_channels: int, out_channels: int, kernel_size: tuple[int, int], groups: int
) -> None:
    """Raise ``ValueError`` if a convolution would hold more than `MAX_LAYER_WEIGHTS` weights."""
    weights = in_channels // groups * out_channels * kernel_size[0] * kernel_size[1]
    if weights > MAX_LAYER_WEIGHTS:
        raise ValueError(
            f"in_channels={in_channels}, out_channels={out_channels}, "
            f"kernel_size={kernel_size}, groups={groups} give {weights:,} weights, more than "
            f"the {MAX_LAYER_WEIGHTS:,} one layer may hold (8 GiB in float32)"
        )
