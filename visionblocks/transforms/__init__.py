"""Sample-level augmentation: whole detection samples warped with one matrix.

`warp_sample` warps an image and its target (boxes, masks, polygons, key points) with a
matrix you build; `RandomAffine` draws the matrix as ``v2.RandomAffine`` does and works inside
``torchvision.transforms.v2.Compose`` on ``tv_tensors``, next to torchvision's transforms.
Tensor-level warps (`visionblocks.ops.warp_affine`, `visionblocks.ops.warp_boxes`...) live in
`visionblocks.ops`.
"""

from visionblocks._core.namespace import public_dir
from visionblocks.transforms.affine import RandomAffine
from visionblocks.transforms.sample import warp_sample

__all__ = ["RandomAffine", "warp_sample"]
__dir__ = public_dir(__name__, __all__)
