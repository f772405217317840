"""torchvision's Mask R-CNN with visionblocks' RoI pooling and mask pasting (group ``workload``).

The model is torchvision's own ``maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)``
(random weights, nothing downloaded), at a small size for 2 CPU cores: images resized to
128 px (``min_size``/``max_size``), 200/100 proposals before/after the RPN's NMS, 64 sampled
RoIs per image in training, at most 10 detections per image (the mask head's cost grows with
them). The peer is that model as it is; ours is a copy of it (the same weights) where
`visionblocks_in_maskrcnn` has put

- `visionblocks.ops.MultiScaleRoIAlign` (built from torchvision's, the same arguments) in
  place of ``roi_heads.box_roi_pool`` and ``roi_heads.mask_roi_pool``, and
- `visionblocks.ops.paste_masks` in place of ``paste_masks_in_image``, which
  ``GeneralizedRCNNTransform.postprocess`` looks up in ``torchvision.models.detection.
  transform`` (it imported the name from ``roi_heads``, so patching ``roi_heads`` alone does
  not reach it: both are patched), for the duration of ours' call.

Cases:

- ``workload_maskrcnn_eval``: one eval-mode forward of 2 images (150x170 and 130x140 before
  resizing): boxes, labels, scores and the pasted masks.
- ``workload_maskrcnn_train_step``: one training step (forward with 2 to 4 objects per image,
  the five losses, backward, SGD step); each side trains its own copy, with the same seed for
  the RPN's and the RoI heads' sampling.

Both run on 1 thread (the suite's rule for timing on a shared machine: 2 threads on 2 busy
cores make every parallel region wait for a descheduled thread). The check compares, on the
same weights and inputs, the detections (boxes, labels and scores
to float rounding, masks within `MASK_ATOL`) and the five training losses (within 1e-6
relative). Our RoI Align adds its samples in another order than torchvision's kernel from
some size on (equal to float rounding); the random-weight mask head amplifies that rounding
to about 1e-4 in the mask probabilities, as it does any: torchvision's own model with its
pooled features moved by one float32 rounding (a relative 2**-24) moves its masks by 6e-5
to 1.3e-4, its boxes by up to 5e-5 pixels and its scores by up to 6e-7 (relative).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.harness.case import BenchCase, register_case
from benchmarks.harness.check import assert_same

__all__ = ["MASKRCNN_CASES", "maskrcnn", "visionblocks_in_maskrcnn"]

SMALL = {
    "min_size": 128,
    "max_size": 128,
    "rpn_pre_nms_top_n_test": 200,
    "rpn_post_nms_top_n_test": 100,
    "rpn_pre_nms_top_n_train": 200,
    "rpn_post_nms_top_n_train": 100,
    "box_batch_size_per_image": 64,
    "box_detections_per_img": 10,
}
"""Options of the small model: every size the CPU cost grows with, cut down."""
MASK_ATOL, LOSS_RTOL = 5e-4, 1e-6


def maskrcnn(num_classes: int = 5, **overrides: Any) -> torch.nn.Module:
    """torchvision's ``maskrcnn_resnet50_fpn`` with random weights at the `SMALL` sizes."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    options = {**SMALL, **overrides}
    return maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=num_classes, **options
    )


def _paste(masks: torch.Tensor, boxes: torch.Tensor, img_shape: Any, padding: int = 1) -> Any:
    """``paste_masks_in_image``'s signature (``(N, 1, M, M)`` masks) over `paste_masks`."""
    from visionblocks.ops import paste_masks

    return paste_masks(masks[:, 0], boxes, tuple(img_shape), padding)[:, None]


def with_visionblocks_pools(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose RoI heads pool with `visionblocks.ops.MultiScaleRoIAlign`."""
    from visionblocks.ops import MultiScaleRoIAlign

    ours = copy.deepcopy(model)
    for name in ("box_roi_pool", "mask_roi_pool"):
        peer = getattr(model.roi_heads, name)
        pool = MultiScaleRoIAlign(
            peer.featmap_names,
            peer.output_size,
            peer.sampling_ratio,
            canonical_scale=peer.canonical_scale,
            canonical_level=peer.canonical_level,
        )
        setattr(ours.roi_heads, name, pool)
    return ours


@contextmanager
def visionblocks_in_maskrcnn(calls: dict[str, int] | None = None) -> Iterator[None]:
    """Within the block, torchvision's detection models paste masks with `paste_masks`.

    Args:
        calls: If given, counts the calls that reach visionblocks under ``"paste_masks"``.

    Examples:
        >>> import torchvision.models.detection.transform as transform
        >>> before = transform.paste_masks_in_image
        >>> with visionblocks_in_maskrcnn():
        ...     transform.paste_masks_in_image is before
        False
        >>> transform.paste_masks_in_image is before
        True
    """
    import torchvision.models.detection.roi_heads as roi_heads
    import torchvision.models.detection.transform as transform

    def paste(*args: Any, **kwargs: Any) -> Any:
        if calls is not None:
            calls["paste_masks"] = calls.get("paste_masks", 0) + 1
        return _paste(*args, **kwargs)

    saved = [(m, m.paste_masks_in_image) for m in (roi_heads, transform)]
    try:
        for module, _ in saved:
            module.paste_masks_in_image = paste
        yield
    finally:
        for module, value in saved:
            module.paste_masks_in_image = value


def _images(generator: torch.Generator) -> list[torch.Tensor]:
    return [
        torch.rand(3, 150, 170, generator=generator),
        torch.rand(3, 130, 140, generator=generator),
    ]


def _targets(images: list[torch.Tensor], generator: torch.Generator) -> list[dict]:
    """2 to 4 objects per image: boxes, labels and a rectangle-and-noise mask inside each box."""
    targets = []
    for image in images:
        height, width = image.shape[1:]
        n = int(torch.randint(2, 5, (1,), generator=generator))
        xy = torch.rand(n, 2, generator=generator) * torch.tensor([width, height]) * 0.6
        wh = (0.2 + 0.3 * torch.rand(n, 2, generator=generator)) * torch.tensor([width, height])
        boxes = torch.cat([xy, xy + wh], 1).floor()
        masks = torch.zeros(n, height, width, dtype=torch.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
            masks[i, y1:y2, x1:x2] = torch.rand(y2 - y1, x2 - x1, generator=generator) < 0.9
        labels = torch.randint(1, 5, (n,), generator=generator)
        targets.append({"boxes": boxes, "labels": labels, "masks": masks})
    return targets


def _eval_setup() -> dict[str, Any]:
    torch.manual_seed(0)
    model = maskrcnn().eval()
    return {
        "peer": model,
        "ours": with_visionblocks_pools(model).eval(),
        "images": _images(torch.Generator().manual_seed(1)),
    }


def eval_ours(state: dict[str, Any], calls: dict[str, int] | None = None) -> list[dict]:
    with torch.no_grad(), visionblocks_in_maskrcnn(calls):
        return state["ours"](state["images"])


def eval_peer(state: dict[str, Any]) -> list[dict]:
    with torch.no_grad():
        return state["peer"](state["images"])


def _eval_outputs(state: dict[str, Any]) -> tuple[Any, Any]:
    calls: dict[str, int] = {}
    return {"detections": eval_ours(state, calls), "calls": calls}, {"detections": eval_peer(state)}


def check_detections(ours: dict[str, Any], peer: dict[str, Any]) -> None:
    """visionblocks reached; detections equal, masks within `MASK_ATOL`."""
    assert ours["calls"].get("paste_masks"), "paste_masks never called"
    for i, (a, b) in enumerate(zip(ours["detections"], peer["detections"], strict=True)):
        assert set(a) == set(b)
        assert torch.equal(a["labels"], b["labels"]), f"labels of image {i}"
        assert_same(a["boxes"], b["boxes"], rtol=1e-6, atol=1e-4, where=f"boxes[{i}]")
        assert_same(a["scores"], b["scores"], rtol=1e-5, atol=1e-7, where=f"scores[{i}]")
        assert_same(a["masks"], b["masks"], rtol=0.0, atol=MASK_ATOL, where=f"masks[{i}]")


def _train_setup() -> dict[str, Any]:
    torch.manual_seed(0)
    model = maskrcnn().train()
    generator = torch.Generator().manual_seed(1)
    images = _images(generator)
    state: dict[str, Any] = {"images": images, "targets": _targets(images, generator)}
    state["model"], state["pooled"] = model, with_visionblocks_pools(model).train()
    for side, copy_ in (("ours", with_visionblocks_pools(model)), ("peer", copy.deepcopy(model))):
        optimizer = torch.optim.SGD(copy_.parameters(), lr=0.002, momentum=0.9)
        state[side] = (copy_.train(), optimizer)
    return state


def train_step(model: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> dict:
    torch.manual_seed(2)  # the RPN's and the RoI heads' sampling: the same on both sides
    losses = model(state["images"], state["targets"])
    optimizer.zero_grad(set_to_none=True)
    sum(losses.values()).backward()
    optimizer.step()
    return {k: v.detach() for k, v in losses.items()}


def _train_ours(state: dict[str, Any]) -> dict:
    with visionblocks_in_maskrcnn():
        return train_step(*state["ours"], state)


def _train_peer(state: dict[str, Any]) -> dict:
    return train_step(*state["peer"], state)


def train_losses(model: torch.nn.Module, state: dict[str, Any]) -> dict:
    """The five losses of one forward pass (seeded sampling), no step."""
    torch.manual_seed(2)
    with torch.no_grad():
        return {k: v.detach() for k, v in model(state["images"], state["targets"]).items()}


def _train_outputs(state: dict[str, Any]) -> tuple[dict, dict]:
    return train_losses(state["pooled"], state), train_losses(state["model"], state)


def check_losses(ours: dict, peer: dict) -> None:
    assert set(ours) == set(peer) and len(peer) == 5
    assert_same(ours, peer, rtol=LOSS_RTOL, atol=0.0)


MASKRCNN_CASES: list[BenchCase] = [
    register_case(
        BenchCase(
            name="workload_maskrcnn_eval",
            setup=_eval_setup,
            ours=eval_ours,
            peer=eval_peer,
            peer_name="torchvision",
            description="torchvision maskrcnn_resnet50_fpn (random weights) eval forward, 2 "
            "images resized to 128 px, up to 10 detections each; ours: visionblocks' "
            "MultiScaleRoIAlign (box and mask heads) and paste_masks swapped in; 1 thread",
            min_speedup=1.0,
            threads=1,
            memory=False,
            check=check_detections,
            outputs=_eval_outputs,
            group="workload",
            verify=True,
        )
    ),
    register_case(
        BenchCase(
            name="workload_maskrcnn_train_step",
            setup=_train_setup,
            ours=_train_ours,
            peer=_train_peer,
            peer_name="torchvision",
            description="torchvision maskrcnn_resnet50_fpn (random weights) training step, 2 "
            "images resized to 128 px, 2 to 4 objects each, five losses, SGD; ours: "
            "visionblocks' MultiScaleRoIAlign swapped in; 1 thread",
            min_speedup=1.0,
            threads=1,
            memory=False,
            check=check_losses,
            outputs=_train_outputs,
            group="workload",
            verify=True,
        )
    ),
]
"""``workload_maskrcnn_eval`` and ``workload_maskrcnn_train_step``."""
