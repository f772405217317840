"""Upper bounds on layer sizes (private), far above any real network: a typo such as
``in_channels=10**9`` fails fast instead of allocating gigabytes or looping for hours."""

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

MAX_CHANNELS = 2**16  # channels of any layer, classes of a head, widths of a backbone
MAX_KERNEL_SIZE = 1024  # convolution kernel side, stride, dilation and padding
MAX_WINDOW = 63  # window side of the local layers (memory grows with its square)
MAX_LAYER_WEIGHTS = 2**31  # weights of one convolution (8 GiB in float32)
MAX_REPEATS = 64  # repeated blocks (tower convolutions, blocks per stage)
MAX_EXTRA_LEVELS = 8  # pyramid levels added on top of a backbone
MAX_STRIDE = 2**16  # feature strides
MAX_SIDE = 16384  # side of dry-run inputs and output sizes


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
