"""Intermediate feature extraction: `IntermediateLayerGetter` and `feature_info`.

`IntermediateLayerGetter` returns the outputs of named submodules (``"layer3"``,
``"layer4.1.conv2"``) exactly as the model's own ``forward`` computes them; on chain-like
models it gives what torchvision's getter gives. `feature_info` measures the channels and
stride of features with a dry run.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.features.getter import IntermediateLayerGetter
from visionblocks.features.info import feature_info

__all__ = ["IntermediateLayerGetter", "feature_info"]
__dir__ = public_dir(__name__, __all__)
