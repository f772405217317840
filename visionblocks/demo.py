"""Deprecated location of the demo: use `visionblocks.cli.demo` (removed in 0.3)."""

import warnings

from visionblocks.cli.demo import *  # noqa: F403
from visionblocks.cli.demo import __all__  # noqa: F401

warnings.warn(
    "visionblocks.demo moved to visionblocks.cli.demo; the old module is removed in 0.3",
    DeprecationWarning,
    stacklevel=2,
)
