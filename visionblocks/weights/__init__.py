"""Reading checkpoints safely and loading the parts of them that fit a model.

`read_state_dict` reads ``.pt``/``.pth``/``.bin``/``.ckpt`` files with
``torch.load(weights_only=True)`` (memory-mapped when the file is in the zip format) and,
when that refuses a file because it pickles other objects (an ``argparse.Namespace``,
NumPy values, a training framework's classes), with an unpickler that replaces those objects
by inert placeholders (a whole model pickled with ``torch.save(model)`` is read as its
state dict, rebuilt from the pickled module tree); ``.pkl`` files (detectron2) with the same unpickler and
``.safetensors`` files with safetensors. It never runs code stored in a file. `load_partial`
copies every tensor that fits into a model, finds a key prefix to remove or add when that
makes more keys fit, and returns a `LoadReport` saying what was loaded, what was skipped and
why. With ``match="structure"`` it pairs the tensors of the same network under other names
(timm, detectron2 and torchvision layouts) by the order of the module tree and by shape,
reports every pairing, and refuses an ambiguous one instead of guessing. It fails loudly
instead of logging (``strict``, ``require``, ``min_loaded``; loading nothing at all is an
error by default), and all of its checks run before anything is copied, so a failed load
leaves the model as it was.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.weights.load import load_partial
from visionblocks.weights.read import read_state_dict
from visionblocks.weights.report import LoadError, LoadReport

__all__ = ["LoadError", "LoadReport", "load_partial", "read_state_dict"]
__dir__ = public_dir(__name__, __all__)
