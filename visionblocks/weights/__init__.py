"""Reading checkpoints safely and loading the parts of them that fit a model.

`read_state_dict` reads torch, pickle and safetensors files without ever running code stored
in them: ``torch.load(weights_only=True)`` (memory-mapped for zip files), with foreign objects
as inert placeholders and whole pickled models rebuilt as state dicts. `load_partial` copies
every tensor that fits into a model, by name (with prefix changes found automatically) or by
structure (timm, detectron2 and torchvision layouts of one network), and returns a
`LoadReport`. It fails loudly (``strict``, ``require``, ``min_loaded``; loading nothing is an
error by default), and its checks run before anything is copied, so a failed load leaves
the model as it was.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.weights.load import load_partial
from visionblocks.weights.read import read_state_dict
from visionblocks.weights.report import LoadError, LoadReport

__all__ = ["LoadError", "LoadReport", "load_partial", "read_state_dict"]
__dir__ = public_dir(__name__, __all__)
