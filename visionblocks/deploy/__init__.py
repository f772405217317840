"""Export a model to a deployable file and check the file against the eager model.

``visionblocks export CONFIG_OR_CHECKPOINT --format onnx|pt2 --out FILE`` is the command-line
form (`load_for_export` builds the model and loads its weights).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from visionblocks._core.checks import check_choice, check_type
from visionblocks._core.namespace import public_dir
from visionblocks._core.tensor_checks import check_device
from visionblocks.deploy._check import (
    DETECTIONS,
    detections_diff,
    leaves,
    locate,
    max_diff,
    quiet_exporters,
    run_onnx,
)

__all__ = [
    "FORMATS",
    "ExportError",
    "ExportResult",
    "export_kwargs",
    "export_model",
    "load_for_export",
    "max_stride",
]
__dir__ = public_dir(__name__, __all__)

FORMATS: tuple[str, ...] = ("onnx", "pt2")
"""The file formats `export_model` writes."""


class ExportError(RuntimeError):
    """An export failed; ``module_path`` names the innermost submodule whose export fails
    (``""``: the model's own forward), ``module_type`` its class name."""

    def __init__(self, message: str, module_path: str, module_type: str) -> None:
        super().__init__(message)
        self.module_path, self.module_type = module_path, module_type


@dataclass
class ExportResult:
    """What `export_model` wrote and how the file compares with the eager model.

    Attributes:
        path: The written file.
        format: ``"onnx"`` or ``"pt2"``.
        size_bytes: Its size.
        max_abs_diff: Largest absolute difference from the eager outputs on the example
            (padded detections that differ only in the order of tied scores: row by row).
        outputs: Number of output tensors compared.
    """

    path: Path
    format: str
    size_bytes: int
    max_abs_diff: float
    outputs: int


def _dynamic_shapes(
    model: nn.Module, example: Tensor, kwargs: Mapping[str, Any], dynamic_hw: bool, stride: int
) -> dict[str, Any]:
    # torch.export specialises a size of 1 (and a multiple 1 of the stride) to a constant
    if example.dim() < 3 or example.shape[0] < 2:
        raise ValueError(
            f"a dynamic batch size needs an example batch of at least 2 images, got shape "
            f"{tuple(example.shape)}"
        )
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=1024)}
    if dynamic_hw:
        h, w = example.shape[-2:]
        if h % stride or w % stride or min(h, w) < 2 * stride:
            raise ValueError(
                f"dynamic height and width need an example whose size is a multiple of the "
                f"stride {stride}, at least {2 * stride}, got {h}x{w} (pass dynamic_hw=False "
                "for a fixed size)"
            )
        dims[example.dim() - 2] = stride * torch.export.Dim("h_blocks", min=1, max=4096 // stride)
        dims[example.dim() - 1] = stride * torch.export.Dim("w_blocks", min=1, max=4096 // stride)
    first = next(iter(inspect.signature(model.forward).parameters))
    return {first: dims} | {name: None for name in kwargs}


def export_model(
    model: nn.Module,
    example: Tensor,
    path: str | os.PathLike[str],
    format: str = "onnx",
    *,
    dynamic_hw: bool = True,
    stride: int = 32,
    kwargs: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Export ``model`` (in eval mode) for ``example`` and check the file against eager.

    The batch size is dynamic, and with ``dynamic_hw`` the height and width (multiples of
    ``stride``): give at least 2 images of a size that is a multiple of ``stride``, at least
    twice it (``torch.export`` fixes a size of 1). The file is run once on ``example``
    (`torch.export.load` or CPU onnxruntime); a failed export names the innermost failing
    submodule (`ExportError`).

    Args:
        model: The module; called as ``model(example)``.
        example (Tensor[B, C, H, W]): An input the model accepts.
        path: The file to write (parent folders are created).
        format: ``"onnx"`` (``torch.onnx.export(dynamo=True)``) or ``"pt2"`` (`torch.export.save`).
        dynamic_hw: Make height and width dynamic as well as the batch size.
        stride: The largest stride of the model: dynamic sizes are multiples of it.
        kwargs: Keyword arguments of every call (exported as constants), e.g. ``{"padded": True}``
            for the export form of a `visionblocks.models.Detector` (`export_kwargs` gives them).

    Returns:
        ExportResult: The file, its size and the largest difference from eager.

    Raises:
        TypeError: ``model`` not a module or ``example`` not a tensor.
        ValueError: An unknown ``format``, an example that is not a ``(B, C, H, W)`` uint8 or
            floating-point batch of 2 or more, a ``stride`` below 1, or a size that does not
            fit ``stride`` (see above).
        ExportError: The export failed (the message names the submodule).
        ImportError: ``format="onnx"`` without ``onnx``, ``onnxscript`` or ``onnxruntime``.

    Examples:
        >>> import tempfile, torch
        >>> from visionblocks.nn import ConvNormAct
        >>> block = ConvNormAct(3, 8, 3)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     result = export_model(block, torch.rand(2, 3, 64, 64), f"{tmp}/block.pt2", "pt2")
        >>> result.max_abs_diff < 1e-5, result.outputs
        (True, 1)
    """
    check_type("model", model, nn.Module)
    check_type("example", example, Tensor)
    check_type("path", path, (str, os.PathLike))
    check_choice("format", format, FORMATS)
    if example.dim() != 4 or not (example.is_floating_point() or example.dtype == torch.uint8):
        raise ValueError(
            f"example must be a (B, C, H, W) uint8 or floating-point batch, got shape "
            f"{tuple(example.shape)} and dtype {example.dtype}"
        )
    weight = next(iter(model.parameters()), None)
    if weight is not None:
        check_device("example", example, weight.device, "the model's parameters")
    check_type("dynamic_hw", dynamic_hw, bool)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(
            f"kwargs must be a mapping of keyword arguments, got {type(kwargs).__name__}"
        )
    kwargs = dict(kwargs or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            eager = model(example, **kwargs)
        expected = leaves(eager)
        shapes = _dynamic_shapes(model, example, kwargs, dynamic_hw, stride)
        try:
            with quiet_exporters():
                if format == "pt2":
                    program = torch.export.export(model, (example,), kwargs, dynamic_shapes=shapes)
                else:
                    program = torch.onnx.export(
                        model, (example,), kwargs=kwargs, dynamo=True, dynamic_shapes=shapes,
                        verbose=False,
                    )  # fmt: skip
        except Exception as err:
            raise ExportError(*locate(model, (example,), kwargs, err)) from err
        if format == "pt2":
            torch.export.save(program, str(path))
            loaded = torch.export.load(str(path)).module()
            with torch.no_grad():
                got = leaves(loaded(example, **kwargs))
        else:
            program.save(str(path))
            got = run_onnx(path, example)
    finally:
        model.train(was_training)
    diff = max_diff(got, expected)
    if isinstance(eager, Mapping) and tuple(eager) == DETECTIONS and diff > 1e-4:
        paired = detections_diff(got, expected)  # rows of tied scores may swap
        diff = diff if paired is None or paired == float("inf") else paired
    return ExportResult(path, format, path.stat().st_size, diff, len(got))


def export_kwargs(model: nn.Module) -> dict[str, Any]:
    """The keyword arguments that select ``model``'s export form: ``{"padded": True}`` when
    its ``forward`` takes ``padded`` (a `visionblocks.models.Detector`), else none.

    Examples:
        >>> export_kwargs(torch.nn.Identity())
        {}
    """
    check_type("model", model, nn.Module)
    params = inspect.signature(model.forward).parameters
    return {"padded": True} if "padded" in params else {}


def max_stride(model: nn.Module, default: int = 32) -> int:
    """The largest stride of ``model``'s outputs: the largest of ``model.head.strides`` (a
    `visionblocks.models.Detector`), else of ``model.strides``, else ``default``.

    Examples:
        >>> max_stride(torch.nn.Identity())
        32
    """
    check_type("model", model, nn.Module)
    for owner in (getattr(model, "head", None), model):
        strides = getattr(owner, "strides", None)
        if isinstance(strides, Sequence) and strides and all(isinstance(s, int) for s in strides):
            return max(strides)
    return default


def load_for_export(
    source: str | os.PathLike[str], weights: str | os.PathLike[str] | None = None
) -> nn.Module:
    """Build the model a config or checkpoint file describes, with its weights loaded.

    ``source`` is a JSON config (a ``MODELS.build`` config, or ``{"model": config,
    "weights": path}``, the path relative to the config file) or a ``torch.save`` checkpoint
    with the config under ``"config"`` and the state dict under ``"model"`` or
    ``"state_dict"``. ``weights`` overrides the weights the source names; every parameter
    must load (`visionblocks.weights.load_partial`).

    Args:
        source: A JSON config file or a ``torch.save`` checkpoint, as above.
        weights: A weights file that overrides the source's (None: the source's).

    Returns:
        nn.Module: The model, in eval mode.

    Raises:
        TypeError: ``source`` or ``weights`` not a path.
        FileNotFoundError: A file that does not exist.
        ValueError: A config that is not a JSON object, or a checkpoint without a config.

    Examples:
        >>> import json, tempfile
        >>> cfg = {"type": "detector", "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
        ...        "neck": {"type": "fpn", "out_channels": 16},
        ...        "head": {"type": "fcos", "num_classes": 3, "num_convs": 1}}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "cfg.json").write_text(json.dumps(cfg))
        ...     model = load_for_export(Path(tmp, "cfg.json"))
        >>> type(model).__name__, model.training
        ('Detector', False)
    """
    from visionblocks._core.registries import MODELS
    from visionblocks.weights import load_partial

    check_type("source", source, (str, os.PathLike))
    if weights is not None:
        check_type("weights", weights, (str, os.PathLike))
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"source: no such config or checkpoint file: '{source}'")
    if weights is not None and not Path(weights).is_file():
        raise FileNotFoundError(f"weights: no such checkpoint file: '{weights}'")
    state: Any = None
    if source.suffix.lower() == ".json":
        cfg = json.loads(source.read_text(encoding="utf-8"))
        if not isinstance(cfg, Mapping):
            raise ValueError(f"{source}: a config must be a JSON object, got {type(cfg).__name__}")
        if "model" in cfg and isinstance(cfg["model"], Mapping):
            if cfg.get("weights") and weights is None:
                weights = source.parent / str(cfg["weights"])
            cfg = cfg["model"]
    else:
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
        cfg = checkpoint.get("config") if isinstance(checkpoint, Mapping) else None
        if not isinstance(cfg, Mapping):
            raise ValueError(
                f"{source}: a checkpoint to export must hold the model's config under "
                "'config' (a dict for MODELS.build); or pass a JSON config and --weights"
            )
        state = checkpoint.get("model", checkpoint.get("state_dict"))
    model = MODELS.build(dict(cfg))
    if weights is not None:
        load_partial(model, weights, require="*")
    elif state is not None:
        load_partial(model, state, require="*")
    return model.eval()
