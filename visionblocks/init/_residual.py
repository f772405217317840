"""`zero_init_last_norm`: residual blocks that start as their shortcut (private module;
re-exported by `visionblocks.init`)."""

from __future__ import annotations

import sys

from torch import nn

from visionblocks._core.checks import check_type
from visionblocks._core.registries import INITIALIZERS
from visionblocks.init._fans import zero_norm_weight
from visionblocks.init._rules import BLOCK_INITIALIZER

__all__ = ["zero_init_last_norm"]


@INITIALIZERS.register(name="zero_init_last_norm", aliases=("zero_last_norm",))
def zero_init_last_norm(model: nn.Module) -> list[str]:
    """Zero the scale of the last norm layer in every residual block, in place.

    Every block then starts as its shortcut (Goyal et al., 2017). Only the norm's ``weight``
    is zeroed, as torchvision's ``zero_init_residual`` does. For each module of
    ``model.named_modules()`` (the model itself included), the first of these that applies:

    1. A callable ``zero_init_last()`` method is called. timm's residual blocks
       (ResNet, ResNetV2, RegNet, CSPNet, ...) define it; so may ours.
    2. A ``last_norm`` attribute naming the norm of the residual branch: a (dotted)
       submodule name such as ``"bn2"`` (a class attribute is enough), or the norm module
       itself. This is the protocol for visionblocks blocks and your own.
    3. torchvision's ``BasicBlock`` (``bn2``) and ``Bottleneck`` (``bn3``).

    Registered in ``INITIALIZERS`` as ``zero_init_last_norm`` (alias ``zero_last_norm``), a
    block initializer of `init_weights`.

    Args:
        model: Any module.

    Returns:
        list[str]: Qualified names of the blocks handled, in module order (``""`` for the
        model itself). Empty when the model has no recognised block.

    Raises:
        TypeError: If ``model`` is not an ``nn.Module``, or a ``last_norm`` is neither a
            module nor a string.
        ValueError: If a ``last_norm`` names no submodule or has no affine weight.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> class Block(nn.Module):
        ...     last_norm = "bn"  # the protocol
        ...     def __init__(self, c):
        ...         super().__init__()
        ...         self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        ...     def forward(self, x):
        ...         return x + self.bn(self.conv(x))
        >>> model = nn.Sequential(Block(4), Block(4))
        >>> zero_init_last_norm(model)
        ['0', '1']
        >>> x = torch.randn(1, 4, 8, 8)
        >>> torch.equal(model(x), x)
        True
    """
    check_type("model", model, nn.Module)
    # torchvision's blocks can only exist once their module was imported.
    tv_resnet = sys.modules.get("torchvision.models.resnet")
    tv_blocks = (
        () if tv_resnet is None else ((tv_resnet.BasicBlock, "bn2"), (tv_resnet.Bottleneck, "bn3"))
    )
    handled = []
    for name, module in model.named_modules():
        hook = getattr(module, "zero_init_last", None)
        if callable(hook):
            hook()
            handled.append(name)
            continue
        norm = getattr(module, "last_norm", None)
        if norm is None:
            for cls, attr in tv_blocks:
                if isinstance(module, cls):
                    norm = getattr(module, attr)
                    break
        if norm is not None:
            zero_norm_weight(module, name, norm)
            handled.append(name)
    return handled


setattr(zero_init_last_norm, BLOCK_INITIALIZER, True)
