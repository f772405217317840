"""Name → builder registries and plugin discovery.

A `Registry` maps names (plus aliases) to *builders*: classes or functions that
return the object the registry is about. ``build`` calls the builder with keyword arguments,
taken from a config dict (``{"type": name, **kwargs}``) and/or keyword arguments.

Builder contract, per global registry:

| registry | a builder returns | called as |
|---|---|---|
| `BACKBONES` | `nn.Module` whose `forward` returns `OrderedDict[str, Tensor]` and which has `.feature_info` (list of `{"name", "channels", "stride"}`) | `builder(**kwargs)` |
| `NECKS` | `nn.Module` mapping a feature dict to a feature dict | `builder(in_channels=..., **kwargs)` |
| `HEADS` | `nn.Module` turning features into predictions (and losses in training) | `builder(**kwargs)` |
| `LOSSES` | `nn.Module` loss (functional versions live beside it) | `builder(**kwargs)` |
| `LAYERS` | `nn.Module` block | `builder(*args, **kwargs)` |
| `INITIALIZERS` | function `fn(module, **params)` initialising one module in place | `get(name)(module, **params)` |
| `DATASETS` | a map-style `torch.utils.data.Dataset` | `builder(**kwargs)` |
| `MODELS` | a whole model (backbone, neck, head) from config entries | `builder(**cfg)` |

Built-in entries are imported lazily: a registry knows which visionblocks modules fill it
and imports them on its first miss, listing or iteration, so a name is never "missing" just
because a module was not imported yet.

Namespaces (`Registry.add_namespace`) resolve a family of names by prefix: ``BACKBONES``
takes ``"timm/<model>"`` for any timm model (``BACKBONES.build("timm/resnet18")``,
``{"type": "timm/resnet18"}`` in a model config, ``"timm/resnet18" in BACKBONES``), the same
backbone as `build_backbone` (also importable from here). ``list()`` shows only registered
names; a name missing from ``BACKBONES`` that is a timm model is suggested as ``timm/<name>``.

Plugins: a third-party package exposes an entry point in the group ``visionblocks.plugins``;
its target is a module (importing it registers things) or a callable taking no arguments
(called once). Plugins load lazily, on the first lookup miss or listing of any registry. A
broken plugin gives a ``RuntimeWarning`` naming it; it never crashes visionblocks:

    # pyproject.toml of the plugin package
    [project.entry-points."visionblocks.plugins"]
    my_backbones = "my_package.backbones"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from visionblocks._core.config_keys import ConfigError
from visionblocks._core.plugins import PLUGIN_GROUP, load_plugins
from visionblocks._core.registries import (
    BACKBONES,
    DATASETS,
    HEADS,
    INITIALIZERS,
    LAYERS,
    LOSSES,
    MODELS,
    NECKS,
    REGISTRIES,
    get_registry,
)
from visionblocks._core.registry import Registry

if TYPE_CHECKING:
    from visionblocks.backbones import build_backbone

__all__ = [
    "BACKBONES",
    "DATASETS",
    "HEADS",
    "INITIALIZERS",
    "LAYERS",
    "LOSSES",
    "MODELS",
    "NECKS",
    "PLUGIN_GROUP",
    "REGISTRIES",
    "ConfigError",
    "Registry",
    "build_backbone",
    "get_registry",
    "load_plugins",
]


def __getattr__(name: str) -> Any:
    # `build_backbone` lives with the backbones (a layer above the registry core); importing
    # it on first use keeps `import visionblocks.registry` free of torchvision and timm.
    if name == "build_backbone":
        from visionblocks.backbones import build_backbone

        return build_backbone
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
