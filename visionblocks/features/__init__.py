"""Intermediate feature extraction: `IntermediateLayerGetter` and `feature_info`.

`IntermediateLayerGetter` returns the outputs of named submodules (top-level like
``"layer3"`` or nested like ``"layer4.1.conv2"``) exactly as the model's own ``forward``
computes them: forward hooks on the requested modules capture their outputs while
``model.forward`` runs, and the forward stops as soon as every requested output exists. So it
is right for models that are not a chain of children (skip connections, reused modules,
functional ops in ``forward``), and on chain-like models (ResNets, ``nn.Sequential``) it gives
what torchvision's ``IntermediateLayerGetter`` gives: same outputs, same keys, same
parameters and state-dict keys. The model is not modified. Under ``torch.export``,
``torch.compile``, ``torch.jit.trace`` and ``torch.fx`` the getter runs a ``torch.fx`` trace
of the model truncated at the requested outputs instead (no hooks, no early stop).

`feature_info` measures the channels and stride of features with a dry run.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.features.getter import IntermediateLayerGetter
from visionblocks.features.info import feature_info

__all__ = ["IntermediateLayerGetter", "feature_info"]
__dir__ = public_dir(__name__, __all__)
