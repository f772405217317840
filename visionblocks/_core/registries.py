"""The global registries, filled lazily by the modules that register into them.

Documented in `visionblocks.registry` (the public facade).
"""

from __future__ import annotations

import difflib

from visionblocks._core.registry import Registry

__all__ = [
    "BACKBONES",
    "DATASETS",
    "HEADS",
    "INITIALIZERS",
    "LAYERS",
    "LOSSES",
    "MODELS",
    "NECKS",
    "REGISTRIES",
    "get_registry",
]

BACKBONES = Registry("backbones", modules=("visionblocks.backbones",),
                     description="nn.Module returning OrderedDict[str, Tensor], with .feature_info")  # fmt: skip
"""Backbones: ``build_backbone(name, ...)`` builds from here."""
NECKS = Registry("necks", modules=("visionblocks.models",),
                 description="nn.Module mapping a feature dict to a feature dict")  # fmt: skip
"""Necks (e.g. FPN)."""
HEADS = Registry("heads", modules=("visionblocks.models",),
                 description="nn.Module turning features into predictions and losses")  # fmt: skip
"""Detection and segmentation heads."""
LOSSES = Registry("losses", modules=("visionblocks.losses",), description="nn.Module loss")
"""Loss modules (``focal``, ``softmax_focal``, ``bce``, ``ce``, ``giou``, ``diou``, ``ciou``, ``rotated_iou``)."""
LAYERS = Registry("layers", modules=("visionblocks.nn",), description="nn.Module building block")
"""Building blocks (convolutions, local ops)."""
INITIALIZERS = Registry("initializers", modules=("visionblocks.init",),
                        description="fn(module, **params) initialising in place")  # fmt: skip
"""Weight initializers used by ``init_weights`` rules."""
DATASETS = Registry(
    "datasets", modules=("visionblocks.data",), description="map-style torch Dataset"
)
"""Datasets (COCO wrappers)."""
MODELS = Registry("models", modules=("visionblocks.models",),
                  description="whole model (backbone + neck + head) built from a config dict")  # fmt: skip
"""Complete models: the reference ``detector`` and ``segmenter``."""

REGISTRIES: dict[str, Registry] = {
    r.name: r for r in (BACKBONES, NECKS, HEADS, LOSSES, LAYERS, INITIALIZERS, DATASETS, MODELS)
}
"""The global registries by name."""


def get_registry(name: str) -> Registry:
    """Return the global registry called ``name`` (``"losses"``, ``"backbones"``, ...).

    Raises:
        KeyError: For an unknown registry name, listing the valid ones.

    Examples:
        >>> get_registry("losses").name
        'losses'
    """
    if not isinstance(name, str):
        raise TypeError(f"registry name must be a str, got {type(name).__name__} ({name!r})")
    if name not in REGISTRIES:
        close = difflib.get_close_matches(name, list(REGISTRIES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"unknown registry {name!r}.{hint} Valid registries: {', '.join(sorted(REGISTRIES))}"
        )
    return REGISTRIES[name]
