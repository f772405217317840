"""The `Backbone` module and `backbone_from_model`, which turns a classifier into one.

A backbone's parameters and state-dict keys are those of the model it was made from
(``layer1.0.conv1.weight``), minus what the outputs do not need (a classifier head), so a
checkpoint of the original model loads into it as is.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from visionblocks._core.checks import check_int, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_image_batch
from visionblocks.backbones import _checkpointing as ckpt
from visionblocks.backbones._options import (
    check_in_channels,
    check_names,
    check_parameters,
    check_pretrained,
    check_stage_names,
    first_conv,
    normalize_frozen_stages,
    normalize_out_indices,
    replace_first_conv,
)
from visionblocks.backbones._pretrained import load_pretrained
from visionblocks.features import IntermediateLayerGetter, feature_info
from visionblocks.features._capture import MirrorChildren
from visionblocks.features.getter import check_input_size
from visionblocks.nn._limits import MAX_SIDE
from visionblocks.weights import LoadReport

__all__ = ["Backbone", "backbone_from_model"]
__dir__ = public_dir(__name__, __all__)

DRY_RUN_SIZE = 64
"""Height and width of the dry-run input that measures strides (a multiple of 32)."""


def stage_name(index: int) -> str:
    """Output key of stage ``index``: ``"stage0"``, ``"stage1"``, ..."""
    return f"stage{index}"


class Backbone(ckpt.StageCheckpointing, MirrorChildren, nn.Module):
    """A feature extractor whose ``forward`` returns ``OrderedDict[str, Tensor]``.

    Wraps a *body* returning a dict (`visionblocks.features.IntermediateLayerGetter`) or a
    list (a timm ``features_only`` model) of feature maps, with the body's ``state_dict()``.

    ``feature_info`` is measured at construction by one dry run on zeros of shape
    ``(1, *input_size)`` (eval mode, no grad). ``torch.export.export`` (dynamic batch and
    image size where the model allows it), ``torch.onnx.export(..., dynamo=True)``,
    ``torch.compile`` and ``torch.jit.trace`` give the eager outputs.

    ``frozen_parameters`` (``requires_grad=False``; modules whose own parameters are all
    frozen stay in eval mode) and ``norm_eval`` survive every ``.train()`` / ``.eval()``.

    Args:
        body: The feature extractor.
        names: Output names, one per returned feature.
        input_size: ``(C, H, W)`` of the dry run measuring ``feature_info``.
        positions: Which of the body's outputs to return, in order (``None``: all).
        frozen_parameters: Parameters to freeze.
        norm_eval: Keep BatchNorms in eval mode.
        out_indices: The stage indices the outputs come from.
        num_stages: How many stages the model has in all.
        model: The model a getter body calls, if any (a child replaced later, as by
            ``nn.SyncBatchNorm.convert_sync_batchnorm``, is replaced there too).
        channels_last_outputs: The body returns ``(B, H, W, C)`` features (timm's Swin).

    Attributes:
        in_channels (int): Channels of the input (``input_size[0]``).
        load_report (LoadReport | None): What loading ``pretrained`` did (set by the builders).
        out_indices (tuple[int, ...]): Stage index of each output.
        num_stages (int): Number of stages the backbone could return.
        frozen_stages (int): Stages frozen by the builder (0 when none).
        norm_eval (bool): BatchNorms are kept in eval mode.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``OrderedDict`` ``{name: Tensor[B, channels, H / stride, W / stride]}``
          (sizes rounded as the model rounds them).

    Raises:
        TypeError: ``body`` is not an ``nn.Module``, options of the wrong type; in ``forward``, an
            input that is not a floating-point tensor of the parameters' dtype (outside autocast).
        ValueError: ``names`` and the body's outputs disagree; in ``forward``, an input that
            is not ``(B, in_channels, H, W)`` on the parameters' device.

    Examples:
        >>> import torch
        >>> from visionblocks.backbones import build_backbone
        >>> backbone = build_backbone("vb_tiny", out_indices=(-2, -1))
        >>> backbone.feature_info
        [{'name': 'stage2', 'channels': 64, 'stride': 16}, {'name': 'stage3', 'channels': 128, 'stride': 32}]
        >>> {k: tuple(v.shape) for k, v in backbone(torch.randn(2, 3, 64, 96)).items()}
        {'stage2': (2, 64, 4, 6), 'stage3': (2, 128, 2, 3)}
    """

    def __init__(
        self,
        body: nn.Module,
        names: Sequence[str],
        *,
        input_size: Sequence[int] = (3, DRY_RUN_SIZE, DRY_RUN_SIZE),
        positions: Sequence[int] | None = None,
        frozen_parameters: Iterable[nn.Parameter] = (),
        norm_eval: bool = False,
        out_indices: Sequence[int] | None = None,
        num_stages: int | None = None,
        model: nn.Module | None = None,
        channels_last_outputs: bool = False,
    ) -> None:
        super().__init__()
        check_type("body", body, nn.Module)
        names = check_names("names", names, str)
        if positions is not None:
            positions = check_names("positions", positions, int)
        if out_indices is not None:
            out_indices = check_names("out_indices", out_indices, int)
            if len(out_indices) != len(names) or len(set(out_indices)) != len(out_indices):
                raise ValueError(
                    f"out_indices must hold one distinct stage index per entry of names "
                    f"({len(names)}), got {list(out_indices)}"
                )
        if num_stages is not None:
            check_int("num_stages", num_stages, 1)
        frozen_parameters = check_parameters("frozen_parameters", frozen_parameters)
        check_type("channels_last_outputs", channels_last_outputs, bool)
        self._nhwc = channels_last_outputs
        check_type("norm_eval", norm_eval, bool)
        if model is not None:
            check_type("model", model, nn.Module)
        mode = body.training
        object.__setattr__(self, "_body", body)
        # A replaced child (convert_sync_batchnorm) is replaced in the body and in the model
        # the body calls too, so that the forward runs the new module.
        object.__setattr__(self, "_originals", (body,) if model is None else (body, model))
        for name, child in body.named_children():
            self.add_module(name, child)
        self._share_tensors()
        self._names = names
        self._positions = positions
        if self._positions is not None and len(self._positions) != len(self._names):
            raise ValueError(
                f"names and positions must have the same length, got {len(self._names)} "
                f"names for {len(self._positions)} positions"
            )
        self.out_indices = tuple(range(len(self._names)) if out_indices is None else out_indices)
        self.num_stages = len(self._names) if num_stages is None else num_stages
        self.frozen_stages = 0
        self.norm_eval = norm_eval
        self.load_report: LoadReport | None = None
        frozen = {id(p) for p in frozen_parameters}
        self._frozen_names = set()
        for n, p in self.named_parameters():
            if id(p) in frozen:
                p.requires_grad_(False)
                self._frozen_names.add(n)
        self.in_channels = check_input_size(input_size)[0]
        info = feature_info(self, input_size)
        if [f["name"] for f in info] != list(self._names):
            raise ValueError(
                f"names {list(self._names)} do not match the body's outputs "
                f"{[f['name'] for f in info]}"
            )
        self._feature_info = info
        self.train(mode)

    def _share_tensors(self) -> None:
        """Point this module's own parameters and buffers at the body's."""
        body = self._body
        for name, p in body._parameters.items():
            self._parameters[name] = p
        for name, b in body._buffers.items():
            self._buffers[name] = b
            if name in body._non_persistent_buffers_set:
                self._non_persistent_buffers_set.add(name)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """``[{"name", "channels", "stride"}, ...]``, one per output, measured at build time."""
        return [dict(f) for f in self._feature_info]

    @property
    def channels(self) -> list[int]:
        """Channels of the outputs, in order."""
        return [f["channels"] for f in self._feature_info]

    @property
    def strides(self) -> list[int | float]:
        """Strides of the outputs, in order."""
        return [f["stride"] for f in self._feature_info]

    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        check_image_batch("x", x, self.in_channels, weight=next(self.parameters(), None))
        out = self._body(x)
        if self._positions is None and not self._nhwc and isinstance(out, Mapping):
            return out if isinstance(out, OrderedDict) else OrderedDict(out)
        values = list(out.values()) if isinstance(out, Mapping) else list(out)
        positions = range(len(values)) if self._positions is None else self._positions
        if self._nhwc:
            values = [v.permute(0, 3, 1, 2) for v in values]
        return OrderedDict((name, values[p]) for name, p in zip(self._names, positions))

    def train(self, mode: bool = True) -> Backbone:
        super().train(mode)
        self._body.train(mode)
        if mode:
            for module in self._frozen_modules():
                module.eval()
            if self.norm_eval:
                for module in self.modules():
                    if isinstance(module, _BatchNorm):
                        module.eval()
        return self

    def _frozen_modules(self) -> list[nn.Module]:
        """Modules whose own parameters were all frozen by the builder (looked up by name, so
        modules swapped in later, such as SyncBatchNorms, are found too)."""
        found = []
        for prefix, module in self.named_modules():
            names = [
                f"{prefix}.{n}" if prefix else n
                for n, p in module._parameters.items()
                if p is not None
            ]
            if names and all(n in self._frozen_names for n in names):
                found.append(module)
        return found

    def _apply(self, fn: Any, recurse: bool = True) -> Backbone:
        # The children are the body's: let the body convert them (and whatever it keeps
        # beside them), then re-read the body's own tensors, which _apply may have replaced.
        self._body._apply(fn, recurse)
        self._share_tensors()
        return self

    def _replicate_for_data_parallel(self) -> Backbone:
        raise RuntimeError(
            "visionblocks backbones do not support nn.DataParallel (their forward runs the "
            "original model, which DataParallel does not replicate); use "
            "torch.nn.parallel.DistributedDataParallel instead"
        )

    def extra_repr(self) -> str:
        return (
            f"out_indices={self.out_indices}, num_stages={self.num_stages}, "
            f"frozen_stages={self.frozen_stages}, norm_eval={self.norm_eval}"
        )


def backbone_from_model(
    model: nn.Module,
    stages: Sequence[str],
    *,
    name: str | None = None,
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    out_indices: Sequence[int] | None = None,
    in_channels: int | None = None,
    frozen_stages: int = 0,
    norm_eval: bool = False,
    input_size: int = DRY_RUN_SIZE,
    grad_checkpointing: bool | Sequence[int] = False,
) -> Backbone:
    """Make a `Backbone` from any model and the names of the modules that end its stages.

    Stage ``i`` is the output of module ``stages[i]`` (a name as in ``named_modules()``,
    e.g. ``"layer1"`` or ``"features.3"``), returned under the key ``"stage{i}"``, extracted
    with `visionblocks.features.IntermediateLayerGetter` (the model's ``forward`` stops
    after the last requested stage, so no parameter goes without a gradient).

    Args:
        model: The model. It is modified in place only by ``in_channels`` and
            ``frozen_stages``; the backbone shares its modules.
        stages: Module names ending each stage, in execution order.
        name: Name used in error messages (default: the model's class name).
        pretrained: As `visionblocks.backbones.build_backbone` (keys as in ``model.state_dict()``).
        out_indices: As `visionblocks.backbones.build_backbone`, into ``stages``.
        in_channels: Input channels (as `visionblocks.backbones.build_backbone`); ``None``
            keeps the model's.
        frozen_stages: ``n`` freezes every parameter the output of ``stages[n - 1]``
            depends on (their modules stay in eval mode); ``0`` nothing.
        norm_eval: Keep every BatchNorm in eval mode (frozen running statistics).
        input_size: Height and width of the dry runs (a multiple of the total stride).
        grad_checkpointing: Activation checkpointing of every stage (``True``) or of the
            listed stage indices (see `Backbone.set_grad_checkpointing`).

    Returns:
        Backbone: The backbone; ``feature_info`` is measured.

    Raises:
        TypeError: An option has the wrong type.
        ValueError: An unknown stage name, options out of range, a URL or hub name as
            ``pretrained``.
        FileNotFoundError: ``pretrained`` is not an existing file.

    Examples:
        >>> import torch, torchvision
        >>> model = torchvision.models.resnet18(weights=None)
        >>> backbone = backbone_from_model(model, ["layer2", "layer3", "layer4"], frozen_stages=1)
        >>> [(f["name"], f["channels"], f["stride"]) for f in backbone.feature_info]
        [('stage0', 128, 8), ('stage1', 256, 16), ('stage2', 512, 32)]
        >>> backbone.layer2[0].conv1.weight.requires_grad, backbone.layer3[0].conv1.weight.requires_grad
        (False, True)
    """
    check_type("model", model, nn.Module)
    stages = check_stage_names(stages)
    if name is not None:
        check_type("name", name, str)
    check_int("input_size", input_size, 1, MAX_SIDE)
    what = name or type(model).__name__
    indices = normalize_out_indices(out_indices, len(stages), what)
    frozen_stages = normalize_frozen_stages(frozen_stages, len(stages), what)
    check_type("norm_eval", norm_eval, bool)
    ckpt.check_option(grad_checkpointing)
    source = check_pretrained(pretrained)
    if in_channels is not None:
        replace_first_conv(model, check_in_channels(in_channels))
    size = (_model_in_channels(model), input_size, input_size)

    frozen: list[nn.Parameter] = []
    if frozen_stages:
        upstream = IntermediateLayerGetter(model, [stages[frozen_stages - 1]], input_size=size)
        frozen = list(upstream.parameters())
    getter = IntermediateLayerGetter(
        model, {stages[i]: stage_name(i) for i in indices}, input_size=size
    )
    backbone = Backbone(
        getter,
        [stage_name(i) for i in indices],
        input_size=size,
        model=model,
        frozen_parameters=frozen,
        norm_eval=norm_eval,
        out_indices=indices,
        num_stages=len(stages),
    )
    backbone.frozen_stages = frozen_stages
    backbone._stage_blocks = ckpt.stage_blocks(model, stages, range(max(indices) + 1))
    ckpt.configure(backbone, grad_checkpointing)
    if source is not None:
        backbone.load_report = load_pretrained(backbone, source, what)
    return backbone


def _model_in_channels(model: nn.Module) -> int:
    found = first_conv(model)
    return 3 if found is None else found[1].in_channels


def check_common(pretrained: Any, in_channels: Any, norm_eval: Any) -> None:
    """Fail fast (before building a model) on options that need no model."""
    check_pretrained(pretrained)
    check_in_channels(in_channels)
    check_type("norm_eval", norm_eval, bool)
