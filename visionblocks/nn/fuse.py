"""Conv + BatchNorm folding for inference.

In eval mode a BatchNorm is a per-channel affine map,
``bn(y) = (y - mean) * gamma / sqrt(var + eps) + beta``, so it folds into the convolution before
it: ``W' = W * s`` (per output channel), ``b' = (b - mean) * s + beta`` with
``s = gamma / sqrt(var + eps)``. `fuse_conv_bn` folds one pair, `fuse_modules` every pair of a
model, and `find_conv_bn_pairs` says which pairs those are.

Which pairs fold: a ``nn.Conv2d`` (or a subclass that keeps ``Conv2d``'s ``forward``, or
`visionblocks.nn.conv.DepthwiseConv2d`) whose output goes **only** into a ``nn.BatchNorm2d``,
``nn.SyncBatchNorm`` or ``FrozenBatchNorm2d`` (torchvision's or
`visionblocks.nn.FrozenBatchNorm2d`) that keeps running statistics and the stock ``forward``
(norm subclasses that do more, such as timm's ``BatchNormAct2d``, are left alone). Pairs are found on the model's ``torch.fx`` graph (any wiring); a (sub)module
``torch.fx`` cannot trace is searched by structure (``nn.Sequential`` neighbours, a
`visionblocks.nn.conv.ConvNormAct`'s ``conv``/``norm``), then its children are traced. A
pair is left alone when the conv or the norm is called more than once, reachable under two
names, read directly (``self.conv.weight`` in a ``forward``) or carries forward hooks.

The folding is computed in float64 (float32 on MPS) and cast back to the conv's dtype,
inside ``torch.autocast`` too; a ``channels_last`` conv gives a channels_last fused conv.
"""

from __future__ import annotations

import copy
from collections import Counter
from functools import cache
from itertools import pairwise

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from visionblocks._core.checks import check_type
from visionblocks._core.namespace import public_dir
from visionblocks.nn.conv import ConvNormAct, DepthwiseConv2d
from visionblocks.nn.frozen_batch_norm import FrozenBatchNorm2d

__all__ = ["find_conv_bn_pairs", "fuse_conv_bn", "fuse_modules"]
__dir__ = public_dir(__name__, __all__)


@cache
def _bn_types() -> tuple[type[nn.Module], ...]:
    from torchvision.ops.misc import FrozenBatchNorm2d as TorchvisionFrozenBatchNorm2d

    return (nn.BatchNorm2d, nn.SyncBatchNorm, TorchvisionFrozenBatchNorm2d, FrozenBatchNorm2d)


def _is_plain_conv(module: nn.Module) -> bool:
    """A Conv2d whose output is exactly ``F.conv2d`` of its parameters (foldable)."""
    cls = type(module)
    return (
        isinstance(module, nn.Conv2d)
        and cls.forward in (nn.Conv2d.forward, DepthwiseConv2d.forward)
        and cls._conv_forward is nn.Conv2d._conv_forward
    )


def _is_plain_bn(module: nn.Module) -> bool:
    """A supported norm whose ``forward`` is the stock one (only normalisation: foldable)."""
    types = _bn_types()
    return isinstance(module, types) and type(module).forward in {t.forward for t in types}


def _num_features(bn: nn.Module) -> int:
    return bn.running_mean.numel()


def _uses_batch_stats(bn: nn.Module) -> bool:
    """A torch BatchNorm in training mode (``FrozenBatchNorm2d`` never uses batch statistics)."""
    return isinstance(bn, _BatchNorm) and bn.training


def _has_running_stats(bn: nn.Module) -> bool:
    return getattr(bn, "running_mean", None) is not None and bn.running_var is not None


def fuse_conv_bn(conv: nn.Conv2d, bn: nn.Module) -> nn.Conv2d:
    """Fold an eval-mode BatchNorm into the convolution before it.

    Returns a new ``nn.Conv2d`` (with a bias) computing ``bn(conv(x))`` with the running
    statistics, for convs without bias, grouped/depthwise convs, any padding mode and norms
    with ``affine=False``. The inputs are not modified.

    Args:
        conv: A ``nn.Conv2d`` (or a subclass that does not override ``forward``, or a
            `visionblocks.nn.conv.DepthwiseConv2d`).
        bn: A ``nn.BatchNorm2d`` / ``nn.SyncBatchNorm`` in eval mode with running statistics,
            or a ``FrozenBatchNorm2d`` (torchvision's or ours), with ``conv.out_channels`` features.

    Returns:
        nn.Conv2d: The fused convolution, on ``conv``'s device and dtype.

    Raises:
        TypeError: ``conv`` is not a ``nn.Conv2d`` or overrides its ``forward``; ``bn`` is
            not one of the supported norms.
        ValueError: ``bn`` is in training mode (it would use batch statistics; call ``.eval()``),
            has no running statistics (``track_running_stats=False``), or its number of features
            differs from ``conv.out_channels``; ``conv`` is an uninitialised lazy module.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> conv, bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        >>> _ = bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2.0), bn.eval()
        >>> fused = fuse_conv_bn(conv, bn)
        >>> x = torch.randn(2, 3, 16, 16)
        >>> torch.allclose(fused(x), bn(conv(x)), rtol=1e-5, atol=1e-5)
        True
    """
    check_type("conv", conv, nn.Conv2d)
    if not _is_plain_conv(conv):
        raise TypeError(
            f"cannot fold into {type(conv).__name__}: it overrides nn.Conv2d's forward, "
            "so a plain nn.Conv2d would not compute the same thing"
        )
    check_type("bn", bn, _bn_types())
    if not _is_plain_bn(bn):
        raise TypeError(
            f"cannot fold {type(bn).__name__}: it overrides the forward of "
            f"{type(bn).__mro__[1].__name__} (it may do more than normalise, e.g. apply an "
            "activation), so removing it would change the output"
        )
    if isinstance(conv.weight, nn.parameter.UninitializedParameter):
        raise ValueError("conv is an uninitialised lazy module; run one forward pass first")
    if _uses_batch_stats(bn):
        raise ValueError(
            f"{type(bn).__name__} is in training mode, where it normalises with batch "
            "statistics; folding uses its running statistics, so call .eval() first"
        )
    if not _has_running_stats(bn):
        raise ValueError(
            f"{type(bn).__name__} has no running statistics (track_running_stats=False): "
            "it normalises with batch statistics even in eval mode and cannot be folded"
        )
    if _num_features(bn) != conv.out_channels:
        raise ValueError(
            f"bn has {_num_features(bn)} features but conv has {conv.out_channels} output channels"
        )

    weight = conv.weight
    device, dtype = weight.device, weight.dtype
    work = torch.float32 if device.type == "mps" else torch.float64
    with torch.no_grad():
        mean = bn.running_mean.to(work)
        scale = torch.rsqrt(bn.running_var.to(work) + bn.eps)
        if getattr(bn, "weight", None) is not None:
            scale = scale * bn.weight.to(work)
        shift = -mean * scale
        if conv.bias is not None:
            shift = shift + conv.bias.to(work) * scale
        if getattr(bn, "bias", None) is not None:
            shift = shift + bn.bias.to(work)
        new_weight = (weight.to(work) * scale.reshape(-1, 1, 1, 1)).to(dtype)
        new_bias = shift.to(dtype)

    fused = nn.utils.skip_init(
        nn.Conv2d,
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=True,
        padding_mode=conv.padding_mode,
        device=device,
        dtype=dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(new_weight)
        fused.bias.copy_(new_bias)
    if weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous():
        fused.to(memory_format=torch.channels_last)  # a channels_last model stays one
    fused.weight.requires_grad_(weight.requires_grad)
    fused.bias.requires_grad_(weight.requires_grad)
    fused.train(conv.training)
    return fused


class _PairTracer(fx.Tracer):
    """Keeps every Conv2d and BatchNorm as one ``call_module`` node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (nn.Conv2d, _BatchNorm, *_bn_types())):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _touches(target: str, name: str) -> bool:
    return target == name or target.startswith(name + ".")


def _graph_pairs(graph: fx.Graph, module: nn.Module, prefix: str) -> list[tuple[str, str]]:
    modules = dict(module.named_modules())
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
    attrs = [n.target for n in graph.nodes if n.op == "get_attr"]
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not _is_plain_bn(modules.get(node.target)):
            continue
        if len(node.args) != 1 or node.kwargs:
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node) or src.op != "call_module":
            continue
        if not isinstance(modules.get(src.target), nn.Conv2d) or len(src.users) != 1:
            continue
        if calls[src.target] != 1 or calls[node.target] != 1:
            continue
        if any(_touches(t, src.target) or _touches(t, node.target) for t in attrs):
            continue
        pairs.append((prefix + src.target, prefix + node.target))
    return pairs


def _structural_pairs(module: nn.Module, prefix: str) -> list[tuple[str, str]]:
    if type(module).forward is nn.Sequential.forward:
        children = list(module.named_children())
        return [
            (prefix + a, prefix + b)
            for (a, conv), (b, bn) in pairwise(children)
            if isinstance(conv, nn.Conv2d) and _is_plain_bn(bn)
        ]
    if (
        isinstance(module, ConvNormAct)
        and type(module).forward is ConvNormAct.forward
        and _is_plain_bn(module.norm)
    ):
        return [(prefix + "conv", prefix + "norm")]
    return []


def _collect(module: nn.Module, prefix: str) -> list[tuple[str, str]]:
    if not any(True for _ in module.children()):
        return []
    try:
        graph = _PairTracer().trace(module)
    except Exception:  # untraceable: search by structure, then trace the children
        pairs = _structural_pairs(module, prefix)
        for name, child in module.named_children():
            pairs += _collect(child, f"{prefix}{name}.")
        return pairs
    return _graph_pairs(graph, module, prefix)


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def find_conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """Qualified names ``(conv, norm)`` of the Conv2d -> BatchNorm pairs `fuse_modules` folds.

    How pairs are found and which are left alone: the module notes. Norms without running
    statistics are left out; norms in training mode are listed (`fuse_modules` refuses to
    fold them). The model is not changed.

    Args:
        model: Any ``nn.Module``.

    Returns:
        list[tuple[str, str]]: ``(conv_name, bn_name)`` in graph order, names as in
        ``model.named_modules()``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Examples:
        >>> import torchvision
        >>> pairs = find_conv_bn_pairs(torchvision.models.resnet18())
        >>> len(pairs), pairs[0], pairs[-1]
        (20, ('conv1', 'bn1'), ('layer4.1.conv2', 'layer4.1.bn2'))
    """
    check_type("model", model, nn.Module)
    names: Counter[int] = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    pairs, seen = [], set()
    for conv_name, bn_name in _collect(model, ""):
        conv, bn = model.get_submodule(conv_name), model.get_submodule(bn_name)
        if conv_name in seen or names[id(conv)] != 1 or names[id(bn)] != 1:
            continue
        if not _is_plain_conv(conv) or _hooked(conv) or _hooked(bn):
            continue
        if not _has_running_stats(bn) or _num_features(bn) != conv.out_channels:
            continue
        seen.add(conv_name)
        pairs.append((conv_name, bn_name))
    return pairs


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, module)


def fuse_modules(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """Fold every eval-mode Conv2d -> BatchNorm pair of ``model`` for inference.

    Each pair listed by `find_conv_bn_pairs` is replaced in place in the module tree: the
    conv by `fuse_conv_bn`'s result, the norm by ``nn.Identity``. The model keeps its class,
    ``forward`` and module names, so it still traces, scripts and exports; outputs match the
    unfused eval-mode model up to float rounding. For inference only (no more normalising).

    Args:
        model: The model, in eval mode (at least every BatchNorm that follows a conv).
        inplace: Modify ``model`` itself instead of a deep copy (like
            ``torch.ao.quantization.fuse_modules``, the default returns a copy).

    Returns:
        nn.Module: The fused model (``model`` itself when ``inplace=True``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or is a ``torch.jit.ScriptModule``.
        ValueError: A BatchNorm of a pair is in training mode (nothing is modified).

    Examples:
        >>> import torch, torchvision
        >>> model = torchvision.models.resnet18().eval()
        >>> fused = fuse_modules(model)
        >>> x = torch.randn(1, 3, 64, 64)
        >>> torch.allclose(fused(x), model(x), rtol=1e-4, atol=1e-5)
        True
    """
    check_type("model", model, nn.Module)
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("fuse_modules works on eager modules, not torch.jit.ScriptModule")
    check_type("inplace", inplace, bool)
    pairs = find_conv_bn_pairs(model)
    training = [bn for _, bn in pairs if _uses_batch_stats(model.get_submodule(bn))]
    if training:
        raise ValueError(
            f"{len(training)} BatchNorm(s) that follow a conv are in training mode "
            f"(first: {training[0]!r}); folding uses running statistics, so call "
            "model.eval() before fuse_modules"
        )
    target = model if inplace else copy.deepcopy(model)
    for conv_name, bn_name in pairs:
        fused = fuse_conv_bn(target.get_submodule(conv_name), target.get_submodule(bn_name))
        _set_submodule(target, conv_name, fused)
        _set_submodule(target, bn_name, nn.Identity())
    return target
