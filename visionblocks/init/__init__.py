"""Weight initializers with group-aware fans, and rule-based `init_weights`.

Every initializer fills one module's ``weight`` and, when the module has one, its ``bias``
(``bias=None`` leaves the bias untouched). Called directly on a module without a weight
tensor (``nn.ReLU()``, or a norm layer with ``affine=False``) an initializer raises
``TypeError``; `init_weights` rules simply skip such modules.

Fans are group-aware: for grouped, depthwise and transposed convolutions,
``fan_in = in_channels / groups * prod(kernel_size)`` and
``fan_out = out_channels / groups * prod(kernel_size)`` (see `compute_fans`). PyTorch's own
initializers ignore ``groups`` (pytorch #23854) and read a transposed weight's dimensions
the wrong way round.

The initializers are registered in `visionblocks.registry.INITIALIZERS` as ``kaiming``,
``xavier``, ``normal``, ``trunc_normal``, ``constant``, ``c2_msra`` and ``c2_xavier``.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.init._residual import zero_init_last_norm
from visionblocks.init.initializers import (
    bias_init_with_prob,
    c2_msra_fill,
    c2_xavier_fill,
    compute_fans,
    constant_init,
    kaiming_init,
    normal_init,
    trunc_normal_init,
    xavier_init,
)
from visionblocks.init.rule_based import init_weights

__all__ = [
    "bias_init_with_prob",
    "c2_msra_fill",
    "c2_xavier_fill",
    "compute_fans",
    "constant_init",
    "init_weights",
    "kaiming_init",
    "normal_init",
    "trunc_normal_init",
    "xavier_init",
    "zero_init_last_norm",
]
__dir__ = public_dir(__name__, __all__)
