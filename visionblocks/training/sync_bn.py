"""`convert_sync_batchnorm`: BatchNorm statistics over every rank's batch, frozen stages kept;
`SyncBatchNorm` synchronises CPU tensors too (DDP on gloo)."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from visionblocks._core.checks import check_int, check_number, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_device, check_floating

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]
__dir__ = public_dir(__name__, __all__)

MAX_FEATURES = 2**16
"""Most channels a `SyncBatchNorm` takes (the library's channel limit, as in `visionblocks.nn`)."""

_CONVERTED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class SyncBatchNorm(nn.SyncBatchNorm):
    """A ``torch.nn.SyncBatchNorm`` whose training statistics cover every rank's batch, on
    CUDA and on the CPU.

    In training mode, with an initialized process group of more than one rank, the batch
    statistics are those of every rank's batch together: on CUDA by ``torch.nn.
    SyncBatchNorm``'s fused kernels, on the CPU by two differentiable all-reduces (a
    two-pass variance, float32 or wider). Otherwise it is a plain BatchNorm. Made by
    `convert_sync_batchnorm`. ``DistributedDataParallel`` accepts it in a CPU module (DDP's
    check is wrapped to pass over this class; torch's own is still refused there). Like
    torch's, it does not compile with ``torch.jit.script``.

    Args:
        num_features: Channels ``C``, at most 65,536.
        eps: Added to the variance, as for ``nn.BatchNorm2d``.
        momentum: Running-statistics factor (``None``: a cumulative average).
        affine: Learn a per-channel scale and shift.
        track_running_stats: Keep running statistics for eval mode.
        process_group: The group to synchronise over (default: the whole world).
        device: Device of the parameters and buffers.
        dtype: Dtype of the parameters and buffers.

    Shape:
        - Input: ``(N, C, *)``, at least 2-D.
        - Output: same shape and dtype.

    Examples:
        >>> import torch
        >>> bn = SyncBatchNorm(4)
        >>> bn(torch.randn(2, 4, 3, 3)).shape  # no process group: a plain BatchNorm
        torch.Size([2, 4, 3, 3])
        >>> isinstance(bn, torch.nn.SyncBatchNorm)
        True
    """

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
        affine: bool = True, track_running_stats: bool = True, process_group: Any = None,
        device: Any = None, dtype: Any = None,
    ) -> None:  # fmt: skip
        check_int("num_features", num_features, 1, MAX_FEATURES)
        check_number("eps", eps, 0.0)
        if momentum is not None:
            check_number("momentum", momentum, 0.0, 1.0)
        check_type("affine", affine, bool)
        check_type("track_running_stats", track_running_stats, bool)
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, process_group,
            device=device, dtype=dtype,
        )  # fmt: skip
        _let_ddp_take_cpu_layers()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        _let_ddp_take_cpu_layers()  # an unpickled or deep-copied layer goes to DDP too

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Any = None) -> nn.Module:
        """`convert_sync_batchnorm` (torch's classmethod would make torch's class, which DDP
        refuses on the CPU)."""
        return convert_sync_batchnorm(module, process_group)

    def _check_input_dim(self, input: Tensor) -> None:
        check_floating("input", input)
        if input.dim() < 2:
            raise ValueError(f"input must be (N, C, *), got shape {tuple(input.shape)}")

    def _check_non_zero_input_channels(self, input: Tensor) -> None:
        if input.size(1) != self.num_features:
            raise ValueError(
                f"input must have {self.num_features} channels (dim 1), got shape "
                f"{tuple(input.shape)}"
            )
        reference = self.weight if self.weight is not None else self.running_mean
        if reference is not None:
            check_device("input", input, reference.device, "the norm's tensors")

    def forward(self, input: Tensor) -> Tensor:
        if not (isinstance(input, Tensor) and input.device.type == "cpu"):
            return super().forward(input)  # it runs the two input checks below (ours)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        if self.training and self._world_size() > 1:
            return self._cpu_sync(input)
        # A plain BatchNorm (torch's SyncBatchNorm refuses CPU input once a process group
        # is initialized, even of one rank).
        return _BatchNorm.forward(self, input)

    def _world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group or dist.group.WORLD)

    def _cpu_sync(self, input: Tensor) -> Tensor:
        from torch.distributed.nn.functional import all_reduce

        group = self.process_group or dist.group.WORLD
        dims = [d for d in range(input.dim()) if d != 1]
        x = input.to(torch.promote_types(input.dtype, torch.float32))
        local = torch.cat([x.sum(dims), x.new_tensor([input.numel() / max(input.shape[1], 1)])])
        total = all_reduce(local, group=group)
        count = total[-1]
        if count <= 1:
            raise ValueError(
                f"SyncBatchNorm needs more than one value per channel over all ranks, got "
                f"{int(count)} (input {tuple(input.shape)} on this rank)"
            )
        shape = [1, -1] + [1] * (input.dim() - 2)
        mean = total[:-1] / count
        centered = x - mean.view(shape)
        var = all_reduce(centered.square().sum(dims), group=group) / count
        if self.track_running_stats:
            self._update_running(mean.detach(), var.detach() * (count / (count - 1)))
        y = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)

    @torch.no_grad()
    def _update_running(self, mean: Tensor, var: Tensor) -> None:
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        assert self.running_mean is not None and self.running_var is not None
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(var.to(self.running_var.dtype), factor)


@functools.cache
def _let_ddp_take_cpu_layers() -> None:
    """Let ``DistributedDataParallel`` wrap CPU modules holding our `SyncBatchNorm` (once):
    its ``_passing_sync_batchnorm_handle`` check passes over them."""
    ddp = nn.parallel.DistributedDataParallel
    check = getattr(ddp, "_passing_sync_batchnorm_handle", None)
    if check is None:  # a torch without the check
        return

    @functools.wraps(check)
    def passing_ours(self: Any, module: nn.Module) -> None:
        if getattr(self, "device_type", None) == "cpu" and all(
            isinstance(m, SyncBatchNorm)
            for m in module.modules()
            if isinstance(m, nn.SyncBatchNorm)
        ):
            return
        check(self, module)

    ddp._passing_sync_batchnorm_handle = passing_ours


def _frozen(module: nn.Module) -> bool:
    params = list(module.parameters(recurse=False))
    return bool(params) and not any(p.requires_grad for p in params)


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Make the BatchNorms that train into `SyncBatchNorm`, in place; keep frozen ones.

    A BatchNorm is left as it is when its parameters are all frozen (a `Backbone`'s
    ``frozen_stages``) or when it sits under a module whose ``norm_eval`` attribute is true:
    those never use batch statistics. A converted BatchNorm is the same object with its class
    swapped, so every reference to it (a backbone's body, hooks, an optimizer) stays valid.
    ``nn.BatchNorm1d/2d/3d`` and ``torch.nn.SyncBatchNorm`` are converted; other BatchNorm
    subclasses (timm's ``BatchNormAct2d``) are left as they are, with a warning. Call it
    before wrapping the model in ``DistributedDataParallel``.

    Args:
        module: The model (any ``nn.Module``; a BatchNorm itself too).
        process_group: The group to synchronise over (default: the whole world).

    Returns:
        nn.Module: ``module`` (converted in place).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.

    Examples:
        >>> from visionblocks.backbones import build_backbone
        >>> backbone = build_backbone("resnet18", frozen_stages=1)
        >>> bn = backbone.layer2[0].bn1
        >>> converted = convert_sync_batchnorm(backbone)
        >>> converted is backbone, backbone.layer2[0].bn1 is bn
        (True, True)
        >>> type(backbone.layer1[0].bn1).__name__, type(bn).__name__  # layer1 is frozen
        ('BatchNorm2d', 'SyncBatchNorm')
    """
    check_type("module", module, nn.Module)
    _let_ddp_take_cpu_layers()
    skipped: list[str] = []
    _convert(module, "", process_group, skipped, frozen_scope=False)
    if skipped:
        warnings.warn(
            f"convert_sync_batchnorm left {len(skipped)} BatchNorm subclass(es) with their "
            f"own forward as they are: {', '.join(skipped[:5])}"
            f"{', ...' if len(skipped) > 5 else ''} (for timm models, see "
            "timm.layers.convert_sync_batchnorm)",
            UserWarning,
            stacklevel=2,
        )
    return module


def _convert(
    module: nn.Module, path: str, group: Any, skipped: list[str], frozen_scope: bool
) -> None:
    frozen_scope = frozen_scope or bool(getattr(module, "norm_eval", False))
    if isinstance(module, _BatchNorm) and not frozen_scope and not _frozen(module):
        if type(module) in _CONVERTED:
            module.__class__ = SyncBatchNorm
            module.process_group = group
        elif type(module) is not SyncBatchNorm:
            skipped.append(f"{path or '<model>'} ({type(module).__name__})")
    for name, child in module.named_children():
        _convert(child, f"{path}.{name}" if path else name, group, skipped, frozen_scope)
