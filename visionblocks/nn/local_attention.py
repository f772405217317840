"""A local self-attention layer (`visionblocks.ops.local_attention.local_attention2d`).

`LocalAttention2d`: a ``1 x 1`` convolution projects the input to queries, keys and values;
every pixel attends to its ``k x k`` neighbourhood (multi-head, masked at the image border);
a ``1 x 1`` convolution projects the result back. Like the layers of
`visionblocks.nn.involution` (whose module notes hold the export, TorchScript and size
rules), it runs its op without materialising the unfolded keys or values, except under
``torch.export`` and ``torch.jit.script``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from visionblocks._core.checkpointing import set_grad_checkpointing, without_checkpointing
from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.registries import LAYERS
from visionblocks._core.tensor_checks import check_image_batch, is_tracing
from visionblocks.nn._export_paths import local_attention_plain
from visionblocks.nn._limits import MAX_CHANNELS, MAX_KERNEL_SIZE, MAX_WINDOW
from visionblocks.ops.local_attention import local_attention2d

__all__ = ["LocalAttention2d"]
__dir__ = public_dir(__name__, __all__)


@LAYERS.register(name="local_attention")
class LocalAttention2d(nn.Module):
    """Multi-head self-attention of every pixel over its ``k x k`` neighbourhood.

    ``q, k, v = chunk(qkv(x), 3)`` (one ``1 x 1`` conv to ``3 * channels``), then
    ``out = proj(local_attention2d(q, k, v, kernel_size, dilation, num_heads))`` with a
    ``1 x 1`` conv ``proj``: the stand-alone self-attention layer of Ramachandran et al.
    with centred windows clipped (masked) at the border. Channels and size are kept.

    There is no relative position bias: the attention weights depend on content only, as
    the fused kernels compute them. Add position information before the layer where it
    matters (e.g. a depthwise ``3 x 3`` conv as a conditional positional encoding).

    Args:
        channels: Input and output channels ``C``.
        kernel_size: Window side ``k``, odd.
        num_heads: Attention heads (must divide ``channels``).
        dilation: Spacing between window taps.
        qkv_bias: Bias in the query/key/value projection.
        grad_checkpointing: Recompute the layer's activations in the backward instead of
            keeping them (`visionblocks.training.set_grad_checkpointing`).

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, C, H, W)``. Under ``torch.autocast`` in the autocast dtype: the
          ``1 x 1`` convs run in it, the attention in float32 on their q, k, v. Memory
          format of ``proj``'s output: channels_last for a channels_last module.

    Raises:
        TypeError: Non-int sizes or a non-bool ``qkv_bias``; in ``forward``, a wrong input
            type or dtype.
        ValueError: Sizes out of bounds (as `visionblocks.nn.involution`), ``num_heads`` not
            dividing ``channels``; in ``forward``, a wrong input shape or device.

    Examples:
        >>> import torch
        >>> layer = LocalAttention2d(32, kernel_size=5, num_heads=4)
        >>> layer(torch.randn(2, 32, 9, 10)).shape
        torch.Size([2, 32, 9, 10])
        >>> layer.extra_repr()
        'channels=32, kernel_size=5, num_heads=4, dilation=1, qkv_bias=True'

    References:
        Ramachandran et al., "Stand-Alone Self-Attention in Vision Models", NeurIPS 2019.
        https://arxiv.org/abs/1906.05909
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        num_heads: int = 8,
        dilation: int = 1,
        qkv_bias: bool = True,
        *,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        for name, value, high in (
            ("channels", channels, MAX_CHANNELS),
            ("kernel_size", kernel_size, MAX_WINDOW),
            ("num_heads", num_heads, MAX_CHANNELS),
            ("dilation", dilation, MAX_KERNEL_SIZE),
        ):
            check_int(name, value, 1, high)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (windows are centred), got {kernel_size}")
        if channels % num_heads:
            raise ValueError(
                f"num_heads must divide channels, got num_heads={num_heads}, channels={channels}"
            )
        check_type("qkv_bias", qkv_bias, bool)
        check_type("grad_checkpointing", grad_checkpointing, bool)
        self.channels, self.kernel_size, self.num_heads = channels, kernel_size, num_heads
        self.dilation, self.qkv_bias = dilation, qkv_bias
        self.qkv = nn.Conv2d(channels, 3 * channels, 1, bias=qkv_bias)
        self.proj = nn.Conv2d(channels, channels, 1)
        if grad_checkpointing:
            set_grad_checkpointing(self)

    def forward(self, x: Tensor) -> Tensor:
        """Attend ``x (B, C, H, W)`` to itself within each pixel's window."""
        if not torch.jit.is_scripting():  # Python only: TorchScript skips the block
            if not is_tracing(x):  # reading self.qkv.weight would show in a torch.fx graph
                check_image_batch("x", x, self.channels, weight=self.qkv.weight)
            if not torch.compiler.is_exporting():  # the threaded op does not trace
                q, k, v = self.qkv(x).chunk(3, dim=1)
                out = local_attention2d(q, k, v, self.kernel_size, self.dilation, self.num_heads)
                return self.proj(out)
        q, k, v = self.qkv(x).chunk(3, dim=1)
        # Export and TorchScript: the same maths on the unfolded windows.
        out = local_attention_plain(q, k, v, self.kernel_size, self.dilation, self.num_heads)
        return self.proj(out)

    def __prepare_scriptable__(self) -> nn.Module:
        """What ``torch.jit.script`` compiles: the layer without activation checkpointing."""
        return without_checkpointing(self)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, kernel_size={self.kernel_size}, "
            f"num_heads={self.num_heads}, dilation={self.dilation}, qkv_bias={self.qkv_bias}"
        )
